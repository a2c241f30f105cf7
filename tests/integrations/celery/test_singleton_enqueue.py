"""``lock_on="enqueue"`` with a real worker: one call queued or running per lock name, the reservation passes from
the sending process to the worker, and neither a lost message nor a crashed sender keeps the key for long.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from _support import child_env, wait_until
from celery import Celery

from distlock.celery import RESERVATIONS, DuplicateTask, SingletonTask, get_client
from distlock.testing import EtcdServer

if TYPE_CHECKING:
    # To mypy (search path tests/) this directory is the package "celery"; pytest loads conftest.py by its path.
    from celery.conftest import Events

pytestmark = pytest.mark.usefixtures("celery_worker")


def _queued(app: Celery) -> SingletonTask:
    task = app.tasks["t.queued"]
    assert isinstance(task, SingletonTask)
    return task


def test_ten_enqueues_while_one_is_queued_make_one_run_and_a_later_enqueue_is_accepted(
    celery_app: Celery,
    celery_events: Events,
    together: Callable[[Sequence[Callable[..., Any]]], list[Any]],
    lock_ttl: float,
) -> None:
    queued, plain = _queued(celery_app), celery_app.tasks["t.plain"]
    job, busy = uuid.uuid4().hex, uuid.uuid4().hex
    client = get_client(celery_app)
    name = queued.singleton_key((job, 1.0))
    blockers = [plain.delay(busy, 2.0) for _ in range(2)]  # both worker processes busy: the task stays queued
    wait_until(lambda: len(celery_events.of(busy, "start")) == 2, 30, "both worker processes to be busy")

    policies = ["result"] * 5 + ["raise"] * 5
    random.shuffle(policies)
    calls = [
        lambda policy=policy: queued.apply_async((job, 1.0), singleton={"on_duplicate": policy}) for policy in policies
    ]
    answers = together(calls)
    errors = [a for a in answers if isinstance(a, DuplicateTask)]
    results = [a for a in answers if not isinstance(a, DuplicateTask)]
    ids = {r.id for r in results} | {e.task_id for e in errors}
    assert len(ids) == 1, answers  # every caller got the one queued task: its AsyncResult, or its id in the error
    (queued_id,) = ids
    assert all(e.name == name for e in errors)
    assert len(errors) >= 4  # the raise-policy callers that lost (at most one of them sent the task)
    holder = client.holder(name)
    assert holder is not None and holder.owner == f"celery-task:{queued_id}"  # reserved while still in the queue
    assert not celery_events.of(job, "start")

    wait_until(lambda: bool(celery_events.of(job, "start")), 30, "the queued task to start")
    during = queued.delay(job, 1.0)  # while it runs: still a duplicate, answered with the running task
    assert during.id == queued_id
    assert results[0].get(timeout=30)["token"] == celery_events.runs(job)[0].token
    for blocker in blockers:
        blocker.get(timeout=30)

    later = queued.delay(job, 0.2)
    assert later.id != queued_id
    later.get(timeout=30)
    runs = celery_events.runs(job)
    assert [r.id for r in runs] == [queued_id, later.id]
    assert celery_events.overlaps(runs) == []
    assert client.holder(name) is None
    # The sender drops a reservation taken over at its client's next check of its keys (every third of the TTL).
    wait_until(lambda: RESERVATIONS.held() == [], 3 * lock_ttl, "the sender to see its reservation taken over")


def test_a_lost_message_frees_its_reservation_after_max_queued(celery_app: Celery, redis_url: str) -> None:
    queued = _queued(celery_app)
    job, nowhere = uuid.uuid4().hex, f"nowhere-{uuid.uuid4().hex[:8]}"  # a queue no worker consumes
    name = queued.singleton_key((job, 0.0))
    client = get_client(celery_app)
    try:
        first = queued.apply_async((job, 0.0), queue=nowhere, singleton={"lock_max_queued": 1.0})
        sent_at = time.monotonic()
        assert queued.apply_async((job, 0.0), queue=nowhere).id == first.id
        wait_until(lambda: client.holder(name) is None, 5, "the reservation of the lost message to end")
        held_for = time.monotonic() - sent_at
        assert 0.9 <= held_for <= 1.0 + 2.0
        second = queued.apply_async((job, 0.0), queue=nowhere, singleton={"lock_max_queued": 1.0})
        assert second.id != first.id
    finally:
        redis.Redis.from_url(redis_url).delete(nowhere)


@pytest.mark.parametrize("ending", ["sigkill", "exit"])
def test_an_enqueuer_that_dies_or_exits_frees_its_reservation(
    celery_app: Celery,
    celery_urls: tuple[str, str, str, str],
    celery_app_path: Path,
    redis_url: str,
    lock_ttl: float,
    ending: str,
) -> None:
    """A reservation lives on its sender's lease: a SIGKILLed sender's lapses within ttl (not lock_max_queued), a
    sender that exits normally revokes it on the way out."""
    queued = _queued(celery_app)
    job, nowhere = uuid.uuid4().hex, f"nowhere-{uuid.uuid4().hex[:8]}"
    name = queued.singleton_key((job, 0.0))
    client = get_client(celery_app)
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(celery_app_path.parent)!r})
import celeryapp
app = celeryapp.make_app(*{list(celery_urls)!r})
result = app.tasks["t.queued"].apply_async(({job!r}, 0.0), queue={nowhere!r}, singleton={{"lock_max_queued": 600}})
print(result.id, flush=True)
if {ending == "sigkill"}:
    os.kill(os.getpid(), signal.SIGKILL)
"""
    try:
        enqueuer = subprocess.run(
            [sys.executable, "-c", script], check=False, capture_output=True, text=True, env=child_env()
        )
        ended_at = time.monotonic()
        assert enqueuer.returncode == (-signal.SIGKILL if ending == "sigkill" else 0), enqueuer.stderr
        task_id = enqueuer.stdout.strip()
        if ending == "sigkill":
            holder = client.holder(name)
            assert holder is not None and holder.owner == f"celery-task:{task_id}"  # outlives its dead sender...
            wait_until(lambda: client.holder(name) is None, lock_ttl + 5, "the dead sender's reservation to lapse")
            assert time.monotonic() - ended_at <= lock_ttl + 1.0  # ...by at most its lease
        else:
            assert client.holder(name) is None
        assert queued.apply_async((job, 0.0), queue=nowhere).id != task_id
    finally:
        redis.Redis.from_url(redis_url).delete(nowhere)


