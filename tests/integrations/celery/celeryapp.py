"""The Celery app of the singleton-task tests: the same tasks in the test process (which sends) and the worker.

``make_app(...)`` builds the app on a real broker (Redis), a real result backend (Redis) and a real etcd. The worker
runs this file as a script (``python celeryapp.py worker ...``) with the URLs in the environment; the tests load it
by path (``conftest.py``), since a test directory named ``celery`` cannot be a package.

Every task records what happened to it as JSON lines appended to ``$DISTLOCK_CELERY_TEST_EVENTS`` (one small
``O_APPEND`` write per event, so lines from concurrent processes never interleave): when a run started and ended
(on ``time.monotonic()``, which is one clock for every process of the machine), its pid, task id and fencing token.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from celery import Celery, Task
from celery.exceptions import Ignore

import distlock
from distlock.celery import SingletonTask, get_client

QUEUE_ENV = "DISTLOCK_CELERY_TEST_QUEUE"
ENV = ("DISTLOCK_CELERY_TEST_BROKER", "DISTLOCK_CELERY_TEST_BACKEND", "DISTLOCK_CELERY_TEST_ETCD")
EVENTS_ENV = "DISTLOCK_CELERY_TEST_EVENTS"
#: Seconds after which the Redis broker delivers an unacknowledged message again (the worker's transport option;
#: unset: kombu's hour), checked every second.
VISIBILITY_ENV = "DISTLOCK_CELERY_TEST_VISIBILITY_TIMEOUT"
TTL = 2.0


def record(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": time.monotonic(), "pid": os.getpid(), **fields}) + "\n"
    fd = os.open(os.environ[EVENTS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def make_app(broker: str, backend: str, etcd_url: str, queue: str) -> Celery:
    app = Celery("distlock_celery_tests", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(
        distlock_url=etcd_url,
        distlock_options={"connect_timeout": 5.0, "request_timeout": 5.0},
        task_default_queue=queue,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        result_expires=600,
        broker_connection_retry_on_startup=True,
    )
    if os.environ.get(VISIBILITY_ENV):
        app.conf.broker_transport_options = {
            "visibility_timeout": float(os.environ[VISIBILITY_ENV]),
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }

    def run_body(task: SingletonTask, job: str, seconds: float, **extra: Any) -> dict[str, Any]:
        token = task.lock.token
        record("start", job=job, id=task.request.id, token=token, **extra)
        time.sleep(seconds)
        record("end", job=job, id=task.request.id, token=token)
        return {"token": token, "pid": os.getpid()}

    @app.task(
        shared=False,
        bind=True,
        base=SingletonTask,
        name="t.work",
        unique_on=["job"],
        lock_ttl=TTL,
        duplicate_retry_delay=0.5,
        max_retries=100,
    )
    def work(self: SingletonTask, job: str, seconds: float, caller: int = 0) -> dict[str, Any]:
        """A run of ``seconds``; ``caller`` tells the calls apart but is not part of the lock name."""
        return run_body(self, job, seconds, caller=caller)

    @app.task(shared=False, bind=True, base=SingletonTask, name="t.hold", unique_on="hold:{job}", lock_ttl=TTL)
    def hold(self: SingletonTask, job: str, seconds: float) -> dict[str, Any]:
        """Hold the lock for ``seconds`` (many TTLs), proving every 100 ms that it is still ours, on the server."""
        client = get_client(self.app)
        record("start", job=job, id=self.request.id, token=self.lock.token)
        checks = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.lock.ensure_held(verify=True)
            holder = client.holder(self.lock.name)
            assert holder is not None and holder.token == self.lock.token, holder
            checks += 1
            time.sleep(0.1)
        record("end", job=job, id=self.request.id, token=self.lock.token)
        return {"checks": checks, "token": self.lock.token, "lost": self.lock.lost}

    def crash_body(task: SingletonTask, job: str, marker: str) -> dict[str, Any]:
        """The first run waits to be SIGKILLed; any later run (a redelivery, a new call) finishes at once."""
        first = not Path(marker).exists()
        Path(marker).touch()
        record("start", job=job, id=task.request.id, token=task.lock.token, first=first)
        if first:
            time.sleep(60)
        record("end", job=job, id=task.request.id, token=task.lock.token)
        return {"token": task.lock.token}

    @app.task(
        shared=False, bind=True, base=SingletonTask, name="t.crash", unique_on=["job"], lock_ttl=TTL, acks_late=False
    )
    def crash(self: SingletonTask, job: str, marker: str) -> dict[str, Any]:
        return crash_body(self, job, marker)

    @app.task(
        shared=False,
        bind=True,
        base=SingletonTask,
        name="t.crash_late",
        unique_on=["job"],
        lock_ttl=TTL,
        acks_late=True,
        reject_on_worker_lost=True,
    )
    def crash_late(self: SingletonTask, job: str, marker: str) -> dict[str, Any]:
        """Acknowledged after the run: the broker delivers it again when its worker process dies."""
        return crash_body(self, job, marker)

    @app.task(
        shared=False, bind=True, base=SingletonTask, name="t.queued", unique_on=["job"], lock_on="enqueue", lock_ttl=TTL
    )
    def queued(self: SingletonTask, job: str, seconds: float) -> dict[str, Any]:
        return run_body(self, job, seconds)

    @app.task(
        shared=False, bind=True, base=SingletonTask, name="t.retrying", unique_on=["job"], lock_ttl=TTL, max_retries=3
    )
    def retrying(self: SingletonTask, job: str, countdown: float) -> dict[str, Any]:
        """Attempt 0 asks for a retry; attempt 1 finishes. Both record the token they hold."""
        token = self.lock.token
        record("start", job=job, id=self.request.id, token=token, attempt=self.request.retries)
        if self.request.retries == 0:
            time.sleep(0.3)
            record("end", job=job, id=self.request.id, token=token, attempt=0)
            raise self.retry(countdown=countdown)
        time.sleep(0.5)
        record("end", job=job, id=self.request.id, token=token, attempt=self.request.retries)
        return {"token": token, "attempts": self.request.retries + 1}

    @app.task(shared=False, bind=True, base=SingletonTask, name="t.lease", unique_on=["job"], lock_ttl=TTL)
    def lease(self: SingletonTask, job: str, seconds: float) -> dict[str, Any]:
        """Which process and which etcd lease hold this run's lock, and whether fenced writes would find it."""
        holder = get_client(self.app).holder(self.lock.name)
        assert holder is not None
        time.sleep(seconds)
        return {
            "pid": os.getpid(),
            "lease": holder.lease_id,
            "token": self.lock.token,
            "current_fence": distlock.current_fence(self.lock.name) == self.lock.fence,
        }

    @app.task(shared=False, bind=True, base=SingletonTask, name="t.overstay", unique_on=["job"], lock_ttl=TTL)
    def overstay(self: SingletonTask, job: str, seconds: float) -> dict[str, Any]:
        """Runs for ``seconds``, longer than the per-call lock_max_hold the test gives it."""
        record("start", job=job, id=self.request.id, token=self.lock.token)
        time.sleep(seconds)
        return {"lost": self.lock.lost}

    @app.task(shared=False, bind=True, base=SingletonTask, name="t.ignore", unique_on=["job"], lock_ttl=TTL)
    def ignore(self: SingletonTask, job: str) -> None:
        """Ends with Ignore, after which Celery calls no after_return: the lock must be released all the same."""
        record("start", job=job, id=self.request.id, token=self.lock.token)
        raise Ignore()

    aborting: dict[str, Any] = {"shared": False, "bind": True, "base": SingletonTask, "unique_on": ["job"]}
    aborting.update(lock_ttl=TTL, abort_on_lost=True)

    @app.task(name="t.abortable", **aborting)
    def abortable(self: SingletonTask, job: str, steps: int) -> dict[str, Any]:
        """Writes a step every 20 ms (``steps`` of them), recording each; stopped by LockLost when its lock is lost."""
        return abortable_body(self, job, steps)

    @app.task(
        name="t.abortable_retry", autoretry_for=(distlock.LockLost,), max_retries=1, default_retry_delay=0, **aborting
    )
    def abortable_retry(self: SingletonTask, job: str, steps: int) -> dict[str, Any]:
        """As ``t.abortable``, retried once when stopped; the retry writes 3 steps."""
        return abortable_body(self, job, 3 if self.request.retries else steps)

    def abortable_body(self: SingletonTask, job: str, steps: int) -> dict[str, Any]:
        token = self.lock.token
        record("start", job=job, id=self.request.id, token=token)
        try:
            for step in range(steps):
                record("write", job=job, id=self.request.id, token=token, step=step)
                time.sleep(0.02)
        except BaseException as e:
            record("stopped", job=job, id=self.request.id, token=token, error=type(e).__name__)
            raise
        record("end", job=job, id=self.request.id, token=token)
        return {"token": token, "retries": self.request.retries}

    def redelivered_body(task: SingletonTask, job: str, barriers: str) -> dict[str, Any]:
        """The first run waits to be SIGKILLed; every later run waits for the test's go (the file ``go``), then
        appends its line to the events file ("end"): one line per completed run of the body."""
        folder = Path(barriers)
        first = not (folder / "started").exists()
        (folder / "started").touch()
        token = task.lock.token
        record("start", job=job, id=task.request.id, token=token, first=first)
        if first:
            time.sleep(60)
        deadline = time.monotonic() + 30
        while not (folder / "go").exists():
            assert time.monotonic() < deadline, "the test never said go"
            time.sleep(0.02)
        record("end", job=job, id=task.request.id, token=token)
        return {"token": token}

    redelivered: dict[str, Any] = {"shared": False, "bind": True, "base": SingletonTask, "unique_on": ["job"]}
    redelivered.update(lock_ttl=TTL, acks_late=True, reject_on_worker_lost=True)

    @app.task(name="t.once", once=True, **redelivered)
    def once(self: SingletonTask, job: str, barriers: str) -> dict[str, Any]:
        """Acknowledged after the run, delivered again when its process dies or past the visibility timeout."""
        return redelivered_body(self, job, barriers)

    @app.task(name="t.twice", **redelivered)
    def twice(self: SingletonTask, job: str, barriers: str) -> dict[str, Any]:
        """``t.once`` without ``once``: the control."""
        return redelivered_body(self, job, barriers)

    @app.task(shared=False, bind=True, name="t.plain")
    def plain(self: Task, job: str, seconds: float) -> int:  # type: ignore[type-arg]
        """A plain task (no lock): keeps a worker process busy, and shows what overlap looks like."""
        record("start", job=job, id=self.request.id)
        time.sleep(seconds)
        record("end", job=job, id=self.request.id)
        return os.getpid()

    @app.task(shared=False, name="t.ping")
    def ping() -> str:
        return "pong"

    # The decorators register the tasks; keep the linters from calling the names unused.
    del (
        work,
        hold,
        crash,
        crash_late,
        queued,
        retrying,
        lease,
        overstay,
        ignore,
        abortable,
        abortable_retry,
        once,
        twice,
        plain,
        ping,
    )
    return app


if __name__ == "__main__":
    broker, backend, etcd_url = (os.environ[name] for name in ENV)
    worker_app = make_app(broker, backend, etcd_url, os.environ[QUEUE_ENV])
    worker_app.worker_main(sys.argv[1:])
