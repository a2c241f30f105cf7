"""Benchmark: what ``distlock.celery.SingletonTask`` costs per task over a plain Celery task, on the same worker.

One run starts an etcd (fsync on, :func:`benchmarks._harness.servers.etcd_server`, or ``--etcd-url``), a Redis as
broker and result backend (``distlock.testing.RedisServer``, or ``--redis-url``) and one Celery worker (prefork, 2
processes) running three tasks with empty bodies:

* ``plain``: ``@app.task`` — the floor;
* ``run``: ``@app.task(base=SingletonTask, unique_on=["i"])`` — locked while it runs (``lock_on="run"``);
* ``enqueue``: the same with ``lock_on="enqueue"`` — reserved by the sender, handed to the worker.

Every call has its own ``i``, so no call is a duplicate: this measures the price of the lock, not of contention. It
measures, for each task:

* **round trip**: ``task.delay(i).get()`` one call at a time, from this process, the tasks interleaved in blocks (the
  order rotating from block to block) so that a slow spell of the shared machine hits them alike;
* **in the worker**: the time from Celery's ``task_prerun`` to its ``task_postrun`` signal in the worker process
  (the lock taken before the body and released after it, the result stored), recorded by the worker;
* **etcd RPCs per task**, read from etcd's own counters between blocks (keep-alives of the worker's lease included);
* **throughput**: a burst of calls sent at once, until the last result is in.

The figures are printed and written into ``docs/BENCHMARKS.md`` between the ``celery-overhead`` markers, with the
machine (through :func:`benchmarks._harness.machine.machine`). Everything is bounded: a result that does not come within
``--timeout`` seconds stops the run with an error instead of hanging it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from celery import Celery, signals

from benchmarks._harness.figures import NA, breakdown, median, ms, per, percentile, ratio, table_row, verdict
from benchmarks._harness.machine import ETCD_PACKAGES, machine, package_version
from benchmarks._harness.report import publish, section
from benchmarks._harness.run import Run, add_etcd_arguments, add_out_argument, summary
from benchmarks._harness.servers import EtcdUnderTest, etcd_server
from benchmarks._harness.timing import Timed, interleaved
from distlock.celery import SingletonTask
from distlock.testing import RedisServer

NAME = "celery-overhead"
#: What each mode's burst throughput should reach, as a share of the plain task's.
BURST_TARGETS = {"run": 0.7, "enqueue": 0.5}
KINDS = {
    "plain": "plain `@app.task`",
    "run": '`SingletonTask`, `lock_on="run"`',
    "enqueue": '`SingletonTask`, `lock_on="enqueue"`',
}
TTL = 30.0
TIMINGS_ENV = "DISTLOCK_BENCH_CELERY_TIMINGS"
URL_ENV = ("DISTLOCK_BENCH_CELERY_BROKER", "DISTLOCK_BENCH_CELERY_BACKEND", "DISTLOCK_BENCH_CELERY_ETCD")
QUEUE_ENV = "DISTLOCK_BENCH_CELERY_QUEUE"


def make_app(broker: str, backend: str, etcd_url: str, queue: str) -> Celery:
    """The benchmark's app: the same three tasks in the sending process and in the worker."""
    app = Celery("distlock_celery_bench", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(
        distlock_url=etcd_url,
        task_default_queue=queue,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        result_expires=600,
        broker_connection_retry_on_startup=True,
    )

    @app.task(shared=False, name="bench.plain")
    def plain(i: int) -> int:
        return i

    @app.task(shared=False, base=SingletonTask, name="bench.run", unique_on=["i"], lock_ttl=TTL)
    def run(i: int) -> int:
        return i

    @app.task(shared=False, base=SingletonTask, name="bench.enqueue", unique_on=["i"], lock_on="enqueue", lock_ttl=TTL)
    def enqueue(i: int) -> int:
        return i

    del plain, run, enqueue
    return app


# --- the worker process -----------------------------------------------------------------------------------


def _record_worker_timings(path: str) -> None:
    """In the worker: append ``{"task": name, "seconds": prerun -> postrun}`` per task to ``path``."""
    started: dict[str, float] = {}

    @signals.task_prerun.connect(weak=False)
    def prerun(task_id: str, **_: Any) -> None:
        started[task_id] = time.perf_counter()

    @signals.task_postrun.connect(weak=False)
    def postrun(task_id: str, task: Any, **_: Any) -> None:
        begin = started.pop(task_id, None)
        if begin is None:
            return
        line = json.dumps({"task": task.name, "seconds": time.perf_counter() - begin}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def _worker_main(argv: list[str]) -> None:
    broker, backend, etcd_url = (os.environ[name] for name in URL_ENV)
    app = make_app(broker, backend, etcd_url, os.environ[QUEUE_ENV])
    _record_worker_timings(os.environ[TIMINGS_ENV])
    app.worker_main(argv)


@contextmanager
def _worker(urls: tuple[str, str, str, str], timings: Path, log: Path, app: Celery, timeout: float) -> Iterator[None]:
    broker, backend, etcd_url, queue = urls
    env = dict(os.environ)
    env.update(dict(zip(URL_ENV, (broker, backend, etcd_url), strict=True)))
    env.update({QUEUE_ENV: queue, TIMINGS_ENV: str(timings)})
    command = [sys.executable, "-m", "benchmarks.celery_overhead", "--as-worker", "worker", "--pool=prefork"]
    command += ["--concurrency=2", "--loglevel=WARNING", "--without-gossip", "--without-mingle"]
    command += ["--without-heartbeat", "-Q", queue, f"--hostname={queue}@%h"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            app.tasks["bench.plain"].delay(0).get(timeout=timeout)
        except Exception as e:
            raise RuntimeError(f"the Celery worker did not answer: {e!r}\n{log.read_text()[-3000:]}") from e
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=15)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


# --- measuring --------------------------------------------------------------------------------------------


class Kind:
    """What was measured for one task."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.round_trips = Timed()  # the sequential calls: seconds each, etcd RPCs of them all
        self.in_worker: list[float] = []
        self.burst: tuple[int, float] | None = None  # (calls, seconds)

    @property
    def calls(self) -> int:
        return len(self.round_trips.seconds)

    def row(self) -> str:
        trips, work, rpcs = self.round_trips.seconds, self.in_worker, self.round_trips.requests
        rate = f"{self.burst[0] / self.burst[1]:.0f}" if self.burst else NA
        return table_row(
            [
                KINDS[self.key],
                str(len(trips)),
                ms(percentile(trips, 50)),
                ms(percentile(trips, 99)),
                ms(percentile(work, 50)),
                ms(percentile(work, 99)),
                f"{per(rpcs.total(), self.calls):.2f}",
                breakdown(rpcs, self.calls),
                rate,
            ]
        )


def _sequential(app: Celery, etcd: EtcdUnderTest, kinds: dict[str, Kind], args: argparse.Namespace) -> None:
    """``--warmup`` calls of each task, then ``--rounds`` each, one at a time, :func:`interleaved`."""
    numbers = itertools.count(1)

    def call(key: str) -> Callable[[], object]:
        task = app.tasks[f"bench.{key}"]
        return lambda: task.delay(next(numbers)).get(timeout=args.timeout)

    runs = {key: call(key) for key in kinds}
    for key, timed in interleaved(runs, args.rounds, args.warmup, args.block, etcd.counters).items():
        kinds[key].round_trips = timed


def _burst(app: Celery, kind: Kind, calls: int, first: int, timeout: float) -> None:
    task = app.tasks[f"bench.{kind.key}"]
    start = time.perf_counter()
    results = [task.delay(first + n) for n in range(calls)]
    for result in results:
        result.get(timeout=timeout)
    kind.burst = (calls, time.perf_counter() - start)


def _worker_timings(path: Path, kinds: dict[str, Kind], skip: Counter[str]) -> None:
    """Attach the worker's prerun -> postrun times of the sequential calls: per task, the first ``skip[task]``
    were warm-up calls, the next ``calls`` the sequential ones (one at a time, so in order), the rest the burst."""
    seen: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        key = str(entry["task"]).removeprefix("bench.")
        seen[key] += 1
        if key in kinds and skip[key] < seen[key] <= skip[key] + kinds[key].calls:
            kinds[key].in_worker.append(float(entry["seconds"]))


# --- report -----------------------------------------------------------------------------------------------


def render(*, run: Run, machine: list[str], kinds: dict[str, Kind]) -> str:
    plain = kinds["plain"]
    lines = [
        *run.heading(
            "## Celery: `SingletonTask` over a plain task, same worker",
            [
                *machine,
                f"- celery {package_version('celery')}, kombu {package_version('kombu')}, "
                f"redis-py {package_version('redis')}; Redis as broker and result backend "
                "(`distlock.testing.RedisServer`, loopback, no persistence)",
                f"- One worker: prefork, 2 processes, prefetch 1; lock TTL {TTL:g} s",
            ],
        ),
        "Task bodies are empty and every call has its own lock name, so nothing waits for a lock: the difference to",
        "the plain task is what taking and releasing the lock costs. *Round trip*: `task.delay(i).get()`, one call",
        "at a time from the benchmark process (blocks of calls, the tasks taking turns). *In the worker*: Celery's",
        "`task_prerun` to `task_postrun` in the worker process (lock, body, result stored, lock released). *RPCs*:",
        "gRPC messages etcd received per call, from both sides (the enqueue mode's sender included). *Burst*: calls",
        "sent at once, tasks per second until the last result is in.",
        "",
        "| Task | calls | round trip p50 ms | p99 ms | in the worker p50 ms | p99 ms | etcd RPCs / task "
        "| RPCs by method / task | burst tasks/s |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
        *(kind.row() for kind in kinds.values()),
        "",
        "### Overhead over the plain task",
        "",
    ]
    for key in ("run", "enqueue"):
        kind = kinds[key]
        bound = BURST_TARGETS[key]
        trip = median(kind.round_trips.seconds) - median(plain.round_trips.seconds)
        work = median(kind.in_worker) - median(plain.in_worker)
        rate = NA
        if kind.burst and plain.burst:
            share = (kind.burst[0] / kind.burst[1]) / (plain.burst[0] / plain.burst[1])
            rate = f"{ratio(kind.burst[0] / kind.burst[1], plain.burst[0] / plain.burst[1])} (target ≥ {bound:g}x: "
            rate += f"{verdict(share >= bound)})"
        lines.append(
            f"- {KINDS[key]}: +{ms(trip)} ms per round trip (median), +{ms(work)} ms in the worker (median); "
            f"burst throughput {rate} of the plain task's"
        )
    lines += [
        "",
        "The enqueue mode pays for its reservation in the sender (a read to look for a duplicate, a `Txn` to take",
        "it) and for the hand-over in the worker: a second lock so that only one delivery takes over (a `Txn` to",
        "take it, one to release it), a join behind the reservation, and the reservation's removal (a read and a",
        "`Txn`). The sender takes no part after sending: it neither polls nor waits, whatever the backlog.",
    ]
    return section(NAME, lines)


def _parse_args(run: Run) -> argparse.Namespace:
    parser = argparse.ArgumentParser(run.prog, description=summary(__doc__))
    parser.add_argument("--rounds", type=int, default=300, help="sequential calls per task (default 300)")
    parser.add_argument("--block", type=int, default=25, help="calls per block (default 25)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up calls per task (default 20)")
    parser.add_argument("--burst", type=int, default=300, help="calls per burst (default 300)")
    parser.add_argument("--timeout", type=float, default=60.0, help="longest wait for one result, s (default 60)")
    add_out_argument(parser)
    add_etcd_arguments(parser)
    parser.add_argument("--redis-url", help="use this Redis (redis://HOST:PORT) as broker and result backend")
    args = parser.parse_args(run.argv)
    if min(args.rounds, args.block, args.burst) < 1 or args.warmup < 0:
        parser.error("--rounds, --block and --burst must be positive, --warmup not negative")
    return args


@contextmanager
def _redis(url: str | None) -> Iterator[str]:
    """``redis://HOST:PORT`` of the broker: ``--redis-url`` (its database number dropped) or a new server."""
    if url:
        parts = urllib.parse.urlsplit(url)
        yield parts._replace(path="").geturl()
        return
    with RedisServer() as server:
        yield server.url.rsplit("/", 1)[0]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--as-worker"]:
        _worker_main(argv[1:])
        return 0
    run = Run.begin("benchmarks.celery_overhead", argv)
    args = _parse_args(run)
    queue = f"bench-{run.id}"
    kinds = {key: Kind(key) for key in KINDS}

    with (
        tempfile.TemporaryDirectory(prefix="distlock-celery-bench-") as temp,
        etcd_server(args) as etcd,
        _redis(args.redis_url) as redis_base,
    ):
        scratch = Path(temp)
        timings = scratch / "worker-timings.jsonl"
        lines = machine(etcd, ETCD_PACKAGES)
        print("\n".join(lines), flush=True)
        urls = (f"{redis_base}/0", f"{redis_base}/1", etcd.url, queue)
        app = make_app(*urls)
        with _worker(urls, timings, scratch / "worker.log", app, args.timeout):
            _sequential(app, etcd, kinds, args)
            for number, kind in enumerate(kinds.values()):
                _burst(app, kind, args.burst, 10_000_000 * (number + 1), args.timeout)
        # The worker ran the warm-up calls first, and one plain call before them: the check that it answers.
        warm = Counter({key: args.warmup + (1 if key == "plain" else 0) for key in kinds})
        _worker_timings(timings, kinds, warm)
        app.close()

    for kind in kinds.values():
        print(kind.row(), flush=True)
    publish(args.out, NAME, render(run=run, machine=lines, kinds=kinds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
