"""Handing a lock from the process that sent a task to the worker that runs it.

A distlock lock belongs to one handle in one process: only that process keeps its lease alive, and nothing can move
a lease from one process to another. Two cases still need the lock to outlive the process step that took it:

- ``lock_on="enqueue"``: the caller of ``apply_async`` takes the lock (a *reservation*) so that only one call is
  queued or running, and the worker that later runs the task must end up holding it;
- ``self.retry()``: the failing attempt holds the lock, and the retry, perhaps on another worker, must get it back
  without a gap in which a duplicate could start.

Both work the same way, and the sender takes no part once the message is out. The sending process holds the lock
under the task's id as owner (``client.holder()`` shows it), writes the lock name and the reservation's fencing token
into the message headers, and hands the lock over (``Lock.hand_over``): its lease stays alive as before, and the key
is left for the worker to remove. The worker that runs the message (:func:`take_over`) first takes a second,
per-reservation *takeover* lock, without waiting, so that only one delivery of the message goes on; then it joins
the lock's FIFO queue behind the reservation and, once queued, removes the reservation's key, checked against its
token (``Lock.take_over``). The queue makes the worker the holder at that moment: the lock is held without a gap
from enqueue to the end of the run, first by the reservation, then by the worker. The sender learns of it at its
client's next check of its keys (one request per lease after each refresh, however many reservations it holds) and
drops the handle quietly. No thread, no poll, no request per reservation in the sender: a reservation left in a
backlog costs nothing until it is taken over or its time runs out.

Races and failures, in prose:

- *The sender dies or loses the lock service* (SIGKILL, OOM, a partition): the reservation's lease lapses within
  ``ttl``. A worker already queued behind it becomes the holder then; one that comes later finds the lock free and
  takes it. A crashed enqueue never holds the key longer than ``ttl``.
- *The message is lost* (never delivered, purged, expired): nobody takes the reservation over, and it ends at its
  deadline (``lock_max_queued``, default ``ttl``, counted from when the task is due), which the sender's client
  enforces with the lock's hold deadline (a warning is logged). A message that waits longer than that in the broker
  loses its reservation: a duplicate can then be queued, and the two run one after the other, never at once, since
  a run always holds the lock. When the late message arrives and another call's reservation holds the lock, its
  take-over finds another token at the head, leaves the queue, and the call is a duplicate (skipped).
- *The sender exits normally* before a worker took over: closing its client revokes the lease at once, so the same
  applies from that moment. A short-lived script that enqueues and exits gets "one at a time", not "one queued".
- *The worker dies* after it removed the reservation: it holds the lock itself, and its lease lapses within ``ttl``.
  Before that: the reservation lives on until its deadline. A redelivery (``acks_late``) finds the dead worker's
  takeover lock still held, goes the ordinary way, sees the lock held under its own task id, and waits up to
  ``ttl`` plus a grace period for it: it runs if the reservation ends within that wait, else it is dropped as
  already running. Never two runs at once; at worst none, with ``lock_max_queued`` much longer than ``ttl``.
- *The message is delivered twice* (redelivery): only one delivery gets the takeover lock, so only one queues and
  removes the reservation; the other goes the ordinary way, finds the lock held under its own task id, and treats
  the call as already running (it waits for a dead holder's lease to lapse, and is dropped if the holder lives).
  Without the takeover lock both would queue, and one would run after the other.
- *Someone else queues between the reservation and the worker* (a run-mode call of the same lock name with a
  ``lock_timeout``): the reservation's key is removed only once the worker is queued too, so the lock passes to that
  waiter, who runs first, and the worker runs after it. Order, not exclusion, is what that rare race can cost. A
  caller racing with a non-blocking attempt never sees the lock free in between: the worker is already queued.
- *The lock service is briefly away*: every step is a request retried within the client's request timeout; a worker
  that still cannot reach it fails the task with ``BackendUnavailable``, and nothing was removed that it did not
  queue behind (the join comes first, the removal is token-checked). The sender only needs its lease refreshed.

After ``fork()`` a child starts with no reservations: its parent's stay with the parent, whose client keeps them.
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
    signal = client.lock(takeover_name(lock.name, token), ttl=lock.ttl, owner=lock.owner)
    if not signal.acquire(blocking=False):
        return False
    try:
        return lock.take_over(token, timeout=wait)
    finally:
        _release_quietly(signal)


RESERVATIONS = Reservations()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RESERVATIONS._reset)
