"""The SQL lock table backend: the primitives of ``_protocol.Backend`` as rows in the application's own database,
through SQLAlchemy Core (PostgreSQL with psycopg, MariaDB/MySQL with PyMySQL, SQLite).

Three tables, named after the URL's prefix (``distlock`` by default), created on first use (or beforehand by
``distlock sql-tables --url URL``, which also prints their DDL for a DBA; :func:`table_ddl` is the one place it is
written)::

    distlock_leases   (id, ttl, expires_at)                  one row per client session lease
    distlock_waiters  (id, name, lease_id, nonce, owner)     one row per queue entry; id is the fencing token
    distlock_locks    (name_key, record)                     one row per lock name ever used: serialises joins,
                                                             and keeps the lock's record

- A *lease* is a row with a random 63-bit id and ``expires_at``, seconds since the epoch **by the database server's
  clock**: ``grant_lease`` and ``keep_alive`` write ``expires_at = <server now> + ttl`` in SQL, and every liveness
  check compares ``expires_at > <server now>`` in SQL, so no client's clock (off by an hour, stepped, frozen)
  makes a lease look longer or shorter than the server says. The server's now is PostgreSQL's
  ``clock_timestamp()``, MariaDB's ``NOW(6)`` (in a session time zone of UTC), and SQLite's ``julianday('now')``:
  SQLite has no server, so there it is the clock of whichever process runs the statement (one machine's clock).
  A refresh only extends a lease that is still alive (``WHERE expires_at > now``): a dead lease never comes back,
  so an entry seen dead stays dead, and whoever sees it may remove it.
- A *waiter* is a row whose auto-increment ``id`` orders the queue and, at its head, is the fencing token. It never
  repeats: PostgreSQL takes it from an identity sequence, which never hands out a value twice (not after a
  rollback, not after a crash: it may skip values, never repeat them); MariaDB's InnoDB keeps its AUTO_INCREMENT
  counter in the redo log since 10.2.4, so deleting the largest row and restarting does not lower it; SQLite's
  ``AUTOINCREMENT`` keeps the largest id ever used in ``sqlite_sequence`` (without the keyword it would reuse the
  largest id once its row is deleted).
- An auto-increment value is assigned when a row is inserted, not when it commits: two joins of one lock could
  commit out of id order, and a reader that saw only the later one would let it hold while the earlier one, with
  the smaller token, appears ahead of it a moment later. So a join first locks its lock's row in
  ``distlock_locks`` (``SELECT ... FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` locks the whole database): the joins
  of one lock take their ids one after another, each after the previous one committed. Joins of different locks
  do not wait for each other (their ids are unique and comparable, but may commit out of order).

Holder: the entries of a name whose lease is alive, in id order, hold by the grant rule of ``_shape`` (a mutex: the
first one). An entry whose lease expired (or whose lease row is gone) is dead; whoever reads a queue to learn its
own place removes the dead entries ahead of it in the same transaction, and ``grant_lease`` removes expired leases
with their entries. Release, give-up and force release are revision-checked: ``DELETE ... WHERE id = :token AND
name = :name``, never by name alone; a force release first reads the live head and deletes it only if its id is
still the token the operator saw. Every read runs at READ COMMITTED (SQLite: serialisable, one writer at a time).

Waiting: on PostgreSQL with ``LISTEN``/``NOTIFY``. Every removal sends a notification, delivered at commit, on the
entry's own channel (``<prefix>_w<id>``) and on its lock's (``<prefix>_l<hash of the name>``). A waiter listens on
the channel of the one entry it waits for (the one just ahead; for a reader the newest writer ahead), so a release
wakes one waiter; a semaphore waiter, which waits for any of several, listens on its lock's channel. After it has
subscribed, the waiter reads its place again before it sleeps, so a removal between its last read and its
subscription is never missed. It listens on a connection of its own, kept for the next wait. On MariaDB and SQLite,
which have no notifications, a waiter polls: it reads its place again every 50 ms (sooner when a waiter of the same
process released). Either way, a waiter never sleeps past the moment the lease of an entry ahead of it would expire
without reading again (that entry may be dead then), and an :class:`~distlock._protocol.Interrupt` wakes it at once.

What can go wrong: the database can be down, restarting, paused or refuse us. A connection that cannot be opened or
breaks, a deadlock, a serialisation failure, a lock wait timeout or a busy SQLite file are retried within the
request timeout (every request is safe to send again: a join sent again first looks for its own nonce, removals
are by id and name, refreshes and reads change nothing twice), then raise ``BackendUnavailable`` with SQLAlchemy's
exception as ``__cause__`` (its ``orig`` is the driver's); bad credentials or missing privileges raise
``AuthenticationFailed``; a database that does not exist (a SQLite file that cannot be made) is a
``ConfigurationError`` from ``check()``, where the URL is given, and a ``BackendError`` later. A statement that
does not answer by its attempt's deadline (a paused server keeps the connection open and says nothing) has its
socket shut down by a watchdog thread, so no request outlives its deadline. A server clock that steps makes every
lease that much longer or shorter (the token still holds: it does not depend on the clock). SQLite serves the
processes of one machine only; its readers share the file, its writers take turns (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import heapq
import itertools
import logging
import math
import os
import secrets
import select
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from ... import _clock
from ..._errors import (
    AuthenticationFailed,
    BackendError,
    BackendUnavailable,
    ClientClosed,
    ConfigurationError,
    DistlockError,
)
from ..._protocol import (
    Head,
    Holder,
    Interrupt,
    Lease,
    LeaseGone,
    LockState,
    Position,
    Ticket,
    Waiter,
    owner_id,
    unreachable,
)
from ..._retry import Attempt, ErrorTable, retrying
from ..._shape import holding, kind_of, lock_state, refuse_mixed, waiting, waits_on
from . import driver_extra

try:
    import sqlalchemy as sa
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.dialects import mysql as sa_mysql
    from sqlalchemy.dialects import postgresql as sa_postgresql
    from sqlalchemy.dialects import sqlite as sa_sqlite
    from sqlalchemy.engine import URL, Connection, Engine
    from sqlalchemy.ext.compiler import compiles
    from sqlalchemy.schema import CreateIndex, CreateTable
    from sqlalchemy.sql.compiler import SQLCompiler
    from sqlalchemy.sql.functions import FunctionElement
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "the SQL lock table backend needs the 'sqltable' extra: pip install 'distlock-fenced[sqltable]' (SQLAlchemy; "
        "sqltable-postgresql adds psycopg, sqltable-mysql PyMySQL)"
    ) from _e

__all__ = ["SqlTableBackend", "lock_tables", "table_ddl"]

log = logging.getLogger("distlock")

_R = TypeVar("_R")

#: How often a waiter without notifications (MariaDB, SQLite) reads its place again, in seconds.
POLL_INTERVAL = 0.05
#: Wake this long after a lease ahead would expire, so that the server sees it expired when we read.
_EXPIRY_SLACK = 0.01
#: Idle LISTEN connections kept for the next wait (PostgreSQL).
_IDLE_LISTENERS = 4
#: The longest lock name (``_names.MAX_NAME_BYTES``: 1,024 bytes of UTF-8, so at most 1,024 characters).
_NAME_LENGTH = 1024
#: MariaDB indexes at most 3,072 bytes of a key: index the first 255 characters of a name (utf8mb4: 1,020 bytes).
_MYSQL_NAME_PREFIX = 255


# -- the server's clock, in SQL --------------------------------------------------------------------------------


class server_now(FunctionElement[float]):  # noqa: N801 - a SQL function, named like one
    """The database server's current time in seconds since the epoch, as a float (see the module docstring)."""

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


