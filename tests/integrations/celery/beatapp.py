"""The Celery app of the beat-on-a-leader tests, run as ``python beatapp.py beat`` by each beat process.

The settings come from the environment (the test starts several beats on one broker, lock service and election).
One schedule entry, ``every-second``, sends the task ``beat.tick`` every second to the test's own queue; no worker
consumes it, so the test reads every message the beats sent from the broker's list.

``$DISTLOCK_BEAT_TEST_PAUSE`` names a file: a beat whose pid is written there stops itself (SIGSTOP) when it is about
to send, after its tick found it leading and before it records the run: the worst moment for a pause, made certain.
Each beat appends what it did to ``$DISTLOCK_BEAT_TEST_EVENTS`` (JSON lines on ``time.monotonic()``, one clock for
every process): ``sent`` after each message, ``deposed`` when it finds it no longer leads.
``DISTLOCK_BEAT_TEST_UNFENCED=1`` turns the ledger write off (the leader sends without asking the lock service), to
show that the test catches a run sent twice without it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry

import distlock
from distlock.celery import LeaderScheduler

TTL = 2.0


def record(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": time.monotonic(), "pid": os.getpid(), **fields}) + "\n"
    path = os.environ.get("DISTLOCK_BEAT_TEST_EVENTS")
    if path:
        with open(path, "a") as events:
            events.write(line)


class PausingScheduler(LeaderScheduler):
    def apply_async(self, entry: ScheduleEntry, *args: Any, **kwargs: Any) -> Any:
        result = super().apply_async(entry, *args, **kwargs)
        record("sent", term=self._term)
        return result

    def _leading(self) -> bool:
        term = self._term
        leading = super()._leading()
        if term is not None and self._term is None:
            record("deposed", term=term)
        return leading

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
