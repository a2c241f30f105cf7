"""Benchmark distlock's etcd lock against python-etcd3's ``Lock`` and a raw-transaction floor.

One run against one etcd server (started here by :class:`distlock.testing.EtcdServer`, or an existing one
given by ``--etcd-url``) measures:

* **uncontended** acquire + release latency (median, p99) and etcd RPCs per acquisition, for distlock, for
  python-etcd3's ``Lock``, and for the floor: one ``Txn`` (put if absent, with a lease granted once) and one
  ``DeleteRange`` on the raw gRPC stubs, with no library logic at all;
* **contention**: N processes loop acquire -> tiny critical section -> release on one lock name for a fixed
  time: acquisitions/s, RPCs per acquisition, wait percentiles, fairness (fewest / most acquisitions).

Every measurement runs in child processes started with "spawn" (gRPC channels do not survive ``fork()``), each
with its own client, connected and warmed up before anything is timed or counted. RPCs are etcd's own counters
(``grpc_server_msg_received_total`` on ``/metrics``, read over HTTP so that reading them is not counted). The
uncontended locks share one process and take turns in blocks, so a slow spell of a shared machine hits all of
them alike, and that process reads the counters between blocks. Contending processes meet the parent at a
barrier; the parent reads the counters, lets them go, and reads the counters again when the window closes.
Leases a measurement leaves behind are counted and revoked before the next one, so one lock's leftovers do not
expire (costing etcd work) during another's measurement.

Everything is bounded: a child stops after its rounds or its duration; whatever has not reported a grace
period later is killed and reported as an error instead of hanging the run. Results are printed and written
into ``docs/BENCHMARKS.md`` between the ``etcd-locks`` markers; the rest of that file is left alone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib.metadata
import json
import math
import multiprocessing
import os
import platform
import queue
import shlex
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.context import SpawnContext
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any, Protocol, TypeVar

import etcd3
import grpc
from etcd3 import etcdrpc

import distlock
from distlock.testing import EtcdServer, parse_prometheus_text

TTL = 30
RPC_TIMEOUT = 10.0
# Connecting and warming up: 32 freshly spawned interpreters share two cores with etcd.
SETUP_TIMEOUT = 90.0
# After a contention window, waiters still queued in acquire() get the lock in turn and exit; bounds that.
GRACE = 30.0
BEGIN_MARKER = "<!-- etcd-locks:begin -->"
END_MARKER = "<!-- etcd-locks:end -->"
LABELS = {
    "raw": "raw `Txn` + `DeleteRange` (floor)",
    "python-etcd3": "python-etcd3 `Lock`",
    "distlock": "distlock",
}
CONTENDERS = ("python-etcd3", "distlock")
NA = "n/a"

_MSG_RECEIVED = "grpc_server_msg_received_total{"


def _endpoint_of(url: str) -> str:
    """``host:port`` of an ``etcd://host:port`` (or ``http://``, or bare ``host:port``) URL."""
    parsed = urllib.parse.urlsplit(url if "://" in url else f"etcd://{url}")
    if parsed.hostname is None or parsed.port is None:
        raise SystemExit(f"--etcd-url {url!r}: expected etcd://HOST:PORT")
    return f"{parsed.hostname}:{parsed.port}"


# --- the three locks, each used the way an application would ----------------------------------------------


class Session(Protocol):
    def cycle(self) -> None:
        """One uncontended acquire + release, written the way an application writes it."""

    def close(self) -> None: ...


class BlockingSession(Session, Protocol):
    def acquire(self, timeout: float) -> bool: ...

    def release(self) -> None: ...


class DistlockSession:
    def __init__(self, url: str, name: str) -> None:
        self._client = distlock.connect(url)
        self._name = name
        self._held: distlock.Lock | None = None

    def cycle(self) -> None:
        with self._client.lock(self._name, ttl=TTL):
            pass

    def acquire(self, timeout: float) -> bool:
        lock = self._client.lock(self._name, ttl=TTL)
        if not lock.acquire(timeout=timeout):
            return False
        self._held = lock
        return True

    def release(self) -> None:
        assert self._held is not None
        self._held.release()
        self._held = None

    def close(self) -> None:
        self._client.close()