# -- the tables ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tables:
    metadata: sa.MetaData
    leases: sa.Table
    waiters: sa.Table
    locks: sa.Table


def lock_tables(prefix: str) -> _Tables:
    """The three tables of the lock table named ``<prefix>_leases``, ``<prefix>_waiters``, ``<prefix>_locks``."""
    metadata = sa.MetaData()
    token = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite's AUTOINCREMENT needs INTEGER
    # MariaDB/MySQL: UTF-8 and a binary collation, so names compare as they do elsewhere ('A' is not 'a').
    text_options: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
    leases = sa.Table(
        f"{prefix}_leases",
        metadata,
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("ttl", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Index(f"{prefix}_leases_expires_at", "expires_at"),
        **text_options,
    )
    waiters = sa.Table(
        f"{prefix}_waiters",
        metadata,
        # PostgreSQL: GENERATED ALWAYS, so that not even an INSERT naming an id can reuse one.
        sa.Column("id", token, sa.Identity(always=True), primary_key=True),
        sa.Column("name", sa.String(_NAME_LENGTH), nullable=False),
        sa.Column("lease_id", sa.BigInteger(), nullable=False),
        sa.Column("nonce", sa.String(64), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Index(f"{prefix}_waiters_name_id", "name", "id", mysql_length={"name": _MYSQL_NAME_PREFIX}),
        sa.Index(f"{prefix}_waiters_lease_id", "lease_id"),
        sqlite_autoincrement=True,
        **text_options,
    )
    locks = sa.Table(
        f"{prefix}_locks",
        metadata,
        sa.Column("name_key", sa.String(64), primary_key=True),  # sha256 of the name, hex: any name, one key length
        # The lock's record (``write_record``); a length past 64 KiB makes it a MEDIUMBLOB on MariaDB/MySQL.
        sa.Column("record", sa.LargeBinary(length=2**24 - 1), nullable=True),
        **text_options,
    )
    return _Tables(metadata, leases, waiters, locks)


def table_ddl(url: URL, prefix: str) -> list[str]:
    """The DDL that creates the lock table's tables and indexes on ``url``'s database, one statement per item.

    Compiled for the URL's dialect without connecting (the driver need not be installed)."""
    dialect = url.get_dialect()()
    tables = lock_tables(prefix)
    statements = []
    for table in tables.metadata.sorted_tables:
        statements.append(str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)).strip())
        statements.extend(
            str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect)).strip()
            for index in sorted(table.indexes, key=lambda index: str(index.name))
        )
    return statements


