"""Soak: does a lock get slower, or leave state behind, the more it is used? distlock against the peers, per service.

Per service (etcd, Redis, ZooKeeper, the SQL lock table on PostgreSQL and on SQLite), each with its defaults (etcd
without auto-compaction), and per client (distlock; python-etcd3's, redis-py's and kazoo's ``Lock`` where there is
one), two workloads, each on a freshly started server and in a freshly spawned process:

* **hot**: one name acquired and released ``--count`` times in a row;
* **wide**: ``--count`` names, each acquired and released once; every tenth name also a semaphore (limit 2) and a
  read/write lock (read, then write), for the clients that have them (distlock, kazoo).

It reports the latency of a lock's acquire + release in the first and the last window of a fifth of the rounds
(median, p99, last ÷ first), what the service stores once the client is closed and its leases gone (keys on etcd
and Redis, znodes on ZooKeeper, rows in the lock tables; etcd's database size), and the client's resident memory
(``VmRSS``) before and after. Results are printed and written into ``docs/BENCHMARKS.md`` between the ``soak``
markers. The aims (issue 24): last window ÷ first ≤ 1.1, nothing stored, memory flat. The issue's 100,000 rounds
(the default) take over an hour on 2 cores, growing with the latency they measure; ``--count 10000`` took 6 minutes,
``--quick`` (2,000) is a smoke run.

What can go wrong: a workload that fails or outlives its time bound (30 ms a round + 2 min) is killed and
reported as that row's error, and the run then exits with status 1; the servers are stopped however the run ends.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import dataclasses
import multiprocessing
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import etcd3
import redis
import sqlalchemy as sa
from etcd3 import etcdrpc

import distlock
from benchmarks._harness.figures import NA, median, ms, percentile, ratio, table_row, verdict
from benchmarks._harness.machine import cpu_line, software_line
from benchmarks._harness.report import errors_lines, publish, section
from benchmarks._harness.run import Run, add_out_argument, add_subset_argument, check_subset, summary
from benchmarks._harness.servers import REQUEST_TIMEOUT, EtcdMetrics, EtcdUnderTest, endpoint_of
from benchmarks.zookeeper_locks import kazoo_client, mntr
from distlock.testing import EtcdServer, PostgresServer, RedisServer, ZooKeeperServer, etcd_version, find_etcd

NAME = "soak"
PACKAGES = {
    "python3-etcd3": "python3-etcd3",
    "redis-py": "redis",
    "kazoo": "kazoo",
    "SQLAlchemy": "sqlalchemy",
    "psycopg": "psycopg",
}
WORKLOADS = ("hot", "wide")
#: Windows per run: the first and the last are compared.
WINDOWS = 5
#: Every this many names of the wide workload also get a semaphore and a read/write lock.
EXTRA_EVERY = 10
SEMAPHORE_LIMIT = 2
#: The aims of issue 24: last window's median ÷ first's, and resident memory after ÷ before.
LATENCY_AIM = 1.1
MEMORY_AIM = 1.1
QUICK_COUNT = 2000


def _rss_kib() -> int:
    """This process's resident memory (``VmRSS``), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- the clients, each used the way an application would, with its defaults ----------------------------------


class Client(abc.ABC):
    """One lock library on one service: a lock's acquire + release, and a semaphore's and a read/write lock's
    where the library has them."""

    @abc.abstractmethod
    def cycle(self, name: str) -> None: ...

    def extras(self, name: str) -> None:
        """A semaphore and a read/write lock near ``name`` (nothing for a library without them)."""
        return None

    @abc.abstractmethod
    def close(self) -> None: ...


class DistlockClient(Client):
    """``with client.lock(name): pass``; ``client.semaphore(...)`` and ``client.rwlock(...)``, default options."""

    def __init__(self, url: str) -> None:
        self._client = distlock.connect(url)

    def cycle(self, name: str) -> None:
        with self._client.lock(name):
            pass

    def extras(self, name: str) -> None:
        with self._client.semaphore(f"{name}:sem", SEMAPHORE_LIMIT):
            pass
        rw = self._client.rwlock(f"{name}:rw")
        with rw.read():
            pass
        with rw.write():
            pass

    def close(self) -> None:
        self._client.close()


