"""The token a fenced model instance's data was read with: what its ``save()`` and ``delete()`` compare.

A write of a loaded instance carries ``fence_token = :read`` (``_models`` builds the statements), so nothing a lock
holder wrote since the read is overwritten. The token is kept on ``instance._state`` (copied and pickled with the
instance), never in the ``fence_token`` attribute, which code may overwrite; it is noted by ``from_db()``, a full
``refresh_from_db()``, ``bulk_create()``, and the instance's own saves and claims. ``None`` means unknown (built
from a pk, loaded without its token, or saved to another database): the write is blind (``<= :t`` alone).

A save or claim made inside a transaction counts only while that transaction (or savepoint) lives: after a
rollback the instance's read is again what came before (after a rolled-back claim: unknown, blind inside that lock
and refused elsewhere). How a rollback is noticed without a callback of our own: the comment on :class:`_Pending`.

What cannot be told apart or followed: within one lock's tenure, a rolled-back write of this instance and another
instance's write with the same token (the instance's save lands; the last save wins, as in plain Django); manual
transactions (``set_autocommit(False)``), where a write counts at once; a pickled instance keeps the read it had
when pickled. docs/integrations/django.md ("FencedModel") says the same to users.
"""

from __future__ import annotations

from typing import Any, cast

from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = ["UNMATCHED", "note_read", "note_write", "read_filter", "read_of"]

_ATTR = "distlock_read"  # on instance._state: an int, None, a _Pending or a _Claimed
#: The read a write must not land with: it matches no row (the statement then explains the refusal).
UNMATCHED = -1


# A write made in a transaction is pending until we know it was not rolled back. Django tells nobody of a rollback,
# and a callback of ours in its on_commit() list would show in the application's tests (captureOnCommitCallbacks).
# What it does show: it makes a new list of those callbacks whenever a transaction ends or a savepoint is rolled
# back, and keeps the same list (appending) otherwise. So a pending write keeps the list it was made under: while
# that list is still the connection's, nothing was rolled back since, and the row carries the write's token. Once
# the list changed, the row's token is read (once; only then) and decides: the write's token still there, it stands
# (committed, or still in an open transaction); another, it was rolled back, and the read is what came before.
class _Pending:
    """``token``, written or claimed in a transaction of ``connection`` while its list of on-commit callbacks was
    ``seen``; ``before`` (an int, None, a ``_Claimed`` or another ``_Pending``) if it was rolled back."""

    __slots__ = ("before", "connection", "seen", "token")

    def __init__(self, token: int, connection: BaseDatabaseWrapper, before: Any) -> None:
        self.token, self.connection, self.before = token, connection, before
        self.seen = connection.run_on_commit

    def __reduce__(self) -> tuple[Any, ...]:
        return (_same, (self.token,))  # a pickled copy outlives the connection: it keeps the read it has now

    def __deepcopy__(self, memo: dict[int, Any]) -> _Pending:
        return self  # a copy in this process follows the same transaction


class _Claimed:
    """Before a claim that was rolled back: the row carries a token this instance never read, no larger than the
    claim's ``token``. Inside that same lock the holder may write it blind; anywhere else its write is refused."""

    __slots__ = ("token",)

    def __init__(self, token: int) -> None:
        self.token = token

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Claimed, (self.token,))


def _same(read: int | None) -> int | None:
    return read


def _settled(read: Any, row_token: Any) -> Any:
    """``read`` with what has ended taken out: a write that stands is its token (or stays pending while a
    transaction is open), a rolled-back one what came before. ``row_token()`` reads the row's token."""
    while isinstance(read, _Pending):
        connection = read.connection
        if connection.run_on_commit is read.seen and connection.in_atomic_block:
            return read  # nothing rolled back or ended since the write
        if row_token() == read.token:
            if not connection.in_atomic_block:
                return read.token
            read.seen = connection.run_on_commit  # a sibling savepoint's rollback, or another transaction's end
            return read
        read = read.before
    return read


def read_of(instance: models.Model, using: str, token: int | None = None) -> int | None:
    """The token ``instance``'s row must carry for a write to database ``using`` with ``token`` (None: plain) to
    land; None: unknown, a blind write (also for a copy of an instance read from another database); ``UNMATCHED``:
    no write but the claiming lock's may land blind."""
    if instance._state.db != using:
        return None
    read = getattr(instance._state, _ATTR, None)
    if isinstance(read, _Pending):
        found: list[int | None] = []

        def row_token() -> int | None:
            if not found:
                rows = type(instance)._base_manager.using(using).filter(pk=instance.pk)
                found.append(rows.values_list("fence_token", flat=True).first())
            return found[0]

        read = _settled(read, row_token)
        setattr(instance._state, _ATTR, read)
        if isinstance(read, _Pending):
            return read.token
    if isinstance(read, _Claimed):
        return None if token == read.token else UNMATCHED
    return cast("int | None", read)


def note_read(instance: models.Model, token: int | None) -> None:
    setattr(instance._state, _ATTR, token)


def note_write(instance: models.Model, token: int, using: str, *, claim: bool = False, insert: bool = False) -> None:
    """``instance``'s row now carries ``token`` (this instance wrote, inserted or claimed it): its read from now on,
    or, in a transaction, until that transaction is rolled back (then what was read before; for an insert, nothing:
    a blind write; for a claim, :class:`_Claimed`)."""
    connection = connections[using]
    if not connection.in_atomic_block:  # autocommit (or manual transactions, which cannot be followed)
        note_read(instance, token)
        return
    before = _Claimed(token) if claim else None if insert else getattr(instance._state, _ATTR, None)
    setattr(instance._state, _ATTR, _Pending(token, connection, before))


def read_filter(read: int | None, token: int | None = None) -> dict[str, Any]:
    """The one lookup a write of data read with ``read`` carries: ``fence_token = :read`` (and, written with
    ``token``, ``<= :t``: a read newer than ``token`` matches no row), or ``<= :t`` alone for a blind write. One
    lookup, not two: building each costs a save about as much as running it adds."""
    if read is None:
        return {} if token is None else {"fence_token__lte": token}
    return {"fence_token": read if token is None or read <= token else UNMATCHED}
