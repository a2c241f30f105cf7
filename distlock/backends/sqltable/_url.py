"""The SQL lock table URL grammar: ``sql+`` and a SQLAlchemy URL (``sql+postgresql://user:password@host/db``,
``sql+mysql://``, ``sql+mariadb://``, ``sql+sqlite:///path``; a driver may be named, ``sql+postgresql+psycopg2://``,
else the scheme's default driver of ``SCHEMES`` is used); ``?prefix=`` names the tables, other query options go to
the driver. :func:`parse` reads it into a :class:`SqlTableConfig` with SQLAlchemy's ``make_url`` alone.

What can go wrong: a URL SQLAlchemy cannot parse, a prefix that is not a plain SQL name, a SQLite URL without a
file (an in-memory database is one process's only; ``sql+sqlite://:memory:`` or ``sql+sqlite://locks.db``, whose
two slashes make a host of what follows, are refused before SQLAlchemy reads them) or an unknown option raise
``ConfigurationError``, and so does
a missing SQLAlchemy (naming the extra to install); ``open()`` raises it for an unknown dialect or a driver that is
not installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._errors import ConfigurationError
from .. import _url

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ..._protocol import Backend
    from .. import Scheme

__all__ = ["SqlTableConfig", "parse"]


@dataclass(frozen=True)
class SqlTableConfig:
    url: URL  # its repr hides the password
    prefix: str
    connect_timeout: float
    request_timeout: float

    def open(self) -> Backend:
        from ._backend import SqlTableBackend  # imports SQLAlchemy's engine and the driver

        return SqlTableBackend(
            self.url, prefix=self.prefix, connect_timeout=self.connect_timeout, request_timeout=self.request_timeout
        )


def _require_sqlite_file(url: str) -> None:
    """Refuse a SQLite URL that names no file: after ``://`` comes the file's path, so three slashes for a relative
    path and four for an absolute one (with two, SQLAlchemy reads a host, and ``:memory:`` as a bad port)."""
    path, _, query = url.partition("://")[2].partition("?")
    if path.startswith("/") and path.strip("/") and ":memory:" not in path and "mode=memory" not in query:
        return
    raise ConfigurationError(
        f"distlock URL {_url.redact(url)!r} names no SQLite file: a lock table is shared by every process, and an "
        "in-memory SQLite database is one process's only. Name a file: sql+sqlite:///locks.db (three slashes: a "
        "path relative to the working directory) or sql+sqlite:////var/lib/app/locks.db (four: an absolute path)"
    )


def parse(url: str, scheme: Scheme, options: dict[str, Any]) -> SqlTableConfig:
    try:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError
    except ImportError as e:
        raise _url.missing_extra(scheme, e) from e

    _url.check_options(options, _url.PLAIN_OPTIONS)
    if scheme.name == "sql+sqlite":
        _require_sqlite_file(url)
    try:
        parsed = make_url(url.partition("+")[2])
    except (ArgumentError, ValueError) as e:
        raise ConfigurationError(f"distlock URL {_url.redact(url)!r} is not a SQLAlchemy URL after 'sql+': {e}") from e
    database, _, driver = parsed.drivername.partition("+")
    if scheme.driver is not None and not driver:
        parsed = parsed.set(drivername=f"{database}+{scheme.driver}")
    query = dict(parsed.query)
    given, chosen = query.pop("prefix", _url.DEFAULT_PREFIX), options.get("prefix")
    prefix = str(given if chosen is None else chosen)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,40}", prefix):
        raise ConfigurationError(
            f"table prefix {prefix!r} must be a plain SQL name: a letter or _, then up to 40 letters, digits or _"
        )
    connect_timeout, request_timeout = _url.timeouts(options)
    return SqlTableConfig(parsed.set(query=query), prefix, connect_timeout, request_timeout)