class _LockMethodClient(Client):
    """A peer whose client makes locks with ``lock(name)``: acquire, release, with the library's defaults."""

    _client: Any

    def cycle(self, name: str) -> None:
        lock = self._client.lock(name)
        lock.acquire()
        lock.release()

    def close(self) -> None:
        self._client.close()


class Etcd3Client(_LockMethodClient):
    """python-etcd3: ``client.lock(name)`` (a lease of 60 s per acquisition, left to expire), acquire, release."""

    def __init__(self, url: str) -> None:
        host, port = endpoint_of(url).rsplit(":", 1)
        self._client = etcd3.client(host, int(port), timeout=REQUEST_TIMEOUT)


class RedisPyClient(_LockMethodClient):
    """redis-py: ``r.lock(name)`` (no expiry, its default), acquire, release."""

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url)


class KazooClient(Client):
    """kazoo: ``Lock(path)``; ``Semaphore(path, max_leases=2)``, ``ReadLock`` and ``WriteLock`` for the extras."""

    def __init__(self, url: str) -> None:
        self._client = kazoo_client(url)

    def cycle(self, name: str) -> None:
        with self._client.Lock(f"/kazoo/{name}"):
            pass

    def extras(self, name: str) -> None:
        with self._client.Semaphore(f"/kazoo/{name}:sem", max_leases=SEMAPHORE_LIMIT):
            pass
        with self._client.ReadLock(f"/kazoo/{name}:rw"):
            pass
        with self._client.WriteLock(f"/kazoo/{name}:rw"):
            pass

    def close(self) -> None:
        self._client.stop()
        self._client.close()


# --- one workload in a spawned process ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one spawned process does: ``count`` rounds of ``kind`` with the client ``factory`` on ``url``."""

    factory: Callable[[str], Client]
    url: str
    kind: str
    count: int

    def names(self) -> Iterator[str]:
        for i in range(self.count):
            yield "order:hot" if self.kind == "hot" else f"order:{i}"

    def __call__(self) -> Measured:
        client = self.factory(self.url)
        try:
            rss_before = _rss_kib()
            seconds = []
            clock = time.perf_counter
            for i, name in enumerate(self.names()):
                t0 = clock()
                client.cycle(name)
                seconds.append(clock() - t0)
                if i == 0:
                    rss_before = _rss_kib()  # after the first round has loaded what the library loads lazily
                if self.kind == "wide" and i % EXTRA_EVERY == 0:
                    client.extras(name)
            return Measured(seconds, rss_before, _rss_kib())
        finally:
            client.close()