class Etcd3Session:
    """python-etcd3's ``Lock``: one key, a lease per attempt (not revoked), all waiters woken per release."""

    def __init__(self, url: str, name: str) -> None:
        host, port = _endpoint_of(url).rsplit(":", 1)
        self._client = etcd3.client(host, int(port), timeout=RPC_TIMEOUT)
        self._name = name
        self._held: Any = None

    def cycle(self) -> None:
        lock = self._client.lock(self._name, ttl=TTL)
        if not lock.acquire():
            raise RuntimeError("python-etcd3 Lock.acquire() timed out without contention")
        lock.release()

    def acquire(self, timeout: float) -> bool:
        lock = self._client.lock(self._name, ttl=TTL)
        if not lock.acquire(timeout=timeout):
            return False
        self._held = lock
        return True

    def release(self) -> None:
        self._held.release()
        self._held = None

    def close(self) -> None:
        # Its watcher thread dies with NameError ("six") when the stream closes (DESIGN.md section 2): a known
        # bug, harmless here, so keep it off the benchmark's output.
        threading.excepthook = _quiet_etcd3_watcher(threading.excepthook)
        self._client.close()


ExceptHook = Callable[[threading.ExceptHookArgs], object]


def _quiet_etcd3_watcher(hook: ExceptHook) -> ExceptHook:
    def quiet(args: threading.ExceptHookArgs) -> None:
        if not (args.exc_type is NameError and args.thread and args.thread.name.startswith("etcd3_watch")):
            hook(args)

    return quiet


class RawSession:
    """The floor: what any etcd lock must at least send, on the generated stubs, with nothing around it."""

    def __init__(self, url: str, name: str) -> None:
        self._channel = grpc.insecure_channel(_endpoint_of(url))
        self._kv = etcdrpc.KVStub(self._channel)
        self._leases = etcdrpc.LeaseStub(self._channel)
        self._lease_id = self._leases.LeaseGrant(etcdrpc.LeaseGrantRequest(TTL=TTL), timeout=RPC_TIMEOUT).ID
        key = f"/bench/raw/{name}".encode()
        not_created = etcdrpc.Compare(
            key=key, result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.CREATE, create_revision=0
        )
        put = etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=b"held", lease=self._lease_id))
        self._acquire = etcdrpc.TxnRequest(compare=[not_created], success=[put])
        self._release = etcdrpc.DeleteRangeRequest(key=key)
        self._revoke = etcdrpc.LeaseRevokeRequest(ID=self._lease_id)

    def cycle(self) -> None:
        if not self._kv.Txn(self._acquire, timeout=RPC_TIMEOUT).succeeded:
            raise RuntimeError("raw lock key already exists")
        self._kv.DeleteRange(self._release, timeout=RPC_TIMEOUT)

    def close(self) -> None:
        self._leases.LeaseRevoke(self._revoke, timeout=RPC_TIMEOUT)
        self._channel.close()


SESSIONS: dict[str, Callable[[str, str], Session]] = {
    "raw": RawSession,
    "python-etcd3": Etcd3Session,
    "distlock": DistlockSession,
}
BLOCKING_SESSIONS: dict[str, Callable[[str, str], BlockingSession]] = {
    "python-etcd3": Etcd3Session,
    "distlock": DistlockSession,
}


# --- what runs in the child processes ----------------------------------------------------------------------


