"""``@singleton_task`` on django.tasks, run by django_tasks_db's real worker (``db_worker``, a process of its own).

On SQLite and PostgreSQL (``db_alias``), the lock on the session's etcd: a second enqueue of a key queued or running
is answered with the first call's result and runs nothing, another key runs beside it; the task's fenced write
carries its token; a worker SIGKILLed mid-task frees the key within its TTL. Bad templates and arguments fail where
they are written. ``testapp/tasks.py`` has the task; it waits for the test's word (a file) before it writes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from djangotests.testapp.models import Account
from djangotests.testapp.tasks import deposit, drain, note

import distlock
from distlock_django import get_client, lock_name, singleton_task

pytestmark = [pytest.mark.real_server, pytest.mark.django_db(transaction=True, databases=["default", "pg"])]

HERE = Path(__file__).resolve().parent
_BOUND = 60.0  # generous: a worker process starts Django and polls the queue every 0.05 s


def _wait_for(path: Path, what: str) -> str:
    deadline = time.monotonic() + _BOUND
    while not path.exists():
        assert time.monotonic() < deadline, f"{what} did not happen within {_BOUND:g} s"
        time.sleep(0.02)
    time.sleep(0.01)  # the writer's write_text has created the file; let it finish its few bytes
    return path.read_text()


_POLL = ["--interval", "0.05"]


class DbWorker:
    """``manage.py db_worker`` on the test's database, polling every 0.05 s."""

    def __init__(self, env: dict[str, str]) -> None:
        env = {**env, "DJANGO_SETTINGS_MODULE": "djangotests.testsettings"}
        env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env["PYTHONPATH"]])
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "db_worker", "--skip-checks", "--no-startup-delay", "--no-reload", *_POLL],
            env=env,
            stdout=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


@pytest.fixture
def worker(django_child_env: dict[str, str]) -> Iterator[DbWorker]:
    w = DbWorker(django_child_env)
    yield w
    w.stop()


def test_a_key_queued_or_running_is_enqueued_once_and_its_run_writes_fenced(
    db_alias: str, worker: DbWorker, tmp_path: Path
) -> None:
    first, other = Account.objects.create(), Account.objects.create()
    result = deposit.enqueue(first.pk, str(tmp_path))
    again = deposit.enqueue(first.pk, str(tmp_path))  # queued: not yet running
    assert again.id == result.id
    token = int(_wait_for(tmp_path / f"started-{first.pk}", "the first run"))
    running = deposit.enqueue(first.pk, str(tmp_path))  # running
    assert running.id == result.id
    holder = get_client().holder(lock_name(f"account:{first.pk}"))
    assert holder is not None and holder.token == token

    beside = deposit.enqueue(other.pk, str(tmp_path))  # another key runs beside it (after it: one worker)
    assert beside.id != result.id
    (tmp_path / f"go-{first.pk}").touch()
    (tmp_path / f"go-{other.pk}").touch()
    for each in (result, beside):
        deadline = time.monotonic() + _BOUND
        while not each.is_finished:
            assert time.monotonic() < deadline
            time.sleep(0.05)
            each.refresh()
    assert result.return_value == token and beside.status == "SUCCESSFUL"
    first.refresh_from_db()
    assert (first.balance, first.fence_token) == (1, token)  # one run, its write fenced with its token
    other.refresh_from_db()
    assert other.balance == 1
    assert get_client().holder(lock_name(f"account:{first.pk}")) is None  # free: the next enqueue is a new call


def test_a_worker_killed_mid_task_frees_the_key_within_its_ttl(
    db_alias: str, worker: DbWorker, django_child_env: dict[str, str], tmp_path: Path
) -> None:
    account = Account.objects.create()
    name = lock_name(f"account:{account.pk}")
    killed = deposit.enqueue(account.pk, str(tmp_path))
    _wait_for(tmp_path / f"started-{account.pk}", "the run")
    worker.stop()  # SIGKILL mid-task: its row stays RUNNING, its lease lapses
    assert deposit.enqueue(account.pk, str(tmp_path)).id == killed.id  # still held
    deadline = time.monotonic() + 3 + 10  # ttl=3, plus a generous bound for the service to expire the lease
    while get_client().holder(name) is not None:
        assert time.monotonic() < deadline, "the dead worker's lock outlived its TTL"
        time.sleep(0.1)
    (tmp_path / f"started-{account.pk}").unlink()
    result = deposit.enqueue(account.pk, str(tmp_path))
    assert result.id != killed.id
    second = DbWorker(django_child_env)
    try:
        (tmp_path / f"go-{account.pk}").touch()
        deadline = time.monotonic() + _BOUND
        while not result.is_finished:
            assert time.monotonic() < deadline
            time.sleep(0.05)
            result.refresh()
        assert result.status == "SUCCESSFUL"
    finally:
        second.stop()
    account.refresh_from_db()
    assert account.balance == 1


