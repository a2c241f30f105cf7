"""The seam between the lock algorithm and a lock service: a handful of primitives every backend provides.

The algorithm in ``_lock.py`` (queueing, waiting with timeouts, cancellation, re-queueing after a lost lease) and the
session keeper in ``_session.py`` (lease refresh, lost-lock deadlines, maximum hold time) are written once, above this
protocol. A backend only knows how to

- grant, refresh and revoke a *lease*: a server-side liveness token with a TTL that all of one client's keys of one
  TTL hang on, so that a crashed client's locks vanish without its help;
- put a waiter into a lock's FIFO queue (idempotently: a retried enqueue returns the same ticket) and say where in
  the queue a ticket stands;
- block until the waiter ahead of a ticket is gone, a timeout passes, or an :class:`Interrupt` fires;
- remove a ticket *only if it is still the same ticket* (never an unconditional delete), and, for operators, remove
  a lock's holder *only if its token is still the one the operator saw* (a force release);
- find the key a join would make, so that one made by a late copy of a retried join can be removed;
- say which of a lease's held tickets are gone (a force release or a hand removed them while the lease lived on);
- name the current holder of a lock (and, optionally, list every lock: :class:`Inspectable`);
- keep one small *record* per lock that only a holder can write: the write and the check that the writer's ticket
  still holds are one atomic step on the server (an election's leader keeps its ledger there).

A ticket at the head of its queue holds the lock. Its ``revision`` is the fencing token: it must strictly increase
from one holder of a name to the next, and survive client and server restarts. Semaphores and read/write locks use
the same queue with a *kind* per entry, carried in the nonce the core passes to ``enqueue`` (``_shape``): a ticket
holds when fewer than its limit of the entries ahead conflict with it, and ``position`` answers by that rule.

Errors: a backend raises only :mod:`distlock` errors (``BackendUnavailable``, ``AuthenticationFailed``, ...), with the
client library's exception as ``__cause__``, after retrying what is safe to retry within its request timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ._errors import BackendError

__all__ = [
    "Backend",
    "Holder",
    "Inspectable",
    "Interrupt",
    "Lease",
    "LeaseGone",
    "LockState",
    "Position",
    "Ticket",
    "Waiter",
    "owner_id",
    "owner_record",
]


class LeaseGone(BackendError):
    """The lease a request named no longer exists on the server. The core catches it and starts a new session."""


_process_tag: dict[int, str] = {}


def owner_record(owner: str) -> bytes:
    """The value stored with a waiter: its owner id, plus host and pid for operators reading the store directly."""
    pid = os.getpid()
    tag = _process_tag.get(pid)
    if tag is None:  # first call in this process (a forked child too)
        _process_tag.clear()
        tag = _process_tag[pid] = json.dumps({"host": socket.gethostname(), "pid": pid})[1:]
    return f'{{"id": {json.dumps(owner)}, {tag}'.encode()


def owner_id(value: bytes) -> str:
    """The opaque id of an :func:`owner_record` ("" when the value is not one)."""
    try:
        return str(json.loads(value)["id"])
    except (ValueError, KeyError, TypeError):
        return ""


@dataclass(frozen=True)
class Lease:
    """A granted lease: ``id`` on the server, and the ``ttl`` in seconds the server granted."""

    id: int
    ttl: float


@dataclass(frozen=True)
class Ticket:
    """One waiter's place in one lock's queue. ``revision`` orders the queue and, at its head, is the fencing token."""

    name: str
    key: bytes
    revision: int
    lease_id: int
    #: The join that made this ticket was sent more than once: a late copy may make the key again after it is gone.
    resent: bool = False


@dataclass(frozen=True)
class Position:
    """Where a ticket stands: ``held`` (head of the queue), ``gone`` (its key no longer exists), or waiting.

    When waiting, ``ahead`` is the key of the waiter just in front. ``waiters_ahead`` is a hint for messages only, -1
    when unknown. The core reads nothing else; a backend that needs more to wait well (etcd: the revision the answer
    was read at) returns a subclass of its own, and gets it back in :meth:`Backend.wait`.
    """

    held: bool
    gone: bool = False
    ahead: bytes = b""
    waiters_ahead: int = -1


@dataclass(frozen=True)
class Holder:
    """The current holder of a lock, as ``Client.holder()`` and ``Lock.locked()`` see it.

    ``waiters`` counts the entries that wait, and ``holders`` those that hold: several for a semaphore's slots or
    readers of a read/write lock (this holder is the first of them, the others are not waiters), as
    ``Client.inspect()`` lists them in ``LockState.holders`` and ``LockState.waiters``.
    """

    name: str
    token: int
    lease_id: int
    owner: str
    waiters: int
    holders: int = 1


@dataclass(frozen=True)
class Waiter:
    """One key in a lock's queue, as an inspector shows it: an opaque owner id, the token it holds or will hold,
    its lease, and the seconds its lease has left (None when the backend cannot tell)."""

    owner: str
    token: int
    lease_id: int
    ttl_left: float | None


@dataclass(frozen=True)
class LockState:
    """A lock with a holder: who holds it and who waits, in queue order.

    ``holders`` lists every entry that holds, in queue order (several for a semaphore or readers of a read/write
    lock; left out, it is ``(holder,)``); ``holder`` is the first of them, and ``waiters`` are the entries that wait.
    """

    name: str
    holder: Waiter
    waiters: tuple[Waiter, ...]
    holders: tuple[Waiter, ...] = ()

    def __post_init__(self) -> None:
        if not self.holders:
            object.__setattr__(self, "holders", (self.holder,))


@runtime_checkable
class Inspectable(Protocol):
    """A backend that can list every lock under its prefix (for inspectors; optional: ``Client.inspect()`` checks
    ``isinstance(backend, Inspectable)``)."""

    def inspect(self) -> list[LockState]:
        """Every lock with a holder or waiter, sorted by name."""


@dataclass
class Interrupt:
    """Wakes a blocked :meth:`Backend.wait` from another thread (a lost lease, a closed client, asyncio cancel).

    ``fire(reason)`` sets the flag and calls every callback registered with :meth:`on_fire`; a callback registered
    after the fire runs at once, so a wait that starts just after the fire never blocks.
    """

    reason: str | None = None
    _callbacks: list[Callable[[], None]] = field(default_factory=list)
    _mutex: threading.Lock = field(default_factory=threading.Lock)

    @property
    def fired(self) -> bool:
        return self.reason is not None

    def fire(self, reason: str) -> None:
        with self._mutex:
            if self.reason is not None:
                return
            self.reason = reason
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_fire(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Register ``callback``; returns a function that unregisters it."""
        with self._mutex:
            if self.reason is None:
                self._callbacks.append(callback)
                return lambda: self._discard(callback)
        callback()
        return lambda: None

    def _discard(self, callback: Callable[[], None]) -> None:
        with self._mutex, contextlib.suppress(ValueError):
            self._callbacks.remove(callback)