@dataclasses.dataclass
class WorkerResult:
    index: int
    lock: str
    # Uncontended: seconds per acquire + release. Contention: seconds waited per acquisition in the window.
    seconds: list[float] = dataclasses.field(default_factory=list)
    rpcs: Counter[str] = dataclasses.field(default_factory=Counter)  # uncontended: counted by the child
    late: int = 0  # contention: acquisitions after the window closed (waiters draining), not counted
    failures: int = 0  # contention: acquire() returned False
    overlaps: int = 0  # contention: another process was inside the critical section at the same time
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Metrics:
    """etcd's Prometheus endpoint. Reading it is plain HTTP, so it does not count as an RPC itself."""

    url: str

    def rpcs(self) -> Counter[str]:
        """gRPC messages received so far, by method (every message of a stream: watch create, cancel, ...)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no $http_proxy for loopback
        with opener.open(self.url, timeout=RPC_TIMEOUT) as response:
            samples = parse_prometheus_text(response.read().decode())
        counts: Counter[str] = Counter()
        for key, value in samples.items():
            if key.startswith(_MSG_RECEIVED):
                counts[key.partition('grpc_method="')[2].partition('"')[0]] += int(value)
        return counts


class Sessions:
    def __init__(self, by_lock: dict[str, Session]) -> None:
        self.by_lock = by_lock

    def close(self) -> None:
        for session in self.by_lock.values():
            with contextlib.suppress(Exception):
                session.close()


@dataclasses.dataclass
class LatencyJob:
    """Every lock in one process, interleaved: block k runs ``block`` rounds of each lock, in an order
    rotated by k, so a slow spell of a shared machine hits all locks alike. RPCs are counted between blocks.
    """

    locks: list[str]
    url: str
    name: str
    rounds: int
    warmup: int
    metrics: Metrics
    block: int = 25

    def open(self) -> Sessions:
        sessions = Sessions({})
        try:
            for lock in self.locks:
                session = sessions.by_lock[lock] = SESSIONS[lock](self.url, f"{self.name}-{lock}")
                for _ in range(self.warmup):
                    session.cycle()
        except BaseException:
            sessions.close()
            raise
        return sessions

    def run(self, sessions: Sessions, index: int, start: float) -> list[WorkerResult]:
        results = {lock: WorkerResult(index, lock) for lock in self.locks}
        clock = time.perf_counter
        for k, done in enumerate(range(0, self.rounds, self.block)):
            shift = k % len(self.locks)
            for lock in self.locks[shift:] + self.locks[:shift]:
                session, result = sessions.by_lock[lock], results[lock]
                before = self.metrics.rpcs()
                for _ in range(min(self.block, self.rounds - done)):
                    t0 = clock()
                    session.cycle()
                    result.seconds.append(clock() - t0)
                result.rpcs += self.metrics.rpcs() - before
        return list(results.values())


@dataclasses.dataclass
class ContentionJob:
    lock: str
    url: str
    name: str
    duration: float
    acquire_timeout: float
    counter: Any  # multiprocessing RawValue("q"): incremented without any other lock than the one measured
    owner: Any  # multiprocessing RawValue("q"): 1 + index of the process inside the critical section, else 0

    def open(self) -> BlockingSession:
        session = BLOCKING_SESSIONS[self.lock](self.url, self.name)
        # Warm up with one acquisition: distlock grants its session lease here, once per client.
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
                if self.owner.value != 0:
                    result.overlaps += 1
                self.owner.value = me
                self.counter.value += 1
                if self.owner.value != me:
                    result.overlaps += 1
                self.owner.value = 0
                session.release()
                if acquired <= end:
                    result.seconds.append(acquired - t0)
                else:
                    result.late += 1
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        return [result]


class Closeable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=Closeable)


class Job(Protocol[S]):
    def open(self) -> S:
        """Connect (and warm up): not measured."""

    def run(self, session: S, index: int, start: float) -> list[WorkerResult]:
        """The measured part; ``start`` is the ``time.monotonic()`` at which all processes were let go."""


@dataclasses.dataclass
class Meeting:
    """How the parent and the children of one measurement meet (passed to each child when it is spawned)."""

    barrier: Barrier  # passed twice: all connected and warmed up (counters read), then "go"
    start: Any  # RawValue("d"): time.monotonic() of "go", set by the parent before it lets the children go
    finished: Event  # set by the parent once it has read the counters: the children may disconnect
    results: Any  # Queue[list[WorkerResult]]


def _child(job: Job[S], index: int, meeting: Meeting) -> None:
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


# --- the parent: etcd counters, process orchestration -------------------------------------------------------


class Etcd:
    """The server under test: its distlock URL, its client URL (HTTP gateway) and its metrics."""

    def __init__(self, url: str, metrics: Metrics, description: str) -> None:
        self.url = url
        self.endpoint = _endpoint_of(url)
        self.client_url = f"http://{self.endpoint}"
        self.metrics = metrics
        self.description = description

    def _gateway(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """GET or POST through etcd's HTTP/JSON gateway (bypassing $http_proxy: this is loopback)."""
        data = None if body is None else json.dumps(body).encode()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.client_url}{path}", data=data, timeout=RPC_TIMEOUT) as response:
            return json.loads(response.read())

    def version(self) -> str:
        return str(self._gateway("/version")["etcdserver"])

    def revoke_leases(self) -> int:
        """Revoke every lease on the server; return how many there were.

        The list comes from the JSON gateway: python3-etcd3's generated stubs have no ``LeaseLeases``.
        """
        ids = [int(lease["ID"]) for lease in self._gateway("/v3/lease/leases", {}).get("leases", [])]
        with grpc.insecure_channel(self.endpoint) as channel:
            stub = etcdrpc.LeaseStub(channel)

            def revoke(lease_id: int) -> None:
                with contextlib.suppress(grpc.RpcError):  # expired meanwhile
                    stub.LeaseRevoke(etcdrpc.LeaseRevokeRequest(ID=lease_id), timeout=RPC_TIMEOUT)

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(revoke, ids))
        return len(ids)


