"""Benchmark distlock's PostgreSQL lock table against PostgreSQL's own advisory locks.

One run against one PostgreSQL server (started here by :class:`distlock.testing.PostgresServer` with fsync on, or an
existing one given by ``--postgres-url``) measures, with the machinery of :mod:`benchmarks._harness.processes` (spawned
processes, barriers, interleaved latency blocks, bounded waits):

* **uncontended** acquire + release latency (median, p99) and WAL bytes per acquisition, for distlock's lock
  table (``sql+postgresql://``) and the floor: ``SELECT pg_advisory_lock(k)`` then ``SELECT pg_advisory_unlock(k)``
  on one open connection (autocommit), the least any PostgreSQL lock costs;
* **contention**: N processes loop acquire -> tiny critical section -> release on one lock name for a fixed time:
  acquisitions/s, WAL bytes per acquisition, wait percentiles, per-process fairness (fewest / most). The
  advisory lock contends too: ``pg_advisory_lock`` blocks in PostgreSQL's lock manager (``lock_timeout`` bounds it).

The advisory lock is the floor, not a peer with the same promises: it lives as long as its connection (no lease a
frozen client loses, no token to fence with), and it is held by a connection, so a pooled connection shared by two
callers shares the lock too. The server-side cost counted is the write-ahead log PostgreSQL wrote
(``pg_current_wal_insert_lsn()``, read at once and exactly: the lock table's rows are durable writes, an advisory
lock writes none; its transaction counts are published up to 10 s late, too late to count by). Results are printed
and written into ``docs/BENCHMARKS.md`` between the ``sql-table-locks`` markers; the rest of that file is left
alone.

What can go wrong is bounded by the harness: a process that fails or hangs is killed a grace period after its
window and reported as an error in the section, and the run then exits with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg_errors

from benchmarks._harness.locks import DistlockSession, Plan
from benchmarks._harness.processes import BLOCK, GRACE, lock_benchmark
from benchmarks._harness.report import errors_lines, section
from benchmarks._harness.results import LockResults, contended_table, uncontended_table
from benchmarks._harness.run import Run, add_lock_arguments, parse_lock_arguments, summary
from benchmarks._harness.servers import ServerUnderTest
from distlock.testing import PostgresServer

NAME = "sql-table-locks"
PACKAGES = {"SQLAlchemy": "sqlalchemy", "psycopg": "psycopg"}
LABELS = {
    "raw": "`pg_advisory_lock` + unlock (floor)",
    "distlock": "distlock (PostgreSQL lock table)",
}


def _libpq(url: str) -> str:
    """The libpq URL of a ``sql+postgresql[+driver]://`` URL."""
    return "postgresql://" + url.split("://", 1)[1]


def _key(name: str) -> int:
    """A signed 64-bit advisory-lock key for ``name``."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class AdvisorySession:
    """PostgreSQL's session-level advisory lock on one open connection (autocommit: one statement, one round trip)."""

    def __init__(self, url: str, name: str) -> None:
        self._connection = psycopg.connect(_libpq(url), autocommit=True)
        self._key = _key(name)
        self._timeout: float | None = None

    def cycle(self) -> None:
        self._connection.execute("SELECT pg_advisory_lock(%s)", (self._key,))
        self._connection.execute("SELECT pg_advisory_unlock(%s)", (self._key,))

    def acquire(self, timeout: float) -> bool:
        if timeout != self._timeout:
            self._connection.execute(f"SET lock_timeout = {max(1, int(timeout * 1000))}")
            self._timeout = timeout
        try:
            self._connection.execute("SELECT pg_advisory_lock(%s)", (self._key,))
        except pg_errors.LockNotAvailable:
            return False
        return True

    def release(self) -> None:
        self._connection.execute("SELECT pg_advisory_unlock(%s)", (self._key,))

    def close(self) -> None:
        self._connection.close()


PLAN = Plan(
    LABELS,
    sessions={"raw": AdvisorySession, "distlock": DistlockSession},
    contenders={"raw": AdvisorySession, "distlock": DistlockSession},
)


@dataclasses.dataclass(frozen=True)
class WalCount:
    """Bytes of write-ahead log the server has written so far, as ``WAL``: its own count, exact at every read (the
    read writes none)."""

    url: str

    def requests(self) -> Counter[str]:
        with psycopg.connect(_libpq(self.url), autocommit=True) as connection:
            row = connection.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')").fetchone()
        return Counter({"WAL": int(row[0]) if row else 0})


