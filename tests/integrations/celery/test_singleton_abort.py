"""``abort_on_lost=True`` in a real worker, prefork and solo: a run whose lock is lost is stopped by ``LockLost``
inside its body, writes nothing after, fails with ``LockLost`` (or is retried, with ``autoretry_for``), and the next
run of its key starts.

The lock is force-released under the running task and taken by another holder (this process); the worker's keeper
finds its key gone at its next refresh (every second at ``lock_ttl=2``) and the body is interrupted there. The task
records each write and the moment it was stopped (``time.monotonic()``, one clock for all processes).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _support import wait_until
from celery import Celery

import distlock
from distlock.celery import SingletonTask, get_client

if TYPE_CHECKING:
    from celery.conftest import CeleryWorker, Events

#: The generous bound between the force release and the stop: the keeper's next refresh (1 s at lock_ttl=2), the
#: signal, and a loaded machine.
STOPPED_WITHIN = 8.0


def _lose_a_running_task_and_run_it_again(app: Celery, events: Events) -> float:
    task = app.tasks["t.abortable"]
    assert isinstance(task, SingletonTask)
    job = uuid.uuid4().hex
    name = task.singleton_key((job, 0))
    result = task.delay(job, 5000)  # 100 s of writes unless stopped
    wait_until(lambda: bool(events.of(job, "write")), 30, "the run to write")
    (started,) = events.of(job, "start")
    client = get_client(app)
    assert client.force_release(name, started["token"])
    released_at = time.monotonic()
    with client.lock(name, ttl=10, timeout=5):  # another holder takes the lock while the task still runs
        wait_until(lambda: bool(events.of(job, "stopped")), STOPPED_WITHIN, "the body to be stopped")
        result.get(timeout=30, propagate=False)
    (stopped,) = events.of(job, "stopped")
    assert stopped["error"] == "LockLost"
    late = [e for e in events.of(job, "write") if e["t"] > stopped["t"]]
    assert not late, f"written after the stop: {late}"
    assert result.state == "FAILURE" and type(result.result).__name__ == "LockLost", result.result

    again = task.delay(job, 3)  # the lock is free: the next run of the key starts, and ends
    assert again.get(timeout=30)["token"] > started["token"]
    took = float(stopped["t"]) - released_at
    print(f"stopped {took:.3f} s after the force release")
    return took


def test_a_prefork_task_is_stopped_when_its_lock_is_lost(
    celery_app: Celery, celery_events: Events, celery_worker: CeleryWorker
) -> None:
    _lose_a_running_task_and_run_it_again(celery_app, celery_events)


def test_a_task_stopped_by_its_lost_lock_is_retried_with_autoretry_for(
    celery_app: Celery, celery_events: Events, celery_worker: CeleryWorker
) -> None:
    task = celery_app.tasks["t.abortable_retry"]  # autoretry_for=(LockLost,), max_retries=1
    assert isinstance(task, SingletonTask)
    job = uuid.uuid4().hex
    result = task.delay(job, 5000)
    wait_until(lambda: bool(celery_events.of(job, "write")), 30, "the run to write")
    (started,) = celery_events.of(job, "start")
    assert get_client(celery_app).force_release(task.singleton_key((job, 0)), started["token"])
    outcome = result.get(timeout=30)  # the retry, on a lock of its own
    assert outcome["retries"] == 1 and outcome["token"] > started["token"]
    (stopped,) = celery_events.of(job, "stopped")
    assert stopped["error"] == "LockLost"
    assert not [e for e in celery_events.of(job, "write") if started["token"] == e["token"] and e["t"] > stopped["t"]]


def test_a_solo_task_is_stopped_when_its_lock_is_lost(
    celery_urls: tuple[str, str, str, str],
    make_celery_app: Callable[[str, str, str, str], Celery],
    celery_events: Events,
    start_celery_worker: Callable[..., Any],
    tmp_path: Path,
) -> None:
    broker, backend, lock_url, queue = celery_urls
    urls = (broker, backend, lock_url, f"{queue}-solo")
    app = make_celery_app(*urls)
    with start_celery_worker(urls, app, celery_events, tmp_path, pool="solo"):
        _lose_a_running_task_and_run_it_again(app, celery_events)


def test_outside_the_main_thread_abort_on_lost_is_refused_at_the_run(celery_app: Celery) -> None:
    # What the threads, gevent and eventlet pools do: run the body in another thread (here a direct call).
    task = celery_app.tasks["t.abortable"]
    errors: list[BaseException] = []

    def call() -> None:
        try:
            task(uuid.uuid4().hex, 1)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], distlock.ConfigurationError)
    assert "prefork and solo pools" in str(errors[0]) and "self.lock.ensure_held()" in str(errors[0])


@pytest.mark.parametrize("value", ["yes", 1])
def test_abort_on_lost_takes_a_bool(celery_app: Celery, value: object) -> None:
    task = celery_app.tasks["t.abortable"]
    assert isinstance(task, SingletonTask)
    with pytest.raises(distlock.ConfigurationError, match="abort_on_lost must be True or False"):
        task.apply_async((uuid.uuid4().hex, 1), singleton={"abort_on_lost": value})