@dataclasses.dataclass
class Outcome:
    results: list[WorkerResult]
    rpcs: Counter[str]
    leftover_leases: int
    errors: list[str]

    @property
    def samples(self) -> list[float]:
        return sorted(s for r in self.results for s in r.seconds)


def _run(ctx: SpawnContext, etcd: Etcd, jobs: list[Job[Any]], window: float | None, limit: float) -> Outcome:
    """Run one job per process; count RPCs from "go" to the end of ``window`` (or to the last result).

    ``limit`` bounds how long after "go" the parent waits for results; stragglers are then killed.
    """
    meeting = Meeting(
        ctx.Barrier(len(jobs) + 1, timeout=SETUP_TIMEOUT), ctx.RawValue("d", 0.0), ctx.Event(), ctx.Queue()
    )
    procs = [ctx.Process(target=_child, args=(job, i, meeting), daemon=True) for i, job in enumerate(jobs)]
    for proc in procs:
        proc.start()
    reported = 0
    collected: list[WorkerResult] = []
    errors: list[str] = []
    rpcs: Counter[str] = Counter()
    try:
        meeting.barrier.wait()
        before = etcd.metrics.rpcs()
        meeting.start.value = go = time.monotonic()
        meeting.barrier.wait()
        if window is not None:
            time.sleep(max(0.0, go + window - time.monotonic()))
            rpcs = etcd.metrics.rpcs() - before
        while reported < len(jobs):
            try:
                collected += meeting.results.get(timeout=max(0.0, go + limit - time.monotonic()))
                reported += 1
            except queue.Empty:
                errors.append(f"{len(jobs) - reported} process(es) had not finished after {limit:.0f} s")
                break
        if window is None:
            rpcs = etcd.metrics.rpcs() - before
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
    return Outcome(sorted(collected, key=lambda r: r.index), rpcs, etcd.revoke_leases(), errors)


# --- statistics and report ------------------------------------------------------------------------------


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else math.nan


def _ms(seconds: float) -> str:
    return NA if math.isnan(seconds) else f"{seconds * 1000:.2f}"


def _per(count: float, acquisitions: int) -> float:
    return count / acquisitions if acquisitions else math.nan


def _ratio(numerator: float, denominator: float) -> str:
    ratio = numerator / denominator if denominator else math.nan
    return NA if math.isnan(ratio) else f"{ratio:.2f}x"


def _breakdown(rpcs: Counter[str], acquisitions: int) -> str:
    per_method = [(method, _per(count, acquisitions)) for method, count in rpcs.most_common()]
    return ", ".join(f"{method} {per:.2f}" for method, per in per_method if per >= 0.005) or NA


@dataclasses.dataclass
class Uncontended:
    result: WorkerResult

    @property
    def samples(self) -> list[float]:
        return sorted(self.result.seconds)

    @property
    def median(self) -> float:
        return _percentile(self.samples, 50)

    @property
    def p99(self) -> float:
        return _percentile(self.samples, 99)

    @property
    def rpcs_per_acquisition(self) -> float:
        return _per(self.result.rpcs.total(), len(self.samples))

    def row(self) -> str:
        samples = self.samples
        cells = [
            LABELS[self.result.lock],
            str(len(samples)),
            _ms(self.median),
            _ms(self.p99),
            _ms(max(samples, default=math.nan)),
            f"{self.rpcs_per_acquisition:.2f}",
            _breakdown(self.result.rpcs, len(samples)),
        ]
        return f"| {' | '.join(cells)} |"


