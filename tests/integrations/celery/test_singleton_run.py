"""``lock_on="run"`` in a real prefork worker: no two runs of one lock name overlap, duplicates get what their option
says, the lease outlives TTLs while the task runs, retries keep the lock, and a SIGKILLed worker frees it in time.

Times come from the tasks themselves (``time.monotonic()``, one clock for all processes of the machine), recorded
as they start and end; nothing here sleeps hoping for an interleaving.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _support import wait_until
from celery import Celery

import distlock
from distlock.celery import DuplicateTask, SingletonTask, get_client

if TYPE_CHECKING:
    # To mypy (search path tests/) this directory is the package "celery"; pytest loads conftest.py by its path.
    from celery.conftest import CeleryWorker, Events, Run

pytestmark = pytest.mark.usefixtures("celery_worker")


def test_ten_concurrent_delays_never_overlap_and_each_duplicate_gets_its_option(
    celery_app: Celery, celery_events: Events, together: Callable[[Sequence[Callable[..., Any]]], list[Any]]
) -> None:
    work = celery_app.tasks["t.work"]
    assert isinstance(work, SingletonTask)
    job = uuid.uuid4().hex
    policies = ["skip"] * 4 + ["raise"] * 4 + ["retry"] * 2
    random.shuffle(policies)
    calls = [
        lambda i=i, policy=policy: work.apply_async((job, 2.0), {"caller": i}, singleton={"on_duplicate": policy})
        for i, policy in enumerate(policies)
    ]
    results = together(calls)
    outcomes = [r.get(timeout=60, propagate=False) for r in results]

    runs = {run.id: run for run in celery_events.runs(job)}
    assert runs, "no call ran at all"
    assert celery_events.overlaps(list(runs.values())) == []
    assert all(run.end is not None for run in runs.values())
    for result, policy, outcome in zip(results, policies, outcomes, strict=True):
        if result.id in runs:  # this call held the lock and ran
            assert isinstance(outcome, dict) and outcome["token"] == runs[result.id].token
        elif policy == "skip":
            assert outcome is None and result.state == "SUCCESS"
        elif policy == "raise":
            assert isinstance(outcome, DuplicateTask), outcome
            assert result.state == "FAILURE"
            assert outcome.task_id in runs  # the task that held the lock then, and ran
        else:
            pytest.fail(f"call {result.id} with on_duplicate='retry' never ran (outcome {outcome!r})")
    not_run = [p for r, p in zip(results, policies, strict=True) if r.id not in runs]
    assert len(not_run) >= 5, f"too few duplicates to prove anything: {not_run}"
    retried = [r for r, p in zip(results, policies, strict=True) if p == "retry"]
    assert all(r.id in runs for r in retried)
    tokens = [run.token or 0 for run in sorted(runs.values(), key=lambda r: r.start)]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_the_overlap_check_catches_a_task_without_the_lock(
    celery_app: Celery, celery_events: Events, together: Callable[[Sequence[Callable[..., Any]]], list[Any]]
) -> None:
    """The same ten calls of a plain task overlap, and ``overlaps`` says so: the check above can fail."""
    plain = celery_app.tasks["t.plain"]
    job = uuid.uuid4().hex
    results = together([lambda: plain.delay(job, 0.5)] * 10)
    for result in results:
        result.get(timeout=60)
    assert celery_events.overlaps(celery_events.runs(job))


def test_a_run_of_three_ttls_keeps_its_lock_the_whole_time(
    celery_app: Celery, celery_events: Events, etcd_url: str, lock_ttl: float
) -> None:
    hold = celery_app.tasks["t.hold"]
    job = uuid.uuid4().hex
    result = hold.delay(job, 3 * lock_ttl)
    wait_until(lambda: bool(celery_events.of(job, "start")), 30, "the long run to start")
    duplicate = hold.delay(job, 0.0)
    name = f"hold:{job}"
    rejected = 0
    with distlock.connect(etcd_url) as outsider:
        while not celery_events.of(job, "end"):
            lock = outsider.lock(name, ttl=lock_ttl)
            assert not lock.acquire(blocking=False), "another process got the lock while the task held it"
            rejected += 1
            time.sleep(0.25)
    outcome = result.get(timeout=30)
    assert outcome["lost"] is False
    assert outcome["checks"] >= 3 * lock_ttl / 0.1 * 0.5  # about every 100 ms, on a busy machine at least half of them
    assert rejected >= 3 * lock_ttl / 0.25 * 0.5
    run = celery_events.runs(job)
    assert len(run) == 1 and run[0].end is not None and run[0].end - run[0].start >= 3 * lock_ttl
    assert duplicate.get(timeout=30) is None  # skipped while the long run held the lock


def test_prefork_children_hold_their_locks_on_leases_of_their_own(celery_app: Celery) -> None:
    lease = celery_app.tasks["t.lease"]
    first, second = lease.delay(uuid.uuid4().hex, 1.0), lease.delay(uuid.uuid4().hex, 1.0)
    a, b = first.get(timeout=30), second.get(timeout=30)
    assert a["pid"] != b["pid"] and os.getpid() not in (a["pid"], b["pid"])
    assert a["lease"] != b["lease"]
    assert a["current_fence"] and b["current_fence"]  # the task's lock is the current one for fenced writes


def test_a_run_past_max_hold_loses_its_lock_and_says_so(
    celery_app: Celery, celery_events: Events, celery_worker: CeleryWorker
) -> None:
    overstay = celery_app.tasks["t.overstay"]
    assert isinstance(overstay, SingletonTask)
    job = uuid.uuid4().hex
    name = overstay.singleton_key((job, 0.0))
    result = overstay.apply_async((job, 2.5), singleton={"lock_max_hold": 1.0})
    wait_until(lambda: bool(celery_events.of(job, "start")), 30, "the run to start")
    client = get_client(celery_app)
    wait_until(lambda: client.holder(name) is None, 5, "max_hold to release the lock while the task still runs")
    assert result.state != "SUCCESS"
    assert result.get(timeout=30) == {"lost": True}
    wait_until(lambda: f"[{result.id}] did not hold its lock to the end" in celery_worker.log(), 10, "the error log")


def test_a_task_ending_with_ignore_releases_its_lock(celery_app: Celery, celery_events: Events) -> None:
    ignore = celery_app.tasks["t.ignore"]
    assert isinstance(ignore, SingletonTask)
    job = uuid.uuid4().hex
    ignore.delay(job)
    wait_until(lambda: bool(celery_events.of(job, "start")), 30, "the run to start")
    client = get_client(celery_app)
    wait_until(lambda: client.holder(ignore.singleton_key((job,))) is None, 5, "the lock to be released")


def test_retry_keeps_the_lock_between_attempts_and_releases_it_at_the_end(
    celery_app: Celery, celery_events: Events
) -> None:
    retrying = celery_app.tasks["t.retrying"]
    assert isinstance(retrying, SingletonTask)
    job = uuid.uuid4().hex
    name = retrying.singleton_key((job, 1.5))
    client = get_client(celery_app)
    result = retrying.delay(job, 1.5)
    wait_until(lambda: bool(celery_events.of(job, "end")), 30, "the first attempt to end")
    first = celery_events.runs(job)[0]
    # Between the attempts (1.5 s countdown) the lock stays with the task: same owner, same token.
    holder = client.holder(name)
    assert holder is not None and holder.owner == f"celery-task:{result.id}" and holder.token == first.token
    duplicate = retrying.delay(job, 1.5)
    assert duplicate.get(timeout=30) is None  # skipped: the retrying task still holds the lock
    outcome = result.get(timeout=30)
    runs = celery_events.runs(job)
    assert [r.event["attempt"] for r in runs] == [0, 1]
    assert all(r.id == result.id for r in runs)
    assert celery_events.overlaps(runs) == []
    assert runs[1].token is not None and first.token is not None and runs[1].token > first.token
    assert outcome == {"token": runs[1].token, "attempts": 2}
    assert client.holder(name) is None


def _start_and_kill(
    task: SingletonTask, job: str, marker: Path, events: Events, worker: CeleryWorker
) -> tuple[Any, Run, float]:
    """Send ``task``, wait until its first run has started, SIGKILL the worker process running it."""
    result = task.delay(job, str(marker))
    wait_until(lambda: bool(events.of(job, "start")), 30, "the first run to start")
    victim = events.runs(job)[0]
    assert victim.event["first"] is True and victim.pid != worker.process.pid
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    holder = get_client(task.app).holder(task.singleton_key((job, "")))
    assert holder is not None and holder.token == victim.token  # the dead process's lease still holds the lock
    return result, victim, killed_at


def _second_run(job: str, events: Events, victim: Run, timeout: float) -> Run:
    """The run after the killed one, which must hold a newer token: the dead holder's key was gone first."""
    wait_until(lambda: len(events.of(job, "start")) == 2, timeout, "a second run to start")
    rerun = events.runs(job)[1]
    assert rerun.token is not None and victim.token is not None and rerun.token > victim.token
    return rerun


