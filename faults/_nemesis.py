"""The nemesis: faults on a lock service under test (a `Service`: ``_service``) and on the lock-holding worker
processes, each undone after.

A fault runs for ``duration`` seconds and is recorded as a `Window` (name, start and end on CLOCK_MONOTONIC) for the
checker's per-fault availability. `Nemesis.run` has the service do it (`Service.do`: ``_etcd``, ``_servers``),
which hands the faults on workers back to the nemesis:

- ``holder-pause`` (on every service): SIGUSR1 asks the workers to SIGSTOP themselves between read and write, lock
  held (see ``_workload``); once the kernel shows the first stopped it stays so for the duration (longer than the
  TTL: its lease lapses and another worker takes the lock), then SIGCONT: it resumes with a stale token and tries its
  write, at the moment the newest holder is stopped between its own read and write (the same way).
- `Nemesis.stale_write`, the same with something done to the service meanwhile (Redis's restart).

Worker 0 runs with group `CLIENT_GID` (the runner starts it so, as root): etcd's client partition tells its packets
apart by it.

What can go wrong: a fault that fails half-way is still undone (``finally``: SIGCONT sent to the workers,
`Service.undo`), and the runner calls `Nemesis.undo` once more before it closes the service. When no worker
reaches its pause point within 30 s, that is a `HarnessError`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from distlock.testing import HarnessError

if TYPE_CHECKING:
    from faults._service import Service

__all__ = ["CLIENT_GID", "HOLDER_PAUSE", "Nemesis", "Window"]

CLIENT_GID = 64990
HOLDER_PAUSE = "holder-pause"


#: How long a holder pause waits for a worker to stop at its pause point (the lock must come round to one).
_PAUSE_WITHIN = 90.0


@dataclass(frozen=True)
class Window:
    """One fault, as it happened."""

    fault: str
    start: float
    end: float
    note: str = ""


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class Nemesis:
    """Faults on ``service`` and on the worker processes ``workers`` (pids; worker 0 runs with `CLIENT_GID`)."""

    def __init__(self, service: Service, workers: Sequence[int], lock_name: str) -> None:
        self.service = service
        self.workers = list(workers)
        self.lock_name = lock_name
        self.windows: list[Window] = []
        self._stopped: set[int] = set()

    def run(self, fault: str, duration: float) -> Window:
        """Do ``fault`` for ``duration`` s; undo it (also on error); record and return its window."""
        start = _now()
        note = ""
        try:
            note = self.service.do(fault, duration, self)
        finally:
            self.undo()
        window = Window(fault, start, _now(), note)
        self.windows.append(window)
        return window

    def undo(self) -> None:
        """Undo whatever a fault left: SIGCONT the workers, then the service's own undo (servers back, no nft)."""
        for pid in sorted(self._stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2)
                os.kill(pid, signal.SIGCONT)
        self._stopped.clear()
        self.service.undo()

    def holder_pause(self, duration: float) -> str:
        """A worker stops itself between read and write (lock held) for ``duration``; it resumes at the worst time."""
        return self.stale_write(hold=duration, timeout=duration)

    def stale_write(self, hold: float, timeout: float, during: Callable[[], str] | None = None) -> str:
        """Stop a worker between its read and write, lock held, for ``hold`` s at least (``during`` runs then), and
        continue it at the worst time.

        Every worker is asked to stop at its pause point: the first there is the stale holder, and the first to get
        the lock after it lost it stops after its read (``timeout`` s at most are waited for that), so the stale holder
        writes while a newer holder is between its read and its write, and nobody wrote in between (the
        interleaving a write-only fence lets through).
        """
        # Every worker is asked: the stale holder is whoever holds the lock next (under the queue's order, each in
        # turn). Asking one chosen worker failed CI once, on a loaded machine, when it did not get the lock in 30 s;
        # asking them all, a run beside other heavy work once waited 30 s in vain too, after a leader kill: 90 s.
        self._ask_pause(self.workers)
        stale = self._first_stopped(self.workers, _PAUSE_WITHIN)
        if stale is None:
            raise HarnessError(
                f"none of the workers (pids {self.workers}) reached its pause point within {_PAUSE_WITHIN:g} s"
            )
        frozen_at = _now()
        others = [pid for pid in self.workers if pid != stale]
        done = during() + "; " if during else ""
        # None when the stale holder keeps the database's row lock (a claim in its open transaction): nobody reads.
        newer = self._first_stopped(others, timeout)
        time.sleep(max(0.0, hold - (_now() - frozen_at)))
        os.kill(stale, signal.SIGCONT)
        stopped = _now() - frozen_at
        time.sleep(0.2)  # the stale holder's write: a few statements
        self._cancel_pauses(others)
        self._stopped.clear()
        there = f"while pid {newer} was there too" if newer else "alone (nobody else reached a read)"
        return f"{done}worker pid {stale} stopped {stopped:.2f} s between read and write; resumed {there}"

    def _ask_pause(self, pids: Sequence[int]) -> None:
        """Ask ``pids`` to stop at their pause point (SIGUSR1)."""
        self._stopped.update(pids)
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)

    def _first_stopped(self, pids: Sequence[int], timeout: float) -> int | None:
        """The first of ``pids`` seen stopped, None after ``timeout``."""
        deadline = _now() + timeout
        while _now() < deadline:
            stopped = [pid for pid in pids if _state(pid) in ("T", "t")]
            if stopped:
                return stopped[0]
            time.sleep(0.002)
        return None

    def _cancel_pauses(self, pids: Sequence[int]) -> None:
        """Withdraw the pause requests (SIGUSR2) and continue whoever stopped, also just after the withdrawal."""
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2)
        deadline = _now() + 0.5
        while _now() < deadline:
            for pid in pids:
                if _state(pid) in ("T", "t"):
                    os.kill(pid, signal.SIGCONT)
            time.sleep(0.01)


def _state(pid: int) -> str:
    """The process state letter of ``pid`` from /proc (``T`` stopped, ``Z`` zombie), "" when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