@dataclasses.dataclass
class Contended:
    lock: str
    processes: int
    duration: float
    counter: int
    outcome: Outcome

    @property
    def acquisitions(self) -> int:
        return len(self.outcome.samples)

    @property
    def rate(self) -> float:
        return self.acquisitions / self.duration

    @property
    def exclusion(self) -> str:
        """Did the lock exclude? The unguarded counter must equal the acquisitions, with no overlap seen."""
        results = self.outcome.results
        total = sum(len(r.seconds) + r.late for r in results)
        overlaps = sum(r.overlaps for r in results)
        if len(results) == self.processes and total == self.counter and overlaps == 0:
            return "ok"
        return f"**counter {self.counter} for {total} acquisitions, {overlaps} overlaps**"

    def row(self) -> str:
        results = self.outcome.results
        samples = self.outcome.samples
        per_process = [len(r.seconds) for r in results]
        low, high = min(per_process, default=0), max(per_process, default=0)
        cells = [
            LABELS[self.lock],
            str(self.processes),
            f"{self.rate:.1f}",
            f"{_per(self.outcome.rpcs.total(), self.acquisitions):.2f}",
            _ms(_percentile(samples, 50)),
            _ms(_percentile(samples, 99)),
            f"{low}..{high}",
            f"{low / high:.2f}" if high else NA,
            str(sum(r.failures for r in results)),
            self.exclusion,
            _breakdown(self.outcome.rpcs, self.acquisitions),
            str(self.outcome.leftover_leases),
        ]
        return f"| {' | '.join(cells)} |"


