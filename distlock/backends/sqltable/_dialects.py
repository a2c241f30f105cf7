"""What differs between the SQL lock table's databases (PostgreSQL with psycopg, MariaDB/MySQL with PyMySQL,
SQLite), kept out of the backend: the server's clock in SQL (:class:`server_now`), one statement that makes a row or
locks the existing one (:func:`insert_or_lock`), each driver's connection arguments and session set-up
(:func:`create_engine`), the socket under a driver connection (:func:`driver_socket`), and how each driver's errors
read (:func:`error_table`).

What can go wrong: an unknown dialect or a driver that is not installed is a ``ConfigurationError`` from
:func:`create_engine`. A driver error is retried when it means "not now" (a lost or refused connection, a server
starting or stopping, a deadlock, a serialisation failure, a lock wait timeout, a busy SQLite file) and then
becomes ``BackendUnavailable``; refused credentials or privileges become ``AuthenticationFailed``; a database that
does not exist becomes :class:`NoDatabase` (``check()`` raises ``ConfigurationError`` for it); anything else a
``BackendError``. The driver's exception stays the ``__cause__``'s ``orig``. A driver this module does not know is
read by SQLAlchemy's exception classes alone. Why the server's clock: docs/operations/sql-table.md.
"""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql as sa_mysql
from sqlalchemy.dialects import postgresql as sa_postgresql
from sqlalchemy.dialects import sqlite as sa_sqlite
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from ... import _clock
from ..._errors import AuthenticationFailed, BackendError, BackendUnavailable, ConfigurationError
from ..._retry import ErrorTable
from . import driver_extra

__all__ = [
    "NoDatabase",
    "bound_sqlite_wait",
    "connect_args",
    "create_engine",
    "driver_socket",
    "error_table",
    "insert_or_lock",
    "retryable",
    "server_now",
    "set_up_sessions",
]

# -- the server's clock, in SQL --------------------------------------------------------------------------------


class server_now(FunctionElement[float]):  # noqa: N801 - a SQL function, named like one
    """The database server's current time in seconds since the epoch, as a float (SQLite: the running process's)."""

    type = sa.Double()
    inherit_cache = True


@compiles(server_now, "postgresql")
def _now_postgresql(element: server_now, compiler: SQLCompiler, **kw: Any) -> str:
    # clock_timestamp(), not now(): now() is the start of the transaction.
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(server_now, "mysql")
@compiles(server_now, "mariadb")
def _now_mysql(element: server_now, compiler: SQLCompiler, **kw: Any) -> str:
    # The session's time zone is UTC (set on connect), so NOW(6) has no daylight-saving fold to misread.
    return "UNIX_TIMESTAMP(NOW(6))"


