"""Measuring a lock benchmark's :class:`~benchmarks._harness.locks.Plan` in spawned processes, start to end.

:func:`measure` times every lock uncontended in one process (:func:`~benchmarks._harness.timing.interleaved`), then
each contender in N processes on one lock name for a fixed window. Processes are started with "spawn" (gRPC channels
do not survive ``fork()``), connect and warm up, then meet the parent at a barrier; the parent reads the server's
counters, lets them go, and reads the counters again when the window closes. :func:`lock_benchmark` is a lock
benchmark from start to end: the machine, the measurements, the published section.

What can go wrong: a process that hangs in its set-up or its loop would hang the run, so every wait is bounded (a
child stops after its rounds or its window; whatever has not reported :data:`GRACE` seconds later is killed and
reported as an error, as is a set-up that fails or does not finish). What one measurement leaves on the server is
removed before the first and after each.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from multiprocessing.context import SpawnContext
from multiprocessing.synchronize import Barrier, Event
from typing import Any, Protocol, TypeVar

from benchmarks._harness.locks import BlockingSession, BlockingSessionFactory, Plan, Session, SessionFactory
from benchmarks._harness.machine import machine
from benchmarks._harness.report import publish
from benchmarks._harness.results import Contended, LockResults, Outcome, Uncontended, WorkerResult
from benchmarks._harness.run import Run
from benchmarks._harness.servers import Counters, ServerUnderTest
from benchmarks._harness.timing import interleaved

__all__ = ["BLOCK", "GRACE", "lock_benchmark", "measure"]

# Connecting and warming up: 32 freshly spawned interpreters share two cores with the server.
SETUP_TIMEOUT = 90.0
#: After a contention window, waiters still queued in acquire() get the lock in turn and exit; bounds that.
GRACE = 30.0
#: Rounds per block of :func:`interleaved` in the lock benchmarks.
BLOCK = 25


class _Sessions:
    def __init__(self, by_lock: dict[str, Session]) -> None:
        self.by_lock = by_lock

    def close(self) -> None:
        for session in self.by_lock.values():
            with contextlib.suppress(Exception):
                session.close()


@dataclasses.dataclass
class _LatencyJob:
    """Every lock in one process, :func:`interleaved` with the server's requests counted between blocks."""

    sessions: Mapping[str, SessionFactory]
    locks: list[str]
    url: str
    name: str
    rounds: int
    warmup: int
    counters: Counters

    def open(self) -> _Sessions:
        sessions = _Sessions({})
        try:
            for lock in self.locks:
                session = sessions.by_lock[lock] = self.sessions[lock](self.url, f"{self.name}-{lock}")
                for _ in range(self.warmup):
                    session.cycle()
        except BaseException:
            sessions.close()
            raise
        return sessions

    def run(self, sessions: _Sessions, index: int, start: float) -> list[WorkerResult]:
        runs = {lock: sessions.by_lock[lock].cycle for lock in self.locks}
        timed = interleaved(runs, self.rounds, 0, BLOCK, self.counters)
        return [WorkerResult(index, lock, t.seconds, t.requests) for lock, t in timed.items()]


@dataclasses.dataclass
class _ContentionJob:
    """One of N processes on one lock name: acquire, bump a counter that no other lock guards, release, until the
    window closes; it counts what it saw of another process in the critical section."""

    lock: str
    open_session: BlockingSessionFactory
    url: str
    name: str
    duration: float
    acquire_timeout: float
    counter: Any  # multiprocessing RawValue("q"): incremented without any other lock than the one measured
    owner: Any  # multiprocessing RawValue("q"): 1 + index of the process inside the critical section, else 0
    limit: int = 1  # more than 1: a semaphore; ``owner`` then counts the holders inside, under ``guard``
    guard: Any = None  # multiprocessing Lock: only for a semaphore, to count its holders exactly

    def open(self) -> BlockingSession:
        session = self.open_session(self.url, self.name)
        # Warm up with one acquisition: distlock creates its session lease here, once per client.
        if not session.acquire(timeout=self.acquire_timeout):
            raise RuntimeError(f"warm-up acquire() timed out after {self.acquire_timeout:g} s")
        session.release()
        return session

    def run(self, session: BlockingSession, index: int, start: float) -> list[WorkerResult]:
        result = WorkerResult(index, self.lock)
        me = index + 1
        end = start + self.duration
        try:
            while time.monotonic() < end:
                t0 = time.monotonic()
                if not session.acquire(timeout=self.acquire_timeout):
                    result.failures += 1
                    continue
                acquired = time.monotonic()
                if self.limit == 1:
                    if self.owner.value != 0:
                        result.overlaps += 1
                    self.owner.value = me
                    self.counter.value += 1
                    if self.owner.value != me:
                        result.overlaps += 1
                    self.owner.value = 0
                else:
                    with self.guard:  # the holders inside, counted exactly: more than the limit is an overlap
                        self.owner.value += 1
                        result.overlaps += self.owner.value > self.limit
                        self.counter.value += 1
                    with self.guard:
                        self.owner.value -= 1
                session.release()
                if acquired <= end:
                    result.seconds.append(acquired - t0)
                else:
                    result.late += 1
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        return [result]


class _Closeable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=_Closeable)


class _Job(Protocol[S]):
    def open(self) -> S:
        """Connect (and warm up): not measured."""

    def run(self, session: S, index: int, start: float) -> list[WorkerResult]:
        """The measured part; ``start`` is the ``time.monotonic()`` at which all processes were let go."""


