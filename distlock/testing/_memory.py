"""The in-memory reference backend: ``_protocol.Backend`` in plain Python, the contract made executable.

``distlock.connect("memory://[name][?prefix=...]")`` (or ``Client(MemoryBackend(name))``) gives a client of a lock
"server" that lives in this process: one per name, shared by every client made for that name, so two clients
contend as two processes would. Each member below states its rule in a line and does just that, under one
``threading.Condition`` per server; the contract tests run here first, in seconds, then on every real backend, and
a real backend that disagrees with this module is the one to read twice. Unit tests of code that takes locks can
use it too, with no lock service running.

The queue is a list per lock: an entry's token is its creation number, from one counter per server, so tokens
strictly increase; entries are ordered by it and ``_shape`` says which of them hold. A lease has a TTL on
distlock's clock (``_clock``); a lease past its deadline vanishes with its entries, checked on every call, and a
blocked ``wait`` wakes at the earliest deadline of the leases in its queue, at every removal, and when its
``Interrupt`` fires. A lock's record sits beside its queue and outlives its holders; its marks too, each until its
own deadline, past which the next call finds it gone.

What it does not model: other processes (a forked child gets a copy of every server, as at the fork, and the two
copies never meet again), clock faults (one clock for client and server: no pause outlives a lease unseen), network
faults (a call never fails but for a closed client, ``ClientClosed``, and kind mismatches), persistence (the
servers go with the process; tokens start again from 1). Use the real servers of ``distlock.testing`` for those.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from .. import _clock
from .._errors import ClientClosed, ConfigurationError
from .._protocol import (
    PROCESSES,
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
)
from .._shape import holding, kind_of, lock_state, refuse_mixed, waiting
from ..backends import Scheme, _url

__all__ = ["MemoryBackend", "MemoryConfig", "parse"]

_T = TypeVar("_T")

#: The longest a blocked ``wait`` sleeps at once (``Condition.wait`` refuses timeouts past ``TIMEOUT_MAX``).
_MAX_SLEEP = 60.0


@dataclass
class _Entry:
    """One waiter in a lock's queue: ``key`` is ``<lease hex>-<nonce>``, ``token`` its creation number."""

    key: bytes
    token: int
    lease_id: int
    kind: str
    owner: bytes


@dataclass
class _Server:
    """One named in-memory lock service: leases (id -> deadline and TTL), queues and records by (prefix, name), and
    marks by (prefix, name, key) with their deadlines."""

    cond: threading.Condition = field(default_factory=lambda: threading.Condition(threading.RLock()))
    counter: int = 0
    leases: dict[int, tuple[float, float]] = field(default_factory=dict)
    queues: dict[tuple[str, str], list[_Entry]] = field(default_factory=dict)
    records: dict[tuple[str, str], bytes] = field(default_factory=dict)
    marks: dict[tuple[str, str, str], tuple[bytes, float]] = field(default_factory=dict)

    def next_number(self) -> int:
        self.counter += 1
        return self.counter

    def expire(self) -> None:
        """Drop every lease past its deadline, with its entries, and every mark past its own."""
        now = _clock.now()
        for lease_id in [lease_id for lease_id, (deadline, _) in self.leases.items() if deadline <= now]:
            self.drop_lease(lease_id)
        for place in [place for place, (_, deadline) in self.marks.items() if deadline <= now]:
            del self.marks[place]

    def drop_lease(self, lease_id: int) -> None:
        self.leases.pop(lease_id, None)
        for place in list(self.queues):
            self.remove(place, lambda entry: entry.lease_id == lease_id)

    def remove(self, place: tuple[str, str], which: Any) -> bool:
        """Remove the entries of queue ``place`` for which ``which(entry)``; wake every waiter when any went."""
        queue = self.queues.get(place, [])
        kept = [entry for entry in queue if not which(entry)]
        if len(kept) == len(queue):
            return False
        if kept:
            self.queues[place] = kept
        else:
            del self.queues[place]
        self.cond.notify_all()
        return True