@dataclasses.dataclass(frozen=True)
class Measured:
    """Seconds per acquire + release of the lock, in order, and the process's resident memory (KiB) after the
    first round and after the last."""

    seconds: list[float]
    rss_before: int
    rss_after: int

    def window(self, which: int) -> list[float]:
        size = max(1, len(self.seconds) // WINDOWS)
        return self.seconds[:size] if which == 0 else self.seconds[-size:]

    @property
    def growth(self) -> float:
        first = median(self.window(0))
        return median(self.window(-1)) / first if first else float("nan")


def _in_a_fresh_process(workload: Workload, limit: float) -> Measured:
    """Run ``workload`` in a spawned process (gRPC does not survive ``fork()``); killed after ``limit`` seconds."""
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        result: Measured = pool.apply_async(workload).get(timeout=limit)
        return result


# --- the services: a fresh server per workload, and what it stores --------------------------------------------


@dataclasses.dataclass(frozen=True)
class Server:
    """A started server: the URL each client connects to, and what the service stores now (a table cell and the
    residue: what stays for ever, counted against the aim of nothing)."""

    urls: dict[str, str]
    stored: Callable[[], tuple[str, int]]


class Service(abc.ABC):
    """A lock service: its label, what the section says of it, its clients, and how to start a fresh server."""

    def __init__(self, label: str, description: str, clients: dict[str, Callable[[str], Client]]) -> None:
        self.label = label
        self.description = description
        self.clients = clients

    @abc.abstractmethod
    def server(self) -> contextlib.AbstractContextManager[Server]: ...


class Etcd(Service):
    def __init__(self) -> None:
        version = ".".join(map(str, etcd_version(find_etcd())))
        description = f"etcd {version}: one member, fsync on, no auto-compaction (etcd's defaults)"
        super().__init__("etcd", description, {"distlock": DistlockClient, "python-etcd3 `Lock`": Etcd3Client})

    @contextlib.contextmanager
    def server(self) -> Iterator[Server]:
        with EtcdServer(unsafe_no_fsync=False) as etcd:
            under_test = EtcdUnderTest(etcd.url, EtcdMetrics(f"{etcd.metrics_url}/metrics"), "")
            host, port = under_test.endpoint.rsplit(":", 1)

            def stored() -> tuple[str, int]:
                leases = under_test.remove_leftovers()  # what expiry would do, now
                with contextlib.closing(etcd3.client(host, int(port), timeout=REQUEST_TIMEOUT)) as client:
                    everything = etcdrpc.RangeRequest(key=b"\0", range_end=b"\0", count_only=True)
                    keys = int(client.kvstub.Range(everything, timeout=REQUEST_TIMEOUT).count)
                    status = client.maintenancestub.Status(etcdrpc.StatusRequest(), timeout=REQUEST_TIMEOUT)
                cell = f"{keys} keys; db {status.dbSize / 2**20:.2f} MiB; {leases} leases left at close"
                return cell, keys

            yield Server({"distlock": etcd.url, "python-etcd3 `Lock`": etcd.url}, stored)


class Redis(Service):
    def __init__(self) -> None:
        with RedisServer() as server, redis.Redis.from_url(server.url) as client:
            version = client.info("server")["redis_version"]
        description = f"Redis {version}: as `distlock.testing` starts it, no persistence (no RDB snapshots)"
        super().__init__("Redis", description, {"distlock": DistlockClient, "redis-py `Lock`": RedisPyClient})

    @contextlib.contextmanager
    def server(self) -> Iterator[Server]:
        with RedisServer() as server:

            def stored() -> tuple[str, int]:
                with redis.Redis.from_url(server.url) as client:
                    keys = [bytes(k) for k in client.scan_iter(count=1000)]
                    pipe = client.pipeline(transaction=False)
                    for key in keys:
                        pipe.ttl(key)
                    lasting = sum(1 for ttl in pipe.execute() if ttl == -1)
                expiring = len(keys) - lasting
                return f"{lasting} keys" + (f" (+{expiring} expiring)" if expiring else ""), lasting

            yield Server({"distlock": server.url, "redis-py `Lock`": server.url}, stored)


class ZooKeeper(Service):
    def __init__(self) -> None:
        with ZooKeeperServer() as server:
            stats = mntr(server.url)
        #: The znodes of a fresh server (``/zookeeper`` and its children), not counted as stored.
        self._baseline = int(stats["zk_znode_count"])
        description = (
            f"ZooKeeper {stats.get('zk_version', '?').split(',')[0]}: as `distlock.testing` starts it, no fsync"
        )
        super().__init__("ZooKeeper", description, {"distlock": DistlockClient, "kazoo `Lock`": KazooClient})

    @contextlib.contextmanager
    def server(self) -> Iterator[Server]:
        with ZooKeeperServer() as server:

            def stored() -> tuple[str, int]:
                # Each client's root (``/distlock``, the prefix; ``/kazoo``) is one znode per application, not per
                # name: shown, not counted as residue.
                znodes = int(mntr(server.url)["zk_znode_count"]) - self._baseline
                return f"{znodes} znodes (1 the root)" if znodes else "0 znodes", max(znodes - 1, 0)

            yield Server({"distlock": server.url, "kazoo `Lock`": server.url}, stored)


def _count_rows(url: str) -> tuple[str, int]:
    """The rows of distlock's three lock tables (default prefix) at the SQLAlchemy URL ``url``."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            counts = {
                table: int(connection.scalar(sa.text(f"SELECT count(*) FROM distlock_{table}")) or 0)
                for table in ("locks", "waiters", "leases")
            }
    finally:
        engine.dispose()
    cell = ", ".join(f"{n} {table}" for table, n in counts.items())
    return f"rows: {cell}", sum(counts.values())


class Postgres(Service):
    def __init__(self) -> None:
        with self._started() as url:
            engine = sa.create_engine(url)
            with engine.connect() as connection:
                version = str(connection.scalar(sa.text("SHOW server_version"))).split()[0]
            engine.dispose()
        super().__init__("PostgreSQL", f"PostgreSQL {version}: fsync on (its default)", {"distlock": DistlockClient})

    @staticmethod
    @contextlib.contextmanager
    def _started() -> Iterator[str]:
        """A fresh PostgreSQL with fsync on, as its SQLAlchemy URL."""
        with PostgresServer(settings={"fsync": "on", "full_page_writes": "on"}) as server:
            yield server.dsn.replace("postgresql://", "postgresql+psycopg://", 1)

    @contextlib.contextmanager
    def server(self) -> Iterator[Server]:
        with self._started() as url:
            yield Server({"distlock": f"sql+{url}"}, lambda: _count_rows(url))


class Sqlite(Service):
    def __init__(self) -> None:
        # The lock table leaves the file as SQLite makes it (not the WAL and synchronous=NORMAL that the fenced-write
        # benchmarks set on their own databases).
        description = (
            f"SQLite {sqlite3.sqlite_version} (pysqlite), a file in a temporary directory, rollback journal, "
            "synchronous=FULL (SQLite's defaults)"
        )
        super().__init__("SQLite", description, {"distlock": DistlockClient})

    @contextlib.contextmanager
    def server(self) -> Iterator[Server]:
        with tempfile.TemporaryDirectory(prefix="distlock-soak-") as scratch:
            url = f"sqlite:///{scratch}/locks.db"
            yield Server({"distlock": f"sql+{url}"}, lambda: _count_rows(url))


SERVICES: dict[str, Callable[[], Service]] = {
    "etcd": Etcd,
    "redis": Redis,
    "zookeeper": ZooKeeper,
    "postgresql": Postgres,
    "sqlite": Sqlite,
}


# --- a run and its report ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    service: str
    client: str
    workload: str
    measured: Measured | None
    stored: str
    residue: int | None
    seconds: float
    error: str = ""


def _soak(service: Service, client: str, kind: str, count: int) -> Row:
    """One client's workload on a fresh server of ``service``, and what the server stores after it."""
    started = time.monotonic()
    with service.server() as server:
        workload = Workload(service.clients[client], server.urls[client], kind, count)
        try:
            measured = _in_a_fresh_process(workload, limit=count * 0.03 + 120)
        except Exception as e:  # the row reports it, the run goes on
            return Row(service.label, client, kind, None, NA, None, time.monotonic() - started, repr(e))
        stored, residue = server.stored()
    return Row(service.label, client, kind, measured, stored, residue, time.monotonic() - started)


def _table(rows: Sequence[Row]) -> list[str]:
    lines = [
        "| Service | client | rounds | first median ms | last median ms | last ÷ first | first p99 ms | last p99 ms"
        " | stored after close | client RSS MiB (after 1st → last) | s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for row in rows:
        m = row.measured
        if m is None:
            lines.append(table_row([row.service, row.client, *[NA] * 8, f"{row.seconds:.0f}"]))
            continue
        first, last = m.window(0), m.window(-1)
        lines.append(
            table_row(
                [
                    row.service,
                    row.client,
                    str(len(m.seconds)),
                    ms(median(first)),
                    ms(median(last)),
                    ratio(median(last), median(first)),
                    ms(percentile(first, 99)),
                    ms(percentile(last, 99)),
                    row.stored,
                    f"{m.rss_before / 1024:.1f} → {m.rss_after / 1024:.1f}",
                    f"{row.seconds:.0f}",
                ]
            )
        )
    return lines


def _aims(rows: Sequence[Row]) -> list[str]:
    """distlock's rows against the three aims: the misses by name, or that each is met."""
    ours = [r for r in rows if r.client == "distlock" and r.measured is not None]
    slower = [
        f"{r.service} {r.workload} {r.measured.growth:.2f}x"
        for r in ours
        if r.measured and r.measured.growth > LATENCY_AIM
    ]
    left = [f"{r.service} {r.workload} {r.residue}" for r in ours if r.residue]
    grew = [
        f"{r.service} {r.workload} {r.measured.rss_after / r.measured.rss_before:.2f}x"
        for r in ours
        if r.measured and r.measured.rss_after > MEMORY_AIM * r.measured.rss_before
    ]

    def aim(text: str, misses: list[str]) -> str:
        return f"- {text}: {verdict(not misses)}" + (f" ({'; '.join(misses)})" if misses else "")

    return [
        aim(f"last window's median ÷ first's ≤ {LATENCY_AIM:g} on every service", slower),
        aim("nothing stored after close (keys, znodes, rows; etcd's database size aside)", left),
        aim(f"client RSS flat (after the last round ≤ {MEMORY_AIM:g} times after the first)", grew),
    ]


def render(run: Run, services: Sequence[Service], count: int, rows: Sequence[Row]) -> str:
    window = max(1, count // WINDOWS)
    lines = [
        *run.heading(
            "## Soak: one name taken again and again, many names taken once",
            [cpu_line(), software_line(PACKAGES), *(f"- {s.description}" for s in services)],
        ),
        "Each row is one client's workload on a freshly started server, in a freshly spawned process: *hot* takes",
        f"and releases one name {count} times; *wide* takes and releases {count} names once each, and every",
        f"{EXTRA_EVERY}th name also a semaphore (limit {SEMAPHORE_LIMIT}) and a read/write lock (read, then write) on",
        "names of their own, for the clients that have them (distlock, kazoo). Only the lock's acquire + release is",
        f"timed: *first* and *last* are the first and the last {window} rounds. *Stored after close* is what the",
        "server holds once the client is closed and its leases are gone (etcd: every lease left is revoked first,",
        "as its expiry would; Redis: keys with no expiry, those that will expire counted apart; ZooKeeper: znodes",
        "beyond a fresh server's, the client's root among them but not counted against the aim; SQL: the rows of",
        "distlock's three tables).",
        "*RSS* is the process's `VmRSS` after the first round and after the last. Every client runs with its",
        "defaults (distlock: 30 s leases; python-etcd3: a 60 s lease per acquisition; redis-py: no expiry; kazoo:",
        "a 30 s session).",
        "",
        "### Aims (issue 24), distlock's rows",
        "",
        *_aims(rows),
    ]
    for kind in WORKLOADS:
        title = "one name" if kind == "hot" else "many names"
        lines += ["", f"### {kind}: {title}", "", *_table([r for r in rows if r.workload == kind])]
    errors = [f"{r.service}, {r.client}, {r.workload}: {r.error}" for r in rows if r.error]
    return section(NAME, [*lines, *errors_lines(errors)])


def _parse_args(run: Run) -> argparse.Namespace:
    parser = argparse.ArgumentParser(run.prog, description=summary(__doc__))
    parser.add_argument(
        "--count",
        type=int,
        default=100_000,
        help="rounds of the hot workload and names of the wide one (default 100,000: over an hour on 2 cores, where"
        " 10,000 took 6 minutes)",
    )
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: --count {QUICK_COUNT}")
    add_subset_argument(parser, "--services", list(SERVICES))
    add_out_argument(parser)
    args = parser.parse_args(run.argv)
    if args.quick:
        args.count = QUICK_COUNT
    check_subset(parser, args.services, list(SERVICES), "service")
    if args.count < WINDOWS:
        parser.error(f"--count must be at least {WINDOWS} (one round per window)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    run = Run.begin("benchmarks.soak", argv)
    args = _parse_args(run)
    services = [SERVICES[name]() for name in args.services]
    rows = []
    for service in services:
        for client in service.clients:
            for kind in WORKLOADS:
                print(f"{service.label}, {client}, {kind} ...", file=sys.stderr, flush=True)
                rows.append(_soak(service, client, kind, args.count))
    publish(args.out, NAME, render(run, services, args.count, rows))
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
