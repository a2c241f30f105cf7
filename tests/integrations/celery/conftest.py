"""Fixtures for the Celery integration: a real worker (prefork, 2 processes) on a real Redis broker and a real etcd.

``celery_worker`` starts ``celeryapp.py`` as a Celery worker once for the session — against the session's Redis
(``redis_url``, started by the root fixtures) as broker and result backend and the session's etcd — waits until it
answers a task, and stops it after the tests (SIGTERM, then SIGKILL of its process group). ``celery_app`` is the
same app in the test process, for sending. Tests tell their calls apart by a random ``job`` argument, and read what
the worker did from the events file (``celery_events``). Eager mode is never used: every test goes through the
broker to separate worker processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _support import child_env, load_module
from celery import Celery

HERE = Path(__file__).resolve().parent


testapp = load_module("distlock_celery_testapp", HERE / "celeryapp.py")


@dataclass
class Events:
    """The events file the tasks append to (see ``celeryapp.record``)."""

    path: Path

    def all(self, job: str | None = None) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        events = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return [e for e in events if job is None or e.get("job") == job]

    def of(self, job: str, event: str) -> list[dict[str, Any]]:
        return [e for e in self.all(job) if e["event"] == event]

    @staticmethod
    def overlaps(runs: list[Run]) -> list[tuple[Run, Run]]:
        """Pairs of runs whose [start, end] intervals intersect (a run that never ended lasts forever)."""
        ordered = sorted(runs, key=lambda r: r.start)
        pairs = []
        for i, first in enumerate(ordered):
            for second in ordered[i + 1 :]:
                if first.end is None or second.start < first.end:
                    pairs.append((first, second))
        return pairs

    def runs(self, job: str) -> list[Run]:
        """The runs of ``job`` that started, in order of start (``end`` is None for a run that never ended)."""
        ends = {(e["id"], e.get("token"), e.get("attempt")): e["t"] for e in self.of(job, "end")}
        starts = sorted(self.of(job, "start"), key=lambda e: float(e["t"]))
        return [
            Run(e["id"], e.get("token"), e["pid"], e["t"], ends.get((e["id"], e.get("token"), e.get("attempt"))), e)
            for e in starts
        ]


@dataclass(frozen=True)
class Run:
    id: str
    token: int | None
    pid: int
    start: float
    end: float | None
    event: dict[str, Any]


@dataclass
class CeleryWorker:
    process: subprocess.Popen[bytes]
    log_path: Path
    queue: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def celery_events(tmp_path_factory: pytest.TempPathFactory) -> Events:
    return Events(tmp_path_factory.mktemp("celery-events") / "events.jsonl")


@pytest.fixture(scope="session")
def celery_urls(redis_url: str, etcd_url: str) -> tuple[str, str, str, str]:
    """Broker, result backend, etcd URL and a queue of this session's own."""
    base = redis_url.rsplit("/", 1)[0]
    return f"{base}/0", f"{base}/1", etcd_url, f"distlock-tests-{uuid.uuid4().hex[:8]}"


def _together(calls: Sequence[Callable[..., Any]]) -> list[Any]:
    """Run ``calls`` on threads released at once by a barrier; each one's result, or the exception it raised."""
    barrier = threading.Barrier(len(calls))

    def go(call: Callable[..., Any]) -> Any:
        barrier.wait(timeout=10)
        try:
            return call()
        except Exception as e:
            return e

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(go, calls))


@pytest.fixture(scope="session")
def together() -> Callable[[Sequence[Callable[..., Any]]], list[Any]]:
    """Make calls at the same moment from many threads (see ``_together``)."""
    return _together


@pytest.fixture(scope="session")
def lock_ttl() -> float:
    """The lease of the test tasks' locks."""
    ttl: float = testapp.TTL
    return ttl


@pytest.fixture(scope="session")
def make_celery_app() -> Callable[[str, str, str, str], Celery]:
    """``celeryapp.make_app(broker, backend, etcd_url, queue)``: the test app, on other URLs."""
    make: Callable[[str, str, str, str], Celery] = testapp.make_app
    return make


@pytest.fixture(scope="session")
def celery_app_path() -> Path:
    """The test app's file, for scripts that import it in processes of their own."""
    return HERE / "celeryapp.py"


@pytest.fixture(scope="session")
def celery_app(celery_urls: tuple[str, str, str, str]) -> Celery:
    app: Celery = testapp.make_app(*celery_urls)
    return app


@pytest.fixture(scope="session")
def celery_worker(
    celery_urls: tuple[str, str, str, str],
    celery_app: Celery,
    celery_events: Events,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[CeleryWorker]:
    with run_worker(celery_urls, celery_app, celery_events, tmp_path_factory.mktemp("celery-worker")) as worker:
        yield worker


@pytest.fixture(scope="session")
def start_celery_worker() -> Callable[..., Any]:
    """``run_worker``: a context manager that runs a worker of the test app on other URLs."""
    return run_worker


@contextlib.contextmanager
def run_worker(
    urls: tuple[str, str, str, str],
    app: Celery,
    events: Events,
    log_dir: Path,
    pool: str = "prefork",
    concurrency: int = 2,
) -> Iterator[CeleryWorker]:
    """A worker of the test app on ``urls`` (broker, result backend, lock service, queue) with ``pool`` of
    ``concurrency`` processes, answering ``app``'s ping before it is handed out, and stopped afterwards."""
    broker, backend, lock_url, queue = urls
    log_path = log_dir / "worker.log"
    env = child_env()
    env.update(
        {
            "DISTLOCK_CELERY_TEST_BROKER": broker,
            "DISTLOCK_CELERY_TEST_BACKEND": backend,
            "DISTLOCK_CELERY_TEST_ETCD": lock_url,
            testapp.QUEUE_ENV: queue,
            testapp.EVENTS_ENV: str(events.path),
        }
    )
    os.environ[testapp.EVENTS_ENV] = str(events.path)
    command = [sys.executable, str(HERE / "celeryapp.py"), "worker", f"--pool={pool}", f"--concurrency={concurrency}"]
    command += ["--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat", "-Q", queue]
    command += [f"--hostname={queue}@%h"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    worker = CeleryWorker(process, log_path, queue)
    try:
        result = app.tasks["t.ping"].delay()
        try:
            assert result.get(timeout=60) == "pong"
        except Exception as e:
            raise AssertionError(f"the Celery worker did not answer: {e!r}\n{worker.log()[-4000:]}") from e
        yield worker
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # warm shutdown: the worker waits for running tasks
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=15)
    # Pool processes the main process left behind (it was killed, or they hang) go with the session it leads.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
