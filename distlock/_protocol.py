"""The seam between the lock algorithm and a lock service: the few primitives every backend provides.

The algorithm (``_lock``: queueing, waiting, timeouts, release, force release, hand-over) and the session keeper
(``_session``: lease refresh, lost-lock deadlines, strays) are written once above :class:`Backend`. A backend grants,
refreshes and revokes *leases* (a crashed client's keys vanish with its lease); joins a lock's FIFO queue
(idempotent per lease and nonce); says where a ticket stands, waits for the one ahead; removes a ticket only if it is
still that ticket; names a lock's head; finds held tickets that vanished while their lease lived; removes what a late
copy of a retried join left. A ticket at the head holds, and its ``token`` strictly increases from one holder of a
name to the next across client and server restarts. Semaphores and read/write locks share the queue: each entry's
kind is in its nonce, and ``_shape`` holds the grant rule. Optional capabilities (:class:`Inspectable`,
:class:`Recording`, :class:`Marking`, entries of other kinds) are declared by the backend (``unsupported``) and
checked where a user asks for them; :class:`HeadWatching` only saves reads, so where a backend lacks it the caller
polls. Errors: only :mod:`distlock` errors, the client library's as ``__cause__``, after retrying what is safe
within the request timeout. Each member's docstring says why it exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ._errors import BackendError

__all__ = [
    "KINDS",
    "MARKS",
    "PROCESSES",
    "RECORDS",
    "Backend",
    "Head",
    "HeadWatching",
    "Holder",
    "Inspectable",
    "Interrupt",
    "Lease",
    "LeaseGone",
    "LockState",
    "Marking",
    "Position",
    "Recording",
    "Ticket",
    "Waiter",
    "default_owner",
    "owner_id",
    "owner_record",
    "unreachable",
]


class LeaseGone(BackendError):
    """The lease a request named no longer exists on the server. The core catches it and starts a new session."""


_process_tag: dict[int, str] = {}


def default_owner(lease_id: int, nonce: str) -> str:
    """The owner id of a waiter the code gave none: its lease and seat, ``<lease hex>-<nonce>``, which no other live
    entry of the lock has (two holders of one lease have two seats)."""
    return f"{lease_id:x}-{nonce}"


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
    """One waiter's entry in one lock's queue: ``key`` names it on the server, ``token`` orders the queue and, at its
    head, is the fencing token."""

    name: str
    key: bytes
    token: int
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


@dataclass(frozen=True)
class Head:
    """A lock's head as a backend reads it: the ticket that heads the queue and the :class:`Holder` it makes."""

    ticket: Ticket
    holder: Holder


#: The optional capabilities a backend may lack, by the name its ``unsupported`` mapping uses.
RECORDS = "records"  # Recording: an election's record
KINDS = "kinds"  # queue entries of other kinds than a plain lock's: semaphores, read/write locks
PROCESSES = "processes"  # locks other processes see (the ``distlock`` command, other workers)
MARKS = "marks"  # Marking: a holder's small values that expire by themselves


@runtime_checkable
class Recording(Protocol):
    """A backend that keeps one small *record* per lock, written only by a holder (an election's leader keeps its
    ledger there). Optional: ``client.election()`` checks it."""

    def write_record(self, ticket: Ticket, value: bytes) -> bool:
        """Set lock ``ticket.name``'s record to ``value`` if ``ticket``'s key still exists, in one atomic step.

        A ticket that once held keeps holding until its key is removed (nobody gets ahead of the head), so "the key
        exists" is "it still holds". False, writing nothing, when the key is gone. The record belongs to the lock,
        not to a lease: the next holder reads what the last one wrote. Idempotent: a retried write sets the same value.
        """

    def read_record(self, name: str) -> bytes | None:
        """Lock ``name``'s record (every write acknowledged before is seen), or None when none was ever written."""


@runtime_checkable
class Marking(Protocol):
    """A backend that keeps *marks*: small values under keys of a lock, each written only while a given ticket of
    that lock holds, each expiring by itself ``ttl`` seconds after its write (on the service's clock: no sweeper).
    The Celery integration remembers there which task ids have run. A mark is not a lock: no queue, head or listing
    (``inspect()``) ever sees one. Optional: ``Context.marks`` checks it."""

    def write_mark(self, ticket: Ticket, key: str, value: bytes, ttl: float) -> bool:
        """Set mark ``key`` of lock ``ticket.name`` to ``value`` if ``ticket``'s key still exists (the compare of
        :meth:`Recording.write_record`, in the same atomic step), to expire no sooner than ``ttl`` s later and not
        much after (a service that counts whole seconds or shares one expiry among marks adds at most a tenth of
        ``ttl`` or a second). False, writing nothing, when the key is gone. Idempotent: a retry writes it again."""

    def read_mark(self, name: str, key: str) -> bytes | None:
        """Mark ``key`` of lock ``name``, or None when none was written or it expired."""


