"""The locks a lock benchmark measures: each library's lock as a session, and the :class:`Plan` that names them.

A :class:`Session` is one lock library used the way an application uses it (one client, a new lock object per
attempt; :class:`LockSession` is that common shape, :class:`DistlockSession` distlock's on whichever backend a URL
names); a :class:`BlockingSession` can also wait with a timeout, for the contention runs. A :class:`Plan` names the
locks, their labels, and which of them contend. Session factories are classes, so that a spawned process gets them
by name; an uncontended acquire that fails raises (there is nothing to wait for), which the measuring process
reports as that lock's error.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import distlock

__all__ = [
    "TTL",
    "BlockingSession",
    "BlockingSessionFactory",
    "DistlockSession",
    "LockSession",
    "Plan",
    "Session",
    "SessionFactory",
]

#: The lease (TTL) of the locks the lock benchmarks measure, in seconds.
TTL = 30


class Session(Protocol):
    def cycle(self) -> None:
        """One uncontended acquire + release, written the way an application writes it."""

    def close(self) -> None: ...


class BlockingSession(Session, Protocol):
    def acquire(self, timeout: float) -> bool: ...

    def release(self) -> None: ...


SessionFactory = Callable[[str, str], Session]
BlockingSessionFactory = Callable[[str, str], BlockingSession]


class LockSession(abc.ABC):
    """A lock library used the way an application uses it: one client, a new lock object per attempt. A subclass
    says how to make a lock object and how to acquire it; its lock objects have ``release()``."""

    def __init__(self) -> None:
        self._held: Any = None

    @abc.abstractmethod
    def new_lock(self) -> Any: ...

    @abc.abstractmethod
    def take(self, lock: Any, timeout: float | None) -> bool:
        """Acquire ``lock``, waiting at most ``timeout`` s (None: as long as it takes)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def cycle(self) -> None:
        lock = self.new_lock()
        if not self.take(lock, None):
            raise RuntimeError(f"{type(self).__name__}: acquire() failed without contention")
        lock.release()

    def acquire(self, timeout: float) -> bool:
        lock = self.new_lock()
        if not self.take(lock, timeout):
            return False
        self._held = lock
        return True

    def release(self) -> None:
        self._held.release()
        self._held = None


class DistlockSession(LockSession):
    """distlock's lock, on whichever backend ``url`` names."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__()
        self._client = distlock.connect(url)
        self._name = name

    def new_lock(self) -> distlock.Lock:
        return self._client.lock(self._name, ttl=TTL)

    def take(self, lock: Any, timeout: float | None) -> bool:
        return bool(lock.acquire(timeout=timeout))

    def cycle(self) -> None:
        with self.new_lock():
            pass

    def close(self) -> None:
        self._client.close()


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a lock benchmark measures: each lock's label in the tables, how to open a session on it (a class, so
    that it reaches a spawned process by name), and which locks contend, with their blocking sessions."""

    labels: Mapping[str, str]
    sessions: Mapping[str, SessionFactory]
    contenders: Mapping[str, BlockingSessionFactory]
    #: How many may hold at once: 1 for locks, the limit for semaphores (exclusion then means "never more").
    limit: int = 1
