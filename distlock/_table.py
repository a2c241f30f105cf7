"""The lock table that operators read: one line per holder and waiter, as ``distlock list`` and ``manage.py distlock``
print it.

Only formatting: the states come from ``Client.inspect()``, read by the caller, so what can go wrong here is nothing
but a caller passing something that is not a :class:`~distlock.LockState`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._protocol import LockState

__all__ = ["format_lock_table"]


def format_lock_table(states: Iterable[LockState], *, prefix: str = "") -> str:
    """The locks whose names start with ``prefix`` as a text table, holders first (several for a semaphore or
    readers), then the waiters in queue order.

    Columns: lock name, role (``holder`` or ``waiter N``), fencing token, the seconds the entry's lease has left
    (``-`` when the service cannot tell), and the owner id. Without any lock: ``no locks held``.
    """
    rows = [
        (state.name, "holder" if position < len(holders) else f"waiter {position - len(holders) + 1}", entry)
        for state in states
        if state.name.startswith(prefix)
        for holders in (state.holders,)
        for position, entry in enumerate((*holders, *state.waiters))
    ]
    if not rows:
        return "no locks held"
    width = max(len("LOCK"), *(len(name) for name, _, _ in rows))
    lines = [f"{'LOCK':<{width}}  {'ROLE':<9}  {'TOKEN':>10}  {'LEASE LEFT':>10}  OWNER"]
    for name, role, entry in rows:
        left = "-" if entry.ttl_left is None else f"{entry.ttl_left:.0f} s"
        lines.append(f"{name:<{width}}  {role:<9}  {entry.token:>10}  {left:>10}  {entry.owner}")
    return "\n".join(lines)
