"""How the SQL lock table's waiters learn of a change, and how no driver call outlives its deadline.

- :class:`ShutdownAtDeadline` shuts down the socket of a request (or of a new connection's set-up) still running at
  its deadline: a paused database server keeps the connection open and answers nothing, and libpq has no read
  timeout. The blocked call then fails at once, and SQLAlchemy drops the connection.
- PostgreSQL: :func:`notify_removed` sends ``NOTIFY`` on the channels of removed entries and of their lock
  (delivered at commit); :class:`ListenConnections` keeps the connections that ``LISTEN`` on them, and sleeps on
  one until a notification, a deadline or an interrupt.
- :class:`LocalWakeups` wakes the waiters of this process that poll (MariaDB, SQLite) when a commit of this process
  removed an entry of their lock.

What can go wrong: a LISTEN connection that cannot be opened raises ``BackendUnavailable`` (the waiter polls
instead); one that fails while waiting ends that wait early (the waiter reads its place again); a closed backend
raises ``ClientClosed``. Nothing is missed: a waiter reads its place again after it subscribed and before it sleeps
(docs/operations/sql-table.md, "How it works").
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import os
import select
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from ... import _clock
from ..._errors import BackendUnavailable, ClientClosed, DistlockError
from ..._protocol import Interrupt, Position
from ._dialects import driver_socket
from ._schema import name_key

__all__ = [
    "ListenConnections",
    "LocalWakeups",
    "ShutdownAtDeadline",
    "end_setup_watch",
    "entry_channel",
    "lock_channel",
    "notify_removed",
]

log = logging.getLogger("distlock")

#: Idle LISTEN connections kept for the next wait (PostgreSQL).
_IDLE_LISTENERS = 4


# -- socket deadlines ------------------------------------------------------------------------------------------


class ShutdownAtDeadline:
    """Shuts down the socket of a request (or a new connection's set-up) still running at its deadline.

    A paused (SIGSTOPped) database server keeps its connections open and answers nothing; libpq has no read timeout,
    so without this a request would wait for it forever. Shutting the socket down makes the blocked call fail at
    once; SQLAlchemy then drops the connection. It holds a duplicate of the socket's descriptor, not the
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
                self._thread = threading.Thread(target=self._run, name="distlock-sql-deadlines", daemon=True)
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

    def watch_setup(self, seconds: float, dbapi_connection: Any, record: Any) -> None:
        """Watch a new connection's set-up for ``seconds``, until :func:`end_setup_watch` (SQLAlchemy events)."""
        fd = driver_socket(dbapi_connection)
        if fd is not None:
            record.info["distlock_unwatch"] = self.watch(fd, _clock.now() + seconds)


def end_setup_watch(dbapi_connection: Any, record: Any) -> None:
    unwatch = record.info.pop("distlock_unwatch", None)
    if unwatch is not None:
        unwatch()


# -- notifications ---------------------------------------------------------------------------------------------


#: PostgreSQL's longest identifier: ``pg_notify`` refuses a longer channel ("channel name too long"), ``LISTEN``
#: cuts one. A prefix may have 41 characters, so a lock's channel is cut here, for both.
_CHANNEL_LENGTH = 63


def entry_channel(prefix: str, entry_id: int) -> str:
    return f"{prefix}_w{entry_id}"  # at most 41 + 2 + 19 characters


def lock_channel(prefix: str, name: str) -> str:
    return f"{prefix}_l{name_key(name)[:32]}"[:_CHANNEL_LENGTH]


def notify_removed(connection: Connection, prefix: str, name: str, ids: Sequence[int]) -> None:
    """NOTIFY the waiters of entries ``ids`` of lock ``name`` and of the lock itself, at commit (PostgreSQL)."""
    channels = [lock_channel(prefix, name), *(entry_channel(prefix, entry_id) for entry_id in ids)]
    notify = sa.select(*(sa.func.pg_notify(channel, "") for channel in channels))
    connection.execute(notify)


class ListenConnections:
    """A backend's connections for LISTEN (PostgreSQL): the driver's own, each used by one waiter at a time and kept
    for the next wait (up to ``_IDLE_LISTENERS`` idle); their statements bound by ``shutdown``."""

    def __init__(
        self,
        engine: Engine,
        url: URL,
        connect_args: dict[str, Any],
        description: str,
        request_timeout: float,
        shutdown: ShutdownAtDeadline,
    ) -> None:
        self._engine = engine
        self._url = url
        self._connect_args = connect_args
        self.description = description
        self.request_timeout = request_timeout
        self._shutdown = shutdown
        self._mutex = threading.Lock()
        self._closed = False
        self._idle: list[Any] = []

    def take(self) -> Any:
        """An idle LISTEN connection, else a new one."""
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
            if self._idle:
                return self._idle.pop()
        # The driver's own connection, in autocommit: LISTEN takes effect at once, and no pool or dialect set-up
        # runs queries on it (libpq's connect_timeout bounds the opening).
        dialect = self._engine.dialect
        arguments, options = dialect.create_connect_args(self._url)
        try:
            return dialect.loaded_dbapi.connect(*arguments, **{**options, **self._connect_args, "autocommit": True})
        except Exception as e:  # the driver's own error: nothing of SQLAlchemy's wraps it here
            raise BackendUnavailable(f"could not open a LISTEN connection to {self.description}: {e}") from e

    def wait(
        self,
        listener: Any,
        channels: Sequence[str],
        look: Callable[[], Position | None],
        until: float,
        interrupt: Interrupt,
    ) -> Position | None:
        """LISTEN on ``channels`` with ``listener`` (from :meth:`take`, given back here), ``look`` once more (a
        place it returns ends the wait), then sleep until a notification, ``until`` or ``interrupt``."""
        healthy = False
        wake_reader, wake_writer = socket.socketpair()
        unregister = interrupt.on_fire(lambda: _poke(wake_writer))
        try:
            self._execute(listener, [f'LISTEN "{channel}"' for channel in channels])
            seen = look()
            if seen is not None:
                self._execute(listener, ["UNLISTEN *"])
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
            self._execute(listener, ["UNLISTEN *"])
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
            self._give_back(listener, healthy)

    def _execute(self, listener: Any, statements: Sequence[str]) -> None:
        """Run ``statements`` on a LISTEN connection (autocommit), its socket watched like any request's."""
        unwatch = self._shutdown.watch(int(listener.pgconn.socket), _clock.now() + self.request_timeout)
        try:
            for statement in statements:
                listener.execute(statement)
        finally:
            unwatch()

    def _give_back(self, listener: Any, healthy: bool) -> None:
        with self._mutex:
            if healthy and not self._closed and len(self._idle) < _IDLE_LISTENERS:
                self._idle.append(listener)
                return
        with contextlib.suppress(Exception):
            listener.close()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            idle, self._idle = self._idle, []
        for listener in idle:
            with contextlib.suppress(Exception):
                listener.close()


def _poke(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.send(b"!")


class LocalWakeups:
    """The waiters of this process that poll, by lock name: set when a commit of this process removed an entry of
    their lock."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._events: dict[str, set[threading.Event]] = {}

    def add(self, name: str, event: threading.Event) -> None:
        with self._mutex:
            self._events.setdefault(name, set()).add(event)

    def discard(self, name: str, event: threading.Event) -> None:
        with self._mutex:
            waiting = self._events.get(name)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._events[name]

    def wake(self, names: Iterable[str]) -> None:
        for name in names:
            with self._mutex:
                events = list(self._events.get(name, ()))
            for event in events:
                event.set()
