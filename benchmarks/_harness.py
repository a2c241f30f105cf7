"""What every benchmark in this package shares: its options, its servers, its measuring, its statistics, its report.

* **Options**: those of the lock benchmarks (:func:`add_lock_arguments`, :func:`parse_lock_arguments`), of the
  database benchmarks (:func:`database_arguments`), and ``--etcd-url`` / ``--out`` (:func:`add_etcd_arguments`,
  :func:`add_out_argument`). :class:`Run` keeps the command line, when it started and the machine's load then.
* **Servers**: :class:`ServerUnderTest`, the lock service a lock benchmark measures, read through its own request
  counters (:class:`Counters`); :class:`EtcdUnderTest` and :func:`etcd_server` (an etcd started with fsync on, or
  ``--etcd-url``), which every benchmark but the Redis one uses; :func:`database_servers` (etcd, PostgreSQL and a
  scratch directory for SQLite) for the database benchmarks.
* **Measuring**: :func:`interleaved` times several variants in turns, in blocks whose order rotates from block to
  block, so a slow spell of a shared machine hits them alike. :func:`measure` runs a lock benchmark's
  :class:`Plan` (its locks, each a :class:`Session`; :class:`LockSession` is the common shape of a lock library's):
  every lock uncontended in one process, then each contender in N processes on one lock name for a fixed window.
  Its processes are started with "spawn" (gRPC channels do not survive ``fork()``), connect and warm up, then meet
  the parent at a barrier; the parent reads the server's counters, lets them go, and reads the counters again
  when the window closes. :func:`lock_benchmark` is a lock benchmark from start to end.
* **Statistics**: nearest-rank percentiles, requests per acquisition, ratios, fairness (fewest ÷ most acquisitions
  of one process), and whether the lock excluded (a counter that no other lock guards equals the acquisitions).
* **Report**: the machine's lines (:func:`machine`), the tables every lock or database benchmark prints, and
  :func:`publish`, which prints a benchmark's section and writes it into ``docs/BENCHMARKS.md`` between that
  benchmark's markers (appending it if they are missing), leaving the rest of the file alone.

What can go wrong, and what is done about it: a process that hangs in its set-up or its loop would hang the run, so
every wait is bounded (a child stops after its rounds or its window; whatever has not reported a grace period later
is killed and reported as an error). Leases and keys one measurement leaves on the server would expire, costing the
server work, during the next one, so they are counted and removed before the first measurement and after each
(:meth:`ServerUnderTest.remove_leftovers`). Counters must not count their own reads: etcd's are read over HTTP, not
gRPC. The figures are only as quiet as the machine: each section states the load average when the run started.
"""

from __future__ import annotations

import abc
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
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.context import SpawnContext
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import grpc
from etcd3 import etcdrpc

import distlock
from distlock.testing import EtcdServer, PostgresServer, parse_prometheus_text

__all__ = [
    "BLOCK",
    "ETCD_PACKAGES",
    "GRACE",
    "NA",
    "REQUEST_TIMEOUT",
    "SQLITE_DESCRIPTION",
    "TTL",
    "BlockingSession",
    "Contended",
    "Counters",
    "DatabaseServers",
    "DistlockSession",
    "EtcdMetrics",
    "EtcdUnderTest",
    "LockResults",
    "LockSession",
    "Plan",
    "Run",
    "ServerUnderTest",
    "Session",
    "Timed",
    "Uncontended",
    "Variants",
    "add_etcd_arguments",
    "add_lock_arguments",
    "add_out_argument",
    "breakdown",
    "contended_table",
    "cpu_line",
    "database_arguments",
    "database_servers",
    "endpoint_of",
    "errors_lines",
    "etcd_server",
    "interleaved",
    "latency_cells",
    "lock_benchmark",
    "machine",
    "measure",
    "median",
    "ms",
    "package_version",
    "parse_lock_arguments",
    "per",
    "percentile",
    "publish",
    "ratio",
    "section",
    "software_line",
    "summary",
    "table_row",
    "target",
    "uncontended_table",
    "variants_table",
    "verdict",
]

