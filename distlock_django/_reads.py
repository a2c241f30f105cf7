"""The token a fenced model instance's data was read with: what its ``save()`` and ``delete()`` compare.

A write of a loaded instance carries ``fence_token = :read``: it lands only while the row still carries the token
the instance's data was read with, so nothing a lock holder wrote since is overwritten (``distlock_django._models``
builds the statements). This module keeps that token:

- on ``instance._state`` (Django's ModelState: copied with the instance, pickled with it), never in the
  ``fence_token`` attribute, which code may overwrite; ``None``: unknown (built from a pk, loaded without its token,
  or saved to another database than it was read from), and the write is blind (the lock's ``<= :t`` alone);
- from ``from_db()``, a full ``refresh_from_db()``, and the instance's own saves and claims, which move the row to
  their token.

A write or claim made inside a transaction moves the row only while that transaction lives: rolled back (the whole
transaction, or the savepoint the write was made in), the row carries again what it carried before. Django tells
nobody of a rollback, but it drops the ``on_commit()`` callbacks registered inside what it rolls back. So each
transaction level (a transaction, or one of its savepoints) gets one marker, a callback put *first* in Django's
list (it runs before any of the application's, which may save, and which may raise and stop the rest); a write
made in it is read as its token while the marker is registered or has run, and as what came before once Django has
dropped it (unknown after a claim: the token before the claim was never read). Accepting both instead would let a
retry overwrite what another instance wrote with the same token after the rollback.

What cannot be followed: manual transactions (``transaction.set_autocommit(False)``): a write counts at once; after
your own ``rollback()``, ``refresh_from_db()`` what you wrote. A pickled instance keeps what its read was when
pickled.
"""

from __future__ import annotations

from typing import Any, cast

from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper

import distlock

__all__ = ["note_loaded", "note_read", "note_write", "read_filter", "read_of"]

_ATTR = "distlock_read"  # on instance._state: an int, None, or a _Pending
_MARKERS = "_distlock_markers"  # on a connection: {savepoint ids: _Level}


class _Level:
    """One transaction level of a connection: committed once Django runs its marker, rolled back once Django drops
    the marker without running it."""

    __slots__ = ("committed", "connection")

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection, self.committed = connection, False

    def commit(self) -> None:
        self.committed = True

    def open(self) -> bool:
        return any(entry[1] == self.commit for entry in self.connection.run_on_commit)


def _level(connection: BaseDatabaseWrapper) -> _Level:
    """The marker of the connection's current transaction level (made and registered on first use)."""
    levels: dict[tuple[str, ...], _Level] = connection.__dict__.setdefault(_MARKERS, {})
    key = tuple(connection.savepoint_ids)
    level = levels.get(key)
    if level is None or not level.open():
        for stale in [k for k, v in levels.items() if not v.open()]:
            del levels[stale]
        level = levels[key] = _Level(connection)
        # Django's own entry format (savepoints it was made in, callback, robust), put first: see the docstring.
        cast(Any, connection.run_on_commit).insert(0, (set(connection.savepoint_ids), level.commit, True))
    return level


class _Pending:
    """``token``, written or claimed at transaction level ``level``; ``before`` (an int, None or another
    ``_Pending``) if that level is rolled back."""

    __slots__ = ("before", "level", "token")

    def __init__(self, token: int, level: _Level, before: Any) -> None:
        self.token, self.level, self.before = token, level, before

    def __reduce__(self) -> tuple[Any, ...]:
        read = _settled(self)  # a pickled copy outlives the connection: it keeps what the read is now
        return (_same, (read.token if isinstance(read, _Pending) else read,))

    def __deepcopy__(self, memo: dict[int, Any]) -> _Pending:
        return self  # a copy in this process follows the same transaction


def _same(read: int | None) -> int | None:
    return read


def _settled(read: Any) -> Any:
    """``read`` with what has ended taken out: a committed write is its token, a rolled-back one what came before;
    an open one stays (it may yet be rolled back)."""
    while isinstance(read, _Pending):
        if read.level.committed:
            return read.token
        if read.level.open():
            return read
        read = read.before
    return read


def read_of(instance: models.Model, using: str) -> int | None:
    """The token ``instance``'s row carries for its data to be current, written to database ``using``; None: unknown
    (or the instance was read from another database: a copy there is a blind write)."""
    if instance._state.db != using:
        return None
    read = getattr(instance._state, _ATTR, None)
    if isinstance(read, _Pending):
        read = _settled(read)
        setattr(instance._state, _ATTR, read)
        if isinstance(read, _Pending):
            return read.token
    return cast("int | None", read)


def note_read(instance: models.Model, token: int | None) -> None:
    setattr(instance._state, _ATTR, token)


def note_loaded(instance: models.Model, token: int | None, using: str | None) -> None:
    """``instance`` was loaded with ``token``. Read inside a transaction with the token of the innermost lock held
    here, the row may carry it only until this transaction is rolled back (this holder's own claim or write, not
    committed yet): followed as that claim would be."""
    if token is not None and using is not None and connections[using].in_atomic_block:
        fence = distlock.current_fence()
        if fence is not None and fence.token == token:
            note_write(instance, token, using, before_unknown=True)
            return
    note_read(instance, token)


def note_write(instance: models.Model, token: int, using: str, *, before_unknown: bool = False) -> None:
    """``instance``'s row now carries ``token`` (this instance wrote or claimed it): its read from now on, or, in a
    transaction, until that transaction is rolled back (then what was read before; unknown after a claim)."""
    connection = connections[using]
    if not connection.in_atomic_block:  # autocommit (or manual transactions, which no callback can follow)
        note_read(instance, token)
        return
    before = None if before_unknown else getattr(instance._state, _ATTR, None)
    setattr(instance._state, _ATTR, _Pending(token, _level(connection), before))


def read_filter(read: int | None, token: int | None = None) -> dict[str, Any]:
    """The one lookup a write of data read with ``read`` carries: ``fence_token = :read`` (and, written with
    ``token``, ``<= :t``: a read newer than ``token`` matches no row), or ``<= :t`` alone for a blind write. One
    lookup, not two: building each costs a save about as much as running it adds."""
    if read is None:
        return {} if token is None else {"fence_token__lte": token}
    return {"fence_token": read if token is None or read <= token else -1}