_registry = threading.Lock()
_servers: dict[str, _Server] = {}


def _server(name: str) -> _Server:
    with _registry:
        return _servers.setdefault(name, _Server())


def _renew_locks_in_child() -> None:
    # A thread of the parent may have held a lock at the fork; no thread of the child ever will release it.
    global _registry
    _registry = threading.Lock()
    for server in _servers.values():
        server.cond = threading.Condition(threading.RLock())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_in_child)


def _key(lease: Lease, nonce: str) -> bytes:
    return f"{lease.id:x}-{nonce}".encode()


def _position(queue: list[_Entry], ticket: Ticket) -> Position:
    for index, entry in enumerate(queue):
        if entry.token == ticket.token and entry.key == ticket.key:
            if holding([each.kind for each in queue[: index + 1]])[index]:
                return Position(held=True, waiters_ahead=index)
            return Position(held=False, ahead=queue[index - 1].key, waiters_ahead=index)
    return Position(held=False, gone=True)


class MemoryBackend:
    """Lock primitives on the in-memory server ``name`` of this process (see the module). Thread-safe."""

    unsupported: Mapping[str, str] = MappingProxyType(
        {PROCESSES: "its locks live in this process only (a test double); use a lock service's URL"}
    )

    def __init__(
        self, name: str = "", *, prefix: str = "distlock", connect_timeout: float = 5.0, request_timeout: float = 5.0
    ) -> None:
        self.description = f"in-memory locks at memory://{name}"
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._prefix = prefix
        self._server = _server(name)
        self._closed = False

    @contextlib.contextmanager
    def _state(self) -> Iterator[_Server]:
        """The server, locked, with expired leases gone; ``ClientClosed`` once this client is closed."""
        server = self._server
        with server.cond:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
            server.expire()
            yield server

    def check(self) -> None:
        """Never fails: the server is in this process (a closed client raises ``ClientClosed``)."""
        with self._state():
            pass

    def grant_lease(self, ttl: float) -> Lease:
        """A new lease of exactly ``ttl`` seconds."""
        with self._state() as server:
            lease_id = server.next_number()
            server.leases[lease_id] = (_clock.now() + ttl, ttl)
            return Lease(id=lease_id, ttl=ttl)

    def keep_alive(self, lease: Lease, tickets: Sequence[Ticket], timeout: float) -> float:
        """Restart the lease's TTL; 0 when it is gone (revoked, or expired before this call). ``tickets``: nothing to
        keep alive here, a lock's state lives as long as its entries."""
        with self._state() as server:
            if lease.id not in server.leases:
                return 0.0
            server.leases[lease.id] = (_clock.now() + lease.ttl, lease.ttl)
            return lease.ttl

    def revoke_lease(self, lease: Lease, tickets: Sequence[Ticket]) -> None:
        """Drop the lease and every entry on it (``tickets`` are not needed); a lease already gone is no error."""
        with self._state() as server:
            server.drop_lease(lease.id)

    def enqueue(self, name: str, lease: Lease, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        """Append an entry ``<lease hex>-<nonce>`` with a new token; the entry already there for a repeated nonce.

        ``LeaseGone`` when the lease is; ``LockKindMismatch`` when the queue holds entries of another family.
        """
        lease_id, key, kind = lease.id, _key(lease, nonce), kind_of(nonce)
        with self._state() as server:
            if lease_id not in server.leases:
                raise LeaseGone(f"enqueue for lock {name!r}: lease {lease_id:x} is gone on {self.description}")
            queue = server.queues.setdefault((self._prefix, name), [])
            for entry in queue:
                if entry.key == key:
                    ticket = Ticket(name=name, key=key, token=entry.token, lease_id=lease_id, resent=True)
                    return ticket, _position(queue, ticket)
            refuse_mixed(name, kind, (entry.kind for entry in queue))
            entry = _Entry(key=key, token=server.next_number(), lease_id=lease_id, kind=kind, owner=owner)
            queue.append(entry)
            server.cond.notify_all()  # a head watch of an empty queue
            ticket = Ticket(name=name, key=key, token=entry.token, lease_id=lease_id)
            return ticket, _position(queue, ticket)

    def position(self, ticket: Ticket) -> Position:
        """Held when ``_shape.holding`` says so of the entries up to the ticket's; gone when its entry is."""
        with self._state() as server:
            return _position(server.queues.get((self._prefix, ticket.name), []), ticket)

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> Position | None:
        """Block until the ticket's position differs from ``position`` (returned), ``timeout`` passes or
        ``interrupt`` fires (None); wakes at every removal and at the earliest lease deadline of the queue."""

        def moved(queue: list[_Entry]) -> Position | None:
            now = _position(queue, ticket)
            return now if now != position else None

        return self._block(ticket.name, moved, timeout, interrupt)

    def watch_head(self, name: str, seen: Ticket | None, timeout: float, interrupt: Interrupt) -> None:
        """Block until the queue's first entry is not ``seen``'s (by token), ``timeout`` passes or ``interrupt``
        fires. The check and the wait are one step under the server's condition: no change slips between them."""
        token = None if seen is None else seen.token

        def changed(queue: list[_Entry]) -> bool | None:
            return True if (queue[0].token if queue else None) != token else None

        self._block(name, changed, timeout, interrupt)

    def _block(
        self, name: str, changed: Callable[[list[_Entry]], _T | None], timeout: float | None, interrupt: Interrupt
    ) -> _T | None:
        """Block until ``changed(queue)`` of lock ``name`` is not None (returned), ``timeout`` passes or
        ``interrupt`` fires (None); looks again at every join and removal and at the earliest lease deadline."""
        deadline = None if timeout is None else _clock.now() + timeout
        server = self._server

        def wake() -> None:
            with server.cond:
                server.cond.notify_all()

        unregister = interrupt.on_fire(wake)
        try:
            with server.cond:
                while not (interrupt.fired or self._closed):
                    server.expire()
                    queue = server.queues.get((self._prefix, name), [])
                    now = changed(queue)
                    if now is not None:
                        return now
                    moment = _clock.now()
                    if deadline is not None and moment >= deadline:
                        return None
                    until = min([server.leases[entry.lease_id][0] for entry in queue], default=moment + _MAX_SLEEP)
                    until = until if deadline is None else min(until, deadline)
                    server.cond.wait(timeout=min(max(until - moment, 0.0), _MAX_SLEEP))
                return None  # the caller's next call reports a closed client
        finally:
            unregister()

    def dequeue(self, ticket: Ticket) -> bool:
        """Remove the ticket's entry if it is still there (same key, same token); False when it was gone."""
        with self._state() as server:
            place = (self._prefix, ticket.name)
            return server.remove(place, lambda entry: entry.token == ticket.token and entry.key == ticket.key)

    def head(self, name: str) -> Head | None:
        """The queue's first entry, with how many entries hold and wait; None when the queue is empty."""
        with self._state() as server:
            queue = server.queues.get((self._prefix, name), [])
            if not queue:
                return None
            first = queue[0]
            waiters = waiting([entry.kind for entry in queue])
            holder = Holder(
                name=name,
                token=first.token,
                lease_id=first.lease_id,
                owner=owner_id(first.owner),
                waiters=waiters,
                holders=len(queue) - waiters,
            )
            return Head(Ticket(name=name, key=first.key, token=first.token, lease_id=first.lease_id), holder)

    def discard(self, name: str, lease: Lease, nonce: str) -> int | None:
        """Remove the entry ``enqueue(name, lease, nonce, ...)`` makes, if it is in the queue now; its token."""
        key = _key(lease, nonce)
        with self._state() as server:
            found = [entry.token for entry in server.queues.get((self._prefix, name), []) if entry.key == key]
            if found:
                server.remove((self._prefix, name), lambda entry: entry.key == key)
            return found[0] if found else None

    def missing_tickets(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        """The tickets whose entry is gone; ``LeaseGone`` when a ticket's lease is."""
        with self._state() as server:
            if tickets and tickets[0].lease_id not in server.leases:
                raise LeaseGone(f"check held locks: lease {tickets[0].lease_id:x} is gone on {self.description}")
            return [t for t in tickets if _position(server.queues.get((self._prefix, t.name), []), t).gone]

    def write_record(self, ticket: Ticket, value: bytes) -> bool:
        """Set the lock's record to ``value`` if the ticket's entry is still there, in the same locked step."""
        with self._state() as server:
            if _position(server.queues.get((self._prefix, ticket.name), []), ticket).gone:
                return False
            server.records[(self._prefix, ticket.name)] = value
            return True

    def read_record(self, name: str) -> bytes | None:
        """The lock's record, None when none was ever written."""
        with self._state() as server:
            return server.records.get((self._prefix, name))

    def write_mark(self, ticket: Ticket, key: str, value: bytes, ttl: float) -> bool:
        """Set mark ``key`` of the lock, to expire exactly ``ttl`` s from now, if the ticket's entry is still there."""
        with self._state() as server:
            if _position(server.queues.get((self._prefix, ticket.name), []), ticket).gone:
                return False
            server.marks[(self._prefix, ticket.name, key)] = (value, _clock.now() + ttl)
            return True

    def read_mark(self, name: str, key: str) -> bytes | None:
        """The mark, None when none was written or it expired."""
        with self._state() as server:
            mark = server.marks.get((self._prefix, name, key))
            return None if mark is None else mark[0]

    def inspect(self) -> list[LockState]:
        """Every lock under this client's prefix with entries, by name, as ``_shape.lock_state`` shows them."""
        with self._state() as server:
            now = _clock.now()
            states = []
            for (prefix, name), queue in sorted(server.queues.items()):
                if prefix == self._prefix:
                    entries = [
                        Waiter(
                            owner=owner_id(entry.owner),
                            token=entry.token,
                            lease_id=entry.lease_id,
                            ttl_left=max(server.leases[entry.lease_id][0] - now, 0.0),
                        )
                        for entry in queue
                    ]
                    states.append(lock_state(name, entries, [entry.kind for entry in queue]))
            return states

    def close(self) -> None:
        """Every later call raises ``ClientClosed``; a blocked ``wait`` of this client returns. The server stays."""
        with self._server.cond:
            self._closed = True
            self._server.cond.notify_all()

    def after_fork(self) -> None:
        """Nothing to drop: the child works on its own copy of the servers, as they were at the fork (see the
        module: no processes are modelled; the parent's leases there expire, as the child never refreshes them)."""


@dataclass(frozen=True)
class MemoryConfig:
    """A parsed ``memory://`` URL: the server's ``name``, the key ``prefix``, the timeouts (kept, never needed)."""

    name: str
    prefix: str = "distlock"
    connect_timeout: float = 5.0
    request_timeout: float = 5.0

    def open(self) -> MemoryBackend:
        return MemoryBackend(
            self.name, prefix=self.prefix, connect_timeout=self.connect_timeout, request_timeout=self.request_timeout
        )


def parse(url: str, scheme: Scheme, options: dict[str, Any]) -> MemoryConfig:
    """``memory://[name][?prefix=...]`` and ``connect()``'s ``prefix``, ``connect_timeout``, ``request_timeout``;
    ``ConfigurationError`` for anything else."""
    parts = _url.split(url)
    if parts.path not in ("", "/"):
        raise ConfigurationError(
            f"distlock URL {parts.shown!r} has a path {parts.path!r}; a memory URL is memory://[name]"
        )
    found = _url.query(parts, {"prefix"})
    _url.check_options(options, _url.PLAIN_OPTIONS)
    connect_timeout, request_timeout = _url.timeouts(options)
    return MemoryConfig(
        name=parts.netloc,
        prefix=_url.prefix(options, found),
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
    )