@dataclasses.dataclass
class _Meeting:
    """How the parent and the children of one measurement meet (passed to each child when it is spawned)."""

    barrier: Barrier  # passed twice: all connected and warmed up (counters read), then "go"
    start: Any  # RawValue("d"): time.monotonic() of "go", set by the parent before it lets the children go
    finished: Event  # set by the parent once it has read the counters: the children may disconnect
    results: Any  # Queue[list[WorkerResult]]


def _child(job: _Job[S], index: int, meeting: _Meeting) -> None:
    session: S | None = None
    try:
        try:
            session = job.open()
            meeting.barrier.wait()
            meeting.barrier.wait()
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:
            meeting.barrier.abort()
            error = f"set-up failed: {type(exc).__name__}: {exc}"
            meeting.results.put([WorkerResult(index, "", error=error)])
            return
        try:
            results = job.run(session, index, meeting.start.value)
        except Exception as exc:
            results = [WorkerResult(index, "", error=f"{type(exc).__name__}: {exc}")]
        meeting.results.put(results)
        # Disconnecting is not the lock's cost: stay until the parent has read the counters.
        meeting.finished.wait(SETUP_TIMEOUT + GRACE)
    finally:
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()


def _run(
    ctx: SpawnContext, server: ServerUnderTest, jobs: list[_Job[Any]], window: float | None, limit: float
) -> Outcome:
    """Run one job per process; count requests from "go" to the end of ``window`` (or to the last result).

    ``limit`` bounds how long after "go" the parent waits for results; stragglers are then killed.
    """
    meeting = _Meeting(
        ctx.Barrier(len(jobs) + 1, timeout=SETUP_TIMEOUT), ctx.RawValue("d", 0.0), ctx.Event(), ctx.Queue()
    )
    procs = [ctx.Process(target=_child, args=(job, i, meeting), daemon=True) for i, job in enumerate(jobs)]
    for proc in procs:
        proc.start()
    reported = 0
    collected: list[WorkerResult] = []
    errors: list[str] = []
    requests: Counter[str] = Counter()
    try:
        meeting.barrier.wait()
        before = server.counters.requests()
        meeting.start.value = go = time.monotonic()
        meeting.barrier.wait()
        if window is not None:
            time.sleep(max(0.0, go + window - time.monotonic()))
            requests = server.counters.requests() - before
        while reported < len(jobs):
            try:
                collected += meeting.results.get(timeout=max(0.0, go + limit - time.monotonic()))
                reported += 1
            except queue.Empty:
                errors.append(f"{len(jobs) - reported} process(es) had not finished after {limit:.0f} s")
                break
        if window is None:
            requests = server.counters.requests() - before
    except threading.BrokenBarrierError:
        errors.append("set-up did not complete")
        with contextlib.suppress(queue.Empty):
            while True:
                collected += meeting.results.get(timeout=1.0)
    finally:
        meeting.finished.set()
        deadline = time.monotonic() + 10.0
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    errors += [f"process {r.index}: {r.error}" for r in collected if r.error]
    return Outcome(sorted(collected, key=lambda r: r.index), requests, server.remove_leftovers(), errors)


def measure(server: ServerUnderTest, args: argparse.Namespace, run: Run, plan: Plan) -> LockResults:
    """The uncontended latencies of every chosen lock, then each contender at each process count; errors too.
    Each row is printed as it is measured. What was on the server before is removed first."""
    ctx = multiprocessing.get_context("spawn")
    server.remove_leftovers()
    contended: list[Contended] = []
    errors: list[str] = []
    locks = [lock for lock in plan.labels if lock in args.locks]
    name = f"bench-{run.id}"
    latency = _LatencyJob(plan.sessions, locks, server.url, name, args.rounds, args.warmup, server.counters)
    outcome = _run(ctx, server, [latency], window=None, limit=GRACE + len(locks) * args.rounds * 0.05)
    uncontended = [Uncontended(result) for result in outcome.results if not result.error]
    errors += [f"uncontended: {e}" for e in outcome.errors]
    print("\n".join(u.row(plan.labels) for u in uncontended), flush=True)
    for processes in args.processes:
        for lock, session in plan.contenders.items():
            if lock not in args.locks:
                continue
            counter, owner = ctx.RawValue("q", 0), ctx.RawValue("q", 0)
            timeout = args.duration + GRACE / 2
            job = _ContentionJob(
                lock,
                session,
                server.url,
                f"{name}-contended-{lock}-{processes}",
                args.duration,
                timeout,
                counter,
                owner,
                plan.limit,
                ctx.Lock() if plan.limit > 1 else None,
            )
            jobs: list[_Job[Any]] = [job] * processes
            outcome = _run(ctx, server, jobs, window=args.duration, limit=args.duration + GRACE)
            contended.append(Contended(lock, processes, args.duration, counter.value, outcome))
            errors += [f"{plan.labels[lock]}, {processes} processes: {e}" for e in outcome.errors]
            print(contended[-1].row(plan.labels), flush=True)
    return LockResults(uncontended, contended, errors)


def lock_benchmark(
    run: Run,
    args: argparse.Namespace,
    server: contextlib.AbstractContextManager[ServerUnderTest],
    packages: Mapping[str, str],
    plan: Plan,
    name: str,
    render: Callable[[Run, list[str], argparse.Namespace, LockResults], str],
) -> int:
    """A lock benchmark from start to end: print the machine (:func:`machine`), :func:`measure` the ``plan`` on the
    ``server``, and :func:`publish` the section ``render`` makes of it. Returns 1 if there were errors, else 0."""
    with server as under_test:
        lines = machine(under_test, packages)
        print("\n".join(lines), flush=True)
        results = measure(under_test, args, run, plan)
    publish(args.out, name, render(run, lines, args, results))
    return 1 if results.errors else 0
