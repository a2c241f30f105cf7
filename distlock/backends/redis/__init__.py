"""The Redis backend (``redis://``, ``rediss://``, ``redis+cluster://``; the ``redis`` extra): Lua scripts over
redis-py connections, in ``_backend``.

Importing this package imports no client library; ``_backend`` imports redis-py and is loaded only when a Redis URL
is used.
"""
