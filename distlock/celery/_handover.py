"""Handing a lock from the process that sent a task to the worker that runs it.

A distlock lock belongs to one handle in one process: only that process can keep it alive or release it, and
nothing can move a lease from one process to another. Two cases still need the lock to outlive the process step
that took it:

- ``lock_on="enqueue"``: the caller of ``apply_async`` takes the lock (a *reservation*) so that only one call is
  queued or running, and the worker that later runs the task must end up holding it;
- ``self.retry()``: the failing attempt holds the lock, and the retry, perhaps on another worker, must get it back
  without a gap in which a duplicate could start.

Both work the same way. The sending process holds the lock under the task's id as owner (``client.holder()`` shows
it), writes the lock name and the reservation's fencing token into the message headers, and hands the lock to this
module's :class:`Reservations`. The worker that runs the message (:func:`take_over`) checks that the reservation is
still the holder, takes a second, per-reservation *takeover* lock as a signal, and queues for the real lock behind
the reservation. A thread in the sending process polls each reservation (after 5 ms, then after 5 % of its age, at
least every 100 ms: a worker waits for the handover at most that long, and a reservation left in a backlog costs one
read every 100 ms); once it sees a waiter behind it *and* the takeover lock held, it releases the reservation and the
queue hands the lock to the worker. The poll is the price of a lock service without a "tell me when someone queues"
primitive: a process can only be woken when a lock it waits for is *released*, and nothing the worker could release
exists before it arrives. The lock is held without a gap from enqueue to the end of the run: first by the
reservation, then by the worker, whose ticket was already next in the FIFO queue.

Races and failures, in prose:

- *The sender dies or loses the lock service* (SIGKILL, OOM, a partition): the reservation's lease lapses within
  ``ttl`` and the waiting worker becomes the holder. A crashed enqueue never holds the key longer than ``ttl``.
- *The message is lost* (never delivered, purged, expired): nobody takes the reservation over, and it ends at its
  hold limit (``lock_max_queued``, default ``ttl``, counted from when the task is due; for an enqueue-time
  reservation it is the lock's ``max_hold``, which the core enforces even if this thread is stuck). A message that
  waits longer than that in the broker loses its reservation: a duplicate can then be queued, and the two run one
  after the other, never at once, since a run always holds the lock.
- *The sender exits normally* before a worker took over: closing its client revokes the lease at once, so the same
  applies from that moment. A short-lived script that enqueues and exits gets "one at a time", not "one queued".
- *The message is delivered twice* (redelivery): only one delivery gets the takeover lock; the other finds the
  reservation gone or held by a run of its own task id, which the task treats as "already running".
- *A stranger waits behind the reservation* (a run-mode call of the same lock name, a caller racing on an empty
  queue): the sender does not release for a waiter alone, only when the takeover lock of *this* reservation is held.
  A worker that takes the takeover lock and has not yet queued can coincide with a stranger's waiting ticket; then
  the reservation is released to the stranger, who runs first, and the worker runs after it. Order, not exclusion,
  is what that rare race can cost.
- *The sender's poll fails* (the lock service briefly unavailable): it tries again at the next poll; the worker's
  wait is bounded by ``ttl`` plus a grace period, after which it treats the call as a duplicate of a run it cannot
  reach.

After ``fork()`` a child starts with no reservations: its parent's stay with the parent, whose thread hands them on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import distlock
from distlock import DistlockError

__all__ = ["RESERVATIONS", "Reservations", "take_over", "takeover_name"]

log = logging.getLogger("distlock.celery")

#: A reservation is polled after this share of its age (within the bounds below): a task picked up at once is handed
#: over within milliseconds, and a young reservation costs polls that grow with the log of its age, not linearly.
POLL_SHARE = 0.05
#: Shortest and longest interval between two polls of one reservation. The longest bounds how long a worker waits
#: for the handover (and what a backlog of old reservations costs: one request per reservation per interval).
FIRST_POLL = 0.005
MAX_POLL = 0.1
#: Reservations polled at once (each poll is one or two requests to the lock service).
POLLERS = 8
#: How much longer than ``ttl`` a worker waits for a reservation to pass to it (polls, RPCs, a slow machine).
TAKEOVER_GRACE = 2.0


def takeover_name(name: str, token: int) -> str:
    """The lock a worker holds to say "I am taking over reservation ``token`` of lock ``name``"."""
    return f"{name}#takeover:{token}"


@dataclasses.dataclass(eq=False)
class _Reservation:
    client: distlock.Client
    lock: distlock.Lock
    token: int
    kept_at: float
    deadline: float | None
    next_poll: float = 0.0

    def schedule(self, now: float) -> None:
        self.next_poll = now + min(max(POLL_SHARE * (now - self.kept_at), FIRST_POLL), MAX_POLL)


class Reservations:
    """The locks this process holds only until a worker takes them over, and the thread that hands them on."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._items: list[_Reservation] = []
        self._thread: threading.Thread | None = None

    def keep(self, client: distlock.Client, lock: distlock.Lock, hold_for: float | None = None) -> None:
        """Hold ``lock`` until a worker takes it over, it is lost, or ``hold_for`` seconds pass."""
        now = time.monotonic()
        reservation = _Reservation(client, lock, lock.token, now, None if hold_for is None else now + hold_for)
        reservation.schedule(now)
        with self._cond:
            self._items.append(reservation)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="distlock-celery-handover", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def cancel(self, lock: distlock.Lock) -> None:
        """Stop keeping ``lock`` and release it (its message was never sent)."""
        with self._cond:
            self._items = [r for r in self._items if r.lock is not lock]
        _release_quietly(lock)

    def held(self) -> list[distlock.Lock]:
        """The reservations this process holds now (for tests and inspection)."""
        with self._cond:
            return [r.lock for r in self._items]

    def _run(self) -> None:
        with ThreadPoolExecutor(POLLERS, thread_name_prefix="distlock-celery-poll") as pool:
            while True:
                with self._cond:
                    now = time.monotonic()
                    due = [r for r in self._items if r.next_poll <= now]
                    if not due:
                        wake = min((r.next_poll for r in self._items), default=None)
                        self._cond.wait(None if wake is None else wake - now)
                        continue
                list(pool.map(self._step, due))

    def _step(self, reservation: _Reservation) -> None:
        if self._finished(reservation):
            with self._cond:
                self._items = [r for r in self._items if r is not reservation]
            _release_quietly(reservation.lock)
        else:
            reservation.schedule(time.monotonic())

    def _finished(self, reservation: _Reservation) -> bool:
        """True when the reservation should end now: taken over, lost, gone, or past its deadline."""
        lock = reservation.lock
        if not lock.owned():
            return True
        if reservation.deadline is not None and time.monotonic() >= reservation.deadline:
            log.warning("distlock.celery: no worker took over %r in time; releasing the reservation", lock.name)
            return True
        try:
            holder = reservation.client.holder(lock.name)
            if holder is None or holder.token != reservation.token:
                return True
            signal = takeover_name(lock.name, reservation.token)
            return holder.waiters > 0 and reservation.client.holder(signal) is not None
        except DistlockError as e:
            log.debug("distlock.celery: polling reservation %r failed (%s); trying again", lock.name, e)
            return False


def _release_quietly(lock: distlock.Lock) -> None:
    with contextlib.suppress(DistlockError):
        lock.release()


def take_over(client: distlock.Client, lock: distlock.Lock, token: int, wait: float) -> bool:
    """Acquire ``lock`` as the successor of reservation ``token``, waiting up to ``wait`` seconds.

    False, at once, when that reservation no longer holds the lock (it lapsed, was released, or another delivery of
    the message is taking it over); False after ``wait`` when it never passed the lock on.
    """
    holder = client.holder(lock.name)
    if holder is None or holder.token != token:
        return False
    signal = client.lock(takeover_name(lock.name, token), ttl=lock.ttl, owner=lock.owner)
    if not signal.acquire(blocking=False):
        return False
    try:
        return lock.acquire(timeout=wait)
    finally:
        _release_quietly(signal)


RESERVATIONS = Reservations()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RESERVATIONS._reset)