class Backend(Protocol):
    """What a lock service must provide. Implementations live in :mod:`distlock.backends`."""

    #: Where the backend points, for error messages: ``"etcd at 127.0.0.1:2379"``.
    description: str

    def check(self) -> None:
        """Prove the service is reachable and the credentials work; raise within the connect timeout otherwise."""

    def grant_lease(self, ttl: float) -> Lease:
        """Grant a new lease of ``ttl`` seconds."""

    def keep_alive(self, lease_id: int, timeout: float) -> float:
        """Refresh a lease within ``timeout`` s; return its remaining TTL, or ``<= 0`` when the lease is gone."""

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease (deleting every key on it); a lease that is already gone is not an error."""

    def enqueue(self, name: str, lease_id: int, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        """Join the queue of lock ``name`` as waiter ``nonce`` on ``lease_id``; idempotent for the same nonce."""

    def position(self, ticket: Ticket) -> Position:
        """Where ``ticket`` stands now."""

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> Position | None:
        """Block until the waiter ahead (``position.ahead``) may be gone, ``timeout`` passes or ``interrupt`` fires.

        None says only "look again": the caller re-reads the position. A backend that has just read the position
        itself (etcd reads it once the watch reports the deletion) returns it, and the caller uses it as such.
        """

    def dequeue(self, ticket: Ticket) -> bool:
        """Delete ``ticket``'s key if it is still this ticket; False when it was already gone."""

    def holder(self, name: str) -> Holder | None:
        """The current holder of ``name``, or None when nobody holds it."""

    def force_release(self, name: str, token: int) -> bool:
        """Delete the holder of ``name`` if its token is still ``token``, waking the next waiter as a release does.

        False when nobody holds the lock or its holder has another token: a newer holder is never touched. True also
        when a retried request's first attempt may have landed (the key at ``token`` is gone either way).
        """

    def lingering(self, name: str, lease_id: int, nonce: str) -> Ticket | None:
        """The key that ``enqueue(name, lease_id, nonce, ...)`` makes, as a ticket, if it exists now; else None.

        The keeper asks this of joins that were sent more than once, after their lock is done with them: a late
        copy of such a join may have made the key again (see ``_session.Stray``).
        """

    def missing_tickets(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        """Of ``tickets`` (held, all on one live lease), those whose key is gone although the lease lives.

        One request per lease where the service allows it, not one per ticket: the keeper asks this after every
        refresh of a lease that holds locks. May raise ``LeaseGone`` when the lease itself is gone.
        """

    def write_record(self, ticket: Ticket, value: bytes) -> bool:
        """Set lock ``ticket.name``'s record to ``value`` if ``ticket``'s key still exists, in one atomic step.

        Only a holder calls it, and a ticket that once held keeps holding until its key is removed (nobody gets
        ahead of the head), so "the key exists" is "it still holds". False, writing nothing, when the key is gone.
        A record belongs to the lock, not to a lease: it outlives every holder, and the next holder reads what the
        last one wrote. Idempotent: a retried write sets the same value.
        """

    def read_record(self, name: str) -> bytes | None:
        """Lock ``name``'s record (as current as a holder's read: every write acknowledged before is seen), or
        None when none was ever written."""

    def close(self) -> None:
        """Release client resources (channels, connections). Leases are revoked by the caller first."""

    def after_fork(self) -> None:
        """In a forked child: drop the parent's connections without touching them, and open new ones lazily."""
