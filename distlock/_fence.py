"""Fences: a fencing token together with the name of the lock it came from, for the database integrations.

A fenced row is guarded by exactly one lock name (its model declares a template such as ``"account:{pk}"``). A
write to it must carry a token *of that lock*: tokens are comparable across names in one etcd cluster, so a token
of another, busier lock would pass the ``fence_token <= :token`` check and defeat the fence. :func:`fence_for`
finds the right fence in the current context (or checks one passed explicitly) and refuses any other.

What can go wrong: no lock of that name is held here (None: the integration writes unfenced, or raises
``UnfencedWrite`` in strict mode); a fence of another lock is passed (``LockNotOwned``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import LockNotOwned
from ._lock import Lock, current_lock

__all__ = ["Fence", "current_fence", "fence_for"]


@dataclass(frozen=True)
class Fence:
    """A fencing token and the lock name it belongs to. ``Lock.fence`` gives the fence of a held lock."""

    name: str
    token: int

    @classmethod
    def of(cls, lock: Lock) -> Fence:
        return cls(lock.name, lock.token)


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