@compiles(server_now, "sqlite")
def _now_sqlite(element: server_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


def insert_or_lock(dialect: str, table: sa.Table, **values: Any) -> Any:
    """An INSERT of ``values`` into ``table`` that, when the row's key exists, locks that row instead (until commit),
    in one atomic statement: a row another transaction is deleting is waited for, then made anew.

    PostgreSQL: ``ON CONFLICT DO UPDATE ... WHERE false`` locks the conflicting row and writes nothing (its docs: the
    row is locked even when the condition fails); when the row it waited for is deleted, it inserts instead. MariaDB:
    ``ON DUPLICATE KEY UPDATE`` takes an exclusive lock on the duplicate (an ``INSERT IGNORE`` takes a shared one,
    and two joins each holding one and asking for the exclusive lock would deadlock); the update sets the key to
    itself, which changes nothing. SQLite has no row locks: one writer at a time (``BEGIN IMMEDIATE``) serialises."""
    key = [column.name for column in table.primary_key.columns]
    if dialect == "postgresql":
        upsert = sa_postgresql.insert(table).values(**values)
        return upsert.on_conflict_do_update(
            index_elements=key, set_={name: upsert.excluded[name] for name in key}, where=sa.false()
        )
    if dialect == "sqlite":
        return sa_sqlite.insert(table).values(**values).on_conflict_do_nothing()
    upsert_mysql = sa_mysql.insert(table).values(**values)
    return upsert_mysql.on_duplicate_key_update({name: upsert_mysql.inserted[name] for name in key})


# -- errors ----------------------------------------------------------------------------------------------------

#: PostgreSQL SQLSTATEs: retry (the server is starting or stopping, too busy, a deadlock or serialisation failure),
#: refused (credentials, privileges) and a database that does not exist.
_PG_RETRY = {"57P01", "57P02", "57P03", "53300", "40001", "40P01", "55P03"}
_PG_REFUSED = {"28P01", "28000", "42501"}
_PG_NO_DATABASE = {"3D000"}
#: MySQL/MariaDB error codes, likewise: lost or refused connections, server shutdown, too many connections,
#: lock wait timeout and deadlock; access denied; unknown database.
_MYSQL_RETRY = {0, 1040, 1053, 1205, 1213, 2003, 2006, 2013, 2055}
_MYSQL_REFUSED = {1044, 1045, 1142, 1143, 1227, 1698}
_MYSQL_NO_DATABASE = {1049}


def _code(error: BaseException) -> tuple[str, object]:
    """The driver's view of a database error: (``"pg"``, SQLSTATE), (``"mysql"``, code) or (``"sqlite"``, message)."""
    original = getattr(error, "orig", None) or error
    module = type(original).__module__
    if module.startswith("psycopg"):
        return "pg", getattr(original, "sqlstate", None)
    if module.startswith("pymysql"):
        args = getattr(original, "args", ())
        return "mysql", args[0] if args and isinstance(args[0], int) else 0
    if module.startswith("sqlite3"):
        return "sqlite", str(original)
    return "", None


#: What libpq says when the server refuses a connection before any SQLSTATE can be read (psycopg then has none).
_PG_REFUSED_TEXT = ("password authentication failed", "no pg_hba.conf entry", 'role "', "permission denied")


def _pg_connect_refusal(error: BaseException) -> str:
    """For a failed PostgreSQL connection: ``"refused"`` (credentials), ``"no database"``, or ``""``."""
    text = str(getattr(error, "orig", error))
    if 'database "' in text and "does not exist" in text:
        return "no database"
    return "refused" if any(part in text for part in _PG_REFUSED_TEXT) else ""


def _misnamed(error: BaseException) -> bool:
    """Whether ``error`` says that the database the URL names does not exist (or, SQLite, cannot be opened)."""
    driver, code = _code(error)
    return (
        (driver == "pg" and (code in _PG_NO_DATABASE or (code is None and _pg_connect_refusal(error) == "no database")))
        or (driver == "mysql" and code in _MYSQL_NO_DATABASE)
        or (driver == "sqlite" and "unable to open" in str(code))
    )


class NoDatabase(BackendError):
    """The URL's database does not exist: ``check()`` (``connect()``, where the URL is given) raises
    ``ConfigurationError`` for it instead."""


def retryable(error: Exception) -> bool:
    """Whether ``error`` means "not now": try the request again."""
    if isinstance(error, sa_exc.TimeoutError):  # no pooled connection free in time
        return True
    if not isinstance(error, sa_exc.DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    driver, code = _code(error)
    if driver == "pg":
        if code is None:
            return not _pg_connect_refusal(error)
        return code in _PG_RETRY or str(code).startswith("08")
    if driver == "mysql":
        return code in _MYSQL_RETRY
    if driver == "sqlite":
        return "locked" in str(code) or "busy" in str(code)
    return isinstance(error, (sa_exc.OperationalError, sa_exc.InterfaceError))


def _translate(error: Exception, what: str, description: str) -> BackendError | None:
    if isinstance(error, sa_exc.TimeoutError):
        return BackendUnavailable(f"{what}: no connection to {description} free in time")
    if not isinstance(error, sa_exc.DBAPIError):
        return None
    driver, code = _code(error)
    detail = str(getattr(error, "orig", error)).strip().splitlines()[0] if str(error).strip() else type(error)
    refusal = _pg_connect_refusal(error) if driver == "pg" and code is None else ""
    if (
        refusal == "refused"
        or (driver == "pg" and code in _PG_REFUSED)
        or (driver == "mysql" and code in _MYSQL_REFUSED)
    ):
        return AuthenticationFailed(f"{what}: {description} refused access ({detail})")
    if _misnamed(error):
        return NoDatabase(f"{what}: the database the URL names cannot be opened on {description} ({detail})")
    if retryable(error):
        return BackendUnavailable(f"{what}: {description} did not answer ({detail})")
    return BackendError(f"{what} failed on {description}: {detail}")


def _retryable_or_conflict(error: Exception) -> bool:
    return retryable(error) or isinstance(error, sa_exc.IntegrityError)


def error_table(description: str, *, retry_conflicts: bool = False) -> ErrorTable:
    """How the errors of the database ``description`` names read, for ``_retry``. ``retry_conflicts``: retry a
    unique violation too (a lease id drawn twice; two first users creating the tables at once: PostgreSQL may report
    the loser's ``CREATE ... IF NOT EXISTS`` as a unique violation in its catalog, and looking again finds them)."""

    def translate(error: Exception, what: str) -> BackendError | None:
        # A function of this package, not a partial: its module names the backend in distlock.backend.errors.
        return _translate(error, what, description=description)

    return ErrorTable(
        description=description,
        retryable=_retryable_or_conflict if retry_conflicts else retryable,
        translate=translate,
    )


# -- connections -----------------------------------------------------------------------------------------------


def connect_args(dialect: str, opening: float, request_timeout: float) -> dict[str, Any]:
    """The driver's arguments for a new connection, which may take ``opening`` seconds to open."""
    arguments: dict[str, Any] = {}
    if dialect == "postgresql":
        arguments["connect_timeout"] = max(2, math.ceil(opening))  # libpq: whole seconds, at least 2
    elif dialect in ("mysql", "mariadb"):
        # PyMySQL's connect_timeout covers the TCP connect only; it reads the server's greeting with its read
        # timeout, which a paused server would otherwise hold forever. (Requests on open connections have the
        # socket deadlines besides.)
        arguments["connect_timeout"] = max(1, math.ceil(opening))
        arguments["read_timeout"] = arguments["write_timeout"] = opening
    elif dialect == "sqlite":
        arguments["timeout"] = request_timeout  # how long to wait for another writer (busy timeout)
    return arguments


def create_engine(url: URL, description: str, arguments: dict[str, Any], request_timeout: float) -> Engine:
    """SQLAlchemy's engine for ``url``, its connections opened with ``arguments`` (:func:`connect_args`)."""
    dialect = url.get_backend_name()
    options: dict[str, Any] = {"pool_timeout": request_timeout}
    if dialect != "sqlite":
        options["isolation_level"] = "READ COMMITTED"
    try:
        return sa.create_engine(url, connect_args=arguments, **options)
    except sa_exc.NoSuchModuleError as e:
        raise ConfigurationError(f"{description}: SQLAlchemy has no dialect or driver {url.drivername!r}") from e
    except ImportError as e:
        extra = driver_extra(url.drivername)
        hint = f"pip install 'distlock-fenced[{extra}]'" if extra else f"install the driver {url.drivername!r} names"
        raise ConfigurationError(f"{description}: the database driver is not installed ({e}); {hint}") from e
    except (sa_exc.ArgumentError, TypeError) as e:
        raise ConfigurationError(f"{description}: {e}") from e


def set_up_sessions(engine: Engine, dialect: str) -> None:
    """Each new connection's session: UTC on MariaDB/MySQL; on SQLite, transactions that distlock begins itself."""
    if dialect in ("mysql", "mariadb"):
        sa.event.listen(engine, "connect", _utc_session)
    elif dialect == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_no_implicit_transactions)
        sa.event.listen(engine, "begin", _sqlite_begin)


def bound_sqlite_wait(connection: Connection, deadline: float, writes: bool) -> None:
    """On SQLite, before a transaction: how long its BEGIN waits for another writer (until ``deadline`` at most),
    and whether it begins as a writer (``writes``: ``BEGIN IMMEDIATE``, by the begin hook below)."""
    busy = max(int((deadline - _clock.now()) * 1000), 1)
    driver: Any = connection.connection.driver_connection
    driver.execute(f"PRAGMA busy_timeout = {busy}")
    connection.info["distlock_writes"] = writes


def driver_socket(driver: Any) -> int | None:
    """The file descriptor of a driver connection's socket (psycopg, PyMySQL), or None (SQLite, closed)."""
    pgconn = getattr(driver, "pgconn", None)
    if pgconn is not None:
        return int(pgconn.socket) if not driver.closed else None
    sock = getattr(driver, "_sock", None)
    return int(sock.fileno()) if sock is not None else None


def _utc_session(dbapi_connection: Any, record: Any) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+00:00'")


def _sqlite_no_implicit_transactions(dbapi_connection: Any, record: Any) -> None:
    # pysqlite begins transactions lazily and on its own terms; we begin them ourselves (below).
    dbapi_connection.isolation_level = None


def _sqlite_begin(connection: Connection) -> None:
    # A request that writes takes the write lock at BEGIN (IMMEDIATE): the joins of one lock take their ids one at a
    # time, and it never fails on a lock upgrade. Reads begin DEFERRED and share the file; the rare read that finds a
    # dead entry to remove upgrades, and when another writer is in the way that fails at once (SQLITE_BUSY) and the
    # request is retried. Polling waiters read: taking the write lock for each poll would queue every process behind
    # SQLite's busy handler, which sleeps and retries in no particular order (unfair, and slow).
    writes = connection.connection.info.get("distlock_writes", True)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")