def _machine(etcd: Etcd) -> list[str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return [
        f"- CPU: {cpu}, {os.cpu_count()} cores; {platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}, grpcio {version('grpcio')}, protobuf {version('protobuf')}, "
        f"python3-etcd3 {version('python3-etcd3')}, distlock {distlock.__version__} ({_checkout()})",
        f"- etcd {etcd.version()}: {etcd.description}",
    ]


def _checkout() -> str:
    """Which distlock was measured: the git commit of its source tree, and whether it had local changes."""
    source = Path(distlock.__file__).parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return "not a git checkout, or no commit yet"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if git("status", "--porcelain", "--", "."):
            return f"commit {commit} with uncommitted changes"
    return f"commit {commit}"


@dataclasses.dataclass(frozen=True)
class Run:
    """A benchmark run's command line, start time and the machine's load then: what its section states first."""

    command: str
    started: dt.datetime
    clock: float
    load: float

    @classmethod
    def begin(cls, module: str, argv: Sequence[str]) -> Run:
        load = os.getloadavg()[0]  # before our own processes add to it
        return cls(shlex.join(["python", "-m", module, *argv]), dt.datetime.now(dt.UTC), time.monotonic(), load)

    def when(self, note: str = "") -> str:
        """The command, when it started and how long it took (until now)."""
        elapsed = time.monotonic() - self.clock
        return f"`{self.command}`{note}, {self.started:%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s in all."

    def load_line(self) -> str:
        return f"- Load average (1 min) when the run started: {self.load:.1f} (other work on the machine adds noise)"


def render(
    *,
    run: Run,
    machine: list[str],
    args: argparse.Namespace,
    uncontended: list[Uncontended],
    contended: list[Contended],
    errors: list[str],
) -> str:
    lines = [
        BEGIN_MARKER,
        "## etcd locks: distlock, python-etcd3 `Lock`, raw transactions",
        "",
        run.when(" (what `scripts/bench.sh etcd` runs)"),
        "",
        *machine,
        run.load_line(),
        "",
        "One run against one etcd server. Every measurement runs in freshly spawned processes, each with",
        "its own client, connected and warmed up (under contention: one acquisition each) before the clock",
        "and the RPC counters start. *RPCs* are the gRPC messages etcd received",
        "(`grpc_server_msg_received_total`; on a watch stream each create and cancel request counts) divided",
        "by the acquisitions. *Leases left* are leases still on the server after the clients closed; the",
        "benchmark revokes them before the next measurement.",
        "",
        f"### Uncontended acquire + release: {args.rounds} rounds after {args.warmup} warm-up rounds",
        "",
        f"All locks in one process, interleaved in blocks of {LatencyJob.block} rounds (the order rotating",
        "from block to block), so a slow spell of the machine hits them alike; RPCs are counted between",
        "blocks.",
        "distlock: `with client.lock(name, ttl=30): pass`. python-etcd3: `lock = client.lock(name,",
        "ttl=30)`, `lock.acquire()`, `lock.release()`. Floor: one `Txn` putting the key with a lease granted",
        "once if its `create_revision` is 0, then one `DeleteRange`, on the raw gRPC stubs.",
        "",
        "| Lock | rounds | median ms | p99 ms | max ms | RPCs / acq. | RPCs by method / acq. |",
        "|---|---:|---:|---:|---:|---:|---|",
        *(u.row() for u in uncontended),
        "",
        f"### Contention: N processes on one lock name for {args.duration:g} s",
        "",
        "Each process loops acquire -> increment a shared counter that no other lock guards -> release;",
        "all start together at a barrier. Only acquisitions inside the window count; waiters still queued",
        "when it closes get the lock after it. *Wait* is the time spent in `acquire()`, *fairness* the",
        "fewest ÷ the most acquisitions of one process, *exclusion* that the counter equals the",
        f"acquisitions made. `acquire()` has a {args.duration + GRACE / 2:g} s timeout; *failures* are those",
        "that returned False. python-etcd3's `Lock` keeps no queue: a process that has just released can",
        "take the lock again before the waiters it woke get there, buying throughput with fairness.",
        "",
        "| Lock | processes | acq./s | RPCs / acq. | wait p50 ms | wait p99 ms | acq. per process | fairness "
        "| failures | exclusion | RPCs by method / acq. | leases left |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|---:|",
        *(c.row() for c in contended),
        "",
        "### Ratios",
        "",
        *_ratios(args.processes, uncontended, contended),
    ]
    if errors:
        lines += ["", "### Errors", "", *(f"- {e}" for e in errors)]
    lines.append(END_MARKER)
    return "\n".join(lines) + "\n"


def _ratios(processes: list[int], uncontended: list[Uncontended], contended: list[Contended]) -> list[str]:
    by_lock = {u.result.lock: u for u in uncontended}
    lines = []
    if "distlock" in by_lock and "raw" in by_lock:
        ratio = _ratio(by_lock["distlock"].median, by_lock["raw"].median)
        lines.append(f"- Uncontended, distlock median ÷ raw floor median: {ratio}")
    if "distlock" in by_lock and "python-etcd3" in by_lock:
        ours, theirs = by_lock["distlock"], by_lock["python-etcd3"]
        lines.append(
            f"- Uncontended, distlock ÷ python-etcd3 `Lock`: median {_ratio(ours.median, theirs.median)}, "
            f"p99 {_ratio(ours.p99, theirs.p99)}, "
            f"RPCs {_ratio(ours.rpcs_per_acquisition, theirs.rpcs_per_acquisition)}"
        )
    rates = {(c.lock, c.processes): c.rate for c in contended}
    for n in processes:
        if ("distlock", n) in rates and ("python-etcd3", n) in rates:
            ratio = _ratio(rates["distlock", n], rates["python-etcd3", n])
            lines.append(f"- {n} processes, acquisitions/s of distlock ÷ python-etcd3 `Lock`: {ratio}")
    return lines


def write_section(path: Path, section: str, markers: tuple[str, str] = (BEGIN_MARKER, END_MARKER)) -> None:
    """Replace one benchmark's section of ``path`` (or append it), keeping every other section. ``markers`` are
    the comments that open and close the section (this benchmark's by default)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    begin_marker, end_marker = markers
    begin, end = text.find(begin_marker), text.find(end_marker)
    if begin != -1 and end > begin:
        rest = text[end + len(end_marker) :].lstrip("\n")
        text = text[:begin] + section + ("\n" + rest if rest else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def publish(path: Path, section: str, markers: tuple[str, str] = (BEGIN_MARKER, END_MARKER)) -> None:
    """Print a benchmark's section and write it into ``path`` (see :func:`write_section`)."""
    write_section(path, section, markers)
    print(section, flush=True)
    print(f"written to {path}", flush=True)


# --- main -------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[Etcd]:
    if args.etcd_url:
        endpoint = _endpoint_of(args.etcd_url)
        metrics = Metrics(args.metrics_url or f"http://{endpoint}/metrics")
        yield Etcd(f"etcd://{endpoint}", metrics, f"an existing server at {endpoint}")
        return
    # fsync on, as in production: the harness turns it off by default to make tests faster.
    with EtcdServer(unsafe_no_fsync=False) as server:
        description = "one member started by `distlock.testing.EtcdServer` on loopback, fsync on"
        yield Etcd(server.url, Metrics(f"{server.metrics_url}/metrics"), description)


def add_arguments(parser: argparse.ArgumentParser, labels: Sequence[str], *, rounds: int, warmup: int) -> None:
    """The options every lock benchmark takes: rounds, warm-up, duration, process counts, locks, output file."""
    parser.add_argument("--rounds", type=int, default=rounds, help=f"uncontended rounds per lock (default {rounds})")
    parser.add_argument("--warmup", type=int, default=warmup, help=f"uncontended warm-up rounds (default {warmup})")
    parser.add_argument("--duration", type=float, default=10.0, help="contention run length, s (default 10)")
    parser.add_argument(
        "--processes",
        type=lambda s: [int(n) for n in s.split(",")],
        default=[8, 32],
        help="comma-separated process counts for contention (default 8,32)",
    )
    parser.add_argument(
        "--locks",
        type=lambda s: s.split(","),
        default=list(labels),
        help=f"comma-separated subset of {','.join(labels)} (default all)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/BENCHMARKS.md"), help="file to update")


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str], labels: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv`` and check what :func:`add_arguments` added."""
    args = parser.parse_args(argv)
    unknown = set(args.locks) - set(labels)
    if unknown:
        parser.error(f"unknown lock(s) {', '.join(sorted(unknown))}; choose from {', '.join(labels)}")
    if args.rounds < 1 or args.duration <= 0 or not all(n > 0 for n in args.processes):
        parser.error("--rounds, --duration and --processes must be positive")
    return args


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser("python -m benchmarks.etcd_locks", description=__doc__.split("\n\n")[0])
    add_arguments(parser, list(LABELS), rounds=500, warmup=50)
    parser.add_argument("--etcd-url", help="use this etcd (etcd://HOST:PORT) instead of starting one")
    parser.add_argument("--metrics-url", help="its Prometheus metrics (default http://HOST:PORT/metrics)")
    return parse_arguments(parser, argv, list(LABELS))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one benchmark measures: its locks (by label), which of them contend, the jobs that run them, and how
    a result becomes a table row."""

    labels: dict[str, str]
    contenders: Sequence[str]
    latency_job: type[LatencyJob] = LatencyJob
    contention_job: type[ContentionJob] = ContentionJob
    uncontended_row: Callable[[Uncontended], str] = Uncontended.row
    contended_row: Callable[[Contended], str] = Contended.row


