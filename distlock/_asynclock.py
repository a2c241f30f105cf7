"""The asyncio twin of the lock: :class:`AsyncLock` wraps a :class:`~distlock.Lock` and runs its blocking calls off
the event loop.

The wait for the lock runs on a thread of its own (not the default executor, so many waiters cannot starve it);
releases and server reads go through ``asyncio.to_thread``. Nothing of the lock's algorithm is repeated here: the
queue, the timeouts, the keeper's signals and the fencing token are the synchronous handle's (``.sync``).

What can go wrong: as :class:`~distlock.Lock`; in addition, cancelling the awaiting task interrupts the wait and
removes the waiter's key, and a lock acquired at the very moment of cancellation is released before
``CancelledError`` propagates (a loss found in that release is not raised: the cancellation is).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType
from typing import Self

from ._errors import ClientClosed, LockLost, LockNotAcquired
from ._lock import Fence, Lock
from ._protocol import Interrupt
from ._stop import TaskScope

__all__ = ["AsyncLock"]


class AsyncLock:
    """The asyncio twin of :class:`Lock`: ``await lock.acquire()``, ``await lock.release()``, ``async with``.

    The blocking wait runs on a thread of its own (not the default executor, so many waiters cannot starve it);
    cancelling the awaiting task interrupts that wait and removes the waiter's key, and a lock acquired at the very
    moment of cancellation is released before ``CancelledError`` propagates. With ``stop_on_lost=True``,
    ``async with`` runs its body in :meth:`scope`.
    """

    def __init__(self, lock: Lock) -> None:
        self._lock = lock
        self._scope: TaskScope | None = None  # the scope ``async with`` entered (``stop_on_lost``)

    @property
    def sync(self) -> Lock:
        """The underlying synchronous handle."""
        return self._lock

    @property
    def name(self) -> str:
        return self._lock.name

    @property
    def token(self) -> int:
        return self._lock.token

    @property
    def fence(self) -> Fence:
        """The fencing token with this lock's name, for fenced writes. Raises if not held."""
        return Fence(self.name, self.token)

    @property
    def lost(self) -> bool:
        return self._lock.lost

    def owned(self) -> bool:
        return self._lock.owned()

    def __repr__(self) -> str:
        return f"<distlock.AsyncLock {self._lock!r}>"

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        loop = asyncio.get_running_loop()
        result: asyncio.Future[bool] = loop.create_future()
        cancel = Interrupt()

        def settle(outcome: bool | BaseException) -> None:
            if result.done():
                return
            if isinstance(outcome, BaseException):
                result.set_exception(outcome)
            else:
                result.set_result(outcome)

        def run() -> None:
            outcome: bool | BaseException
            try:
                outcome = self._lock._acquire(blocking, timeout, cancel)
            except BaseException as e:
                outcome = e
            loop.call_soon_threadsafe(settle, outcome)

        threading.Thread(target=run, name=f"distlock-acquire-{self._lock.name}", daemon=True).start()
        try:
            acquired = await asyncio.shield(result)
        except asyncio.CancelledError:
            cancel.fire("the acquiring task was cancelled")
            try:
                acquired = await result
            except Exception:
                acquired = False
            if acquired:
                await asyncio.to_thread(self._release_quietly)
            raise
        if acquired:
            self._lock._enter_context()
        return acquired

    def _release_quietly(self) -> None:
        with contextlib.suppress(LockLost):
            self._lock.release()

    async def release(self) -> None:
        self._lock._leave_context()
        await asyncio.to_thread(self._lock.release)

    async def ensure_held(self, verify: bool = False) -> None:
        if verify:
            await asyncio.to_thread(self._lock.ensure_held, True)
        else:
            self._lock.ensure_held()

    async def locked(self) -> bool:
        return await asyncio.to_thread(self._lock.locked)

    def scope(self) -> TaskScope:
        """``async with lock.scope():`` stops its body when this hold is lost: the task is cancelled, and the
        ``CancelledError`` becomes ``LockLost`` at the scope's exit (a cancellation from outside stays one).
        ``LockNotOwned`` if not held, ``LockLost`` at once if lost already; docs/lost.md."""
        return TaskScope((self._lock,))

    async def __aenter__(self) -> Self:
        if not await self.acquire():
            raise LockNotAcquired(
                f"lock {self.name!r} not acquired within {self._lock.timeout:g} s (timeout); "
                "it is held by another holder",
                name=self.name,
            )
        await self._enter_scope()
        return self

    async def _enter_scope(self) -> None:
        """Right after acquiring: enter the scope ``stop_on_lost`` asks for; if it raises (lost already), release."""
        if self._lock._stop_on_lost:
            scope = self.scope()
            try:
                await scope.__aenter__()
            except BaseException:
                await asyncio.to_thread(self._release_quietly)
                raise
            self._scope = scope

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        scope, self._scope = self._scope, None
        try:
            if scope is not None:
                await scope.__aexit__(kind, value, traceback)  # first: a loss from here on no longer stops the body
        finally:
            await self._release_on_exit(kind)

    async def _release_on_exit(self, kind: type[BaseException] | None) -> None:
        if self._lock._own_ticket() is None:
            return
        try:
            await self.release()
        except (LockLost, ClientClosed):
            if kind is None:
                raise