def test_a_sigkilled_worker_frees_the_lock_within_ttl(
    celery_app: Celery, celery_events: Events, celery_worker: CeleryWorker, tmp_path: Path, lock_ttl: float
) -> None:
    crash = celery_app.tasks["t.crash"]
    assert isinstance(crash, SingletonTask)
    job = uuid.uuid4().hex
    killed, victim, killed_at = _start_and_kill(crash, job, tmp_path / "started", celery_events, celery_worker)
    # A new call of the same task, willing to wait for the lock: it runs as soon as the dead lease lapses.
    again = crash.apply_async((job, str(tmp_path / "started")), singleton={"lock_timeout": 30})
    rerun = _second_run(job, celery_events, victim, lock_ttl + 10)
    assert rerun.id == again.id
    assert rerun.start - killed_at <= lock_ttl + 2.0
    assert again.get(timeout=30) == {"token": rerun.token}
    # Without acks_late Celery does not run the killed task again: it fails with WorkerLostError, once the worker's
    # main process has noticed the death (that can take seconds; the lock did not wait for it).
    wait_until(lambda: killed.state == "FAILURE", 30, "the killed task to be marked failed")


def test_an_acks_late_task_redelivered_after_sigkill_runs_again_only_after_the_lease_lapsed(
    celery_app: Celery, celery_events: Events, celery_worker: CeleryWorker, tmp_path: Path, lock_ttl: float
) -> None:
    crash_late = celery_app.tasks["t.crash_late"]
    assert isinstance(crash_late, SingletonTask)
    job = uuid.uuid4().hex
    result, victim, _ = _start_and_kill(crash_late, job, tmp_path / "started", celery_events, celery_worker)
    rerun = _second_run(job, celery_events, victim, lock_ttl + 30)
    assert rerun.id == result.id and rerun.event["first"] is False
    assert result.get(timeout=30) == {"token": rerun.token}
    assert get_client(celery_app).holder(crash_late.singleton_key((job, ""))) is None


