"""Fences: a fencing token together with the name of the lock it came from, and the policy of the database integrations.

A fenced row is guarded by exactly one lock name (its model declares a template such as ``"account:{pk}"``). A
write to it must carry a token *of that lock*: tokens of different locks may be numbers on a common scale (etcd's
one revision counter, a SQL table's one id sequence), so a token of another, busier lock would pass the
``fence_token <= :token`` check and defeat the fence. :func:`fence_for` finds the right fence in the current context
(or checks one passed explicitly) and refuses any other. :func:`fence_for_write` is the whole policy Django's
``FencedModel`` and ``distlock_sqla`` apply to a row's write; :func:`fence_refused` is the one call every refusal
passes through (it counts the ``distlock.fence.refused`` metric) and :func:`stale_token_message` the one explanation.
The :class:`Fence` value itself is defined next to the lock that hands it out, in ``_lock.py``.

What can go wrong: a fence of another lock is passed (``LockNotOwned``); no lock of that name is held here
(:func:`fence_for` returns None; :func:`fence_for_write` raises ``LockNotOwned`` when other locks are held, since
the caller most likely holds the wrong one, and ``UnfencedWrite`` in strict mode, else returns None: a plain write).
"""

from __future__ import annotations

from collections.abc import Callable

from . import _metrics
from ._errors import LockNotOwned, UnfencedWrite
from ._lock import Fence, Lock, current_lock

__all__ = ["Fence", "current_fence", "fence_for", "fence_for_write", "fence_refused", "stale_token_message"]


def current_fence(name: str | None = None) -> Fence | None:
    """The fence of the innermost lock held in this context (named ``name``, when given), or None."""
    lock = current_lock(name)
    return None if lock is None else Fence.of(lock)


def fence_for(name: str, fence: Fence | Lock | None = None) -> Fence | None:
    """The fence to write a row guarded by lock ``name`` with.

    With ``fence`` (a :class:`Fence` or a held :class:`Lock`): that one, if it belongs to ``name``, else
    ``LockNotOwned``. Without: the fence of the innermost lock named ``name`` held in this context, or None.
    """
    if fence is None:
        return current_fence(name)
    given = Fence.of(fence) if isinstance(fence, Lock) else fence
    if given.name != name:
        raise LockNotOwned(
            f"this row is guarded by lock {name!r}, but the fencing token given is of lock {given.name!r}; "
            f"acquire {name!r} and write under it",
            name=name,
        )
    return given


def fence_for_write(
    name: str,
    fence: Fence | Lock | None = None,
    *,
    what: str | Callable[[], str],
    strict: bool,
    inserting: bool = False,
) -> Fence | None:
    """The fence a write to ``what`` (e.g. ``"Account pk=1"``), a row guarded by lock ``name``, must carry.

    :func:`fence_for` first: an explicit ``fence`` must be of lock ``name`` (``LockNotOwned``), else the innermost
    lock of that name held here. With none held: ``LockNotOwned`` if other locks are held (their tokens say nothing
    about this row), except for an insert (``inserting``), whose lock may not be nameable before the row exists;
    ``UnfencedWrite`` if ``strict``; else None, and the caller writes unfenced. ``what`` may be a callable, called
    only to build an error message.
    """
    found = fence_for(name, fence)
    if found is not None:
        return found
    held = current_lock()
    if held is not None and not inserting:
        raise LockNotOwned(
            f"{what() if callable(what) else what} is guarded by lock {name!r}, but the lock held here is "
            f"{held.name!r}: its token says nothing about this row. Acquire {name!r} to write it",
            name=name,
        )
    if strict:
        raise UnfencedWrite(
            f"{what() if callable(what) else what} is guarded by lock {name!r}, which is not held here, and this "
            f"write must be fenced (strict): hold {name!r} and write inside it, or pass fence="
            + (
                " (a new row: hold the lock its values name around the insert; a name made from an automatic primary "
                "key exists only after the insert, so give the key yourself)"
                if inserting
                else ""
            )
        )
    return None


def stale_token_message(
    what: str, token: int | None, current: int | None, *, read: int | None = None, lock: str | None = None
) -> str:
    """Why the database refused ``what`` (e.g. ``"update of Account pk=1"``), written with ``token``.

    ``current`` is the token found on the row afterwards (None: the row is gone); ``read``, for a write of a row
    read earlier, the token it was read with; ``lock``, the lock the token is of. For ``StaleFenceToken``.
    """
    with_token = "without a fencing token (no lock held)" if token is None else f"with fencing token {token}"
    if current is None:
        why = "the row no longer exists"
    elif token is not None and current > token:
        holder = f"of lock {lock!r} " if lock else ""
        why = (
            f"the row carries the newer token {current}: a newer holder {holder}has claimed it, and this holder's "
            "work must not be written"
        )
    elif read is not None and current != read:
        why = (
            f"the row was written after this session read it (read with token {read}, now {current}). Claim rows "
            "inside the lock before reading what you will write back"
        )
    else:
        why = f"the row's token is {current}"
    return f"{what} {with_token} refused: {why}"


def fence_refused(
    what: str,
    token: int | None,
    current: int | None,
    *,
    read: int | None = None,
    lock: str | None = None,
    family: str | None = None,
) -> str:
    """Count a write the database refused and return why (:func:`stale_token_message` of the same arguments).

    For integrations, once per refused write, where they raise ``StaleFenceToken``: it adds one to the
    ``distlock.fence.refused`` metric, with ``family`` (the template of the row's lock, e.g. ``"account:{pk}"``;
    never the lock name) as its ``distlock.lock.family`` attribute.
    """
    _metrics.fence_refused(family)
    return stale_token_message(what, token, current, read=read, lock=lock)
