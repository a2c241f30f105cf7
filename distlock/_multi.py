"""Several locks taken as one: all of them or none, without deadlock, each with its own fencing token.

``client.multi_lock(["account:7", "account:3"])`` is built on :class:`~distlock.Lock` alone, one handle per name,
and adds two rules. *One canonical order*: the names are taken sorted (``str`` order, the same in every process),
so two processes asking for ``{a, b}`` and ``{b, a}`` both queue for ``a`` first and no cycle can form.
*All or nothing*: ``acquire(timeout=T)`` has one deadline for the whole set; when it runs out, the wait is
cancelled or anything raises part-way, the locks already taken are released (in reverse order) first. Others may
have seen those locks held for that moment; nothing was written under them. While held, each lock is current for
its own name, so fenced rows find their own lock's token. docs/primitives.md has the user's view.

What can go wrong: an empty set, a single string where a list was meant, or a bad name raises
``ConfigurationError`` (``InvalidLockName``) from ``multi_lock()`` itself. ``lost`` is true once any lock is lost;
``release()`` releases every lock, even when one fails, then raises the first failure (``LockLost`` when one was
lost while held). Otherwise as :class:`~distlock.Lock`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Self, Unpack

from . import _clock
from ._asynclock import AsyncLock
from ._errors import ConfigurationError, DistlockError, LockNotAcquired
from ._lock import Fence, Lock
from ._lockoptions import LockOptions
from ._stop import TaskScope, ThreadScope, enter_or_release

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["AsyncMultiLock", "MultiLock"]


def _canonical(names: Iterable[str]) -> list[str]:
    if isinstance(names, str | bytes):
        raise ConfigurationError(
            f"multi_lock() takes a list of lock names, not one name ({names!r}); use client.lock() for one lock"
        )
    try:
        unique = set(names)
    except TypeError as e:
        raise ConfigurationError(f"multi_lock() takes a list of lock names (str), not {names!r}") from e
    if not unique:
        raise ConfigurationError("multi_lock() needs at least one lock name")
    strays = [name for name in unique if not isinstance(name, str)]
    if strays:
        raise ConfigurationError(f"lock names are str, not {strays[0]!r}")
    return sorted(unique)


class MultiLock:
    """Locks on several names, taken in one canonical order, all or none. Create with ``client.multi_lock(names)``.

    The options are those of ``client.lock()`` (:class:`~distlock.LockOptions`) and apply to every lock of the set;
    ``timeout`` bounds the whole acquisition, not each lock's.
    """

    def __init__(self, context: Context, names: Iterable[str], **options: Unpack[LockOptions]) -> None:
        self._locks = tuple(Lock(context, name, **options) for name in _canonical(names))
        self.timeout = self._locks[0].timeout
        self._scope: ThreadScope | None = None  # the scope ``with`` entered (``stop_on_lost``)

    @property
    def names(self) -> tuple[str, ...]:
        """The names, in the order they are taken (sorted)."""
        return tuple(lock.name for lock in self._locks)

    @property
    def locks(self) -> tuple[Lock, ...]:
        """One handle per name, in the order they are taken."""
        return self._locks

    def __getitem__(self, name: str) -> Lock:
        for lock in self._locks:
            if lock.name == name:
                return lock
        raise ConfigurationError(f"{name!r} is not one of this multi-lock's names {list(self.names)}")

    def __iter__(self) -> Iterator[Lock]:
        return iter(self._locks)

    def __len__(self) -> int:
        return len(self._locks)

    def __repr__(self) -> str:
        state = "held" if all(lock.owned() for lock in self._locks) else "not held"
        return f"<distlock.MultiLock {list(self.names)} {state}>"

    # -- acquiring --------------------------------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take every lock, in order; True when all are held. False when the wait ran out (or at once, when not
        ``blocking``, if any lock is held elsewhere): then none is held. ``timeout=None`` uses the ``timeout``
        option. Raises as :meth:`Lock.acquire`, after releasing whatever it had taken."""
        wait = self.timeout if timeout is None else timeout
        deadline = _clock.now() + wait
        taken: list[Lock] = []
        try:
            for lock in self._locks:
                if not lock.acquire(blocking, max(deadline - _clock.now(), 0.0)):
                    break
                taken.append(lock)
            else:
                return True
        except BaseException:
            _release_quietly(taken)
            raise
        _release_quietly(taken)
        return False

    # -- holding ----------------------------------------------------------------------------------------------

    @property
    def tokens(self) -> dict[str, int]:
        """Each name's fencing token. Raises ``LockNotOwned`` if any lock is not held."""
        return {lock.name: lock.token for lock in self._locks}

    def fence(self, name: str) -> Fence:
        """The fence of lock ``name`` (its token with its name), for a fenced write of a row it guards."""
        return self[name].fence

    @property
    def lost(self) -> bool:
        """True once any lock of the set is known lost."""
        return any(lock.lost for lock in self._locks)

    def owned(self) -> bool:
        """True while every lock of the set is held by this multi-lock and none is known lost."""
        return all(lock.owned() for lock in self._locks)

    def ensure_held(self, verify: bool = False) -> None:
        """Raise ``LockLost`` / ``LockNotOwned`` (as :meth:`Lock.ensure_held`) for the first lock not held."""
        for lock in self._locks:
            lock.ensure_held(verify)

    def release(self) -> None:
        """Release every lock, in reverse order; then raise the first failure, if any (``LockLost`` when one was
        lost while held, ``LockNotOwned`` when the set was not held)."""
        _release_all(self._locks)

    def scope(self) -> ThreadScope:
        """``with multi.scope():`` stops its body when any lock of the set is lost (as :meth:`Lock.scope`)."""
        return ThreadScope(self._locks)

    def __enter__(self) -> Self:
        scope = self.scope() if self._locks[0]._stop_on_lost else None  # in another thread: ConfigurationError, first
        if not self.acquire():
            raise LockNotAcquired(
                f"locks {list(self.names)} not all acquired within {self.timeout:g} s (timeout); none is held",
                name=self.names[0],
            )
        self._scope = scope and enter_or_release(scope, self.release)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        scope, self._scope = self._scope, None
        try:
            if scope is not None:
                scope.__exit__(kind, value, traceback)  # first: a loss from here on no longer stops the body
        finally:
            held = [lock for lock in self._locks if lock._own_ticket() is not None]
            try:
                _release_all(held)
            except DistlockError:
                if kind is None:
                    raise
                # The body's own exception matters more; a loss is logged where it is found.