def test_a_second_delivery_of_a_running_task_never_runs_beside_it(
    celery_app: Celery, celery_events: Events, celery_worker: CeleryWorker, lock_ttl: float
) -> None:
    """What a visibility-timeout redelivery looks like: the same task id again while the first delivery runs."""
    work = celery_app.tasks["t.work"]
    job = uuid.uuid4().hex
    first = work.delay(job, lock_ttl + 4.0)  # longer than the copy waits for a dead holder (ttl + grace)
    wait_until(lambda: bool(celery_events.of(job, "start")), 30, "the first delivery to start")
    copy = work.apply_async((job, lock_ttl + 4.0), task_id=first.id)
    assert first.get(timeout=30)["token"] == celery_events.runs(job)[0].token
    dropped = f"[{first.id}] already runs elsewhere"
    wait_until(lambda: dropped in celery_worker.log(), 30, "the copy to be dropped")
    assert len(celery_events.runs(job)) == 1
    assert copy.id == first.id


def test_a_direct_call_takes_the_lock_in_the_calling_process(celery_app: Celery, celery_events: Events) -> None:
    work = celery_app.tasks["t.work"]
    assert isinstance(work, SingletonTask)
    job = uuid.uuid4().hex
    outcome = work(job, 0.0)
    assert outcome["pid"] == os.getpid()
    assert get_client(celery_app).holder(work.singleton_key((job, 0.0))) is None
    with pytest.raises(distlock.LockNotOwned):
        work.lock  # noqa: B018  (outside a run there is no lock)
