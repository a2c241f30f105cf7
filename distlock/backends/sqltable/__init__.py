"""The SQL lock table backend (``sql+postgresql://``, ``sql+mysql://``, ``sql+sqlite:///``; the ``sqltable``
extras): lock tables in the application's own database through SQLAlchemy Core. ``_backend`` is the backend, over
``_schema`` (the tables, their DDL), ``_dialects`` (what differs between databases and drivers), ``_queue`` (a
lock's entries and a waiter's place) and ``_notify`` (LISTEN/NOTIFY, socket deadlines); ``_url`` parses its URLs.

Importing this package imports no client library; the modules above but ``_url`` import SQLAlchemy and are loaded
only when a SQL URL is used (``distlock sql-tables --print-only`` loads ``_schema`` alone). :func:`driver_extra`
reads the scheme table for ``_dialects``' hint when a driver is missing.
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
