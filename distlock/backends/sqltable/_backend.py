"""The SQL lock table backend: the primitives of ``_protocol.Backend`` as rows of its tables (``_schema``) in the
application's own database, through SQLAlchemy Core (PostgreSQL with psycopg, MariaDB/MySQL with PyMySQL, SQLite).
How it works — leases on the database server's clock, row ids as tokens, joins of one lock serialised on its row,
waiting by LISTEN/NOTIFY or by polling: docs/operations/sql-table.md.

A name's row in ``<prefix>_locks`` exists while its queue has an entry (or it keeps an election's record): a join
makes or locks it (``insert_or_lock``), and a removal of entries locks the rows of their names (in key order), then
removes the row of each name left without entries (``_queue``: ``forget_emptied``, ``forget_if_emptied``). So a
join and the removal of its row are serialised on that row: the removal sees the join's entry, or the join makes the
row anew.

Every request is one transaction at READ COMMITTED (SQLite: one writer at a time), retried within the request
timeout, and safe to send again: a join sent again first looks for its own nonce; removals are by id and name,
never by name alone (a force release is the core's ``head`` then ``dequeue`` at the token it saw); refreshes extend
only a live lease; reads remove only entries seen dead, which never come back.

What can go wrong: a database that is down, restarting, paused or busy is retried, then ``BackendUnavailable`` with
SQLAlchemy's exception as ``__cause__``; refused credentials are ``AuthenticationFailed``; a database that does not
exist is a ``ConfigurationError`` from ``check()`` (``_dialects`` reads each driver's errors). No request outlives
its deadline (``_notify.ShutdownAtDeadline``). A step of the server's clock makes every lease that much longer or
shorter; tokens do not depend on it. SQLite serves the processes of one machine only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from ... import _clock
from ..._errors import BackendError, BackendUnavailable, ClientClosed, ConfigurationError
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
from ..._retry import Attempt, retrying
from ..._shape import kind_of, lock_state, refuse_mixed, waiting

try:
    import sqlalchemy as sa
    from sqlalchemy.engine import URL, Connection
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "the SQL lock table backend needs the 'sqltable' extra: pip install 'distlock-fenced[sqltable]' (SQLAlchemy; "
        "sqltable-postgresql adds psycopg, sqltable-mysql PyMySQL)"
    ) from _e

from ._dialects import (
    NoDatabase,
    bound_sqlite_wait,
    connect_args,
    create_engine,
    driver_socket,
    error_table,
    insert_or_lock,
    server_now,
    set_up_sessions,
)
from ._marks import mark_reader, mark_writer
from ._notify import (
    ListenConnections,
    LocalWakeups,
    ShutdownAtDeadline,
    end_setup_watch,
    entry_channel,
    lock_channel,
    notify_removed,
)
from ._queue import (
    Entry,
    WaitingPosition,
    forget_emptied,
    forget_if_emptied,
    lock_names,
    place_of,
    read_entries,
    remove_entries_of,
    same_place,
    seconds,
    still_holds,
)
from ._schema import UNSUPPORTED, Tables, create_missing_tables, earlier_layout, lock_tables, name_key

__all__ = ["SqlTableBackend"]

log = logging.getLogger("distlock")

_R = TypeVar("_R")

#: How often a waiter without notifications (MariaDB, SQLite) reads its place again, in seconds.
POLL_INTERVAL = 0.05
#: Wake this long after a lease ahead would expire, so that the server sees it expired when we read.
_EXPIRY_SLACK = 0.01


class SqlTableBackend:
    """Lock primitives in the tables of one SQL database. Thread-safe; new connections after ``fork()``."""

    unsupported: Mapping[str, str] = UNSUPPORTED  # none: every capability is kept

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
        self._notifies = self._dialect == "postgresql"
        self._mutex = threading.Lock()
        self._closed = False
        self._shutdown_at_deadline = ShutdownAtDeadline()
        self._local_wakeups = LocalWakeups()
        self._errors = error_table(self.description)
        # A new connection is opened inside a request: it may take no longer than the request may.
        opening = min(self.connect_timeout, self.request_timeout)
        self._connect_args = connect_args(self._dialect, opening, self.request_timeout)
        self._engine = create_engine(url, self.description, self._connect_args, self.request_timeout)
        # SQLAlchemy's first connection runs the dialect's own queries (server version, types) before any request
        # of ours: watch it too, from before those queries (insert=True) to the connect event that follows them.
        sa.event.listen(self._engine, "first_connect", functools.partial(self._watch_setup, opening), insert=True)
        sa.event.listen(self._engine, "connect", end_setup_watch)
        set_up_sessions(self._engine, self._dialect)
        self._listen_connections = self._new_listen_connections()

    def _watch_setup(self, seconds: float, dbapi_connection: Any, record: Any) -> None:
        # Through self: after a fork, the watching is the child's own.
        self._shutdown_at_deadline.watch_setup(seconds, dbapi_connection, record)

    def _new_listen_connections(self) -> ListenConnections:
        return ListenConnections(
            self._engine,
            self._url,
            self._connect_args,
            self.description,
            self.request_timeout,
            self._shutdown_at_deadline,
        )

    # -- request plumbing -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, each: Attempt, writes: bool = True) -> Iterator[Connection]:
        """One transaction on a pooled connection, its socket watched until the attempt's deadline. ``writes=False``
        (a read that writes only when it finds a dead entry) lets SQLite's readers share the file."""
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
        with self._engine.connect() as connection:
            if self._dialect == "sqlite":
                bound_sqlite_wait(connection, each.deadline, writes)
            fd = driver_socket(connection.connection.driver_connection)
            unwatch = self._shutdown_at_deadline.watch(fd, each.deadline) if fd is not None else None
            try:
                with connection.begin():
                    yield connection
            finally:
                if unwatch is not None:
                    unwatch()
                removed = connection.info.pop("distlock_removed", ())
            self._local_wakeups.wake(removed)  # committed: the removals are visible now

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

    def _ensure_tables(self, budget: float | None = None, *, upgrade: bool = False) -> None:
        """Make the missing tables and read the layout: once per backend, and at the ``upgrade`` step."""
        if self._tables.layout is not None and not upgrade:
            return
        deadline = _clock.now() + (self.request_timeout if budget is None else budget)

        def create(each: Attempt) -> Tables:
            with self._transaction(each) as connection:
                return create_missing_tables(connection, self._tables, upgrade=upgrade)

        errors = error_table(self.description, retry_conflicts=True)
        self._tables, _ = retrying("create the lock tables", create, deadline, errors)
        if not self._tables.removes_name_rows:
            log.warning(earlier_layout(self.description, self._prefix))

    def upgrade_layout(self) -> None:
        """The upgrade step (``distlock sql-tables --upgrade``): mark the tables as of this release's layout."""
        self._ensure_tables(upgrade=True)

    # -- notifications ----------------------------------------------------------------------------------------

    def _removed(self, connection: Connection, name: str, ids: Sequence[int]) -> None:
        """Tell the waiters behind removed entries once the transaction commits: NOTIFY on PostgreSQL (delivered at
        commit), and the waiters of this process that poll (woken by ``_transaction`` after the commit)."""
        if not ids:
            return
        if self._notifies:
            notify_removed(connection, self._prefix, name, ids)
        connection.info.setdefault("distlock_removed", set()).add(name)

    # -- queue reads ------------------------------------------------------------------------------------------

    def _sweep(self, connection: Connection, name: str, dead: Sequence[Entry]) -> None:
        """Remove entries seen dead (their lease never comes back), each by its id, and the name's row with the
        last of them."""
        if not dead:
            return
        w = self._tables.waiters
        ids = [entry.id for entry in dead]
        lock_names(connection, self._tables, [name])
        connection.execute(sa.delete(w).where(w.c.name == name, w.c.id.in_(ids)))
        self._removed(connection, name, ids)
        forget_emptied(connection, self._tables, [name])

    def _read_place(self, connection: Connection, ticket: Ticket) -> Position:
        entries = read_entries(connection, self._tables, ticket.name, upto=ticket.token)
        if not entries or entries[-1].id != ticket.token:
            return Position(held=False, gone=True)
        *ahead, mine = entries
        dead = [entry for entry in entries if not entry.alive]
        self._sweep(connection, ticket.name, dead)
        if not mine.alive:
            return Position(held=False, gone=True)
        return place_of([entry for entry in ahead if entry.alive], mine)

    # -- Backend protocol -------------------------------------------------------------------------------------

    def check(self) -> None:
        try:
            self._ensure_tables(self.connect_timeout)
        except NoDatabase as e:
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

        errors = error_table(self.description, retry_conflicts=True)
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
        """Housekeeping, best effort: expired leases, their entries, and the rows of the names they leave without
        entries go (each client does it once per lease it is granted). An entry ahead of a waiter is removed by that
        waiter anyway when it finds it dead."""
        leases = self._tables.leases

        def request(connection: Connection, each: Attempt) -> None:
            expired = sa.select(leases.c.id).where(leases.c.expires_at <= server_now())
            gone = [int(lease_id) for lease_id in connection.execute(expired).scalars()]
            if gone:
                remove_entries_of(connection, self._tables, gone, functools.partial(self._removed, connection))
                connection.execute(sa.delete(leases).where(leases.c.id.in_(gone)))

        try:
            self._run("remove expired leases", request)
        except BackendError as e:
            log.debug("distlock: could not remove expired leases on %s: %s", self.description, e)

    def keep_alive(self, lease: Lease, tickets: Sequence[Ticket], timeout: float) -> float:
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
        leases, lease_id = self._tables.leases, lease.id

        def request(connection: Connection, each: Attempt) -> None:
            remove_entries_of(connection, self._tables, [lease_id], functools.partial(self._removed, connection))
            connection.execute(sa.delete(leases).where(leases.c.id == lease_id))

        self._run(f"revoke lease {lease_id:x}", request)

    def enqueue(self, name: str, lease: Lease, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        lease_id = lease.id
        tables = self._tables
        w, leases, locks = tables.waiters, tables.leases, tables.locks
        key = name_key(name)
        record = owner.decode("utf-8")
        what = f"enqueue for lock {name!r}"

        def request(connection: Connection, each: Attempt) -> tuple[Ticket, Position]:
            # Joins of one lock take their ids one at a time (docs/operations/sql-table.md, "Tokens never repeat"):
            # each makes or locks the lock's row first, in one statement. A removal of the row (its queue emptied)
            # that holds it is waited for, and then the row is made anew; never do a join and a removal both pass.
            connection.execute(insert_or_lock(self._dialect, locks, name_key=key))
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
            entries = read_entries(connection, self._tables, name)
            # Another kind queued: leave at once (the rollback takes our entry with it) and say so.
            refuse_mixed(name, kind_of(nonce), (kind_of(e.nonce) for e in entries if e.alive))
            ticket = Ticket(name=name, key=str(token).encode(), token=token, lease_id=lease_id)
            return ticket, self._read_place(connection, ticket)

        (ticket, position), attempts = self._run(what, request)
        if attempts > 1:
            ticket = Ticket(name=name, key=ticket.key, token=ticket.token, lease_id=lease_id, resent=True)
        return ticket, position

    def position(self, ticket: Ticket) -> Position:
        position, _ = self._run(
            f"read queue of lock {ticket.name!r}",
            lambda connection, each: self._read_place(connection, ticket),
            writes=False,
        )
        return position

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> Position | None:
        bound = math.inf if timeout is None else timeout
        if isinstance(position, WaitingPosition):
            bound = min(bound, position.recheck_in + _EXPIRY_SLACK)
        until = _clock.now() + bound
        if self._notifies and isinstance(position, WaitingPosition):
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
        self._local_wakeups.add(ticket.name, woken)
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
                if seen is not None and not same_place(seen, position):
                    return seen
        finally:
            unregister()
            self._local_wakeups.discard(ticket.name, woken)

    def _wait_notified(
        self, ticket: Ticket, position: WaitingPosition, until: float, interrupt: Interrupt
    ) -> Position | None:
        """LISTEN on the channels of what we wait for, read our place again, then sleep until a notification."""
        try:
            listener = self._listen_connections.take()
        except BackendUnavailable:
            return self._wait_polling(ticket, position, until, interrupt)
        channels = [lock_channel(self._prefix, ticket.name)] if position.semaphore else []
        channels += [entry_channel(self._prefix, entry_id) for entry_id in position.awaited if not position.semaphore]

        def look() -> Position | None:
            seen = self._peek(ticket, until)
            return seen if seen is not None and not same_place(seen, position) else None

        return self._listen_connections.wait(listener, channels, look, until, interrupt)

    def dequeue(self, ticket: Ticket) -> bool:
        w = self._tables.waiters

        def request(connection: Connection, each: Attempt) -> bool:
            deleted = connection.execute(sa.delete(w).where(w.c.id == ticket.token, w.c.name == ticket.name))
            if deleted.rowcount:
                self._removed(connection, ticket.name, [ticket.token])
                forget_if_emptied(connection, self._tables, ticket.name)
            return bool(deleted.rowcount)

        deleted, attempts = self._run(f"release lock {ticket.name!r}", request)
        return deleted or attempts > 1  # a retried delete whose first attempt landed finds nothing: done

    def write_record(self, ticket: Ticket, value: bytes) -> bool:
        locks = self._tables.locks

        def request(connection: Connection, each: Attempt) -> bool:
            if not still_holds(connection, self._tables, ticket):
                return False
            connection.execute(sa.update(locks).where(locks.c.name_key == name_key(ticket.name)).values(record=value))
            return True

        written, _ = self._run(f"write the record of lock {ticket.name!r}", request)
        return written

    def write_mark(self, ticket: Ticket, key: str, value: bytes, ttl: float) -> bool:
        request = mark_writer(self._tables, self._dialect, ticket, key, value, ttl)
        return self._run(f"write mark {key!r} of lock {ticket.name!r}", request)[0]

    def read_mark(self, name: str, key: str) -> bytes | None:
        return self._run(f"read mark {key!r} of lock {name!r}", mark_reader(self._tables, name, key), writes=False)[0]

    def read_record(self, name: str) -> bytes | None:
        locks = self._tables.locks

        def request(connection: Connection, each: Attempt) -> bytes | None:
            value = connection.execute(sa.select(locks.c.record).where(locks.c.name_key == name_key(name))).scalar()
            return None if value is None else bytes(value)

        value, _ = self._run(f"read the record of lock {name!r}", request, writes=False)
        return value

    def _live_entries(self, connection: Connection, name: str) -> list[Entry]:
        return [entry for entry in read_entries(connection, self._tables, name) if entry.alive]

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
                    ttl_left=seconds(row.left),
                )
            )
            kinds.append(kind_of(str(row.nonce)))
        return [lock_state(name, waiters, kinds) for name, (waiters, kinds) in sorted(by_name.items())]

    def close(self) -> None:
        with self._mutex:
            self._closed = True
        self._listen_connections.close()
        self._engine.dispose()
        self._shutdown_at_deadline.stop()

    def after_fork(self) -> None:
        # The parent's connections are not ours: forget them without closing (closing would end the parent's).
        self._mutex = threading.Lock()
        self._local_wakeups = LocalWakeups()
        self._shutdown_at_deadline = ShutdownAtDeadline()
        self._listen_connections = self._new_listen_connections()
        self._engine.dispose(close=False)
