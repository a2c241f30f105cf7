"""Releasing a lock only once the transactions that wrote under it have ended.

If a lock is released while the transaction that wrote under it is still open, the next holder can read the rows as
they were before that write: the lock then protects nothing. So when a lock ends inside ``transaction.atomic()``
(or ``ATOMIC_REQUESTS``), the release is deferred until every open transaction of this thread has committed.

Django has ``on_commit`` hooks but no rollback hook. A rollback drops the hooks registered inside it, so each hook
here is an object watched by ``weakref.finalize``: when Django drops it without running it (rollback, or a closed
connection) the finalizer releases the lock. On CPython that happens at once, in the thread that rolled back.

What can go wrong: a release that finds the lock lost logs a warning (the transaction has already committed; its
fenced writes were accepted or refused on their own merits) instead of raising into Django's commit path.
"""

from __future__ import annotations

import logging
import threading
import weakref

from django.db import connections

import distlock

__all__ = ["release_after_commit"]

log = logging.getLogger("distlock.django")


class _Pending:
    def __init__(self, lock: distlock.Lock, waiting: int) -> None:
        self._lock = lock
        self._waiting = waiting
        self._done = False
        self._mutex = threading.Lock()

    def committed(self) -> None:
        with self._mutex:
            self._waiting -= 1
            if self._waiting > 0 or self._done:
                return
            self._done = True
        _release(self._lock)

    def dropped(self) -> None:
        with self._mutex:
            if self._done:
                return
            self._done = True
        _release(self._lock)


class _Hook:
    """One on_commit hook; its finalizer tells a rollback (hook dropped unrun) from a commit."""

    def __init__(self, pending: _Pending) -> None:
        self._pending = pending

    def __call__(self) -> None:
        self._pending.committed()


def _release(lock: distlock.Lock) -> None:
    try:
        lock.release()
    except distlock.LockLost as e:
        log.warning("%s", e)
    except distlock.LockNotOwned:
        pass


def release_after_commit(lock: distlock.Lock) -> bool:
    """Release ``lock`` now, or when this thread's open transactions commit (or roll back).

    Returns True when the release was deferred. Raises ``LockLost`` only for an immediate release.
    """
    in_transaction = [c for c in connections.all(initialized_only=True) if c.in_atomic_block]
    if not in_transaction:
        lock.release()
        return False
    pending = _Pending(lock, len(in_transaction))
    for connection in in_transaction:
        hook = _Hook(pending)
        weakref.finalize(hook, pending.dropped)
        connection.on_commit(hook)
    return True