def measure(
    ctx: SpawnContext, server: Etcd, args: argparse.Namespace, run_id: str, plan: Plan
) -> tuple[list[Uncontended], list[Contended], list[str]]:
    """The uncontended latencies of every chosen lock, then each contender at each process count; errors too."""
    contended: list[Contended] = []
    errors: list[str] = []
    locks = [lock for lock in plan.labels if lock in args.locks]
    latency = plan.latency_job(locks, server.url, f"bench-{run_id}", args.rounds, args.warmup, server.metrics)
    outcome = _run(ctx, server, [latency], window=None, limit=GRACE + len(locks) * args.rounds * 0.05)
    uncontended = [Uncontended(result) for result in outcome.results if not result.error]
    errors += [f"uncontended: {e}" for e in outcome.errors]
    print("\n".join(plan.uncontended_row(u) for u in uncontended), flush=True)
    for processes in args.processes:
        for lock in (lock for lock in plan.contenders if lock in args.locks):
            counter, owner = ctx.RawValue("q", 0), ctx.RawValue("q", 0)
            name = f"bench-{run_id}-contended-{lock}-{processes}"
            timeout = args.duration + GRACE / 2
            job = plan.contention_job(lock, server.url, name, args.duration, timeout, counter, owner)
            jobs: list[Job[Any]] = [job] * processes
            outcome = _run(ctx, server, jobs, window=args.duration, limit=args.duration + GRACE)
            contended.append(Contended(lock, processes, args.duration, counter.value, outcome))
            errors += [f"{plan.labels[lock]}, {processes} processes: {e}" for e in outcome.errors]
            print(plan.contended_row(contended[-1]), flush=True)
    return uncontended, contended, errors


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parse_args(argv)
    run = Run.begin("benchmarks.etcd_locks", argv)
    ctx = multiprocessing.get_context("spawn")
    run_id = uuid.uuid4().hex[:8]

    with _server(args) as etcd:
        machine = _machine(etcd)
        print("\n".join(machine), flush=True)
        etcd.revoke_leases()
        uncontended, contended, errors = measure(ctx, etcd, args, run_id, Plan(LABELS, CONTENDERS))

    section = render(
        run=run,
        machine=machine,
        args=args,
        uncontended=uncontended,
        contended=contended,
        errors=errors,
    )
    publish(args.out, section)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
