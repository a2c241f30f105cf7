"""Releasing a lock only once the transactions that wrote under it have ended.

If a lock is released while the transaction that wrote under it is still open, the next holder can read the rows as
they were before that write: the lock then protects nothing. So when a lock ends inside ``transaction.atomic()``
(or ``ATOMIC_REQUESTS``), :func:`release_after_commit` defers the release until every open transaction of this
thread has committed, or one rolled back. The atomic blocks Django's ``TestCase`` wraps a test in never commit and
are not counted (docs/testing.md, "Django's TestCase"); how a rollback and a test's block end are seen: the comments
at the code.

What can go wrong: a release that finds the lock lost logs a warning (the transaction has already committed; its
fenced writes were accepted or refused on their own merits) instead of raising into Django's commit path. Inside a
test case, a block opened with ``atomic(savepoint=False)`` ends without a statement: its lock is released at the
connection's next statement, or when the test case rolls back.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

import distlock

__all__ = ["release_after_commit"]

log = logging.getLogger("distlock.django")


class _Pending:
    """One deferred release: it happens when every connection it waits for has committed, or any rolled back."""

    def __init__(self, lock: distlock.Lock, aliases: set[str]) -> None:
        self._lock = lock
        self._waiting = aliases
        self._done = False
        self._mutex = threading.Lock()

    def committed(self, alias: str) -> None:
        with self._mutex:
            self._waiting.discard(alias)
            if self._waiting or self._done:
                return
            self._done = True
        _release(self._lock)

    def dropped(self) -> None:
        with self._mutex:
            if self._done:
                return
            self._done = True
        _release(self._lock)


# Django has on_commit hooks but no rollback hook. A rollback drops the hooks registered inside it, so each hook is
# watched by ``weakref.finalize``: when Django drops it without running it (a rollback, or a closed connection), the
# finalizer releases the lock. On CPython that happens at once, in the thread that rolled back.
class _Hook:
    """One on_commit hook; its finalizer tells a rollback (hook dropped unrun) from a commit."""

    def __init__(self, pending: _Pending, alias: str) -> None:
        self._pending = pending
        self._alias = alias

    def __call__(self) -> None:
        self._pending.committed(self._alias)


# Inside a test case, the lock is released when the test's own outermost block (the first above the test case's)
# ends, committed or rolled back: in a real transaction that is where it would commit. That end is a RELEASE
# SAVEPOINT (or ROLLBACK TO SAVEPOINT) statement, seen by this execute wrapper (Django's database instrumentation),
# which removes itself once it has fired. TransactionTestCase opens no such blocks: real transactions, real commits.
class _BlockEnd:
    """An execute wrapper that fires once the test's own outermost atomic block (above a test case's) has ended."""

    def __init__(self, pending: _Pending, connection: BaseDatabaseWrapper, depth: int) -> None:
        self._pending = pending
        self._connection = connection
        self._depth = depth
        self._block = connection.atomic_blocks[depth]

    def _ended(self) -> bool:
        blocks = self._connection.atomic_blocks
        return len(blocks) <= self._depth or blocks[self._depth] is not self._block

    def __call__(self, execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        try:
            return execute(sql, params, many, context)
        finally:
            # Django pops the block before it releases (or rolls back to) the block's savepoint.
            if self._ended():
                wrappers = self._connection.execute_wrappers
                if self in wrappers:
                    wrappers.remove(self)
                self._pending.committed(self._connection.alias)


def _release(lock: distlock.Lock) -> None:
    try:
        lock.release()
    except distlock.LockLost as e:
        log.warning("%s", e)
    except distlock.LockNotOwned:
        pass


def _test_case_blocks(connection: BaseDatabaseWrapper) -> int:
    """How many of the connection's open atomic blocks, from the outermost, a test case opened (Django marks them with
    ``Atomic._from_testcase``): ``TestCase`` rolls them back at the end of the test, so they never commit."""
    count = 0
    for block in connection.atomic_blocks:
        if not getattr(block, "_from_testcase", False):
            break
        count += 1
    return count


def release_after_commit(lock: distlock.Lock) -> bool:
    """Release ``lock`` now, or when this thread's open transactions commit (or roll back).

    Blocks a test case opened around the test do not count (see :func:`_test_case_blocks`). Returns True when the
    release was deferred. Raises ``LockLost`` only for an immediate release.
    """
    waiting: list[tuple[BaseDatabaseWrapper, int]] = []
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            continue
        depth = _test_case_blocks(connection)
        if depth and depth == len(connection.atomic_blocks):
            continue  # only the test case's own blocks: they never commit
        waiting.append((connection, depth))
    if not waiting:
        lock.release()
        return False
    pending = _Pending(lock, {connection.alias for connection, _ in waiting})
    for connection, depth in waiting:
        hook = _Hook(pending, connection.alias)
        weakref.finalize(hook, pending.dropped)
        connection.on_commit(hook)
        if depth:
            # First in the list: `with connection.execute_wrapper(...)` pops the last one when it exits.
            connection.execute_wrappers.insert(0, _BlockEnd(pending, connection, depth))
    return True