def _name_key(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


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


class _NoDatabase(BackendError):
    """The URL's database does not exist: ``check()`` (``connect()``, where the URL is given) raises
    ``ConfigurationError`` for it instead."""


def _retryable(error: Exception) -> bool:
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


class _Watchdog:
    """Shuts down the socket of a request (or a new connection's set-up) still running at its deadline.

    A paused (SIGSTOPped) database server keeps its connections open and answers nothing; libpq has no read timeout,
    so without this a request would wait for it forever. Shutting the socket down makes the blocked call fail at
    once; SQLAlchemy then drops the connection. The watchdog holds a duplicate of the socket's descriptor, not the
    number the driver uses: if the driver closes its socket before it is unwatched (a connection whose set-up
    failed), the shutdown still reaches that socket and never one that reused the number.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._deadlines: list[tuple[float, int]] = []
        self._sockets: dict[int, socket.socket] = {}
        self._numbers = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(self, fd: int, deadline: float) -> Callable[[], None]:
        """Shut the socket ``fd`` down at ``deadline`` unless the function returned is called first."""
        try:
            watched = socket.socket(fileno=os.dup(fd))
        except OSError:  # already closed: nothing to watch
            return lambda: None
        with self._condition:
            number = next(self._numbers)
            self._sockets[number] = watched
            heapq.heappush(self._deadlines, (deadline, number))
            if self._thread is None or not self._thread.is_alive():
                self._stopped = False
                self._thread = threading.Thread(target=self._run, name="distlock-sql-watchdog", daemon=True)
                self._thread.start()
            self._condition.notify()

        def unwatch() -> None:
            with self._condition:
                found = self._sockets.pop(number, None)
            if found is not None:
                found.close()

        return unwatch

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify()

    def _run(self) -> None:
        with self._condition:
            while not self._stopped:
                while self._deadlines and self._deadlines[0][1] not in self._sockets:
                    heapq.heappop(self._deadlines)
                if not self._deadlines:
                    self._condition.wait(10.0)
                    if not self._deadlines and not self._stopped:
                        self._thread = None  # idle: the next watch() starts a new thread
                        return
                    continue
                deadline, number = self._deadlines[0]
                left = deadline - _clock.now()
                if left > 0:
                    self._condition.wait(left)
                    continue
                heapq.heappop(self._deadlines)
                late = self._sockets.pop(number)
                with contextlib.suppress(OSError):
                    late.shutdown(socket.SHUT_RDWR)
                late.close()


def _driver_socket(driver: Any) -> int | None:
    """The file descriptor of a driver connection's socket (psycopg, PyMySQL), or None (SQLite, closed)."""
    pgconn = getattr(driver, "pgconn", None)
    if pgconn is not None:
        return int(pgconn.socket) if not driver.closed else None
    sock = getattr(driver, "_sock", None)
    return int(sock.fileno()) if sock is not None else None


# -- places in a queue -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    id: int
    nonce: str
    lease_id: int
    owner: str
    ttl_left: float | None  # by the server's clock; None or <= 0: dead

    @property
    def alive(self) -> bool:
        return self.ttl_left is not None and self.ttl_left > 0


@dataclass(frozen=True)
class _Place(Position):
    """Where a waiter stands, with what it needs to wait well: the entries whose removal it waits for (their
    notification channels) and the seconds until the first lease ahead of it would expire (then it reads again)."""

    awaited: tuple[int, ...] = ()
    semaphore: bool = False
    recheck_in: float = math.inf


def _place(entries: Sequence[_Entry], mine: _Entry) -> Position:
    """The place of ``mine`` behind the live ``entries`` ahead of it (in id order), by the grant rule of ``_shape``."""
    kinds = [kind_of(entry.nonce) for entry in entries] + [kind_of(mine.nonce)]
    index = len(entries)
    if holding(kinds)[-1]:
        return Position(held=True, waiters_ahead=index)
    recheck = min((entry.ttl_left or 0.0 for entry in entries), default=math.inf)
    at = waits_on(kinds)
    if at is None:  # a semaphore slot: any of the entries ahead leaving may let it in
        awaited, semaphore = tuple(entry.id for entry in entries), True
        ahead = entries[-1]
    else:
        ahead, awaited, semaphore = entries[at], (entries[at].id,), False
    return _Place(
        held=False,
        ahead=str(ahead.id).encode(),
        waiters_ahead=index,
        awaited=awaited,
        semaphore=semaphore,
        recheck_in=max(recheck, 0.0),
    )


def _same_place(a: Position, b: Position) -> bool:
    return (a.held, a.gone, a.ahead, a.waiters_ahead) == (b.held, b.gone, b.ahead, b.waiters_ahead)


# -- the backend -----------------------------------------------------------------------------------------------


class SqlTableBackend:
    """Lock primitives in three tables of one SQL database. Thread-safe; new connections after ``fork()``."""

    unsupported: Mapping[str, str] = MappingProxyType({})  # every capability

    def __init__(
        self,
        url: URL,
        *,
        prefix: str,
        connect_timeout: float = 5.0,
        request_timeout: float = 5.0,
    ) -> None:
        self._url = url
        self._prefix = prefix
        self._tables = lock_tables(prefix)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.description = f"SQL lock table {prefix}_* in {url.render_as_string(hide_password=True)}"
        self._dialect = url.get_backend_name()
        self._mysql = self._dialect in ("mysql", "mariadb")
        self._notifies = self._dialect == "postgresql"
        self._mutex = threading.Lock()
        self._closed = False
        self._tables_ready = False
        self._watchdog = _Watchdog()
        self._listeners: list[Any] = []
        self._local_wake: dict[str, set[threading.Event]] = {}
        self._errors = ErrorTable(description=self.description, retryable=_retryable, translate=self._translate)
        self._connect_args: dict[str, Any] = {}
        self._engine = self._create_engine(url)

    def _create_engine(self, url: URL) -> Engine:
        connect_args = self._connect_args
        # A new connection is opened inside a request: it may take no longer than the request may.
        opening = min(self.connect_timeout, self.request_timeout)
        if self._dialect == "postgresql":
            connect_args["connect_timeout"] = max(2, math.ceil(opening))  # libpq: whole seconds, at least 2
        elif self._mysql:
            # PyMySQL's connect_timeout covers the TCP connect only; it reads the server's greeting with its read
            # timeout, which a paused server would otherwise hold forever. (Requests on open connections have the
            # watchdog besides.)
            connect_args["connect_timeout"] = max(1, math.ceil(opening))
            connect_args["read_timeout"] = connect_args["write_timeout"] = opening
        elif self._dialect == "sqlite":
            connect_args["timeout"] = self.request_timeout  # how long to wait for another writer (busy timeout)
        options: dict[str, Any] = {"pool_timeout": self.request_timeout}
        if self._dialect != "sqlite":
            options["isolation_level"] = "READ COMMITTED"
        try:
            engine = sa.create_engine(url, connect_args=connect_args, **options)
        except sa_exc.NoSuchModuleError as e:
            raise ConfigurationError(
                f"{self.description}: SQLAlchemy has no dialect or driver {url.drivername!r}"
            ) from e
        except ImportError as e:
            extra = driver_extra(url.drivername)
            hint = (
                f"pip install 'distlock-fenced[{extra}]'" if extra else f"install the driver {url.drivername!r} names"
            )
            raise ConfigurationError(f"{self.description}: the database driver is not installed ({e}); {hint}") from e
        except (sa_exc.ArgumentError, TypeError) as e:
            raise ConfigurationError(f"{self.description}: {e}") from e
        # SQLAlchemy's first connection runs the dialect's own queries (server version, types) before any request
        # of ours: watch it too, from before those queries (insert=True) to the connect event that follows them.
        sa.event.listen(engine, "first_connect", functools.partial(self._watch_setup, opening), insert=True)
        sa.event.listen(engine, "connect", _setup_done)
        if self._mysql:
            sa.event.listen(engine, "connect", _utc_session)
        elif self._dialect == "sqlite":
            sa.event.listen(engine, "connect", _sqlite_no_implicit_transactions)
            sa.event.listen(engine, "begin", _sqlite_begin)
        return engine

    def _watch_setup(self, seconds: float, dbapi_connection: Any, record: Any) -> None:
        fd = _driver_socket(dbapi_connection)
        if fd is not None:
            record.info["distlock_unwatch"] = self._watchdog.watch(fd, _clock.now() + seconds)

    # -- request plumbing -------------------------------------------------------------------------------------

    def _translate(self, error: Exception, what: str) -> BackendError | None:
        if isinstance(error, sa_exc.TimeoutError):
            return BackendUnavailable(f"{what}: no connection to {self.description} free in time")
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
            return AuthenticationFailed(f"{what}: {self.description} refused access ({detail})")
        if _misnamed(error):
            return _NoDatabase(f"{what}: the database the URL names cannot be opened on {self.description} ({detail})")
        if _retryable(error):
            return BackendUnavailable(f"{what}: {self.description} did not answer ({detail})")
        return BackendError(f"{what} failed on {self.description}: {detail}")

    @contextlib.contextmanager
    def _transaction(self, each: Attempt, writes: bool = True) -> Iterator[Connection]:
        """One transaction on a pooled connection, its socket watched until the attempt's deadline. ``writes=False``
        (a read that writes only when it finds a dead entry) lets SQLite's readers share the file."""
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
        with self._engine.connect() as connection:
            if self._dialect == "sqlite":
                # How long BEGIN IMMEDIATE waits for another writer: until this attempt's deadline at most.
                busy = max(int((each.deadline - _clock.now()) * 1000), 1)
                driver: Any = connection.connection.driver_connection
                driver.execute(f"PRAGMA busy_timeout = {busy}")
                connection.info["distlock_writes"] = writes
            fd = _driver_socket(connection.connection.driver_connection)
            unwatch = self._watchdog.watch(fd, each.deadline) if fd is not None else None
            try:
                with connection.begin():
                    yield connection
            finally:
                if unwatch is not None:
                    unwatch()
                removed = connection.info.pop("distlock_removed", ())
            self._wake_local(removed)  # committed: the removals are visible now

    def _run(
        self,
        what: str,
        request: Callable[[Connection, Attempt], _R],
        budget: float | None = None,
        *,
        writes: bool = True,
    ) -> tuple[_R, int]:
        """Run ``request`` in a transaction until it answers or the deadline passes; the answer and attempts made."""
        self._ensure_tables()
        deadline = _clock.now() + (self.request_timeout if budget is None else budget)

        def attempt(each: Attempt) -> _R:
            with self._transaction(each, writes) as connection:
                return request(connection, each)

        return retrying(what, attempt, deadline, self._errors)

    def _ensure_tables(self, budget: float | None = None) -> None:
        """Create the tables and indexes that are missing (once per backend; concurrent creators are fine)."""
        if self._tables_ready:
            return
        deadline = _clock.now() + (self.request_timeout if budget is None else budget)
        tables = self._tables

        def create(each: Attempt) -> None:
            with self._transaction(each) as connection:
                # Look first: creating needs privileges that a table a DBA made beforehand does not.
                present = set(sa.inspect(connection).get_table_names())
                for table in tables.metadata.sorted_tables:
                    if table.name in present:
                        continue
                    connection.execute(CreateTable(table, if_not_exists=True))
                    for index in table.indexes:
                        connection.execute(CreateIndex(index, if_not_exists=True))

        def racing(error: Exception) -> bool:
            # Two first users creating at once: PostgreSQL may report the loser's CREATE ... IF NOT EXISTS as a
            # unique violation in its catalog. Looking again finds the tables.
            return _retryable(error) or isinstance(error, sa_exc.IntegrityError)

        errors = ErrorTable(description=self.description, retryable=racing, translate=self._translate)
        retrying("create the lock tables", create, deadline, errors)
        self._tables_ready = True

    # -- notifications ----------------------------------------------------------------------------------------

    def _entry_channel(self, entry_id: int) -> str:
        return f"{self._prefix}_w{entry_id}"

    def _lock_channel(self, name: str) -> str:
        return f"{self._prefix}_l{_name_key(name)[:32]}"

    def _removed(self, connection: Connection, name: str, ids: Sequence[int]) -> None:
        """Tell the waiters behind removed entries once the transaction commits: NOTIFY on PostgreSQL (delivered at
        commit), and the waiters of this process that poll (woken by ``_transaction`` after the commit)."""
        if not ids:
            return
        if self._notifies:
            channels = [self._lock_channel(name), *(self._entry_channel(entry_id) for entry_id in ids)]
            notify = sa.select(*(sa.func.pg_notify(channel, "") for channel in channels))
            connection.execute(notify)
        connection.info.setdefault("distlock_removed", set()).add(name)

    def _wake_local(self, names: Iterable[str]) -> None:
        for name in names:
            with self._mutex:
                events = list(self._local_wake.get(name, ()))
            for event in events:
                event.set()

    # -- queue reads ------------------------------------------------------------------------------------------

    def _entries(self, connection: Connection, name: str, upto: int | None = None) -> list[_Entry]:
        """Every entry of ``name`` (up to id ``upto``) in id order, with its lease's time left by the server."""
        w, leases = self._tables.waiters, self._tables.leases
        query = (
            sa.select(w.c.id, w.c.nonce, w.c.lease_id, w.c.owner, (leases.c.expires_at - server_now()).label("left"))
            .select_from(w.outerjoin(leases, leases.c.id == w.c.lease_id))
            .where(w.c.name == name)
            .order_by(w.c.id)
        )
        if upto is not None:
            query = query.where(w.c.id <= upto)
        return [
            _Entry(int(row.id), str(row.nonce), int(row.lease_id), str(row.owner), _seconds(row.left))
            for row in connection.execute(query)
        ]

    def _sweep(self, connection: Connection, name: str, dead: Sequence[_Entry]) -> None:
        """Remove entries seen dead (their lease never comes back), each by its id."""
        if not dead:
            return
        w = self._tables.waiters
        ids = [entry.id for entry in dead]
        connection.execute(sa.delete(w).where(w.c.name == name, w.c.id.in_(ids)))
        self._removed(connection, name, ids)

    def _read_place(self, connection: Connection, ticket: Ticket) -> Position:
        entries = self._entries(connection, ticket.name, upto=ticket.token)
        if not entries or entries[-1].id != ticket.token:
            return Position(held=False, gone=True)
        *ahead, mine = entries
        dead = [entry for entry in entries if not entry.alive]
        self._sweep(connection, ticket.name, dead)
        if not mine.alive:
            return Position(held=False, gone=True)
        return _place([entry for entry in ahead if entry.alive], mine)

    # -- Backend protocol -------------------------------------------------------------------------------------

    def check(self) -> None:
        try:
            self._ensure_tables(self.connect_timeout)
        except _NoDatabase as e:
            raise ConfigurationError(str(e)) from e.__cause__
        except BackendUnavailable as e:
            hint = f"is the database running there? ({e})"
            raise BackendUnavailable(unreachable(self.description, self.connect_timeout, hint)) from e.__cause__

    def grant_lease(self, ttl: float) -> Lease:
        leases = self._tables.leases

        def request(connection: Connection, each: Attempt) -> int:
            lease_id = secrets.randbits(63) or 1  # a duplicate id fails the insert: the next attempt draws again
            connection.execute(
                sa.insert(leases).values(id=lease_id, ttl=ttl, expires_at=server_now() + sa.literal(ttl, sa.Double()))
            )
            return lease_id

        errors = ErrorTable(
            description=self.description,
            retryable=lambda error: _retryable(error) or isinstance(error, sa_exc.IntegrityError),
            translate=self._translate,
        )
        self._ensure_tables()
        lease_id, _ = retrying(
            "grant a lease",
            lambda each: self._in_transaction(each, request),
            _clock.now() + self.request_timeout,
            errors,
        )
        self._remove_expired_leases()
        return Lease(id=lease_id, ttl=ttl)

    def _in_transaction(self, each: Attempt, request: Callable[[Connection, Attempt], _R]) -> _R:
        with self._transaction(each) as connection:
            return request(connection, each)

    def _remove_expired_leases(self) -> None:
        """Housekeeping, best effort: expired leases and their entries go (each client does it once per lease it is
        granted). An entry ahead of a waiter is removed by that waiter anyway when it finds it dead."""
        leases, w = self._tables.leases, self._tables.waiters

        def request(connection: Connection, each: Attempt) -> None:
            expired = sa.select(leases.c.id).where(leases.c.expires_at <= server_now())
            gone = [int(lease_id) for lease_id in connection.execute(expired).scalars()]
            if gone:
                connection.execute(sa.delete(w).where(w.c.lease_id.in_(gone)))
                connection.execute(sa.delete(leases).where(leases.c.id.in_(gone)))

        try:
            self._run("remove expired leases", request)
        except BackendError as e:
            log.debug("distlock: could not remove expired leases on %s: %s", self.description, e)

    def keep_alive(self, lease: Lease, timeout: float) -> float:
        leases, lease_id = self._tables.leases, lease.id

        def request(connection: Connection, each: Attempt) -> float:
            # Only a live lease is extended: one that expired may already have lost its entries to a sweep.
            update = (
                sa.update(leases)
                .where(leases.c.id == lease_id, leases.c.expires_at > server_now())
                .values(expires_at=server_now() + leases.c.ttl)
            )
            if self._engine.dialect.update_returning:  # PostgreSQL, SQLite; not MariaDB
                row = connection.execute(update.returning(leases.c.ttl)).first()
                return float(row.ttl) if row is not None else 0.0
            if connection.execute(update).rowcount != 1:
                return 0.0
            ttl = connection.execute(sa.select(leases.c.ttl).where(leases.c.id == lease_id)).scalar()
            return float(ttl) if ttl is not None else 0.0

        ttl, _ = self._run("lease keep-alive", request, min(timeout, self.request_timeout))
        return ttl

    def revoke_lease(self, lease: Lease, tickets: Sequence[Ticket]) -> None:
        leases, w, lease_id = self._tables.leases, self._tables.waiters, lease.id

        def request(connection: Connection, each: Attempt) -> None:
            rows = connection.execute(sa.select(w.c.id, w.c.name).where(w.c.lease_id == lease_id)).all()
            connection.execute(sa.delete(w).where(w.c.lease_id == lease_id))
            connection.execute(sa.delete(leases).where(leases.c.id == lease_id))
            by_name: dict[str, list[int]] = {}
            for row in rows:
                by_name.setdefault(str(row.name), []).append(int(row.id))
            for name, ids in by_name.items():
                self._removed(connection, name, ids)

        self._run(f"revoke lease {lease_id:x}", request)

    def enqueue(self, name: str, lease: Lease, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        lease_id = lease.id
        tables = self._tables
        w, leases, locks = tables.waiters, tables.leases, tables.locks
        key = _name_key(name)
        record = owner.decode("utf-8")
        what = f"enqueue for lock {name!r}"

        def request(connection: Connection, each: Attempt) -> tuple[Ticket, Position]:
            # Joins of one lock take their ids one at a time (see the module docstring). Lock the row first, and
            # make it only when missing: on MariaDB an INSERT IGNORE that meets the row takes a shared lock on it,
            # and two joins each holding one and asking for the exclusive lock would deadlock.
            lock_row = sa.select(locks.c.name_key).where(locks.c.name_key == key).with_for_update()
            if connection.execute(lock_row).first() is None:
                connection.execute(self._insert_ignore(locks, name_key=key))
                connection.execute(lock_row)
            alive = connection.execute(
                sa.select(leases.c.id).where(leases.c.id == lease_id, leases.c.expires_at > server_now())
            ).first()
            if alive is None:
                raise LeaseGone(f"{what}: lease {lease_id:x} is gone on {self.description}")
            found = None
            if each.number > 1:
                # The earlier attempt may have committed: take its entry rather than make a second one.
                found = connection.execute(
                    sa.select(w.c.id).where(w.c.name == name, w.c.nonce == nonce, w.c.lease_id == lease_id)
                ).scalar()
            if found is None:
                inserted = connection.execute(
                    sa.insert(w).values(name=name, lease_id=lease_id, nonce=nonce, owner=record)
                )
                found = (inserted.inserted_primary_key or (None,))[0]
                if found is None:  # pragma: no cover - every dialect here reports it
                    raise BackendError(f"{what}: {self.description} did not say which id it gave the new entry")
            token = int(found)
            entries = self._entries(connection, name)
            # Another kind queued: leave at once (the rollback takes our entry with it) and say so.
            refuse_mixed(name, kind_of(nonce), (kind_of(e.nonce) for e in entries if e.alive))
            ticket = Ticket(name=name, key=str(token).encode(), token=token, lease_id=lease_id)
            return ticket, self._read_place(connection, ticket)

        (ticket, position), attempts = self._run(what, request)
        if attempts > 1:
            ticket = Ticket(name=name, key=ticket.key, token=ticket.token, lease_id=lease_id, resent=True)
        return ticket, position

    def _insert_ignore(self, table: sa.Table, **values: Any) -> Any:
        if self._dialect == "postgresql":
            return sa_postgresql.insert(table).values(**values).on_conflict_do_nothing()
        if self._dialect == "sqlite":
            return sa_sqlite.insert(table).values(**values).on_conflict_do_nothing()
        return sa_mysql.insert(table).values(**values).prefix_with("IGNORE")

    def position(self, ticket: Ticket) -> Position:
        position, _ = self._run(
            f"read queue of lock {ticket.name!r}",
            lambda connection, each: self._read_place(connection, ticket),
            writes=False,
        )
        return position

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> Position | None:
        bound = math.inf if timeout is None else timeout
        if isinstance(position, _Place):
            bound = min(bound, position.recheck_in + _EXPIRY_SLACK)
        until = _clock.now() + bound
        if self._notifies and isinstance(position, _Place):
            return self._wait_notified(ticket, position, until, interrupt)
        return self._wait_polling(ticket, position, until, interrupt)

    def _peek(self, ticket: Ticket, until: float) -> Position | None:
        """Our place read within the wait (by ``until`` at most), or None when the database did not answer: a wait
        only misses a look then; the caller reads again after it, and raises if the database stays away."""
        budget = min(self.request_timeout, until - _clock.now())
        if budget <= 0:
            return None
        try:
            place, _ = self._run(
                f"read queue of lock {ticket.name!r}",
                lambda connection, each: self._read_place(connection, ticket),
                budget,
                writes=False,
            )
        except BackendError:
            return None
        return place

    def _wait_polling(self, ticket: Ticket, position: Position, until: float, interrupt: Interrupt) -> Position | None:
        """Read our place every ``POLL_INTERVAL`` (at once when a waiter of this process left the lock's queue) until
        it changes, ``until`` passes, or ``interrupt`` fires."""
        woken = threading.Event()
        with self._mutex:
            self._local_wake.setdefault(ticket.name, set()).add(woken)
        unregister = interrupt.on_fire(woken.set)
        try:
            while True:
                left = until - _clock.now()
                if left <= 0 or interrupt.fired:
                    return None
                woken.wait(min(left, POLL_INTERVAL))
                woken.clear()
                if interrupt.fired or _clock.now() >= until:
                    return None
                seen = self._peek(ticket, until)
                if seen is not None and not _same_place(seen, position):
                    return seen
        finally:
            unregister()
            with self._mutex:
                waiting = self._local_wake.get(ticket.name)
                if waiting is not None:
                    waiting.discard(woken)
                    if not waiting:
                        del self._local_wake[ticket.name]

    def _wait_notified(self, ticket: Ticket, position: _Place, until: float, interrupt: Interrupt) -> Position | None:
        """LISTEN on the channels of what we wait for, read our place again, then sleep until a notification."""
        try:
            listener = self._listener()
        except BackendUnavailable:
            return self._wait_polling(ticket, position, until, interrupt)
        channels = [self._lock_channel(ticket.name)] if position.semaphore else []
        channels += [self._entry_channel(entry_id) for entry_id in position.awaited if not position.semaphore]
        healthy = False
        wake_reader, wake_writer = socket.socketpair()
        unregister = interrupt.on_fire(lambda: _poke(wake_writer))
        try:
            self._on_listener(listener, [f'LISTEN "{channel}"' for channel in channels])
            seen = self._peek(ticket, until)
            if seen is not None and not _same_place(seen, position):
                self._on_listener(listener, ["UNLISTEN *"])
                healthy = True
                return seen
            pgconn = listener.pgconn
            left = max(until - _clock.now(), 0.0)
            if not interrupt.fired:
                ready, _, _ = select.select([pgconn.socket, wake_reader], [], [], None if left == math.inf else left)
                if pgconn.socket in ready:
                    pgconn.consume_input()
                    while pgconn.notifies() is not None:
                        pass
            self._on_listener(listener, ["UNLISTEN *"])
            healthy = True
            return None
        except Exception as e:
            if isinstance(e, DistlockError):
                raise
            log.debug("distlock: a LISTEN connection to %s failed: %s", self.description, e)
            return None  # the caller reads again, and raises if the database stays away
        finally:
            unregister()
            wake_reader.close()
            wake_writer.close()
            self._return_listener(listener, healthy)

    def _on_listener(self, listener: Any, statements: Sequence[str]) -> None:
        """Run ``statements`` on a LISTEN connection (autocommit), its socket watched like any request's."""
        unwatch = self._watchdog.watch(int(listener.pgconn.socket), _clock.now() + self.request_timeout)
        try:
            for statement in statements:
                listener.execute(statement)
        finally:
            unwatch()

    def _listener(self) -> Any:
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
            if self._listeners:
                return self._listeners.pop()
        # The driver's own connection, in autocommit: LISTEN takes effect at once, and no pool or dialect set-up
        # runs queries on it (libpq's connect_timeout bounds the opening).
        dialect = self._engine.dialect
        arguments, options = dialect.create_connect_args(self._url)
        try:
            return dialect.loaded_dbapi.connect(*arguments, **{**options, **self._connect_args, "autocommit": True})
        except Exception as e:  # the driver's own error: nothing of SQLAlchemy's wraps it here
            raise BackendUnavailable(f"could not open a LISTEN connection to {self.description}: {e}") from e

    def _return_listener(self, listener: Any, healthy: bool) -> None:
        with self._mutex:
            if healthy and not self._closed and len(self._listeners) < _IDLE_LISTENERS:
                self._listeners.append(listener)
                return
        with contextlib.suppress(Exception):
            listener.close()

    def dequeue(self, ticket: Ticket) -> bool:
        w = self._tables.waiters

        def request(connection: Connection, each: Attempt) -> bool:
            deleted = connection.execute(sa.delete(w).where(w.c.id == ticket.token, w.c.name == ticket.name))
            if deleted.rowcount:
                self._removed(connection, ticket.name, [ticket.token])
            return bool(deleted.rowcount)

        deleted, attempts = self._run(f"release lock {ticket.name!r}", request)
        return deleted or attempts > 1  # a retried delete whose first attempt landed finds nothing: done

    def write_record(self, ticket: Ticket, value: bytes) -> bool:
        tables = self._tables
        w, leases, locks = tables.waiters, tables.leases, tables.locks

        def request(connection: Connection, each: Attempt) -> bool:
            # Locking reads of the lock's row (in the order a join takes it) and of the ticket's row: a waiter that
            # removes the ticket as dead (its lease ran out) must wait for this transaction, or this one sees the
            # row gone. Without the row lock a write could pass its check, the successor remove the row and read
            # the record, and the write land after that read.
            key = _name_key(ticket.name)
            connection.execute(sa.select(locks.c.name_key).where(locks.c.name_key == key).with_for_update())
            row = connection.execute(
                sa.select(w.c.id).where(w.c.id == ticket.token, w.c.name == ticket.name).with_for_update()
            ).first()
            alive = connection.execute(
                sa.select(leases.c.id).where(leases.c.id == ticket.lease_id, leases.c.expires_at > server_now())
            ).first()
            if row is None or alive is None:
                return False
            connection.execute(sa.update(locks).where(locks.c.name_key == _name_key(ticket.name)).values(record=value))
            return True

        written, _ = self._run(f"write the record of lock {ticket.name!r}", request)
        return written

    def read_record(self, name: str) -> bytes | None:
        locks = self._tables.locks

        def request(connection: Connection, each: Attempt) -> bytes | None:
            value = connection.execute(sa.select(locks.c.record).where(locks.c.name_key == _name_key(name))).scalar()
            return None if value is None else bytes(value)

        value, _ = self._run(f"read the record of lock {name!r}", request, writes=False)
        return value

    def _live_entries(self, connection: Connection, name: str) -> list[_Entry]:
        return [entry for entry in self._entries(connection, name) if entry.alive]

    def head(self, name: str) -> Head | None:
        entries, _ = self._run(
            f"read holder of lock {name!r}", lambda connection, each: self._live_entries(connection, name), writes=False
        )
        if not entries:
            return None
        first = entries[0]
        waiters = waiting([kind_of(entry.nonce) for entry in entries])
        holder = Holder(
            name=name,
            token=first.id,
            lease_id=first.lease_id,
            owner=owner_id(first.owner.encode()),
            waiters=waiters,
            holders=len(entries) - waiters,
        )
        return Head(Ticket(name=name, key=str(first.id).encode(), token=first.id, lease_id=first.lease_id), holder)

    def discard(self, name: str, lease: Lease, nonce: str) -> int | None:
        w = self._tables.waiters
        found, _ = self._run(
            f"look for a late join of lock {name!r}",
            lambda connection, each: connection.execute(
                sa.select(w.c.id).where(w.c.name == name, w.c.nonce == nonce, w.c.lease_id == lease.id)
            ).scalar(),
            writes=False,
        )
        if found is None:
            return None
        self.dequeue(Ticket(name=name, key=str(found).encode(), token=int(found), lease_id=lease.id))
        return int(found)

    def missing_tickets(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        leases, w = self._tables.leases, self._tables.waiters
        if not tickets:
            return []
        lease_id = tickets[0].lease_id

        def request(connection: Connection, each: Attempt) -> list[Ticket]:
            alive = connection.execute(
                sa.select(leases.c.id).where(leases.c.id == lease_id, leases.c.expires_at > server_now())
            ).first()
            if alive is None:
                raise LeaseGone(f"check held locks: lease {lease_id:x} is gone on {self.description}")
            present = set(
                connection.execute(
                    sa.select(w.c.id).where(w.c.lease_id == lease_id, w.c.id.in_([t.token for t in tickets]))
                ).scalars()
            )
            return [ticket for ticket in tickets if ticket.token not in present]

        missing, _ = self._run("check held locks", request, writes=False)
        return missing

    def inspect(self) -> list[LockState]:
        """Every lock with a live holder or waiter, in name order; time left by the database server's clock."""
        w, leases = self._tables.waiters, self._tables.leases
        query = (
            sa.select(
                w.c.name, w.c.id, w.c.nonce, w.c.lease_id, w.c.owner, (leases.c.expires_at - server_now()).label("left")
            )
            .select_from(w.join(leases, leases.c.id == w.c.lease_id))
            .where(leases.c.expires_at > server_now())
            .order_by(w.c.name, w.c.id)
        )
        rows, _ = self._run("inspect locks", lambda connection, each: connection.execute(query).all(), writes=False)
        by_name: dict[str, tuple[list[Waiter], list[str]]] = {}
        for row in rows:
            waiters, kinds = by_name.setdefault(str(row.name), ([], []))
            waiters.append(
                Waiter(
                    owner=owner_id(str(row.owner).encode()),
                    token=int(row.id),
                    lease_id=int(row.lease_id),
                    ttl_left=_seconds(row.left),
                )
            )
            kinds.append(kind_of(str(row.nonce)))
        return [lock_state(name, waiters, kinds) for name, (waiters, kinds) in sorted(by_name.items())]

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            with contextlib.suppress(Exception):
                listener.close()
        self._engine.dispose()
        self._watchdog.stop()

    def after_fork(self) -> None:
        # The parent's connections are not ours: forget them without closing (closing would end the parent's).
        self._mutex = threading.Lock()
        self._listeners = []
        self._local_wake = {}
        self._watchdog = _Watchdog()
        self._engine.dispose(close=False)


def _seconds(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _poke(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.send(b"!")


def _setup_done(dbapi_connection: Any, record: Any) -> None:
    unwatch = record.info.pop("distlock_unwatch", None)
    if unwatch is not None:
        unwatch()


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
