"""Leader election: one leader per name among any number of candidates, and the term is a fencing token.

``client.election("scheduler")`` is composition over the public lock API: a candidate is a :class:`~distlock.Lock`
whose owner is its *value* (``"host:pid"`` unless given), so anyone reads who leads (``leader()``, from the lock's
head). ``campaign()`` waits to lead, ``resign()`` steps down (the longest-waiting candidate leads next), and the
**term** is the leader's fencing token, so the database integrations refuse a deposed leader's writes as they refuse
a lock's stale holder. A leader that stops answering is deposed when its lease runs out; until it learns so
(``lost``, ``ensure_held()``, ``on_lost``) it may still believe it leads: the term, not the belief, decides.
``observe()`` yields the leader each time it changes: on a backend that can watch a lock's head
(``HeadWatching``: etcd, ZooKeeper, memory) it waits on the watch and reads again when it fires, else (and at least
every ``poll`` seconds, in case a watch broke unseen) it reads the head every ``poll`` seconds.

The election keeps one **record** that only the leader writes (``record()``) and the next reads (``recorded()``),
such as the ticks ``distlock.celery.LeaderScheduler`` sent. Records are the optional ``Recording`` capability of a
backend: the backend checks that the writer still leads in the same atomic step as the write.

What can go wrong: a bad ``value``, ``poll``, record or option raises ``ConfigurationError`` where it is given;
``client.election()`` raises ``ConfigurationError`` on a backend that keeps no records (``Backend.unsupported``); a
deposed leader's ``record()`` raises ``LockLost``; otherwise as :class:`~distlock.Lock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Self, Unpack

from . import _clock
from ._asynclock import AsyncLock
from ._errors import ConfigurationError, LockNotAcquired
from ._lock import Fence, Lock
from ._lockoptions import LockOptions
from ._protocol import Head, Interrupt
from ._seconds import seconds
from ._stop import TaskScope, ThreadScope, enter_or_release

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["AsyncElection", "Election", "Leader"]


@dataclass(frozen=True)
class Leader:
    """Who leads an election (its candidate's ``value``) and in which ``term`` (the leader's fencing token)."""

    value: str
    term: int


class Election:
    """One candidate in the election ``name``. Create with ``client.election(name, value=..., ttl=...)``.

    The options are a lock's (:class:`~distlock.LockOptions`, except ``owner``: the candidate's ``value`` is its
    owner); ``ttl`` is how long a silent leader keeps leading, ``timeout`` how long ``campaign()`` waits by default.
    """

    def __init__(self, context: Context, name: str, value: str | None = None, **options: Unpack[LockOptions]) -> None:
        if "owner" in options:
            raise ConfigurationError("an election's candidate is named by value=..., not owner=...")
        if value is None:
            value = f"{socket.gethostname()}:{os.getpid()}"
        candidate: LockOptions = {**options, "owner": value}
        self._lock = Lock(context, name, **candidate)
        self._context = context
        self._records = context.records(f"election {name!r}")
        self.value = value

    @property
    def name(self) -> str:
        return self._lock.name

    @property
    def lock(self) -> Lock:
        """The lock under this candidacy (held while leading)."""
        return self._lock

    def __repr__(self) -> str:
        state = f"leading term {self._lock.token}" if self._lock.owned() else "not leading"
        return f"<distlock.Election {self.name!r} value={self.value!r} {state}>"

    # -- leading ----------------------------------------------------------------------------------------------

    def campaign(self, timeout: float | None = None) -> bool:
        """Wait to lead; True once leading, False when ``timeout`` ran out (None: the ``timeout`` option;
        ``math.inf``: forever). Raises as :meth:`Lock.acquire`."""
        return self._lock.acquire(True, timeout)

    def resign(self) -> None:
        """Step down: the next candidate leads at once. Raises ``LockLost`` if this candidate had been deposed
        meanwhile (its lease ran out), ``LockNotOwned`` if it was not leading."""
        self._lock.release()

    def is_leader(self) -> bool:
        """True while this candidate leads and is not known to be deposed (a local check)."""
        return self._lock.owned()

    @property
    def term(self) -> int:
        """The term this candidate leads in: its fencing token. Raises ``LockNotOwned`` when not leading."""
        return self._lock.token

    @property
    def fence(self) -> Fence:
        """The fencing token with the election's name, for fenced writes. Raises when not leading."""
        return self._lock.fence

    @property
    def lost(self) -> bool:
        """True once this leader is known deposed (lease expired or revoked, ``max_hold`` passed)."""
        return self._lock.lost

    def ensure_held(self, verify: bool = False) -> None:
        """Raise ``LockLost`` if deposed, ``LockNotOwned`` if not leading (see :meth:`Lock.ensure_held`)."""
        self._lock.ensure_held(verify)

    def scope(self) -> ThreadScope:
        """``with election.scope():`` stops its body when this leader is deposed (as :meth:`Lock.scope`)."""
        return self._lock.scope()

    def record(self, value: bytes | str) -> None:
        """Store ``value`` (1 byte to 512 KiB; a str is stored as UTF-8) as the election's record, if this
        candidate still leads: the server checks that in the same step. Raises ``LockNotOwned`` when not leading,
        ``LockLost`` when deposed (the write is refused; ``lost`` turns true)."""
        data = _record_bytes(value)
        self._lock._write_held("the record", lambda ticket: self._records.write_record(ticket, data))

    def recorded(self) -> bytes | None:
        """The election's record as the last leader wrote it (asks the server), or None when none was written."""
        with self._context.open_for(f"read the record of election {self.name!r}"):
            return self._records.read_record(self.name)

    def __enter__(self) -> Self:
        scope = self.scope() if self._lock._stop_on_lost else None  # in another thread: ConfigurationError, first
        if not self.campaign():
            raise LockNotAcquired(
                f"election {self.name!r}: not leading within {self._lock.timeout:g} s (timeout)", name=self.name
            )
        self._lock._scope = scope and enter_or_release(scope, self._lock.release)  # left by the lock's __exit__
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._lock.__exit__(kind, value, traceback)

    # -- following --------------------------------------------------------------------------------------------

    def leader(self) -> Leader | None:
        """Who leads now (asks the server), or None when nobody does."""
        return _leader_of(self._head())

    def _head(self) -> Head | None:
        self._context.check_open()
        return self._context.head(self.name)

    def _watch(self, seen: Head | None, wait: float, interrupt: Interrupt) -> bool:
        """Wait up to ``wait`` s on the service's watch for the head to change from ``seen``; False when it has none."""
        return self._context.watch_head(self.name, None if seen is None else seen.ticket, wait, interrupt)

    def observe(
        self, timeout: float | None = None, poll: float = 0.25, stop: threading.Event | None = None
    ) -> Iterator[Leader | None]:
        """Yield the leader now, then again each time it changes (a new term, or None when nobody leads), until
        ``timeout`` seconds have passed (None: forever) or ``stop`` is set. Waits on the service's watch where it
        has one (etcd, ZooKeeper), reading again when it fires and at least every ``poll`` seconds; elsewhere reads
        the holder every ``poll`` seconds. A bad ``timeout`` or ``poll`` raises ``ConfigurationError`` here, not at
        the first step."""
        return self._follow(_Following(timeout, poll), stop)

    def _follow(self, following: _Following, stop: threading.Event | None) -> Iterator[Leader | None]:
        pause = stop or threading.Event()
        while True:
            head = self._head()
            now = _leader_of(head)
            if following.changed(now):
                yield now
            wait = following.pause()
            if wait is None or pause.is_set():
                return
            with _fired_by(stop) as interrupt:
                watched = self._watch(head, wait, interrupt)
            if pause.is_set() or (not watched and pause.wait(wait)):
                return


