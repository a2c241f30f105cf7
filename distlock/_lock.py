"""The lock: queueing, waiting, timeouts, loss, hand-over and release, written once over ``_protocol.Backend``.

A handle from ``client.lock(name)`` (or ``semaphore``/``rwlock``, whose handles are this class with another ``kind``
of queue entry) acquires by joining the lock's FIFO queue with a ticket on its client's session lease for its TTL, and
waits until the backend says the ticket holds; the ticket's token is the fencing token. It reaches its client only
through a ``Context`` (backend, keeper, open-guard). ``current_lock()``/``current_token()`` find the innermost lock held
in the current thread or asyncio task, which fenced writes use. The races handled here (a lease lost while waiting, a
timeout that strikes as the ticket becomes head, a late release, a force release, a hand-over, a fork while holding, a
close while waiting) are told in docs/design.md, "Races the lock handles".

What can go wrong: ``acquire()`` raises ``BackendUnavailable`` when the service does not answer within the client's
``request_timeout`` (a give-up or release whose removal failed is handed to the keeper to retry, with a warning),
``ClientClosed`` when the client is closed; ``release()`` raises ``LockLost`` or ``LockNotOwned``; acquiring a
handle that holds or is acquiring raises ``LockError``; in a forked child the parent's hold is not held (``lost``,
``LockNotOwned``). Bad options raise when the handle is made (``_lockoptions``). Every acquire, hold and loss is
measured here, once for every backend (``_metrics``; a failing metric never fails a lock).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Self, Unpack

from . import _clock, _metrics, _stop
from ._errors import (
    BackendError,
    BackendUnavailable,
    ClientClosed,
    ConfigurationError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)
from ._lockoptions import LockOptions, check_options
from ._protocol import Interrupt, LeaseGone, Ticket, default_owner, owner_record
from ._seconds import seconds
from ._session import CLIENT_CLOSED, Session, Stray
from ._shape import MUTEX

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["Fence", "Lock", "current_lock", "current_token"]

log = logging.getLogger("distlock")

_held: contextvars.ContextVar[tuple[Lock, ...]] = contextvars.ContextVar("distlock_held", default=())

_LEASE_LOST = "lease lost"


def current_lock(name: str | None = None) -> Lock | None:
    """The innermost lock held in this context (of ``name``, when given), or None."""
    for lock in reversed(_held.get()):
        # A handle released elsewhere (another thread or task), or held by the parent of this forked process, is
        # skipped; a lost one is still returned: its token makes the database refuse the writes it should no
        # longer make.
        if lock._own_ticket() is not None and (name is None or lock.name == name):
            return lock
    return None


def current_token(name: str | None = None) -> int | None:
    """The fencing token of :func:`current_lock`, or None when no such lock is held in this context."""
    lock = current_lock(name)
    return None if lock is None else lock.token


@dataclass(frozen=True)
class Fence:
    """A fencing token and the lock name it belongs to. ``Lock.fence`` gives the fence of a held lock."""

    name: str
    token: int

    @classmethod
    def of(cls, lock: Lock) -> Fence:
        return cls(lock.name, lock.token)


class Lock:
    """A handle on one distributed lock. Create with ``client.lock(name, ttl=..., timeout=...)``.

    The options (:class:`LockOptions`) are checked once, here. ``ttl`` stays what was asked; the lease granted
    is at least :data:`~distlock._session.MIN_TTL` (one second) and may be longer (etcd grants whole seconds), and
    refreshes follow the granted TTL. Past ``max_hold`` the lock is released and marked lost even if the holder is
    alive but hung. ``owner`` lets other processes tell who holds the lock (the Celery integration stores the task id
    there). With ``stop_on_lost=True``, ``with`` runs its body in :meth:`scope`: a loss stops it (docs/lost.md).
    """

    def __init__(self, context: Context, name: str, *, kind: str = MUTEX, **options: Unpack[LockOptions]) -> None:
        self.ttl, self.timeout, self.max_hold = check_options(name, options)
        self._context = context
        self.name = name
        self._on_lost = options.get("on_lost")
        self._stop_on_lost = options.get("stop_on_lost", False)
        self._scope: _stop.ThreadScope | None = None  # the scope ``with`` entered (``stop_on_lost``)
        # What to call when the current hold is lost: the scopes, and ``on_lost`` first, on the keeper's clean-up
        # thread (the keeper must go on refreshing leases; a caller of ``lost`` does not expect to run user code).
        self._lost_hooks = _stop.LostHooks(functools.partial(context.keeper.defer, self._call_on_lost))
        self.owner = options.get("owner")
        self.family = options.get("family")
        self._metric_attributes = _metrics.lock_attributes(type(context.backend).__module__, self.family)
        self._mutex = threading.Lock()
        self._busy = False
        self._ticket: Ticket | None = None
        self._session: Session | None = None
        self._pid = 0
        self._acquired_at = 0.0
        self._hold_deadline: float | None = None
        self._lost_reason: str | None = None
        self._lost_event = threading.Event()
        self._wake: Interrupt | None = None
        self._stray: Stray | None = None  # the current key's, when its join was sent more than once
        self._handed_over = False  # hand_over() was called on the current hold
        #: The kind of this handle's queue entries (``_shape``): a lock's, a semaphore slot's, a reader's or writer's.
        self._kind = kind

    def __repr__(self) -> str:
        if self._ticket is not None and self._own_ticket() is None:
            return f"<distlock.Lock {self.name!r} ttl={self.ttl:g} not held (held by parent process {self._pid})>"
        state = "lost" if self._ticket is not None and self.lost else "held" if self._ticket else "not held"
        token = f" token={self._ticket.token}" if self._ticket is not None else ""
        return f"<distlock.Lock {self.name!r} ttl={self.ttl:g} {state}{token}>"

    # -- acquiring --------------------------------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Wait for the lock; True when acquired, False when ``timeout`` ran out (or at once if not ``blocking``).

        ``timeout=None`` uses the handle's ``timeout``. Raises ``BackendUnavailable`` when the lock service cannot
        be reached within its request timeout, never hangs past ``timeout`` plus that; ``ClientClosed`` when the
        client is closed, before or during the wait.
        """
        acquired = self._acquire(blocking, timeout, Interrupt())
        if acquired:
            self._enter_context()
        return acquired

    def take_over(self, token: int, timeout: float | None = None) -> bool:
        """Acquire the lock as the successor of the hold with fencing token ``token`` (one its holder handed over
        with :meth:`hand_over`, typically in another process), leaving no moment in which a third party could take it.

        The handle joins the queue first, then removes that hold's key if it still heads the queue (checked against
        ``token``, like a force release: a newer holder is never touched), then waits its turn as ``acquire()``
        does. The old holder is not asked: it learns at its client's next check of its keys. True when acquired
        (also at once when the lock turned out free); False when the lock is held under another token (the hold
        ``token`` ended and someone else holds the lock: the handle leaves the queue at once), or after ``timeout``.
        Raises ``ConfigurationError`` for a token that is not a positive int, else as ``acquire()``.
        """
        if isinstance(token, bool) or not isinstance(token, int) or token < 1:
            raise ConfigurationError(f"token must be a held lock's fencing token, a positive int, not {token!r}")
        acquired = self._acquire(True, timeout, Interrupt(), predecessor=token)
        if acquired:
            self._enter_context()
        return acquired

    def _acquire(
        self, blocking: bool, timeout: float | None, cancel: Interrupt, predecessor: int | None = None
    ) -> bool:
        if timeout is not None:
            timeout = seconds(timeout, "timeout (how long to wait)", allow_zero=True, allow_forever=True)
        wait = (timeout if timeout is not None else self.timeout) if blocking else 0.0
        started = _clock.now()
        deadline = started + wait
        with self._mutex:
            if self._own_ticket() is not None or self._busy:
                raise LockError(
                    f"lock {self.name!r}: this handle already holds or is acquiring it. Locks are not re-entrant; "
                    "use one client.lock(...) handle per holder",
                    name=self.name,
                )
            self._busy = True
        _metrics.acquire_started(self._metric_attributes)
        outcome = _metrics.ERROR
        try:
            with self._context.open_for(f"acquire lock {self.name!r}"):
                acquired = self._queue_until_head(deadline, cancel, predecessor)
            outcome = _metrics.ACQUIRED if acquired else _metrics.CANCELLED if cancel.fired else _metrics.TIMEOUT
            return acquired
        finally:
            _metrics.acquire_ended(self._metric_attributes, _clock.now() - started, outcome)
            with self._mutex:
                self._busy = False

    def _queue_until_head(self, deadline: float, cancel: Interrupt, predecessor: int | None = None) -> bool:
        backend = self._context.backend
        keeper = self._context.keeper
        while True:
            if cancel.fired:
                return False
            session = keeper.session(self.ttl)
            wake = Interrupt()
            unlink = cancel.on_fire(functools.partial(wake.fire, "cancelled"))
            with self._mutex:
                self._wake = wake
            keeper.attach(session, self)
            ticket: Ticket | None = None
            try:
                answered: Ticket | None = None
                nonce = keeper.join_started(session, self.name, self._kind)  # a seat, reused (see join_started)
                try:
                    record = owner_record(self.owner or default_owner(session.lease.id, nonce))
                    ticket, position = backend.enqueue(self.name, session.lease, nonce, record)
                    answered = ticket
                    self._context.breaker.ended(None)  # the service answers: a probe that waits must not keep it open
                except LeaseGone:
                    keeper.declare_lost(session, f"lease {session.lease.id:x} was not found on the server")
                    continue
                except BaseException:
                    # The join may have landed, or a copy of it may still land: either way nobody waits on the key
                    # (and its seat is retired, so no later join of ours can make that key).
                    keeper.stray(session, self.name, nonce, active=False)
                    raise
                finally:
                    noted = keeper.joined(session, self.name, nonce, answered)
                if not noted:
                    # The lease was revoked while this join was answered, too late for the revoke to name the key
                    # (Redis would keep it): remove it here, and queue again on a live lease.
                    stale, ticket = ticket, None
                    self._give_up(stale, session)
                    continue
                if ticket.resent:
                    self._stray = keeper.stray(session, self.name, nonce)
                if predecessor is not None and not position.held:
                    # Queued behind the hold we take over: only now may its key go (no gap for a third party).
                    if not self._context.release_at(self.name, predecessor):
                        self._give_up(ticket, session)
                        ticket = None
                        return False
                    position = backend.position(ticket)
                predecessor = None  # once: queueing again after a lost lease is an ordinary wait
                while True:
                    if position.gone or wake.reason == _LEASE_LOST or session.expired():
                        # Our key is gone, or goes with a lease that expired while we waited: queue again, at the
                        # back, on a live lease. (A key deleted by hand from a live lease just re-queues.)
                        if session.expired():
                            keeper.declare_lost(session, session.why_expired())
                        if position.gone:
                            keeper.left(session, ticket)  # (otherwise the lease's revoke names it)
                        self._stray_done()
                        ticket = None
                        break
                    if position.held:
                        self._become_holder(ticket, session)
                        ticket = None  # ours now: no clean-up below
                        return True
                    remaining = deadline - _clock.now()
                    if remaining <= 0 or wake.fired:
                        self._give_up(ticket, session)
                        ticket = None
                        return False
                    try:
                        seen = backend.wait(ticket, position, None if remaining == math.inf else remaining, wake)
                        timed_out = _clock.now() >= deadline
                        if not timed_out and not (wake.fired and wake.reason != _LEASE_LOST):
                            position = seen if seen is not None else backend.position(ticket)
                            continue
                    except BackendUnavailable:
                        # A read inside the wait may take the whole request_timeout when the server does not answer:
                        # if our own timeout struck meanwhile, that is the answer, not the outage.
                        if _clock.now() < deadline:
                            raise
                    # Out of time (or cancelled): give up without asking the server anything more, so an unreachable
                    # server makes acquire() return False on time rather than raise late.
                    self._give_up(ticket, session)
                    ticket = None
                    return False
            finally:
                unlink()
                with self._mutex:
                    self._wake = None
                if self._ticket is None:
                    keeper.detach(session, self)
                if ticket is not None:  # an exception escaped mid-wait: leave no key behind
                    self._give_up(ticket, session)

    def _give_up(self, ticket: Ticket, session: Session) -> None:
        try:
            self._context.backend.dequeue(ticket)
            self._context.keeper.left(session, ticket)
        except BackendError as e:
            log.warning("distlock: could not remove waiter of %r now (%s); retrying in the background", self.name, e)
            self._context.keeper.orphan(ticket, session)
        finally:
            self._stray_done()

    def _stray_done(self) -> None:
        """Done with the current key: if its join was sent more than once, a late copy may make it again (the
        keeper then removes it; see ``_session.Stray``)."""
        stray, self._stray = self._stray, None
        if stray is not None:
            self._context.keeper.stray_done(stray)

    def _become_holder(self, ticket: Ticket, session: Session) -> None:
        now = _clock.now()
        with self._mutex:
            self._ticket = ticket
            self._session = session
            self._pid = os.getpid()
            self._acquired_at = now
            self._lost_reason = None
            self._lost_hooks.reset()
            self._lost_event.clear()
            self._handed_over = False
            self._hold_deadline = None if self.max_hold is None else now + self.max_hold
        if self._hold_deadline is not None:
            self._context.keeper.changed()

    def _enter_context(self) -> None:
        _held.set((*_held.get(), self))

    def _leave_context(self) -> None:
        held = _held.get()
        if self in held:
            _held.set(tuple(lock for lock in held if lock is not self))

    # -- holding ----------------------------------------------------------------------------------------------

    def _own_ticket(self) -> Ticket | None:
        """The held ticket, unless there is none or it was taken by the parent of this forked process."""
        ticket = self._ticket
        return ticket if ticket is not None and self._pid == os.getpid() else None

    def _not_owned(self, what: str) -> LockNotOwned:
        if self._ticket is not None and self._own_ticket() is None:
            what = f"was acquired by process {self._pid}; this forked child does not own it"
        return LockNotOwned(f"lock {self.name!r} {what}", name=self.name)

    @property
    def token(self) -> int:
        """The fencing token of this hold: strictly larger than every earlier holder's. Raises ``LockNotOwned``
        if not held (in a forked child too: the parent's token is not the child's)."""
        ticket = self._own_ticket()
        if ticket is None:
            raise self._not_owned("is not held by this handle: it has no token")
        return ticket.token

    @property
    def fence(self) -> Fence:
        """The fencing token with this lock's name, for fenced writes. Raises if not held."""
        return Fence(self.name, self.token)

    @property
    def lost(self) -> bool:
        """True once this hold is known lost (lease expired or revoked, or ``max_hold`` passed); in a forked child,
        True for a hold of the parent's (the child is not protected by it)."""
        if self._ticket is not None and self._own_ticket() is None:
            return True
        return self._lost_reason is not None or self._check_deadlines() is not None

    @property
    def lost_event(self) -> threading.Event:
        """An event set when the lock becomes lost, for threads that want to wait on it (set in a forked child
        for a hold of the parent's)."""
        if self._ticket is not None and self._own_ticket() is None and not self._lost_event.is_set():
            self._lost_event = threading.Event()  # a fresh one: the parent's may be mid-use by a parent thread
            self._lost_event.set()
        return self._lost_event

    @property
    def held_for(self) -> float:
        """Seconds since acquisition (0 when not held)."""
        return _clock.now() - self._acquired_at if self._own_ticket() is not None else 0.0

    def owned(self) -> bool:
        """True while this handle holds the lock and it is not known lost (never in a forked child for a hold of
        the parent's)."""
        return self._own_ticket() is not None and not self.lost

    def locked(self) -> bool:
        """True when anyone holds the lock (asks the server; like ``threading.Lock.locked``)."""
        with self._context.open_for(f"read lock {self.name!r}"):
            return self._context.backend.head(self.name) is not None

    def ensure_held(self, verify: bool = False) -> None:
        """Raise ``LockLost`` if the lock is known lost, ``LockNotOwned`` if not held. Without ``verify`` a local
        check of the lease deadline, free to call in a loop; with ``verify`` it also asks the server that our key
        still heads the queue. Neither makes a write safe: fenced writes do."""
        ticket = self._own_ticket()
        if ticket is None:
            raise self._not_owned("is not held by this handle")
        reason = self._lost_reason or self._check_deadlines()
        if reason is None and verify:
            with self._context.open_for(f"check lock {self.name!r}"):
                position = self._context.backend.position(ticket)
            if not position.held:
                reason = "its key is no longer at the head of the queue" if not position.gone else "its key is gone"
                self._mark_lost(reason)
        if reason is not None:
            raise LockLost(f"lock {self.name!r} (token {ticket.token}) was lost: {reason}", name=self.name)

    def write_mark(self, key: str, value: bytes, ttl: float) -> None:
        """Set mark ``key`` of this lock to ``value`` for ``ttl`` s while this handle holds it; ``Client.read_mark``
        reads it, after the hold too (docs/primitives.md, "Marks"). Raises as :meth:`ensure_held` (``LockLost`` also
        when the service refused it: the key is gone), ``ConfigurationError`` (no marks, bad value or ttl)."""
        self._write_held(f"mark {key!r}", self._context.mark_writer(self.name, key, value, ttl))

    def _write_held(self, what: str, write: Callable[[Ticket], bool]) -> None:
        """Write ``what`` by ``write(ticket)``, a backend's write if the held ticket's key exists (a mark, a record);
        a refused write marks the hold lost (with the usual signals) and raises ``LockLost``."""
        ticket = self._own_ticket()
        if ticket is None:
            raise self._not_owned(f"is not held by this handle: only a holder writes {what}")
        reason = self._lost_reason or self._check_deadlines()
        if reason is None:
            with self._context.open_for(f"write {what} of lock {self.name!r}"):
                if write(ticket):
                    return
            reason = f"its key is gone: {what} was not written"
            self._mark_lost(reason, ticket)
        raise LockLost(f"lock {self.name!r} (token {ticket.token}) was lost: {reason}", name=self.name)

    def _check_deadlines(self) -> str | None:
        """Mark the lock lost if its lease deadline or hold deadline passed (the keeper may not have run yet)."""
        session = self._session
        if self._own_ticket() is None or session is None:
            return None
        now = _clock.now()
        if session.expired(now):
            reason = session.why_expired()
        elif self._hold_deadline is not None and now >= self._hold_deadline and not self._handed_over:
            # (A handed-over hold that nobody took over in time is not lost: the keeper ends it, see hold_expired.)
            reason = f"held longer than max_hold={self.max_hold:g} s"
        else:
            return None
        self._mark_lost(reason)
        return reason

    def _mark_lost(self, reason: str, ticket: Ticket | None = None) -> None:
        """Mark the current hold lost (only if it is still the hold of ``ticket``, when given)."""
        with self._mutex:
            if self._lost_reason is not None or self._ticket is None or ticket not in (None, self._ticket):
                return
            self._lost_reason = reason
        self._lost_event.set()
        _metrics.lock_lost(self._metric_attributes)
        log.warning("distlock: lock %r lost: %s", self.name, reason)
        self._lost_hooks.fire()  # last: a main-thread scope's signal may raise LockLost in this thread

    def scope(self) -> _stop.ThreadScope:
        """``with lock.scope():`` raises ``LockLost`` in its body when this hold is lost (main thread only; lost.md)."""
        return _stop.ThreadScope((self,))

    def _call_on_lost(self) -> None:
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("distlock: on_lost callback for %r raised", self.name)

    # Member protocol (called by the keeper thread)

    @property
    def hold_deadline(self) -> float | None:
        return self._hold_deadline if self._ticket is not None and self._lost_reason is None else None

    def session_lost(self, reason: str) -> None:
        if (wake := self._wake) is not None:
            wake.fire(_LEASE_LOST)
        ticket = self._ticket  # a hold handed over ends quietly with its client: it was given away, not lost
        if ticket is not None and not (reason == CLIENT_CLOSED and self._handed_over and self._end_handed_over(ticket)):
            self._mark_lost(reason)

    @property
    def held_ticket(self) -> Ticket | None:
        return self._own_ticket() if self._lost_reason is None else None

    def ticket_gone(self, ticket: Ticket) -> None:
        if self._handed_over and self._end_handed_over(ticket):
            self._stray_done()
            return  # a successor took it over: the end hand_over() waited for, not a loss
        self._mark_lost("its key was removed while its lease lived (force-released by an operator, or deleted)", ticket)

    def hold_expired(self) -> None:
        ticket, session = self._ticket, self._session
        if ticket is None or session is None:
            return
        if self._handed_over:
            if self._end_handed_over(ticket):
                log.warning("distlock: lock %r was not taken over in time after hand_over(); releasing it", self.name)
                self._context.keeper.defer(functools.partial(self._give_up, ticket, session))
            return
        self._mark_lost(f"held longer than max_hold={self.max_hold:g} s")
        # Deleting the key talks to the server: off the keeper thread, which must go on refreshing leases.
        self._context.keeper.defer(functools.partial(self._give_up, ticket, session))

    # -- handing over -----------------------------------------------------------------------------------------

    def hand_over(self, timeout: float) -> None:
        """Keep this hold only until a successor takes it over (:meth:`take_over` with this hold's ``token``), at
        most ``timeout`` more seconds (and never past ``max_hold``).

        For a lock that must pass to another process without a gap: the Celery integration's reservations. The hold
        goes on as before (its lease is refreshed; a crash of this process frees it within ``ttl``), but the handle no
        longer counts as the caller's lock (``current_lock()`` skips it), and its key's removal is the end it waits
        for, not a loss: the handle stops being held, quietly, when the client next checks its keys (after a lease
        refresh, about every third of ``ttl``; no request per handle) or closes. When ``timeout`` passes first, the key
        is removed and a warning logged. ``release()`` still ends the hold at once. Raises ``LockNotOwned`` if not
        held, ``LockLost`` if lost, ``ConfigurationError`` for a bad ``timeout``.
        """
        timeout = seconds(timeout, "timeout (how long to wait for a successor)", allow_zero=True)
        self.ensure_held()
        with self._mutex:
            deadline = _clock.now() + timeout
            self._hold_deadline = deadline if self._hold_deadline is None else min(self._hold_deadline, deadline)
            self._handed_over = True
        self._leave_context()
        self._context.keeper.changed()

    def _end_handed_over(self, ticket: Ticket) -> bool:
        """End a handed-over hold of ``ticket`` locally (its key is gone, or about to be removed); False when the
        handle holds something else by now."""
        with self._mutex:
            session = self._session
            if self._ticket != ticket or session is None or self._lost_reason is not None:
                return False
            self._ticket = None
            self._session = None
            self._hold_deadline = None
            self._handed_over = False
        _metrics.lock_released(self._metric_attributes, _clock.now() - self._acquired_at)
        self._context.keeper.detach(session, self)
        return True

    # -- releasing --------------------------------------------------------------------------------------------

    def release(self) -> None:
        """Release the lock. Raises ``LockLost`` if it was lost while held (after making sure no newer holder's
        key is touched), ``LockNotOwned`` if this handle does not hold it (in a forked child: the parent holds it),
        ``ClientClosed`` if the client was closed (which released it)."""
        with self._mutex:
            ticket, session = self._own_ticket(), self._session
            if ticket is None or session is None:
                raise self._not_owned("is not held by this handle")
            self._ticket = None
            self._session = None
            self._hold_deadline = None
            self._handed_over = False
            reason = self._lost_reason
        _metrics.lock_released(self._metric_attributes, _clock.now() - self._acquired_at)
        self._leave_context()
        self._context.keeper.detach(session, self)
        if reason is None and session.expired():
            reason = session.why_expired()
        if self._context.closed:
            raise ClientClosed(f"lock {self.name!r}: the distlock client was closed (which released the lock)")
        removed = True
        try:
            with self._context.open_for(f"release lock {self.name!r}", new_work=False):
                removed = self._context.backend.dequeue(ticket)
            self._context.keeper.left(session, ticket)
        except BackendError as e:
            log.warning("distlock: release of %r not confirmed (%s); retrying in the background", self.name, e)
            self._context.keeper.orphan(ticket, session)
        finally:
            self._stray_done()
        if reason is None and not removed:
            reason = "its key was already gone (the lease expired or was revoked)"
        if reason is not None:
            raise LockLost(
                f"lock {self.name!r} (token {ticket.token}) was lost before release: {reason}. "
                "Another holder may have run concurrently; only fenced writes were protected.",
                name=self.name,
            )

    def __enter__(self) -> Self:
        scope = self.scope() if self._stop_on_lost else None  # in another thread: ConfigurationError, before waiting
        if not self.acquire():
            raise LockNotAcquired(
                f"lock {self.name!r} not acquired within {self.timeout:g} s (timeout); it is held by another holder",
                name=self.name,
            )
        self._scope = scope and _stop.enter_or_release(scope, self.release)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        scope, self._scope = self._scope, None
        try:
            if scope is not None:
                scope.__exit__(kind, value, traceback)  # first: a loss from here on no longer stops the body
        finally:
            if self._own_ticket() is not None:  # else released in the body, or a forked child leaving its parent's
                try:
                    self.release()
                except (LockLost, ClientClosed):
                    if kind is None:
                        raise
                    # The body's own exception matters more; the loss is logged by _mark_lost.
