"""Read/write locks: many readers or one writer, FIFO between them, each hold a fenced :class:`~distlock.Lock`.

``client.rwlock(name)`` gives an :class:`RWLock`; its ``read()`` and ``write()`` make lock handles whose queue entries
are readers or writers (``_shape``), so acquiring, waiting, timeouts, renewal, ``max_hold``, loss and fencing are the
lock's own code: a reader holds while no writer is ahead of it, a writer holds alone at the head of the queue. A
reader that arrives behind a waiting writer waits behind it, so a steady stream of readers cannot starve writers.

What can go wrong: everything a lock's acquire and release can raise, plus ``LockKindMismatch`` when the name is in
use as a plain lock or a semaphore at the same time; bad options raise when the ``RWLock`` is made, as for a lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

from ._asynclock import AsyncLock
from ._lock import Lock
from ._lockoptions import LockOptions, check_options
from ._shape import READ, WRITE

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["AsyncRWLock", "RWLock"]


class RWLock:
    """A read/write lock on ``name``: ``read()`` and ``write()`` each make a new :class:`Lock` handle, with this
    object's options, that holds the lock shared (with other readers) or exclusive.

    ``with rw.read(): ...`` reads; ``with rw.write() as lock: ...`` writes, and ``lock.token`` fences the writes (a
    writer's token is larger than every earlier holder's, readers' included). Readers hold together and each has its
    own token, so a reader's token cannot tell readers apart at a database: readers should not make fenced writes.
    """

    def __init__(self, context: Context, name: str, **options: Unpack[LockOptions]) -> None:
        check_options(name, options)  # now, where they are given
        self._context = context
        self.name = name
        self._options = options

    def __repr__(self) -> str:
        return f"<distlock.RWLock {self.name!r}>"

    def read(self) -> Lock:
        """A new handle that holds the lock as a reader (with any other readers, never with a writer)."""
        return self._handle(READ)

    def write(self) -> Lock:
        """A new handle that holds the lock as the writer (alone)."""
        return self._handle(WRITE)

    def _handle(self, kind: str) -> Lock:
        self._context.check_open()
        return Lock(self._context, self.name, kind=kind, **self._options)


class AsyncRWLock:
    """The asyncio twin of :class:`RWLock`: ``read()`` and ``write()`` make :class:`AsyncLock` handles."""

    def __init__(self, rwlock: RWLock) -> None:
        self._rwlock = rwlock

    @property
    def sync(self) -> RWLock:
        """The underlying synchronous read/write lock."""
        return self._rwlock

    @property
    def name(self) -> str:
        return self._rwlock.name

    def __repr__(self) -> str:
        return f"<distlock.AsyncRWLock {self.name!r}>"

    def read(self) -> AsyncLock:
        """A new handle that holds the lock as a reader."""
        return AsyncLock(self._rwlock.read())

    def write(self) -> AsyncLock:
        """A new handle that holds the lock as the writer."""
        return AsyncLock(self._rwlock.write())