def _capture(errors: list[BaseException], call: Any) -> None:
    try:
        call()
    except BaseException as e:  # handed to the test's thread
        errors.append(e)


def _finished(result: Any) -> Any:
    deadline = time.monotonic() + _BOUND
    while not result.is_finished:
        assert time.monotonic() < deadline, f"task {result.id} did not finish within {_BOUND:g} s"
        time.sleep(0.05)
        result.refresh()
    return result


def test_a_run_that_stops_on_loss_writes_nothing_more_and_the_next_run_proceeds(
    worker: DbWorker, tmp_path: Path
) -> None:
    name = lock_name("drain:7")
    stopped = drain.enqueue(7, str(tmp_path))
    token = int(_wait_for(tmp_path / "started-7", "the run"))
    assert get_client().force_release(name, token)  # as an operator would: the run's lock is lost
    assert _finished(stopped).status == "FAILED"
    assert stopped.errors[-1].exception_class_path.endswith(".LockLost")
    beats = (tmp_path / f"beat-{token}").read_text()

    (tmp_path / "started-7").unlink()
    result = drain.enqueue(7, str(tmp_path))
    assert result.id != stopped.id  # the key is free
    _wait_for(tmp_path / "started-7", "the next run")
    (tmp_path / "go-7").touch()
    assert _finished(result).status == "SUCCESSFUL"
    assert (tmp_path / f"beat-{token}").read_text() == beats  # the stopped run wrote nothing after its stop


def test_a_task_run_inside_enqueue_is_not_reported_lost(
    django_servers: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ImmediateBackend runs the task inside enqueue(): the run takes the enqueue's reservation over, which is its
    end, not a loss (a red team saw "lost: its key was removed" logged for every such run longer than ttl / 3)."""

    def let_it_finish_after_40_beats() -> None:
        beat = tmp_path / f"beat-{_wait_for(tmp_path / 'started-9', 'the run')}"
        deadline = time.monotonic() + _BOUND
        while not (beat.exists() and int(beat.read_text()) >= 40):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (tmp_path / "go-9").touch()

    go = threading.Thread(target=let_it_finish_after_40_beats)
    go.start()
    with caplog.at_level(logging.WARNING, logger="distlock"):
        # The run goes on for 40 beats of 0.02 s: the enqueuing client checks its keys every ~0.33 s (ttl 1 s), so
        # the run meets at least two of its checks.
        result = drain.using(backend="immediate").enqueue(9, str(tmp_path))
        assert result.status == "SUCCESSFUL" and result.return_value == "finished"
    go.join(10)
    assert not [r for r in caplog.records if "lost" in r.getMessage()], [r.getMessage() for r in caplog.records]
    assert get_client().holder(lock_name("drain:9")) is None


@pytest.mark.django_db(databases=[])
def test_bad_templates_and_arguments_fail_where_they_are_written(django_servers: dict[str, str]) -> None:
    with pytest.raises(distlock.InvalidKeyTemplate, match="'user_id', which is not a parameter"):
        singleton_task("report:{user_id}")(note)
    with pytest.raises(distlock.InvalidKeyTemplate, match="put it above @task"):
        singleton_task("report:{pk}")(note.func)  # type: ignore[type-var]
    with pytest.raises(distlock.ConfigurationError, match="already a singleton task"):
        singleton_task("report:{pk}")(deposit)
    with pytest.raises(distlock.InvalidKeyTemplate, match="malformed"):
        singleton_task("report:{pk")
    with pytest.raises(TypeError, match="'deposit' called with arguments that do not fit"):
        deposit.enqueue(1)  # type: ignore[call-arg]
    with pytest.raises(distlock.ConfigurationError, match="on_duplicate"):
        singleton_task("report:{pk}", on_duplicate="skip")
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _capture(errors, lambda: drain.call(8, "unused")))
    thread.start()
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], distlock.ConfigurationError), errors
    assert "db_worker --no-reload" in str(errors[0])  # the autoreloader runs it in a thread
    with pytest.raises(distlock.ConfigurationError, match="stop_on_lost must be True or False"):
        singleton_task("report:{pk}", stop_on_lost="yes")  # type: ignore[arg-type]