#: The largest record accepted: well inside every backend's request limit (etcd 1.5 MiB, ZooKeeper 1 MiB).
MAX_RECORD_BYTES = 512 * 1024


def _leader_of(head: Head | None) -> Leader | None:
    return None if head is None else Leader(head.holder.owner, head.holder.token)


#: How often a watch's helper thread looks at ``observe()``'s ``stop`` (an Event calls nobody back when set).
STOP_CHECK = 0.05


@contextlib.contextmanager
def _fired_by(stop: threading.Event | None) -> Iterator[Interrupt]:
    """An interrupt for one watch, fired within ``STOP_CHECK`` s once ``stop`` is set (a helper thread looks at it
    while the watch lasts: the watch blocks in the service's client, which only an :class:`Interrupt` wakes)."""
    interrupt = Interrupt()
    if stop is None:
        yield interrupt
        return
    done = threading.Event()

    def look() -> None:
        while not done.is_set():
            if stop.wait(STOP_CHECK):
                interrupt.fire("observe() was stopped")
                return

    threading.Thread(target=look, name="distlock-observe-stop", daemon=True).start()
    try:
        yield interrupt
    finally:
        done.set()


def _record_bytes(value: object) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, bytes):
        raise ConfigurationError(f"an election's record is bytes or str, not {type(value).__name__}")
    if not 0 < len(value) <= MAX_RECORD_BYTES:
        raise ConfigurationError(
            f"an election's record is 1 byte to {MAX_RECORD_BYTES // 1024} KiB, not {len(value)} bytes"
        )
    return value


