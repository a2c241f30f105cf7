"""The Celery app of the beat-on-a-leader tests, run as ``python beatapp.py beat`` by each beat process.

The settings come from the environment (the test starts several beats on one broker, lock service and election).
One schedule entry, ``every-second``, sends the task ``beat.tick`` every second to the test's own queue; no worker
consumes it, so the test reads every message the beats sent from the broker's list.

``$DISTLOCK_BEAT_TEST_PAUSE`` names a file: a beat whose pid is written there stops itself (SIGSTOP) when it is about
to send, after its tick found it leading and before it records the run: the worst moment for a pause, made certain.
``DISTLOCK_BEAT_TEST_UNFENCED=1`` turns the ledger write off (the leader sends without asking the lock service), to
show that the test catches a run sent twice without it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry

import distlock
from distlock.celery import LeaderScheduler

TTL = 2.0


class PausingScheduler(LeaderScheduler):
    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        pause = Path(os.environ["DISTLOCK_BEAT_TEST_PAUSE"])
        if pause.exists() and pause.read_text().strip() == str(os.getpid()):
            pause.unlink()
            os.kill(os.getpid(), signal.SIGSTOP)
        super().apply_entry(entry, producer)

    def _record(self, election: distlock.Election, ledger: str) -> None:
        if os.environ.get("DISTLOCK_BEAT_TEST_UNFENCED") != "1":
            super()._record(election, ledger)


app = Celery("distlock_beat_tests", broker=os.environ.get("DISTLOCK_BEAT_TEST_BROKER", "memory://"))
app.conf.update(
    distlock_url=os.environ.get("DISTLOCK_BEAT_TEST_LOCK_URL"),
    distlock_options={"connect_timeout": 5.0, "request_timeout": 5.0},
    distlock_beat_ttl=TTL,
    distlock_beat_election=os.environ.get("DISTLOCK_BEAT_TEST_ELECTION", "celery-beat-tests"),
    beat_scheduler=PausingScheduler,
    beat_schedule={"every-second": {"task": "beat.tick", "schedule": 1.0}},
    task_default_queue=os.environ.get("DISTLOCK_BEAT_TEST_QUEUE", "celery"),
)


@app.task(name="beat.tick")
def tick() -> None:
    """Never run: the test reads the messages from the broker."""


if __name__ == "__main__":
    app.start(sys.argv[1:])