#: The lease (TTL) of the locks the lock benchmarks measure, in seconds.
TTL = 30
#: How long one request to etcd (an RPC, a read of its metrics or of its JSON gateway) may take, in seconds.
REQUEST_TIMEOUT = 10.0
# Connecting and warming up: 32 freshly spawned interpreters share two cores with the server.
SETUP_TIMEOUT = 90.0
#: After a contention window, waiters still queued in acquire() get the lock in turn and exit; bounds that.
GRACE = 30.0
#: Rounds per block of :func:`interleaved` in the lock benchmarks.
BLOCK = 25
#: A figure that cannot be computed (no samples, a zero denominator).
NA = "n/a"
#: The packages that the etcd benchmarks' machine line names (label: distribution).
ETCD_PACKAGES = {"grpcio": "grpcio", "protobuf": "protobuf", "python3-etcd3": "python3-etcd3"}
SQLITE_DESCRIPTION = f"{sqlite3.sqlite_version} (pysqlite), a file in a temporary directory, WAL, synchronous=NORMAL"

_MSG_RECEIVED = "grpc_server_msg_received_total{"


# --- options ----------------------------------------------------------------------------------------------------


def summary(doc: str | None) -> str:
    """The first paragraph of a module's docstring: a benchmark's ``--help`` description."""
    return (doc or "").split("\n\n")[0]


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("docs/BENCHMARKS.md"), help="file to update")


def add_etcd_arguments(parser: argparse.ArgumentParser, *, metrics_help: bool = True) -> None:
    """``--etcd-url`` and ``--metrics-url`` (the latter hidden from ``--help`` unless ``metrics_help``)."""
    parser.add_argument("--etcd-url", help="use this etcd (etcd://HOST:PORT) instead of starting one")
    shown = "its Prometheus metrics (default http://HOST:PORT/metrics)"
    parser.add_argument("--metrics-url", help=shown if metrics_help else argparse.SUPPRESS)


def add_lock_arguments(parser: argparse.ArgumentParser, labels: Sequence[str], *, rounds: int, warmup: int) -> None:
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
    add_out_argument(parser)


def parse_lock_arguments(parser: argparse.ArgumentParser, run: Run, labels: Sequence[str]) -> argparse.Namespace:
    """Parse the run's arguments and check what :func:`add_lock_arguments` added."""
    args = parser.parse_args(run.argv)
    unknown = set(args.locks) - set(labels)
    if unknown:
        parser.error(f"unknown lock(s) {', '.join(sorted(unknown))}; choose from {', '.join(labels)}")
    if args.rounds < 1 or args.duration <= 0 or not all(n > 0 for n in args.processes):
        parser.error("--rounds, --duration and --processes must be positive")
    return args


def database_arguments(run: Run, description: str) -> argparse.Namespace:
    """Parse the options of a database benchmark (:mod:`benchmarks.sqla_fenced`, :mod:`benchmarks.django_overhead`)."""
    parser = argparse.ArgumentParser(run.prog, description=description)
    parser.add_argument("--rounds", type=int, default=2000, help="rounds per variant and database (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up rounds per variant (default 200)")
    parser.add_argument("--block", type=int, default=25, help="rounds per interleaved block (default 25)")
    parser.add_argument("--fsync", action="store_true", help="start PostgreSQL with fsync on (default off)")
    parser.add_argument("--postgres-url", help="use this PostgreSQL (postgresql://...) instead of starting one")
    add_etcd_arguments(parser, metrics_help=False)
    add_out_argument(parser)
    args = parser.parse_args(run.argv)
    if args.rounds < 1 or args.warmup < 0 or args.block < 1:
        parser.error("--rounds and --block must be positive, --warmup not negative")
    return args


# --- statistics -------------------------------------------------------------------------------------------------


def percentile(samples: Iterable[float], q: float) -> float:
    """Nearest-rank percentile of ``samples`` (in any order); nan if there are none."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else math.nan


def median(samples: Iterable[float]) -> float:
    return percentile(samples, 50)


def ms(seconds: float) -> str:
    return NA if math.isnan(seconds) else f"{seconds * 1000:.2f}"


def per(count: float, acquisitions: int) -> float:
    return count / acquisitions if acquisitions else math.nan


def ratio(numerator: float, denominator: float) -> str:
    value = numerator / denominator if denominator else math.nan
    return NA if math.isnan(value) else f"{value:.2f}x"


def breakdown(requests: Counter[str], acquisitions: int) -> str:
    """Requests by kind (RPC method, command) per acquisition, most first, leaving out the negligible."""
    per_kind = [(kind, per(count, acquisitions)) for kind, count in requests.most_common()]
    return ", ".join(f"{kind} {share:.2f}" for kind, share in per_kind if share >= 0.005) or NA


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def target(value: float, bound: float) -> str:
    """`` (target ≤ 1.15x: met)``: whether the ratio ``value`` stays within ``bound``."""
    return f" (target ≤ {bound:.2f}x: {verdict(value <= bound)})"


def table_row(cells: Iterable[str]) -> str:
    return f"| {' | '.join(cells)} |"


def latency_cells(label: str, seconds: Sequence[float]) -> list[str]:
    """A table row's label, rounds, median ms and p99 ms."""
    return [label, str(len(seconds)), ms(percentile(seconds, 50)), ms(percentile(seconds, 99))]


