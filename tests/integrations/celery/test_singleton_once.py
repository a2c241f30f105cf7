"""``once=True``: a task id's body runs once across the deliveries of its message, tested the way the bug happens
(celery#5935, pretix#2058): a Redis broker, ``acks_late``, a ``visibility_timeout`` shorter than the task, and the
worker process running it SIGKILLed mid-task.

One worker runs ``t.once`` and its control ``t.twice`` (the same task without ``once``) side by side. Each first run
is SIGKILLed: the body did not finish, so the redelivery (``reject_on_worker_lost``) must run it. That second run
waits for the test's go (a file) until the broker, past its visibility timeout, has delivered the message again and
the copy queues for the lock (a waiter the test sees); then it finishes, and the copy gets the lock. With ``once``
the copy is acknowledged without running the body; without it the same task id's body completes a second time.
Every step waits on a barrier (an event in the file the tasks append to, a waiter on the lock, the go file).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from _support import wait_until
from celery import Celery

from distlock.celery import SingletonTask, get_client

if TYPE_CHECKING:
    from celery.conftest import CeleryWorker, Events

#: The broker's visibility timeout in the worker (s): shorter than the second run, which waits for the test.
VISIBILITY = 2


@pytest.fixture
def redelivering_worker(
    redis_url: str,
    etcd_url: str,
    celery_events: Events,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make_celery_app: Callable[[str, str, str, str], Celery],
    start_celery_worker: Callable[..., Any],
) -> Iterator[tuple[Celery, CeleryWorker]]:
    """A worker of 4 processes whose broker delivers a message again 2 s after it was delivered unacknowledged.

    Its broker is a Redis database of its own: the transport restores every unacknowledged message of the database
    it polls, and the other tests' workers (visibility: an hour) must not see theirs restored."""
    base = redis_url.rsplit("/", 1)[0]
    urls = (f"{base}/3", f"{base}/1", etcd_url, f"once-tests-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("DISTLOCK_CELERY_TEST_VISIBILITY_TIMEOUT", str(VISIBILITY))
    app = make_celery_app(*urls)
    with start_celery_worker(urls, app, celery_events, tmp_path, concurrency=4) as worker:
        yield app, worker


def test_a_task_id_runs_once_across_redeliveries_and_twice_without_once(
    redelivering_worker: tuple[Celery, CeleryWorker], celery_events: Events, tmp_path: Path
) -> None:
    app, worker = redelivering_worker
    client = get_client(app)
    kinds = ("once", "twice")
    jobs = {kind: uuid.uuid4().hex for kind in kinds}
    barriers = {kind: tmp_path / kind for kind in kinds}
    results = {}
    for kind in kinds:
        barriers[kind].mkdir()
        results[kind] = app.tasks[f"t.{kind}"].delay(jobs[kind], str(barriers[kind]))
    tasks = {kind: app.tasks[f"t.{kind}"] for kind in kinds}
    assert all(isinstance(task, SingletonTask) for task in tasks.values())
    names = {kind: cast(SingletonTask, tasks[kind]).singleton_key((jobs[kind], "")) for kind in kinds}

    def starts(kind: str, count: int) -> Callable[[], bool]:
        return lambda: len(celery_events.of(jobs[kind], "start")) == count

    for kind in kinds:  # the first runs: SIGKILLed mid-task
        wait_until(starts(kind, 1), 30, f"the first run of t.{kind}")
        victim = celery_events.runs(jobs[kind])[0]
        assert victim.event["first"] is True and victim.pid != worker.process.pid
        os.kill(victim.pid, signal.SIGKILL)
    for kind in kinds:  # their redelivery runs (the body did not finish), once the dead lease lapsed
        wait_until(starts(kind, 2), 30, f"the redelivered t.{kind} to run")

    def copy_waits(kind: str) -> Callable[[], bool]:
        def waits() -> bool:
            holder = client.holder(names[kind])
            return holder is not None and holder.token == celery_events.runs(jobs[kind])[1].token and holder.waiters > 0

        return waits

    for kind in kinds:  # past the visibility timeout, the running message is delivered again: a copy waits
        wait_until(copy_waits(kind), 30, f"a copy of t.{kind} to wait for the lock")
        (barriers[kind] / "go").touch()

    skipped = f"t.once'[{results['once'].id}] already ran (attempt 0 ended: success)"
    wait_until(lambda: len(celery_events.of(jobs["twice"], "end")) >= 2, 30, "the control's copy to run again")
    wait_until(
        lambda: skipped in worker.log() or len(celery_events.of(jobs["once"], "end")) > 1, 30, "the copy's answer"
    )

    once_runs = celery_events.runs(jobs["once"])
    assert [run.end is not None for run in once_runs] == [False, True], "the body of t.once completed twice"
    assert {run.id for run in once_runs} == {results["once"].id}
    assert results["once"].get(timeout=10) == {"token": once_runs[1].token}  # the copy stored no result over it
    twice_ends = celery_events.of(jobs["twice"], "end")
    assert {end["id"] for end in twice_ends} == {results["twice"].id}  # one task id, its body completed twice
    wait_until(lambda: all(client.holder(name) is None for name in names.values()), 30, "the locks to be free")
