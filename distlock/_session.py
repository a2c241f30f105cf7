"""Sessions: one lease per client and TTL, kept alive by one background thread, and the deadline that says "lost".

Every lock a client takes with the same TTL hangs on one lease, refreshed every third of the TTL the server *granted*
(at least :data:`MIN_TTL`, one second). The keeper keeps a deadline per lease on the boot-time clock: the time the last
successful refresh was **sent** plus the granted TTL, less a margin. When a refresh answers "lease gone" or the deadline
passes, the session is *lost* for good: its held locks are marked lost, its waiters woken to queue again on a new lease,
and the lease revoked, best effort. A second thread, the *cleaner*, does everything else that talks to the server or
runs user code (revokes, ``max_hold`` removals, orphan deletions, ``on_lost`` callbacks, the check after each refresh
that held tickets are still there, and the sweep of *strays*, tickets a late copy of a retried join may make), so
nothing slow stands between a lease and its next refresh. A join's nonce is a *seat* of its session, reused once its
ticket is gone (``Keeper.join_started``), so a lock's keys do not pile up with its acquisitions. Why each of these
exists: docs/design.md, "The session keeper".

What can go wrong: neither thread dies of an exception: one that escapes is logged (logger ``distlock``) and the
thread goes on; the deadline still decides when a session is lost. A slow ``on_lost`` delays the clean-up queued
behind it, never a refresh. ``close()`` revokes every lease and waits a little for the cleaner. After ``fork()`` the
child gets an empty keeper and no threads: the parent's leases are neither refreshed nor revoked by the child.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from . import _clock
from ._errors import ClientClosed, DistlockError
from ._protocol import Backend, Lease, LeaseGone, Ticket
from ._shape import seat_nonce

__all__ = ["CLIENT_CLOSED", "MIN_TTL", "Keeper", "Member", "Session", "Stray"]

log = logging.getLogger("distlock")

#: What a client's close does to the locks on its sessions (``Member.session_lost``'s reason).
CLIENT_CLOSED = "the distlock client was closed"

#: The shortest lease asked of a server, in seconds: a shorter ``ttl`` gets this. Below about a second the safety
#: margin and one refresh interval leave a refresh no time to be late (etcd's own minimum is a second or more).
MIN_TTL = 1.0
#: Refresh a lease this many times per granted TTL.
REFRESHES_PER_TTL = 3
#: How long ``close()`` waits for each background thread to finish what it is doing.
CLOSE_WAIT = 2.0
#: Pause between attempts to delete orphans while the server is away.
ORPHAN_RETRY = 0.2
#: The longest a revoke waits for the joins under way on its lease (each bounded by its request timeout).
JOIN_WAIT = 10.0

#: The most strays a session remembers (the oldest are forgotten, with a warning, past this).
MAX_STRAYS = 1000
#: A stray is looked for again after at most this many refresh intervals.
_STRAY_SPACING = 1024
#: The longest a background thread sleeps at once: whatever a server answers, a wait never overflows.
_MAX_SLEEP = 60.0


class Member(Protocol):
    """A lock holding or waiting on a session: told when the session is lost and when its hold time runs out.

    Both calls come from the keeper thread and must not block: work that talks to the server or runs user code goes
    to :meth:`Keeper.defer`.
    """

    @property
    def hold_deadline(self) -> float | None: ...

    def session_lost(self, reason: str) -> None: ...

    def hold_expired(self) -> None: ...

    @property
    def held_ticket(self) -> Ticket | None:
        """The ticket this member holds and does not know lost, if any."""

    def ticket_gone(self, ticket: Ticket) -> None:
        """The key of ``ticket`` was found gone while its lease lives (force-released)."""


def _margin(ttl: float) -> float:
    """Safety margin subtracted from a lease deadline: covers clock-rate differences and request latency."""
    return min(max(0.05 * ttl, 0.1), 2.0)


@dataclass(eq=False)
class Stray:
    """The key of lock ``name`` that a join with ``nonce`` makes, which a late copy of that join may make again.

    ``active`` while a lock still waits on or holds the key; then the cleaner looks for it (see the module). Its
    seat is retired (``Session.retired``): no later join of the session makes that key, so what the cleaner finds
    there is the stray's.
    """

    name: str
    nonce: str
    active: bool = True
    checks: int = 0
    next_check: float = 0.0


@dataclass(eq=False)
class Session:
    """One lease and what hangs on it. ``ttl`` is what was asked (the key among a client's sessions);
    ``lease.ttl`` is what the server granted, which the schedule follows."""

    lease: Lease
    ttl: float
    deadline: float
    sent_at: float
    next_refresh: float
    members: set[Member] = field(default_factory=set)
    lost_reason: str | None = None
    last_error: str | None = None
    #: A check of the held keys is queued or running (see ``Keeper._check_held``).
    checking: bool = False
    #: Keys that late copies of this session's joins may make (see :class:`Stray`); a sweep is queued or running.
    strays: list[Stray] = field(default_factory=list)
    sweeping: bool = False
    #: The tickets joined on this lease and not known removed, each with its nonce: a revoke names them to the backend
    #: (Redis cannot remove a lease's keys with it). ``revoked``: the revoke has read them; a join answered after it
    #: removes its own key.
    joined: dict[Ticket, str] = field(default_factory=dict)
    #: The seats, ``(lock name, nonce)``, a new join on this lease may not take (see :meth:`Keeper.join_started`):
    #: those of joins under way or joined and not known removed, and those in ``retired``.
    seats: set[tuple[str, str]] = field(default_factory=set)
    #: The seats of joins whose outcome was unknown (strays): never taken again on this lease, even once their stray
    #: is forgotten (:data:`MAX_STRAYS`), so that a key with one of them is only ever that join's or its late copy's.
    retired: set[tuple[str, str]] = field(default_factory=set)
    revoked: bool = False
    #: Joins under way on this lease: a revoke waits for them (at most ``JOIN_WAIT``), so that it can name their keys.
    joining: int = 0

    @property
    def refresh_interval(self) -> float:
        return self.lease.ttl / REFRESHES_PER_TTL

    def expired(self, now: float | None = None) -> bool:
        return self.lost_reason is not None or (_clock.now() if now is None else now) >= self.deadline

    def free_seat(self, name: str, nonce: str) -> None:
        """The join of ``name`` with ``nonce`` left no key: a new join may take its seat, unless it is retired."""
        if (name, nonce) not in self.retired:
            self.seats.discard((name, nonce))

    def why_expired(self) -> str:
        if self.lost_reason is not None:
            return self.lost_reason
        silence = _clock.now() - self.sent_at
        cause = f" (last error: {self.last_error})" if self.last_error else " (process paused, or keep-alive late)"
        return f"lease {self.lease.id:x} not refreshed for {silence:.1f} s, past its {self.lease.ttl:g} s TTL{cause}"


class Keeper:
    """Owns a client's sessions, the keeper thread that keeps them alive and the cleaner thread (see the module)."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._init_state()

    def _init_state(self) -> None:
        mutex = threading.Lock()
        self._cond = threading.Condition(mutex)  # the keeper thread's: sessions, hold deadlines, close
        self._work = threading.Condition(mutex)  # the cleaner's: jobs and orphans
        self._grant_mutex = threading.Lock()
        self._sessions: dict[float, Session] = {}
        self._jobs: list[Callable[[], None]] = []
        self._orphans: list[tuple[Ticket, Session]] = []
        self._thread: threading.Thread | None = None
        self._cleaner: threading.Thread | None = None
        self._closed = False

    # -- used by locks ----------------------------------------------------------------------------------------

    def session(self, ttl: float) -> Session:
        """The live session for ``ttl`` (at least :data:`MIN_TTL`), granting a new lease when there is none."""
        ttl = max(ttl, MIN_TTL)
        with self._grant_mutex:
            with self._cond:
                if self._closed:
                    raise ClientClosed("the distlock client is closed")
                current = self._sessions.get(ttl)
                if current is not None and not current.expired():
                    return current
            if current is not None:
                self.declare_lost(current, current.why_expired())
            sent = _clock.now()
            lease = self._backend.grant_lease(ttl)
            session = Session(
                lease=lease,
                ttl=ttl,
                deadline=sent + lease.ttl - _margin(lease.ttl),
                sent_at=sent,
                next_refresh=sent + lease.ttl / REFRESHES_PER_TTL,
            )
            with self._cond:
                closed = self._closed
                if not closed:
                    self._sessions[ttl] = session
                    self._start_thread()
                    self._cond.notify_all()
            if closed:
                self._revoke(session)
                raise ClientClosed("the distlock client is closed")
            return session

    def attach(self, session: Session, member: Member) -> None:
        # No wake-up for the thread: a member has no hold deadline until it holds, and then calls changed().
        with self._cond:
            session.members.add(member)

    def detach(self, session: Session, member: Member) -> None:
        with self._cond:
            session.members.discard(member)

    def changed(self) -> None:
        """A member's hold deadline changed: let the thread recompute when to wake."""
        with self._cond:
            self._cond.notify_all()

    def defer(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the cleaner thread, after the jobs before it; an exception it raises is logged.

        Jobs deferred while or after the client closes still run (the thread drains its queue, then ends)."""
        with self._work:
            self._jobs.append(job)
            self._start_cleaner()
            self._work.notify_all()

    def orphan(self, ticket: Ticket, session: Session) -> None:
        """Keep trying to delete ``ticket`` in the background (its deletion failed while the server was away)."""
        with self._work:
            if self._closed:
                return  # close() revoked the lease, and the key with it
            self._orphans.append((ticket, session))
            self._start_cleaner()
            self._work.notify_all()

    def stray(self, session: Session, name: str, nonce: str, *, active: bool = True) -> Stray:
        """Remember that a late copy of the join of ``name`` with ``nonce`` on ``session`` may make its key again.

        ``active=False``: nobody waits on the key (the join failed); otherwise call :meth:`stray_done` when done.
        """
        stray = Stray(name, nonce, active=active, next_check=_clock.now())
        with self._cond:
            session.retired.add((name, nonce))  # its seat, for good: see join_started
            session.seats.add((name, nonce))
            session.strays.append(stray)
            if len(session.strays) > MAX_STRAYS:
                forgotten = session.strays.pop(0)
                log.warning(
                    "distlock: more than %d joins of lease %x needed a retry; no longer looking for a late copy of "
                    "the join of %r",
                    MAX_STRAYS,
                    session.lease.id,
                    forgotten.name,
                )
        return stray

    def stray_done(self, stray: Stray) -> None:
        """The lock is done with the key of ``stray``: from now on a key found there is a late copy's."""
        with self._cond:
            stray.active = False
            stray.next_check = _clock.now()

    def declare_lost(self, session: Session, reason: str) -> None:
        """Mark ``session`` lost (once), tell its members, and revoke its lease (on the cleaner thread)."""
        with self._cond:
            if session.lost_reason is not None:
                return
            session.lost_reason = reason
            if self._sessions.get(session.ttl) is session:
                del self._sessions[session.ttl]
            members = list(session.members)
        log.warning("distlock session lost: %s", reason)
        for member in members:
            self._guarded(member.session_lost, reason)
        self.defer(functools.partial(self._revoke, session))

    def close(self) -> None:
        """Revoke every lease (which frees every lock this client holds) and stop both threads."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._sessions.values())
            self._sessions.clear()
            self._cond.notify_all()
            self._work.notify_all()
            keeper = self._thread
        for session in sessions:
            with self._cond:
                session.lost_reason = CLIENT_CLOSED
                members = list(session.members)
            for member in members:
                self._guarded(member.session_lost, CLIENT_CLOSED)
            self._revoke(session)
        with self._work:
            cleaner = self._cleaner  # running the callbacks of the locks just lost, if any
        for thread in (keeper, cleaner):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=CLOSE_WAIT)

    def after_fork(self) -> None:
        """In a forked child: forget the parent's sessions (the parent still refreshes them), jobs and threads."""
        self._init_state()

    # -- the keeper thread ------------------------------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="distlock-keeper", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                if not self._run_once():
                    return
            except Exception:
                log.exception("distlock keeper: unexpected error (carrying on)")
                with self._cond:
                    if not self._closed:
                        self._cond.wait(timeout=0.1)  # whatever it was, do not spin on it

    def _run_once(self) -> bool:
        """One round: wait until something is due, then do it. False once the keeper is closed."""
        with self._cond:
            if self._closed:
                return False
            now = _clock.now()
            wake = now + _MAX_SLEEP
            refresh: list[Session] = []
            expired: list[Session] = []
            holds: list[Member] = []
            for session in self._sessions.values():
                if now >= session.deadline:
                    expired.append(session)
                    continue
                if now >= session.next_refresh:
                    refresh.append(session)
                wake = min(wake, session.next_refresh, session.deadline)
                for member in session.members:
                    deadline = member.hold_deadline
                    if deadline is not None:
                        if now >= deadline:
                            holds.append(member)
                        else:
                            wake = min(wake, deadline)
            if not (refresh or expired or holds):
                self._cond.wait(timeout=max(wake - now, 0.001))
                return True
        for session in expired:
            self._guarded(self.declare_lost, session, session.why_expired())
        for session in refresh:
            self._guarded(self._refresh, session)
        for member in holds:
            self._guarded(member.hold_expired)
        return True

    def _refresh(self, session: Session) -> None:
        with self._cond:
            tickets = list(session.joined)  # as a revoke names them: every ticket not known removed
        sent = _clock.now()
        try:
            # Never block past the deadline: a late answer is worth nothing, and other sessions wait on us.
            remaining = self._backend.keep_alive(session.lease, tickets, max(session.deadline - sent, 0.05))
        except LeaseGone:
            remaining = 0.0
        except Exception as e:
            # Retry soon; the deadline decides when this becomes "lost".
            session.last_error = str(e) or type(e).__name__
            session.next_refresh = _clock.now() + min(0.25, session.refresh_interval / 3)
            if isinstance(e, DistlockError):
                log.info("distlock keep-alive of lease %x failed: %s", session.lease.id, e)
            else:
                log.exception("distlock keep-alive of lease %x raised unexpectedly", session.lease.id)
            return
        if remaining <= 0:
            self.declare_lost(session, f"lease {session.lease.id:x} expired on the server")
            return
        session.last_error = None
        session.sent_at = sent
        session.deadline = sent + remaining - _margin(session.lease.ttl)
        session.next_refresh = sent + session.refresh_interval
        self._check_held(session)
        self._sweep_strays(session)

    def _check_held(self, session: Session) -> None:
        """Queue one check, on the cleaner, that the keys of the locks held on ``session`` still exist.

        One request per lease and refresh interval (not per lock), and none for a lease that holds nothing. A lock
        released while the check is under way is not marked lost: a member acts only on the very ticket it holds.
        """
        with self._cond:
            if session.checking:
                return
            held = {ticket: member for member in session.members if (ticket := member.held_ticket) is not None}
            if not held:
                return
            session.checking = True
        self.defer(functools.partial(self._find_removed, session, held))

    def _find_removed(self, session: Session, held: dict[Ticket, Member]) -> None:
        try:
            if session.lost_reason is not None or self._closed:
                return
            gone = self._backend.missing_tickets(list(held))
        except LeaseGone:
            self.declare_lost(session, f"lease {session.lease.id:x} was not found on the server")
            return
        except DistlockError as e:
            log.info("distlock could not check the locks held on lease %x (next refresh will): %s", session.lease.id, e)
            return
        finally:
            session.checking = False
        for ticket in gone:
            self.left(session, ticket)
            self._guarded(held[ticket].ticket_gone, ticket)

    def _sweep_strays(self, session: Session) -> None:
        """Queue, on the cleaner, a look for the strays of ``session`` that are due (see :class:`Stray`)."""
        now = _clock.now()
        with self._cond:
            if session.sweeping:
                return
            due = [stray for stray in session.strays if not stray.active and stray.next_check <= now]
            if not due:
                return
            session.sweeping = True
        self.defer(functools.partial(self._sweep, session, due))

    def _sweep(self, session: Session, due: list[Stray]) -> None:
        try:
            for stray in due:
                if session.lost_reason is not None or self._closed:
                    return
                token = self._backend.discard(stray.name, session.lease, stray.nonce)
                if token is not None:
                    log.warning(
                        "distlock: a late copy of a retried join of lock %r made a key nobody waits on "
                        "(token %d); removed it",
                        stray.name,
                        token,
                    )
                with self._cond:
                    stray.checks += 1
                    spacing = min(2**stray.checks, _STRAY_SPACING)
                    stray.next_check = _clock.now() + spacing * session.refresh_interval
        except LeaseGone:
            self.declare_lost(session, f"lease {session.lease.id:x} was not found on the server")
        except DistlockError as e:
            log.info("distlock could not look for late joins on lease %x (next refresh will): %s", session.lease.id, e)
        finally:
            session.sweeping = False

    @staticmethod
    def _guarded(call: Callable[..., object], *args: object) -> None:
        """``call(*args)``, logging an exception instead of letting it end a background thread's loop."""
        try:
            call(*args)
        except Exception:
            log.exception("distlock: %s raised in a background thread (carrying on)", getattr(call, "__name__", call))

    # -- the cleaner thread -----------------------------------------------------------------------------------

    def _start_cleaner(self) -> None:
        # Called with the mutex held. The cleaner clears _cleaner itself (under the mutex) when it ends, so a job
        # queued as it ends starts a new one instead of being left behind.
        if self._cleaner is None:
            self._cleaner = threading.Thread(target=self._clean, name="distlock-cleaner", daemon=True)
            self._cleaner.start()

    def _clean(self) -> None:
        retry_at = -math.inf
        while True:
            with self._work:
                while not self._jobs and not (self._orphans and _clock.now() >= retry_at):
                    if self._closed and not self._jobs:
                        self._cleaner = None
                        return
                    pause = retry_at - _clock.now() if self._orphans else _MAX_SLEEP
                    self._work.wait(timeout=min(max(pause, 0.001), _MAX_SLEEP))
                jobs, self._jobs = self._jobs, []
                due = _clock.now() >= retry_at
                orphans, self._orphans = (self._orphans, []) if due else ([], self._orphans)
            for job in jobs:
                self._guarded(job)
            failed = [(t, s) for t, s in orphans if not self._delete_orphan(t, s)]
            if failed:
                with self._work:
                    if not self._closed:
                        self._orphans.extend(failed)
                        retry_at = _clock.now() + ORPHAN_RETRY

    def join_started(self, session: Session, name: str, kind: str) -> str:
        """A join of lock ``name`` with ``kind`` on ``session`` is under way: its nonce, the lowest free *seat*. Call
        :meth:`joined` when it has answered (or failed).

        A seat is taken until its ticket is known removed (:meth:`left`), and for the session's life once a join
        with it had an unknown outcome (:meth:`stray`). So the keys of a lock name grow with leases times holders
        at once, not with acquisitions (etcd's reads step over every key name ever made under a prefix), and a key
        with a retired seat can only be the stray's own or a late copy of it: what ``discard`` removes is never a
        live waiter's.
        """
        with self._cond:
            session.joining += 1
            seat = 0
            while (name, seat_nonce(kind, seat)) in session.seats:
                seat += 1
            session.seats.add((name, nonce := seat_nonce(kind, seat)))
            return nonce

    def joined(self, session: Session, name: str, nonce: str, ticket: Ticket | None) -> bool:
        """The join :meth:`join_started` gave ``nonce`` answered with ``ticket`` (None: it failed, and its seat is
        free unless the caller called :meth:`stray` for it). False when the lease was revoked meanwhile, too early to
        name the key (the revoke waited ``JOIN_WAIT`` in vain): the caller then removes it itself."""
        with self._cond:
            session.joining -= 1
            # Only a lost session's revoke waits for its joins; the keeper thread waits on this condition too, and is
            # not woken for every acquisition.
            if session.lost_reason is not None:
                self._cond.notify_all()
            if ticket is None:
                session.free_seat(name, nonce)
                return True
            if session.revoked:
                return False
            session.joined[ticket] = nonce
            return True

    def left(self, session: Session, ticket: Ticket) -> None:
        """``ticket``'s key is removed (released, given up, found gone): a revoke need not name it, and its seat is
        free again (unless retired)."""
        with self._cond:
            nonce = session.joined.pop(ticket, None)
            if nonce is not None:
                session.free_seat(ticket.name, nonce)

    def _revoke(self, session: Session) -> None:
        # Every ticket joined on the lease and not known removed, waiting or held or orphaned, whatever its lock
        # did since (a waiter woken by the loss leaves without removing its key, which goes with the lease
        # elsewhere); a join answered after this read removes its own key (``joined`` says False).
        with self._cond:
            self._cond.wait_for(lambda: session.joining == 0, timeout=JOIN_WAIT)
            session.revoked = True
            tickets = list(session.joined)
        with self._work:
            if self._closed:  # the revoke takes them with it
                self._orphans = [(ticket, owner) for ticket, owner in self._orphans if owner is not session]
        try:
            self._backend.revoke_lease(session.lease, tickets)
        except DistlockError as e:
            log.info("distlock could not revoke lease %x (it expires by itself): %s", session.lease.id, e)

    def _delete_orphan(self, ticket: Ticket, session: Session) -> bool:
        if session.lost_reason is not None:
            return True  # the lease was revoked, or expired: the key went with it
        try:
            self._backend.dequeue(ticket)
        except Exception as e:
            log.info("distlock could not delete %r's waiter yet: %s", ticket.name, e)
            return False
        self.left(session, ticket)
        return True