# --- the run and the machine ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    """A benchmark run's command line, start time and the machine's load then: what its section states first.
    ``id`` tells this run's lock names, keys and queues from any other run's on the same server."""

    module: str
    argv: list[str]
    command: str
    started: dt.datetime
    clock: float
    load: float
    id: str

    @classmethod
    def begin(cls, module: str, argv: Sequence[str] | None) -> Run:
        """Start the clock for ``python -m module`` with ``argv`` (None: this process's arguments)."""
        load = os.getloadavg()[0]  # before our own processes add to it
        args = sys.argv[1:] if argv is None else list(argv)
        command = shlex.join(["python", "-m", module, *args])
        return cls(module, args, command, dt.datetime.now(dt.UTC), time.monotonic(), load, uuid.uuid4().hex[:8])

    @property
    def prog(self) -> str:
        """The command's name in ``--help``."""
        return f"python -m {self.module}"

    def when(self, note: str = "") -> str:
        """The command, when it started and how long it took (until now)."""
        elapsed = time.monotonic() - self.clock
        return f"`{self.command}`{note}, {self.started:%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s in all."

    def load_line(self) -> str:
        return f"- Load average (1 min) when the run started: {self.load:.1f} (other work on the machine adds noise)"

    def heading(self, title: str, machine: Iterable[str], note: str = "") -> list[str]:
        """A section's first lines: its title, the command (with ``note``) and when it ran, the machine, the load."""
        return [title, "", self.when(note), "", *machine, self.load_line(), ""]


def package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_line() -> str:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"- CPU: {cpu}, {os.cpu_count()} cores; {platform.system()} {platform.release()}"


def software_line(packages: Mapping[str, str]) -> str:
    """Python, the versions of ``packages`` (label: distribution), and which distlock was measured."""
    versions = "".join(f"{label} {package_version(dist)}, " for label, dist in packages.items())
    return f"- Python {platform.python_version()}, {versions}distlock {distlock.__version__} ({_checkout()})"


def machine(server: ServerUnderTest, packages: Mapping[str, str]) -> list[str]:
    """The CPU, the software (see :func:`software_line`) and the server: a section's lines on the machine."""
    return [cpu_line(), software_line(packages), f"- {server.product} {server.version()}: {server.description}"]


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


# --- the report -------------------------------------------------------------------------------------------------


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def section(name: str, lines: Iterable[str]) -> str:
    """The benchmark ``name``'s section of ``docs/BENCHMARKS.md``: ``lines`` between its markers."""
    begin, end = _markers(name)
    return "\n".join([begin, *lines, end]) + "\n"


def _write_section(path: Path, name: str, text: str) -> None:
    """Replace the benchmark ``name``'s section of ``path`` with ``text`` (or append it), keeping every other."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    begin_marker, end_marker = _markers(name)
    begin, end = old.find(begin_marker), old.find(end_marker)
    if begin != -1 and end > begin:
        rest = old[end + len(end_marker) :].lstrip("\n")
        new = old[:begin] + text + ("\n" + rest if rest else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


def errors_lines(errors: Sequence[str]) -> list[str]:
    """The errors of a run, under their own heading; nothing if there were none."""
    return ["", "### Errors", "", *(f"- {e}" for e in errors)] if errors else []


def publish(path: Path, name: str, text: str) -> None:
    """Print the benchmark ``name``'s section ``text`` (made by :func:`section`) and write it into ``path``."""
    _write_section(path, name, text)
    print(text, flush=True)
    print(f"written to {path}", flush=True)


# --- servers ----------------------------------------------------------------------------------------------------


class Counters(Protocol):
    """A server's own count of the requests it received. Reading it must not count itself."""

    def requests(self) -> Counter[str]:
        """Requests received so far, by kind (etcd: gRPC method; Redis: command)."""


class ServerUnderTest(abc.ABC):
    """The lock service a benchmark measures: its URL (for ``distlock.connect``), its counters, what it is."""

    product: ClassVar[str]

    def __init__(self, url: str, counters: Counters, description: str) -> None:
        self.url = url
        self.counters = counters
        self.description = description

    @abc.abstractmethod
    def version(self) -> str: ...

    @abc.abstractmethod
    def remove_leftovers(self) -> int:
        """Remove what the locks measured so far left on the server (leases, keys); return how many there were."""


def endpoint_of(url: str) -> str:
    """``host:port`` of an ``etcd://host:port`` (or ``http://``, or bare ``host:port``) URL."""
    parsed = urllib.parse.urlsplit(url if "://" in url else f"etcd://{url}")
    if parsed.hostname is None or parsed.port is None:
        raise SystemExit(f"--etcd-url {url!r}: expected etcd://HOST:PORT")
    return f"{parsed.hostname}:{parsed.port}"


def _loopback_opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no $http_proxy for loopback


@dataclasses.dataclass(frozen=True)
class EtcdMetrics:
    """etcd's Prometheus endpoint. Reading it is plain HTTP, so it does not count as an RPC itself."""

    url: str

    def requests(self) -> Counter[str]:
        """gRPC messages received so far, by method (every message of a stream: watch create, cancel, ...)."""
        with _loopback_opener().open(self.url, timeout=REQUEST_TIMEOUT) as response:
            samples = parse_prometheus_text(response.read().decode())
        counts: Counter[str] = Counter()
        for key, value in samples.items():
            if key.startswith(_MSG_RECEIVED):
                counts[key.partition('grpc_method="')[2].partition('"')[0]] += int(value)
        return counts


class EtcdUnderTest(ServerUnderTest):
    """An etcd: its distlock URL, its client URL (for the HTTP/JSON gateway) and its metrics."""

    product = "etcd"

    def __init__(self, url: str, counters: Counters, description: str) -> None:
        super().__init__(url, counters, description)
        self.endpoint = endpoint_of(url)
        self.client_url = f"http://{self.endpoint}"

    def _gateway(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """GET or POST through etcd's HTTP/JSON gateway (bypassing $http_proxy: this is loopback)."""
        data = None if body is None else json.dumps(body).encode()
        with _loopback_opener().open(f"{self.client_url}{path}", data=data, timeout=REQUEST_TIMEOUT) as response:
            return json.loads(response.read())

    def version(self) -> str:
        return str(self._gateway("/version")["etcdserver"])

    def remove_leftovers(self) -> int:
        """Revoke every lease on the server; return how many there were.

        The list comes from the JSON gateway: python3-etcd3's generated stubs have no ``LeaseLeases``.
        """
        ids = [int(lease["ID"]) for lease in self._gateway("/v3/lease/leases", {}).get("leases", [])]
        with grpc.insecure_channel(self.endpoint) as channel:
            stub = etcdrpc.LeaseStub(channel)

            def revoke(lease_id: int) -> None:
                with contextlib.suppress(grpc.RpcError):  # expired meanwhile
                    stub.LeaseRevoke(etcdrpc.LeaseRevokeRequest(ID=lease_id), timeout=REQUEST_TIMEOUT)

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(revoke, ids))
        return len(ids)


@contextlib.contextmanager
def etcd_server(args: argparse.Namespace) -> Iterator[EtcdUnderTest]:
    """The etcd of ``--etcd-url`` (and ``--metrics-url``), or one started for the run with fsync on."""
    if args.etcd_url:
        endpoint = endpoint_of(args.etcd_url)
        metrics = EtcdMetrics(args.metrics_url or f"http://{endpoint}/metrics")
        yield EtcdUnderTest(f"etcd://{endpoint}", metrics, f"an existing server at {endpoint}")
        return
    # fsync on, as in production: `EtcdServer` turns it off by default to make tests faster.
    with EtcdServer(unsafe_no_fsync=False) as server:
        description = "one member started by `distlock.testing.EtcdServer` on loopback, fsync on"
        yield EtcdUnderTest(server.url, EtcdMetrics(f"{server.metrics_url}/metrics"), description)


@contextlib.contextmanager
def _postgres_server(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """The URL of ``--postgres-url``, or of a PostgreSQL started for the run (fsync as ``--fsync`` says), and how
    it came to be."""
    if args.postgres_url:
        yield args.postgres_url, "an existing server"
        return
    settings = {"fsync": "on", "full_page_writes": "on"} if args.fsync else {}
    with PostgresServer(settings=settings) as server:
        fsync = "fsync on" if args.fsync else "fsync off (synchronous_commit on)"
        yield server.dsn, f"started by `distlock.testing.PostgresServer` on loopback, {fsync}"


@dataclasses.dataclass(frozen=True)
class DatabaseServers:
    """What a database benchmark runs against (see :func:`database_servers`)."""

    scratch: Path  # a temporary directory, for SQLite's file
    etcd: EtcdUnderTest
    postgres_url: str
    postgres_origin: str  # started here, how, or an existing server

    def postgres_description(self, server_version: str) -> str:
        return f"{server_version} via psycopg {package_version('psycopg')}, {self.postgres_origin}"


@contextlib.contextmanager
def database_servers(args: argparse.Namespace, prefix: str) -> Iterator[DatabaseServers]:
    """A temporary directory (named ``prefix...``), the etcd of :func:`etcd_server` and a PostgreSQL (``--fsync``,
    ``--postgres-url``), for the options of :func:`database_arguments`; all removed or stopped afterwards."""
    with (
        tempfile.TemporaryDirectory(prefix=prefix) as temp,
        etcd_server(args) as etcd,
        _postgres_server(args) as (postgres_url, postgres_origin),
    ):
        yield DatabaseServers(Path(temp), etcd, postgres_url, postgres_origin)


# --- measuring in one process -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Timed:
    """What :func:`interleaved` measured of one variant: seconds per call, and requests if a server was counted."""

    seconds: list[float] = dataclasses.field(default_factory=list)
    requests: Counter[str] = dataclasses.field(default_factory=Counter)


def interleaved(
    runs: Mapping[str, Callable[[], object]],
    rounds: int,
    warmup: int,
    block: int,
    counters: Counters | None = None,
) -> dict[str, Timed]:
    """The seconds of ``rounds`` calls of each of ``runs``, after ``warmup`` calls of each: interleaved blocks of
    ``block`` calls per run, the order rotating from block to block, so a slow spell hits them alike. With
    ``counters``, the server's requests are read before and after each block and credited to its run."""
    keys = list(runs)
    for key in keys:
        for _ in range(warmup):
            runs[key]()
    timed = {key: Timed() for key in keys}
    clock = time.perf_counter
    for k, done in enumerate(range(0, rounds, block)):
        shift = k % len(keys)
        for key in keys[shift:] + keys[:shift]:
            run, samples = runs[key], timed[key].seconds
            before = counters.requests() if counters is not None else Counter()
            for _ in range(min(block, rounds - done)):
                t0 = clock()
                run()
                samples.append(clock() - t0)
            if counters is not None:
                timed[key].requests += counters.requests() - before
    return timed


@dataclasses.dataclass
class Variants:
    """The :func:`interleaved` timings of one set-up's variants (one database's, say), and what that set-up is."""

    label: str
    description: str
    timed: dict[str, Timed] = dataclasses.field(default_factory=dict)

    def median(self, variant: str) -> float:
        return median(self.timed[variant].seconds)

    def row(self, variant: str, label: str, base: str) -> str:
        """A row of :func:`variants_table`: the variant's figures and its median ÷ the ``base`` variant's."""
        cells = latency_cells(label, self.timed[variant].seconds)
        return table_row([self.label, *cells, ratio(self.median(variant), self.median(base))])


def variants_table(rows: Iterable[str]) -> list[str]:
    """A table of :meth:`Variants.row` s, one set-up (a database) after another."""
    return [
        "| Database | variant | rounds | median ms | p99 ms | median ÷ plain |",
        "|---|---|---:|---:|---:|---:|",
        *rows,
    ]


# --- the locks a lock benchmark measures ------------------------------------------------------------------------


class Session(Protocol):
    def cycle(self) -> None:
        """One uncontended acquire + release, written the way an application writes it."""

    def close(self) -> None: ...


class BlockingSession(Session, Protocol):
    def acquire(self, timeout: float) -> bool: ...

    def release(self) -> None: ...


SessionFactory = Callable[[str, str], Session]
BlockingSessionFactory = Callable[[str, str], BlockingSession]


class LockSession(abc.ABC):
    """A lock library used the way an application uses it: one client, a new lock object per attempt. A subclass
    says how to make a lock object and how to acquire it; its lock objects have ``release()``."""

    def __init__(self) -> None:
        self._held: Any = None

    @abc.abstractmethod
    def new_lock(self) -> Any: ...

    @abc.abstractmethod
    def take(self, lock: Any, timeout: float | None) -> bool:
        """Acquire ``lock``, waiting at most ``timeout`` s (None: as long as it takes)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def cycle(self) -> None:
        lock = self.new_lock()
        if not self.take(lock, None):
            raise RuntimeError(f"{type(self).__name__}: acquire() failed without contention")
        lock.release()

    def acquire(self, timeout: float) -> bool:
        lock = self.new_lock()
        if not self.take(lock, timeout):
            return False
        self._held = lock
        return True

    def release(self) -> None:
        self._held.release()
        self._held = None


class DistlockSession(LockSession):
    """distlock's lock, on whichever backend ``url`` names."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__()
        self._client = distlock.connect(url)
        self._name = name

    def new_lock(self) -> distlock.Lock:
        return self._client.lock(self._name, ttl=TTL)

    def take(self, lock: Any, timeout: float | None) -> bool:
        return bool(lock.acquire(timeout=timeout))

    def cycle(self) -> None:
        with self.new_lock():
            pass

    def close(self) -> None:
        self._client.close()


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a lock benchmark measures: each lock's label in the tables, how to open a session on it (a class, so
    that it reaches a spawned process by name), and which locks contend, with their blocking sessions."""

    labels: Mapping[str, str]
    sessions: Mapping[str, SessionFactory]
    contenders: Mapping[str, BlockingSessionFactory]
    #: How many may hold at once: 1 for locks, the limit for semaphores (exclusion then means "never more").
    limit: int = 1


# --- what runs in the child processes ---------------------------------------------------------------------------


@dataclasses.dataclass
class WorkerResult:
    index: int
    lock: str
    # Uncontended: seconds per acquire + release. Contention: seconds waited per acquisition in the window.
    seconds: list[float] = dataclasses.field(default_factory=list)
    requests: Counter[str] = dataclasses.field(default_factory=Counter)  # uncontended: counted by the child
    late: int = 0  # contention: acquisitions after the window closed (waiters draining), not counted
    failures: int = 0  # contention: acquire() returned False
    overlaps: int = 0  # contention: another process was inside the critical section at the same time
    error: str | None = None


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


# --- the parent: counters, process orchestration ----------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    results: list[WorkerResult]
    requests: Counter[str]
    leftovers: int
    errors: list[str]

    @property
    def samples(self) -> list[float]:
        return sorted(s for r in self.results for s in r.seconds)


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


@dataclasses.dataclass
class Uncontended:
    result: WorkerResult

    @property
    def samples(self) -> list[float]:
        return sorted(self.result.seconds)

    @property
    def median(self) -> float:
        return percentile(self.samples, 50)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 99)

    @property
    def requests_per_acquisition(self) -> float:
        return per(self.result.requests.total(), len(self.samples))

    def row(self, labels: Mapping[str, str]) -> str:
        """Label, rounds, median, p99 and max ms, requests per acquisition, and by kind."""
        samples = self.samples
        return table_row(
            [
                labels[self.result.lock],
                str(len(samples)),
                ms(self.median),
                ms(self.p99),
                ms(max(samples, default=math.nan)),
                f"{self.requests_per_acquisition:.2f}",
                breakdown(self.result.requests, len(samples)),
            ]
        )


def uncontended_table(labels: Mapping[str, str], rows: Iterable[Uncontended], requests: str, kind: str) -> list[str]:
    """The table of :meth:`Uncontended.row` s; ``requests`` names the server's requests ("RPCs"), ``kind`` what
    they are counted by ("method")."""
    return [
        f"| Lock | rounds | median ms | p99 ms | max ms | {requests} / acq. | {requests} by {kind} / acq. |",
        "|---|---:|---:|---:|---:|---:|---|",
        *(row.row(labels) for row in rows),
    ]


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
    def per_process(self) -> tuple[int, int]:
        """The fewest and the most acquisitions of one process in the window."""
        counts = [len(r.seconds) for r in self.outcome.results]
        return min(counts, default=0), max(counts, default=0)

    @property
    def requests_per_acquisition(self) -> float:
        return per(self.outcome.requests.total(), self.acquisitions)

    @property
    def fairness(self) -> float:
        low, high = self.per_process
        return low / high if high else math.nan

    @property
    def exclusion(self) -> str:
        """Did the lock exclude? The unguarded counter must equal the acquisitions, with no overlap seen."""
        results = self.outcome.results
        total = sum(len(r.seconds) + r.late for r in results)
        overlaps = sum(r.overlaps for r in results)
        if len(results) == self.processes and total == self.counter and overlaps == 0:
            return "ok"
        return f"**counter {self.counter} for {total} acquisitions, {overlaps} overlaps**"

    def row(self, labels: Mapping[str, str]) -> str:
        """Label, processes, acquisitions/s, requests per acquisition, wait p50 and p99 ms, acquisitions per
        process, fairness, failures, exclusion, requests by kind, leftovers."""
        results = self.outcome.results
        samples = self.outcome.samples
        low, high = self.per_process
        return table_row(
            [
                labels[self.lock],
                str(self.processes),
                f"{self.rate:.1f}",
                f"{self.requests_per_acquisition:.2f}",
                ms(percentile(samples, 50)),
                ms(percentile(samples, 99)),
                f"{low}..{high}",
                NA if math.isnan(self.fairness) else f"{self.fairness:.2f}",
                str(sum(r.failures for r in results)),
                self.exclusion,
                breakdown(self.outcome.requests, self.acquisitions),
                str(self.outcome.leftovers),
            ]
        )


def contended_table(
    labels: Mapping[str, str], rows: Iterable[Contended], requests: str, kind: str, leftovers: str
) -> list[str]:
    """The table of :meth:`Contended.row` s; ``requests`` and ``kind`` as in :func:`uncontended_table`,
    ``leftovers`` names what a measurement left on the server ("leases left")."""
    return [
        f"| Lock | processes | acq./s | {requests} / acq. | wait p50 ms | wait p99 ms | acq. per process | fairness "
        f"| failures | exclusion | {requests} by {kind} / acq. | {leftovers} |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|---:|",
        *(row.row(labels) for row in rows),
    ]


@dataclasses.dataclass
class LockResults:
    """What :func:`measure` measured, and the errors it met."""

    uncontended: list[Uncontended]
    contended: list[Contended]
    errors: list[str]

    @property
    def uncontended_by_lock(self) -> dict[str, Uncontended]:
        return {u.result.lock: u for u in self.uncontended}

    def floor_lines(self, bound: float | None = None) -> list[str]:
        """distlock's uncontended median ÷ the floor's (the locks ``distlock`` and ``raw``), if both were measured;
        with ``bound``, whether it stays within it."""
        by_lock = self.uncontended_by_lock
        if "distlock" not in by_lock or "raw" not in by_lock:
            return []
        ours, floor = by_lock["distlock"].median, by_lock["raw"].median
        beside = "" if bound is None else target(ours / floor, bound)
        return [f"- Uncontended, distlock median ÷ raw floor median: {ratio(ours, floor)}{beside}"]

    def peer_lines(
        self, processes: Sequence[int], peer: str, label: str, target: tuple[float, float] | None = None
    ) -> list[str]:
        """distlock against the lock ``peer`` (called ``label`` in prose): the uncontended median and p99 ratios, then
        at each process count both measured the acquisitions/s ratio beside both fairnesses; with ``target`` (a
        rate ratio and a fairness), whether distlock met it."""
        by_lock = self.uncontended_by_lock
        lines = []
        if "distlock" in by_lock and peer in by_lock:
            ours, theirs = by_lock["distlock"], by_lock[peer]
            lines.append(
                f"- Uncontended, distlock ÷ {label}: median {ratio(ours.median, theirs.median)}, "
                f"p99 {ratio(ours.p99, theirs.p99)}"
            )
        by_run = {(c.lock, c.processes): c for c in self.contended}
        for n in processes:
            ours_c, theirs_c = by_run.get(("distlock", n)), by_run.get((peer, n))
            if ours_c is None or theirs_c is None:
                continue
            line = (
                f"- {n} processes: distlock acquisitions/s {ratio(ours_c.rate, theirs_c.rate)} of {label}'s, "
                f"fairness {ours_c.fairness:.2f} ({peer} {theirs_c.fairness:.2f})"
            )
            if target is not None:
                rate, fairness = target
                met = ours_c.rate >= rate * theirs_c.rate and ours_c.fairness >= fairness
                line += f" (target >= {rate:g}x with fairness >= {fairness:g}: {verdict(met)})"
            lines.append(line)
        return lines


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
