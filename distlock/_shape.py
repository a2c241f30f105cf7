"""Which entries of a lock's queue hold it: the grant rule of mutexes, semaphores and read/write locks, in one place.

Every queue entry has a *kind*, carried in its nonce (and so in its key or member name, where every reader of the
queue can see it without another read): a plain nonce (``0``, a *seat*: ``seat_nonce``) is a mutex waiter, ``s<N>.0``
a slot of a semaphore of limit ``N``, ``r.0`` a reader and ``w.0`` a writer of a read/write lock (before seats, the
nonce was 16 random hex digits where the seat is now; both read alike). One rule covers all of them: an entry
holds when fewer than its *limit* of the entries ahead of it *conflict* with it. A mutex has limit 1 and everything
conflicts (the head holds); a semaphore of limit N likewise with limit N (the first N hold); a reader conflicts only
with writers and a writer with everything, limit 1 (readers hold together until a writer is ahead of them; a writer
holds alone at the head). The queue is FIFO between kinds, so a reader that arrives behind a waiting writer waits
behind it: writers do not starve.

A queue holds one family of kinds only (mutex, one semaphore limit, or read/write): the backends refuse a join that
would mix them, with :class:`LockKindMismatch`, since the rule means nothing across families. The Redis scripts carry
their own copy of this rule in Lua (they grant inside the server); this module is the copy every Python backend and
inspector uses (which entries hold, which one a waiter waits on, which joins are refused).

What can go wrong: a nonce or key this module did not make (a key written by hand) reads as a mutex entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._errors import ConfigurationError, LockKindMismatch
from ._protocol import LockState, Waiter

__all__ = [
    "MAX_LIMIT",
    "MUTEX",
    "READ",
    "WRITE",
    "conflicts",
    "describe",
    "family",
    "holding",
    "kind_of",
    "limit_of",
    "lock_state",
    "mismatch",
    "refuse_mixed",
    "seat_nonce",
    "semaphore_kind",
    "waiting",
    "waits_on",
]

#: The kind of a plain lock's entries.
MUTEX = ""
READ = "r"
WRITE = "w"


#: The largest semaphore limit: every waiter's read walks the entries ahead of it on Redis.
MAX_LIMIT = 10_000


def semaphore_kind(limit: int) -> str:
    """The kind of a semaphore's entries; raises ``ConfigurationError`` for a limit that is not an int from 1 to
    :data:`MAX_LIMIT`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigurationError(
            f"limit (how many may hold the semaphore at once) must be an int from 1 to {MAX_LIMIT}, not {limit!r}"
        )
    return f"s{limit}"


def kind_of(nonce: str) -> str:
    """The kind in a nonce (or a key's tail, ``<kind>.<rest>``): ``""`` for a mutex entry."""
    head, dot, _ = nonce.partition(".")
    if not dot or not head or not (head in (READ, WRITE) or (head[0] == "s" and head[1:].isdigit())):
        return MUTEX
    return head


def seat_nonce(kind: str, seat: int) -> str:
    """The nonce of a join of ``kind`` in seat ``seat`` (``_session.Keeper.join_started``): ``"0"`` for a mutex,
    ``"<kind>.0"`` for the others."""
    return str(seat) if kind == MUTEX else f"{kind}.{seat}"


def limit_of(kind: str) -> int:
    return int(kind[1:]) if kind.startswith("s") else 1


def family(kind: str) -> str:
    """Kinds that may share a queue have one family: readers and writers together, each other kind alone."""
    return "rw" if kind in (READ, WRITE) else kind


def describe(kind: str) -> str:
    """The kind in words, for error messages."""
    if kind == MUTEX:
        return "a lock"
    if kind in (READ, WRITE):
        return "a read/write lock"
    return f"a semaphore of limit {limit_of(kind)}"


def conflicts(behind: str, ahead: str) -> bool:
    """Whether an entry of kind ``ahead`` keeps one of kind ``behind`` from holding (counts toward its limit)."""
    return not (behind == READ and ahead == READ)


def holding(kinds: Sequence[str]) -> list[bool]:
    """For entries of ``kinds`` in queue order, which hold now."""
    result, writers = [], 0  # writers: entries that are not readers (they conflict with everything)
    for entries, kind in enumerate(kinds):
        result.append((writers if kind == READ else entries) < limit_of(kind))
        writers += kind != READ
    return result


def waiting(kinds: Sequence[str]) -> int:
    """For entries of ``kinds`` in queue order, how many wait (``Holder.waiters``; the others hold)."""
    return holding(kinds).count(False)


def waits_on(kinds: Sequence[str]) -> int | None:
    """For the last of ``kinds`` (in queue order), when it does not hold: the index of the one entry ahead whose
    removal it waits for (a reader's: the newest writer ahead; any other's: the entry just ahead), or None for a
    semaphore slot, which waits on no single entry (any ``limit`` of those ahead will do)."""
    ours, index = kinds[-1], len(kinds) - 1
    if limit_of(ours) > 1:
        return None
    if ours == READ:
        return max(i for i in range(index) if conflicts(ours, kinds[i]))
    return index - 1


def refuse_mixed(name: str, ours: str, theirs: Iterable[str]) -> None:
    """Raise :func:`mismatch` when any of the kinds ``theirs`` queued on ``name`` is of another family than ``ours``:
    the grant rule means nothing across families (a plain lock, each semaphore limit, read/write)."""
    for kind in theirs:
        if family(kind) != family(ours):
            raise mismatch(name, ours, kind)


def mismatch(name: str, ours: str, theirs: str) -> LockKindMismatch:
    return LockKindMismatch(
        f"lock {name!r} is in use as {describe(theirs)}; it cannot be used as {describe(ours)} at the same time. "
        "Use one kind (and one semaphore limit) per name",
        name=name,
    )


def lock_state(name: str, entries: Sequence[Waiter], kinds: Sequence[str]) -> LockState:
    """A queue's entries (in queue order, with their kinds) as an inspector shows them: who holds, who waits."""
    held = holding(kinds)
    holders = tuple(entry for entry, holds in zip(entries, held, strict=True) if holds)
    waiters = tuple(entry for entry, holds in zip(entries, held, strict=True) if not holds)
    return LockState(name=name, holder=holders[0], waiters=waiters, holders=holders)