class PostgresUnderTest(ServerUnderTest):
    """A PostgreSQL server with distlock's lock table, the write-ahead log it writes counted."""

    product = "PostgreSQL"

    def __init__(self, url: str, description: str, run_id: str) -> None:
        super().__init__(url, WalCount(url), description)
        self.run_id = run_id

    def version(self) -> str:
        with psycopg.connect(_libpq(self.url)) as connection:
            row = connection.execute("SHOW server_version").fetchone()
        return str(row[0]).split()[0] if row else "?"

    def remove_leftovers(self) -> int:
        """Delete and count this run's waiter rows still in the lock table (advisory locks end with their
        connections)."""
        with psycopg.connect(_libpq(self.url), autocommit=True) as connection:
            exists = connection.execute("SELECT to_regclass('distlock_waiters')").fetchone()
            if not exists or exists[0] is None:
                return 0
            cursor = connection.execute("DELETE FROM distlock_waiters WHERE name LIKE %s", (f"%{self.run_id}%",))
            return cursor.rowcount


def render(run: Run, machine: list[str], args: argparse.Namespace, results: LockResults) -> str:
    lines = [
        *run.heading("## SQL lock table: distlock on PostgreSQL, `pg_advisory_lock`", machine),
        "One run against one PostgreSQL server. Every measurement runs in freshly spawned processes, each with its",
        "own connection, connected and warmed up (under contention: one acquisition each) before the clock and the",
        "counters start. *WAL bytes* are the write-ahead log the server wrote (`pg_current_wal_insert_lsn()`)",
        "divided by the acquisitions: the lock table's rows are durable writes, an advisory lock writes none.",
        "",
        f"### Uncontended acquire + release: {args.rounds} rounds after {args.warmup} warm-up rounds",
        "",
        f"Both locks in one process, interleaved in blocks of {BLOCK} rounds (the order rotating from block to",
        "block). distlock: `with client.lock(name, ttl=30): pass` on `sql+postgresql://` (a lease row of its own",
        "per TTL, refreshed by the keeper). Floor: `SELECT pg_advisory_lock(k)`, `SELECT pg_advisory_unlock(k)` on",
        "one autocommit connection.",
        "",
        *uncontended_table(LABELS, results.uncontended, "WAL bytes", "kind"),
        "",
        f"### Contention: N processes on one lock name for {args.duration:g} s",
        "",
        "Each process loops acquire -> increment a shared counter that no other lock guards -> release; all",
        "start together at a barrier. distlock queues waiters by their row's id and wakes the one behind a release",
        "with `LISTEN`/`NOTIFY`; the advisory lock waits in PostgreSQL's lock manager. distlock adds the token,",
        "the lease (a frozen holder loses the lock) and its keeper; the advisory lock has neither.",
        f"`acquire()` has a {args.duration + GRACE / 2:g} s timeout; *failures* are those that returned False.",
        "",
        *contended_table(LABELS, results.contended, "WAL bytes", "kind", "rows left"),
        "",
        "### Ratios",
        "",
        *results.floor_lines(),
        *results.peer_lines(args.processes, "raw", "`pg_advisory_lock`"),
        *errors_lines(results.errors),
    ]
    return section(NAME, lines)


@contextmanager
def postgres_server(args: argparse.Namespace, run_id: str) -> Iterator[PostgresUnderTest]:
    """The PostgreSQL of ``--postgres-url``, or one started for the run with fsync on."""
    if args.postgres_url:
        yield PostgresUnderTest(args.postgres_url, "an existing server", run_id)
        return
    with PostgresServer(settings={"fsync": "on", "full_page_writes": "on"}) as server:
        description = "started by `distlock.testing.PostgresServer` on loopback, fsync on"
        yield PostgresUnderTest("sql+" + server.dsn, description, run_id)


def _parse_args(run: Run) -> argparse.Namespace:
    parser = argparse.ArgumentParser(run.prog, description=summary(__doc__))
    add_lock_arguments(parser, list(LABELS), rounds=1000, warmup=100)
    parser.add_argument(
        "--postgres-url", help="use this PostgreSQL (sql+postgresql://USER@HOST:PORT/DB) instead of starting one"
    )
    return parse_lock_arguments(parser, run, list(LABELS))


def main(argv: Sequence[str] | None = None) -> int:
    run = Run.begin("benchmarks.sql_table_locks", argv)
    args = _parse_args(run)
    return lock_benchmark(run, args, postgres_server(args, run.id), PACKAGES, PLAN, NAME, render)


if __name__ == "__main__":
    sys.exit(main())
