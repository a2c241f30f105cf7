"""The lock inspector: every held lock, its queued waiters, tokens and lease time left, read live from the service.

Shown by the admin's lock page (``views.py``, at ``admin/distlock/``) and by ``manage.py distlock``. Holders and
waiters appear by their opaque owner id (a random nonce, or the Celery task id), never by anything secret. What can
go wrong: the lock service is unreachable, or (``ConfigurationError``) bad settings or a backend that cannot list
its locks — any ``DistlockError``: the page says so (status 503) and the command exits non-zero with the error.
"""

from __future__ import annotations

from dataclasses import dataclass

import distlock

from ._client import get_client
from ._conf import conf

__all__ = ["LockRow", "describe", "find_locks", "lock_table", "spellings"]


@dataclass(frozen=True)
class LockRow:
    """One line of the inspector: a holder (``position`` 0; every holder of a semaphore or readers) or a waiter
    (1, 2, ...)."""

    name: str
    position: int
    owner: str
    token: int
    ttl_left: float | None


def lock_table(prefix: str | None = None) -> list[LockRow]:
    """Every lock (whose name starts with ``prefix``, default ``DISTLOCK["KEY_PREFIX"]``) as inspector rows."""
    wanted = conf()["KEY_PREFIX"] if prefix is None else prefix
    rows = []
    for state in get_client().inspect():
        if not state.name.startswith(wanted):
            continue
        for holder in state.holders:
            rows.append(LockRow(state.name, 0, holder.owner, holder.token, holder.ttl_left))
        for position, waiter in enumerate(state.waiters, start=1):
            rows.append(LockRow(state.name, position, waiter.owner, waiter.token, waiter.ttl_left))
    return rows


def find_locks(search: str = "") -> list[distlock.LockState]:
    """This project's locks (names under ``DISTLOCK["KEY_PREFIX"]``) whose name starts with ``search``, by name.

    ``search`` may be given with or without the key prefix: with ``KEY_PREFIX = "shop:"``, both ``order:`` and
    ``shop:order:`` find ``shop:order:42``.
    """
    key_prefix: str = conf()["KEY_PREFIX"]
    wanted = spellings(search)
    return [
        state for state in get_client().inspect() if state.name.startswith(key_prefix) and state.name.startswith(wanted)
    ]


def spellings(given: str) -> tuple[str, ...]:
    """What an operator's ``given`` name (or name prefix) may stand for: itself, then itself under
    ``DISTLOCK["KEY_PREFIX"]`` (with ``KEY_PREFIX = "shop:"``, ``order:42`` stands for ``shop:order:42``)."""
    return tuple(dict.fromkeys((given, conf()["KEY_PREFIX"] + given)))


def describe(error: distlock.DistlockError) -> str:
    return f"{type(error).__name__}: {error}"
