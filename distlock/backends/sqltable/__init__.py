"""The SQL lock table backend (``sql+postgresql://``, ``sql+mysql://``, ``sql+sqlite:///``; the ``sqltable``
extras): lock tables in the application's own database through SQLAlchemy Core, in ``_backend``.

Importing this package imports no client library; ``_backend`` imports SQLAlchemy and is loaded only when a SQL URL
is used; ``_url`` parses its URLs. :func:`driver_extra` reads the scheme table for ``_backend``'s hint when a driver
is missing.
"""

from __future__ import annotations

from .. import SCHEMES

__all__ = ["driver_extra"]


def driver_extra(drivername: str) -> str | None:
    """The distlock extra that installs SQLAlchemy driver ``drivername`` (``postgresql+psycopg``), if one does."""
    for scheme in SCHEMES.values():
        if scheme.driver is not None and f"{scheme.name.removeprefix('sql+')}+{scheme.driver}" == drivername:
            return scheme.extra
    return None