class _Following:
    """The bookkeeping of ``observe()``, sync or async: what was yielded last, and how long to pause next."""

    def __init__(self, timeout: float | None, poll: float) -> None:
        self.poll = seconds(poll, "poll (seconds between reads)")
        limit = seconds(timeout, "timeout", allow_none=True, allow_zero=True, allow_forever=True)
        self.deadline = None if limit is None else _clock.now() + limit
        self.seen: Leader | bool | None = False  # nothing yielded yet

    def changed(self, now: Leader | None) -> bool:
        if now == self.seen:
            return False
        self.seen = now
        return True

    def pause(self) -> float | None:
        """Seconds to wait before the next read; None once the timeout has passed."""
        if self.deadline is None:
            return self.poll
        left = self.deadline - _clock.now()
        return None if left <= 0 else min(self.poll, left)


class AsyncElection:
    """The asyncio twin of :class:`Election`: ``await e.campaign()``, ``await e.resign()``, ``async with``,
    ``async for leader in e.observe()``."""

    def __init__(self, election: Election) -> None:
        self._election = election
        self._async = AsyncLock(election.lock)

    @property
    def sync(self) -> Election:
        return self._election

    @property
    def name(self) -> str:
        return self._election.name

    @property
    def value(self) -> str:
        return self._election.value

    @property
    def term(self) -> int:
        return self._election.term

    @property
    def fence(self) -> Fence:
        return self._election.fence

    @property
    def lost(self) -> bool:
        return self._election.lost

    def is_leader(self) -> bool:
        return self._election.is_leader()

    async def campaign(self, timeout: float | None = None) -> bool:
        return await self._async.acquire(True, timeout)

    async def resign(self) -> None:
        await self._async.release()

    async def ensure_held(self, verify: bool = False) -> None:
        await self._async.ensure_held(verify)

    def scope(self) -> TaskScope:
        """``async with election.scope():`` stops its body when this leader is deposed (as ``AsyncLock.scope``)."""
        return self._async.scope()

    async def record(self, value: bytes | str) -> None:
        await asyncio.to_thread(self._election.record, value)

    async def recorded(self) -> bytes | None:
        return await asyncio.to_thread(self._election.recorded)

    async def leader(self) -> Leader | None:
        return await asyncio.to_thread(self._election.leader)

    def observe(self, timeout: float | None = None, poll: float = 0.25) -> AsyncIterator[Leader | None]:
        """``async for leader in election.observe()``: as :meth:`Election.observe`."""
        return self._follow(_Following(timeout, poll))

    async def _follow(self, following: _Following) -> AsyncIterator[Leader | None]:
        while True:
            head = await asyncio.to_thread(self._election._head)
            now = _leader_of(head)
            if following.changed(now):
                yield now
            wait = following.pause()
            if wait is None:
                return
            interrupt = Interrupt()
            try:
                watched = await asyncio.to_thread(self._election._watch, head, wait, interrupt)
            except asyncio.CancelledError:
                interrupt.fire("the observing task was cancelled")  # ends the watch's thread at once
                raise
            if not watched:
                await asyncio.sleep(wait)

    async def __aenter__(self) -> Self:
        if not await self.campaign():
            raise LockNotAcquired(
                f"election {self.name!r}: not leading within {self._election.lock.timeout:g} s (timeout)",
                name=self.name,
            )
        await self._async._enter_scope()  # left by the lock's __aexit__
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self._async.__aexit__(kind, value, traceback)
