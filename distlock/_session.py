"""Sessions: one lease per client and TTL, kept alive by one background thread, and the deadline that says "lost".

Every lock a client takes with the same TTL hangs on one lease, so holding 10,000 locks costs one refresh every TTL/3,
not 10,000. The keeper thread refreshes each lease and keeps a *deadline* per lease on the boot-time clock: the time
the last successful refresh was **sent** plus the TTL the server granted, less a margin. The server restarted its TTL
countdown no earlier than that send, so until the deadline the lease cannot have expired. When a refresh answers
"lease gone", or the deadline passes without a successful refresh (etcd unreachable, or this process was paused —
SIGSTOP, a GC pause, a suspended laptop), the session is *lost*: every lock held on it is marked lost (flag, event,
callback), every waiter on it is woken to queue again on a new lease, and the old lease is revoked, best effort, so
the server agrees with what the locks now say. A lost session is never revived.

The keeper also enforces each held lock's maximum hold time (it deletes the lock's key, revision-checked, and marks it
lost), and keeps retrying deletions that failed when the server was away ("orphans"), so that a waiter that gave up
during an outage cannot block its queue for as long as its lease lives.

What can go wrong: a user ``on_lost`` callback runs on the keeper thread and must be quick; an exception in it is
logged, not raised. After ``fork()`` the child gets an empty keeper: the parent's leases are neither refreshed nor
revoked by the child.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Protocol

from . import _clock
from ._errors import ClientClosed, DistlockError
from ._protocol import Backend, Lease, LeaseGone, Ticket

__all__ = ["Keeper", "Member", "Session"]

log = logging.getLogger("distlock")

#: Refresh a lease this many times per TTL.
REFRESHES_PER_TTL = 3
#: How long a failed revoke or orphan deletion may block the keeper thread.
CLEANUP_BUDGET = 1.0


class Member(Protocol):
    """A lock holding or waiting on a session: told when the session is lost and when its hold time runs out."""

    @property
    def hold_deadline(self) -> float | None: ...

    def session_lost(self, reason: str) -> None: ...

    def hold_expired(self) -> None: ...


def _margin(ttl: float) -> float:
    """Safety margin subtracted from a lease deadline: covers clock-rate differences and request latency."""
    return min(max(0.05 * ttl, 0.1), 2.0)


@dataclass(eq=False)
class Session:
    """One lease and what hangs on it."""

    lease: Lease
    ttl: float
    deadline: float
    sent_at: float
    next_refresh: float
    members: set[Member] = field(default_factory=set)
    lost_reason: str | None = None
    last_error: str | None = None

    def expired(self, now: float | None = None) -> bool:
        return self.lost_reason is not None or (_clock.now() if now is None else now) >= self.deadline

    def why_expired(self) -> str:
        if self.lost_reason is not None:
            return self.lost_reason
        silence = _clock.now() - self.sent_at
        cause = f" (last error: {self.last_error})" if self.last_error else " (process paused, or keep-alive late)"
        return f"lease {self.lease.id:x} not refreshed for {silence:.1f} s, past its {self.lease.ttl:g} s TTL{cause}"


class Keeper:
    """Owns a client's sessions and the background thread that keeps them alive."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._init_state()

    def _init_state(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._grant_mutex = threading.Lock()
        self._sessions: dict[float, Session] = {}
        self._orphans: list[tuple[Ticket, Session]] = []
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- used by locks ----------------------------------------------------------------------------------------

    def session(self, ttl: float) -> Session:
        """The live session for ``ttl``, granting a new lease when there is none."""
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
                next_refresh=sent + ttl / REFRESHES_PER_TTL,
            )
            with self._cond:
                if self._closed:
                    closed = True
                else:
                    closed = False
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

    def orphan(self, ticket: Ticket, session: Session) -> None:
        """Keep trying to delete ``ticket`` in the background (its deletion failed while the server was away)."""
        with self._cond:
            self._orphans.append((ticket, session))
            self._start_thread()
            self._cond.notify_all()

    def declare_lost(self, session: Session, reason: str) -> None:
        """Mark ``session`` lost (once), tell its members, and revoke its lease."""
        with self._cond:
            if session.lost_reason is not None:
                return
            session.lost_reason = reason
            if self._sessions.get(session.ttl) is session:
                del self._sessions[session.ttl]
            members = list(session.members)
        log.warning("distlock session lost: %s", reason)
        for member in members:
            member.session_lost(reason)
        self._revoke(session)

    def close(self) -> None:
        """Stop the thread and revoke every lease (which frees every lock this client holds)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._sessions.values())
            self._sessions.clear()
            self._cond.notify_all()
            thread = self._thread
        for session in sessions:
            with self._cond:
                session.lost_reason = "the distlock client was closed"
                members = list(session.members)
            for member in members:
                member.session_lost("the distlock client was closed")
            self._revoke(session)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=CLEANUP_BUDGET + 1)

    def after_fork(self) -> None:
        """In a forked child: forget the parent's sessions (the parent still refreshes them) and its thread."""
        self._init_state()

    # -- the keeper thread ------------------------------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="distlock-keeper", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = _clock.now()
                wake = math.inf
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
                orphans, self._orphans = self._orphans, []
                if not (refresh or expired or holds or orphans):
                    self._cond.wait(timeout=None if wake == math.inf else max(wake - now, 0.001))
                    continue
            for session in expired:
                self.declare_lost(session, session.why_expired())
            for session in refresh:
                self._refresh(session)
            for member in holds:
                member.hold_expired()
            retry = [(t, s) for t, s in orphans if not self._delete_orphan(t, s)]
            if retry:
                with self._cond:
                    self._orphans.extend(retry)
                    if not self._closed:
                        self._cond.wait(timeout=0.2)

    def _refresh(self, session: Session) -> None:
        sent = _clock.now()
        try:
            # Never block past the deadline: a late answer is worth nothing, and other sessions wait on us.
            remaining = self._backend.keep_alive(session.lease.id, max(session.deadline - sent, 0.05))
        except LeaseGone:
            remaining = 0.0
        except DistlockError as e:
            # Retry soon; the deadline decides when this becomes "lost".
            session.last_error = str(e)
            session.next_refresh = _clock.now() + min(0.25, session.ttl / 10)
            log.info("distlock keep-alive of lease %x failed: %s", session.lease.id, e)
            return
        if remaining <= 0:
            self.declare_lost(session, f"lease {session.lease.id:x} expired on the server")
            return
        session.last_error = None
        session.sent_at = sent
        session.deadline = sent + remaining - _margin(session.lease.ttl)
        session.next_refresh = sent + session.ttl / REFRESHES_PER_TTL

    def _revoke(self, session: Session) -> None:
        try:
            self._backend.revoke_lease(session.lease.id)
        except DistlockError as e:
            log.info("distlock could not revoke lease %x (it expires by itself): %s", session.lease.id, e)

    def _delete_orphan(self, ticket: Ticket, session: Session) -> bool:
        if session.lost_reason is not None:
            return True  # the lease was revoked, or expired: the key went with it
        try:
            self._backend.dequeue(ticket)
        except DistlockError:
            return False
        return True