@runtime_checkable
class HeadWatching(Protocol):
    """A backend that can wait for a change of a lock's head instead of reading it again and again (an election's
    followers wait on it in ``observe()``). Optional: ``Context.watch_head`` checks it, and without it the caller
    reads the head every ``poll`` seconds."""

    def watch_head(self, name: str, seen: Ticket | None, timeout: float, interrupt: Interrupt) -> None:
        """Block until lock ``name``'s head may no longer be ``seen`` (the head's ticket the caller read last; None:
        nobody held it), ``timeout`` passes or ``interrupt`` fires. Returning says only "look again".

        The caller read the head *before* this call, so a change in between would come before any watch armed here
        and never be reported: the caller would wait a full ``timeout`` on a change it missed. So the watch is armed
        first and the head read again after it (or read at the revision the watch starts from): a change before the
        arming shows in that read, which returns at once when its head's token is not ``seen``'s; a change after it
        is the watch's to report. A watch that breaks (connection lost, compacted, refused) returns: the caller's
        next read decides, and raises if the service stays away.
        """


class Backend(Protocol):
    """What a lock service must provide. Implementations live in :mod:`distlock.backends`; the in-memory reference
    implementation is ``distlock.testing.MemoryBackend``."""

    #: Where the backend points, for error messages: ``"etcd at 127.0.0.1:2379"``.
    description: str
    #: The optional capabilities (:data:`RECORDS`, :data:`KINDS`, :data:`PROCESSES`, :data:`MARKS`) this backend
    #: lacks, each with the reason a user is told where asking for it (``client.election()``, ``client.semaphore()``,
    #: ``client.rwlock()``, the ``distlock`` command, ``Lock.write_mark()``, ``Client.read_mark()``).
    unsupported: Mapping[str, str]

    def check(self) -> None:
        """Prove the service is reachable and the credentials work; raise within the connect timeout otherwise
        (``unreachable()`` words the message)."""

    def grant_lease(self, ttl: float) -> Lease:
        """Grant a new lease of ``ttl`` seconds."""

    def keep_alive(self, lease: Lease, tickets: Sequence[Ticket], timeout: float) -> float:
        """Refresh ``lease`` within ``timeout`` s to its granted TTL; return the TTL left, ``<= 0`` when it is gone.

        ``tickets`` are the ones the client still has on it (held or waiting), for a service whose lock state expires
        by itself (Redis): it keeps their locks alive in the same refresh, and raises when it cannot (the refresh
        then counts as failed), so a lock's state outlives the lease that holds it.
        """

    def revoke_lease(self, lease: Lease, tickets: Sequence[Ticket]) -> None:
        """Revoke ``lease``, removing every key on it; a lease already gone is not an error. ``tickets`` are the ones
        the client still has on it (held or waiting), for a service that cannot remove keys with their lease."""

    def enqueue(self, name: str, lease: Lease, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        """Join lock ``name``'s queue as waiter ``nonce`` on ``lease``; idempotent for the same lease and nonce.
        Raises ``LockKindMismatch`` (``_shape.refuse_mixed``) when entries of another family of kinds are queued.

        The nonce is a *seat* (``"0"``, ``"r.1"``: ``Keeper.join_started``), reused by later joins on the lease and
        by every other lease: an entry is this join's only if both its lease and its nonce match. Idempotency rests
        on the core's promise that a seat is never given to a new join on the lease while an entry made with it may
        exist: not before its ticket is known removed, and never again after a join with it had an unknown outcome.
        So an entry found with this lease and nonce is this very join's, made by an earlier attempt of the request.
        """

    def position(self, ticket: Ticket) -> Position:
        """Where ``ticket`` stands now."""

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> Position | None:
        """Block until the entry ahead (``position.ahead``) may be gone, ``timeout`` passes or ``interrupt`` fires.

        None says only "look again": the caller re-reads the position. A backend that learnt the position while
        waiting (etcd reads it once the watch reports the deletion; Redis is told "you hold it") returns it.
        """

    def dequeue(self, ticket: Ticket) -> bool:
        """Delete ``ticket``'s key if it is still this ticket (same key, same token), waking the entry behind it;
        False when it was already gone. A release, a give-up, and (at a head read by :meth:`head`) a force release."""

    def head(self, name: str) -> Head | None:
        """Lock ``name``'s head and its holder, or None when nobody holds it (dead entries at the head are not it)."""

    def missing_tickets(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        """Of ``tickets`` (held, all on one live lease), those whose key is gone although the lease lives.

        One request where the service allows it, not one per ticket: the keeper asks this after every refresh of a
        lease that holds locks. Raises ``LeaseGone`` when the lease itself is gone.
        """

    def discard(self, name: str, lease: Lease, nonce: str) -> int | None:
        """Remove the key ``enqueue(name, lease, nonce, ...)`` makes, if it exists now; its token, or None.

        The keeper asks this of joins that were sent more than once, after their lock is done with them: a late
        copy of such a join may have made the key again (see ``_session.Stray``). Their seat is retired, so the key
        is never a later join's.
        """

    def close(self) -> None:
        """Release client resources (channels, connections). Leases are revoked by the caller first."""

    def after_fork(self) -> None:
        """In a forked child: drop the parent's connections without touching them, and open new ones lazily."""


def unreachable(description: str, connect_timeout: float, hint: str) -> str:
    """The message of ``check()``'s ``BackendUnavailable``, the same for every backend."""
    return f"could not reach {description} within {connect_timeout:g} s (connect_timeout); {hint}"
