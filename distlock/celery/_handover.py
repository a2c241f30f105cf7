"""Handing a lock from the process that sent a task to the worker that runs it (enqueue mode, ``self.retry()``).

The sender holds the lock under the task's id as owner, writes its name and token into the message headers, and
hands it over (``Lock.hand_over``; :data:`RESERVATIONS` lists them): the lease stays alive, the key is left for the
worker, and the sender takes no further part (no thread, no poll, no request per reservation). The worker
(:func:`take_over`) first takes a per-reservation *takeover* lock without waiting, so that only one delivery of the
message goes on, then joins the lock's queue behind the reservation and removes the reservation's key, checked
against its token (``Lock.take_over``): the lock is held without a gap from enqueue to the end of the run.

What can go wrong: a dead sender's reservation lapses within ``ttl``; a lost message's ends at ``lock_max_queued``
(logged); a sender that exits normally ends its reservations at once. A duplicate can then be queued, but two runs
never overlap. A worker that cannot reach the lock service fails with ``BackendUnavailable``, having removed nothing
it did not queue behind. Each race, in prose: docs/integrations/celery.md, "Hand-over races". After ``fork()`` a
child starts with no reservations: its parent's stay with the parent.
"""

from __future__ import annotations

import contextlib
import os
import threading

import distlock
from distlock import DistlockError

__all__ = ["RESERVATIONS", "Reservations", "take_over", "takeover_name"]

#: How much longer than ``ttl`` a worker waits for a reservation to pass to it (RPCs, a slow machine).
TAKEOVER_GRACE = 2.0


def takeover_name(name: str, token: int) -> str:
    """The lock a worker holds to say "I am taking over reservation ``token`` of lock ``name``"."""
    return f"{name}#takeover:{token}"


class Reservations:
    """The locks this process has handed over and holds only until a worker takes them over (for inspection)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._mutex = threading.Lock()
        self._items: list[distlock.Lock] = []
        self._prune_at = 64

    def keep(self, lock: distlock.Lock, hold_for: float) -> None:
        """Hand ``lock`` over: hold it until a worker takes it over, it is lost, or ``hold_for`` seconds pass.

        Raises what ``Lock.hand_over`` raises (``LockLost`` when the lock was lost meanwhile)."""
        lock.hand_over(hold_for)
        with self._mutex:
            self._items.append(lock)
            if len(self._items) >= self._prune_at:  # forget the ones taken over; amortised O(1) per keep
                self._items = [each for each in self._items if each.owned()]
                self._prune_at = max(64, 2 * len(self._items))

    def cancel(self, lock: distlock.Lock) -> None:
        """Stop keeping ``lock`` and release it (its message was never sent)."""
        with self._mutex:
            self._items = [each for each in self._items if each is not lock]
        _release_quietly(lock)

    def held(self) -> list[distlock.Lock]:
        """The reservations this process holds, as far as it knows: one taken over leaves the list when the
        client next checks its keys (about every third of the lock's ``ttl``)."""
        with self._mutex:
            return [each for each in self._items if each.owned()]


def _release_quietly(lock: distlock.Lock) -> None:
    with contextlib.suppress(DistlockError):
        lock.release()


def take_over(client: distlock.Client, lock: distlock.Lock, token: int, wait: float) -> bool:
    """Acquire ``lock`` as the successor of reservation ``token``, waiting up to ``wait`` seconds.

    False, at once, when another delivery of the message is taking it over, or the lock is held under another token
    (the reservation ended: it lapsed, was released, or was taken over); False after ``wait`` when the waiters ahead
    did not leave in time. True also when the reservation ended and the lock was free.
    """
    family = None if lock.family is None else f"{lock.family}#takeover"  # bounded, as the task's family is
    signal = client.lock(takeover_name(lock.name, token), ttl=lock.ttl, owner=lock.owner, family=family)
    if not signal.acquire(blocking=False):
        return False
    try:
        return lock.take_over(token, timeout=wait)
    finally:
        _release_quietly(signal)


RESERVATIONS = Reservations()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RESERVATIONS._reset)
