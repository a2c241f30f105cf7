"""The SQL lock table backend (``sql+postgresql://``, ``sql+mysql://``, ``sql+sqlite:///``; the ``sqltable``
extras): lock tables in the application's own database through SQLAlchemy Core, in ``_backend``.

Importing this package imports no client library; ``_backend`` imports SQLAlchemy and is loaded only when a SQL URL
is used.
"""