def test_send_task_bypasses_the_enqueue_check_but_never_runs_twice_at_once(
    celery_app: Celery, celery_events: Events
) -> None:
    job = uuid.uuid4().hex
    first = celery_app.send_task("t.queued", args=(job, 1.0))
    second = celery_app.send_task("t.queued", args=(job, 1.0))
    outcomes = [first.get(timeout=30), second.get(timeout=30)]
    runs = celery_events.runs(job)
    assert len(runs) == 1 and runs[0].id in (first.id, second.id)  # the other was a duplicate at run time
    assert sorted(outcomes, key=lambda o: o is None) == [{"token": runs[0].token, "pid": runs[0].pid}, None]


def test_a_waiting_reservation_costs_its_sender_no_requests(
    make_celery_app: Callable[[str, str, str, str], Celery], redis_url: str, etcd_server: EtcdServer
) -> None:
    """The sender does not poll: a reservation whose task waits in the broker sends nothing to the lock service.

    The sender has an etcd of its own, so every request etcd counts is the sender's. Its lease (TTL 30 s, granted
    for this reservation) is first refreshed after 10 s: none falls into the second counted here.
    """
    base = redis_url.rsplit("/", 1)[0]
    nowhere = f"nowhere-{uuid.uuid4().hex[:8]}"  # a queue no worker consumes: the reservation waits
    app = make_celery_app(f"{base}/0", f"{base}/1", etcd_server.url, nowhere)
    client = get_client(app)
    try:
        queued = _queued(app)
        job = uuid.uuid4().hex
        queued.apply_async((job, 0.0), singleton={"lock_ttl": 30.0, "lock_max_queued": 600.0})
        name = queued.singleton_key((job, 0.0))
        assert name in [lock.name for lock in RESERVATIONS.held()]
        before = etcd_server.rpc_count()
        time.sleep(1.0)  # the window counted, not a wait for something to happen
        assert etcd_server.rpc_count() - before == 0
        holder = client.holder(name)
        assert holder is not None and holder.waiters == 0
    finally:
        client.close()
        redis.Redis.from_url(redis_url).delete(nowhere)
        app.close()


def test_the_worker_takes_over_a_reservation_from_a_frozen_sender(
    celery_app: Celery, celery_events: Events, celery_urls: tuple[str, str, str, str], celery_app_path: Path
) -> None:
    """The sender takes no part in the hand-over: SIGSTOPped right after sending, with a 30 s lease that cannot
    lapse meanwhile, its reservation still passes to the worker, which runs the task long before the lease ends."""
    job = uuid.uuid4().hex
    name = _queued(celery_app).singleton_key((job, 0.0))
    client = get_client(celery_app)
    script = f"""
import os, signal, sys
from celery.signals import before_task_publish
sys.path.insert(0, {str(celery_app_path.parent)!r})
import celeryapp
app = celeryapp.make_app(*{list(celery_urls)!r})
reserved = []
# The reservation's token, as sent: asking the lock service after sending may find the worker already done with it.
before_task_publish.connect(lambda headers=None, **kw: reserved.append(headers["distlock"]["reservation"]), weak=False)
result = app.tasks["t.queued"].apply_async(({job!r}, 0.0), singleton={{"lock_ttl": 30.0, "lock_max_queued": 600}})
print(result.id, reserved[0], flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""
    sender = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    )
    try:
        assert sender.stdout is not None
        line = sender.stdout.readline()
        if not line:  # the script ended before sending: say why
            raise AssertionError(f"the sender failed: {sender.communicate(timeout=10)[1][-3000:]}")
        task_id, reserved = line.split()
        wait_until(lambda: _stopped(sender.pid), 10, "the sender to be stopped")
        outcome = celery_app.AsyncResult(task_id).get(timeout=20)  # well within the sender's 30 s lease
        runs = celery_events.runs(job)
        assert [run.id for run in runs] == [task_id]
        assert outcome["token"] == runs[0].token and runs[0].token is not None and runs[0].token > int(reserved)
        assert _stopped(sender.pid)  # frozen the whole time
        assert client.holder(name) is None
    finally:
        sender.kill()
        sender.wait(10)


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP), from its state in /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"