def _release_all(locks: Iterable[Lock]) -> None:
    first: BaseException | None = None
    for lock in reversed(tuple(locks)):
        try:
            lock.release()
        except DistlockError as e:
            first = first or e
    if first is not None:
        raise first


def _release_quietly(locks: list[Lock]) -> None:
    with contextlib.suppress(DistlockError):
        _release_all(locks)


class AsyncMultiLock:
    """The asyncio twin of :class:`MultiLock`: ``await multi.acquire()``, ``await multi.release()``,
    ``async with``. Cancelling the awaiting task ends the wait and releases what was taken before
    ``CancelledError`` propagates."""

    def __init__(self, multi: MultiLock) -> None:
        self._multi = multi
        self._async = tuple(AsyncLock(lock) for lock in multi.locks)
        self._scope: TaskScope | None = None  # the scope ``async with`` entered (``stop_on_lost``)

    @property
    def sync(self) -> MultiLock:
        """The underlying synchronous multi-lock."""
        return self._multi

    @property
    def names(self) -> tuple[str, ...]:
        return self._multi.names

    @property
    def tokens(self) -> dict[str, int]:
        return self._multi.tokens

    def fence(self, name: str) -> Fence:
        return self._multi.fence(name)

    @property
    def lost(self) -> bool:
        return self._multi.lost

    def owned(self) -> bool:
        return self._multi.owned()

    def scope(self) -> TaskScope:
        """``async with multi.scope():`` stops its body when any lock of the set is lost (as ``AsyncLock.scope``)."""
        return TaskScope(self._multi.locks)

    def __repr__(self) -> str:
        return f"<distlock.AsyncMultiLock {self._multi!r}>"

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        wait = self._multi.timeout if timeout is None else timeout
        deadline = _clock.now() + wait
        taken: list[AsyncLock] = []
        try:
            for lock in self._async:
                if not await lock.acquire(blocking, max(deadline - _clock.now(), 0.0)):
                    break
                taken.append(lock)
            else:
                return True
        except BaseException:
            await _release_quietly_async(taken)
            raise
        await _release_quietly_async(taken)
        return False

    async def ensure_held(self, verify: bool = False) -> None:
        for lock in self._async:
            await lock.ensure_held(verify)

    async def release(self) -> None:
        for lock in self._async:
            lock.sync._leave_context()
        await asyncio.to_thread(self._multi.release)

    async def __aenter__(self) -> Self:
        if not await self.acquire():
            raise LockNotAcquired(
                f"locks {list(self.names)} not all acquired within {self._multi.timeout:g} s (timeout); none is held",
                name=self.names[0],
            )
        if self._multi.locks[0]._stop_on_lost:
            scope = self.scope()
            try:
                await scope.__aenter__()
            except BaseException:
                await _release_quietly_async(list(self._async))
                raise
            self._scope = scope
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        scope, self._scope = self._scope, None
        try:
            if scope is not None:
                await scope.__aexit__(kind, value, traceback)  # first: a loss from here on no longer stops the body
        finally:
            for lock in self._async:
                lock.sync._leave_context()
            try:
                await asyncio.to_thread(self._multi.__exit__, kind, value, traceback)
            except DistlockError:
                if kind is None:
                    raise


async def _release_quietly_async(locks: list[AsyncLock]) -> None:
    for lock in locks:
        lock.sync._leave_context()  # in the task's context: the thread below has a copy of it
    await asyncio.to_thread(_release_quietly, [lock.sync for lock in locks])
