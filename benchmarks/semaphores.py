"""Benchmark distlock's semaphore against kazoo's ``Semaphore``, both on one ZooKeeper server.

kazoo's ``Semaphore`` recipe is the Python distributed semaphore to beat: maintained, used in production with
ZooKeeper, and of the same shape (at most N holders, waiters in order). The Redis ones on PyPI are unmaintained
(redis-semaphore's last release was in 2016); pottery and tooz offer locks, not semaphores. So the comparison runs
where kazoo runs: one ZooKeeper (started here by :class:`distlock.testing.ZooKeeperServer`, or ``--zookeeper-url``),
limit :data:`LIMIT`, with the machinery of :mod:`benchmarks._harness.processes`:

* **uncontended** acquire + release latency (median, p99) and packets per acquisition;
* **contention**: N processes loop acquire -> bump a counter -> release on one semaphore for a fixed time:
  acquisitions/s, packets per acquisition, wait percentiles, fairness (fewest / most acquisitions per process),
  and exclusion: the holders inside are counted under a lock, and one more than the limit is an overlap.

Packets are the server's own count (``mntr``'s ``zk_packets_received``), as in :mod:`benchmarks.zookeeper_locks`.
Results are printed and written into ``docs/BENCHMARKS.md`` between the ``semaphores`` markers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks._harness.locks import TTL, DistlockSession, LockSession, Plan
from benchmarks._harness.processes import BLOCK, GRACE, lock_benchmark
from benchmarks._harness.report import errors_lines, section
from benchmarks._harness.results import LockResults, contended_table, uncontended_table
from benchmarks._harness.run import Run, add_lock_arguments, parse_lock_arguments, summary
from benchmarks.zookeeper_locks import kazoo_client, zookeeper_server

NAME = "semaphores"
PACKAGES = {"kazoo": "kazoo"}
#: How many may hold the semaphore at once.
LIMIT = 3
LABELS = {
    "kazoo": f"kazoo `Semaphore` (limit {LIMIT})",
    "distlock": f"distlock semaphore (ZooKeeper, limit {LIMIT})",
}


class KazooSemaphoreSession(LockSession):
    """kazoo's ``Semaphore``: a lock node guards a list of lease nodes; waiters watch the lease list."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__()
        self._client = kazoo_client(url)
        self._path = f"/bench/kazoo-semaphore/{name}"

    def new_lock(self) -> Any:
        return self._client.Semaphore(self._path, max_leases=LIMIT)

    def take(self, lock: Any, timeout: float | None) -> bool:
        return bool(lock.acquire(timeout=timeout))

    def close(self) -> None:
        self._client.stop()
        self._client.close()


class DistlockSemaphoreSession(DistlockSession):
    """distlock's semaphore: a slot is a lock handle with its own fencing token."""

    def new_lock(self) -> Any:
        return self._client.semaphore(self._name, limit=LIMIT, ttl=TTL)


PLAN = Plan(
    LABELS,
    sessions={"kazoo": KazooSemaphoreSession, "distlock": DistlockSemaphoreSession},
    contenders={"kazoo": KazooSemaphoreSession, "distlock": DistlockSemaphoreSession},
    limit=LIMIT,
)


def render(run: Run, machine: list[str], args: argparse.Namespace, results: LockResults) -> str:
    lines = [
        *run.heading("## Semaphores: distlock, kazoo `Semaphore`", machine),
        "One run against one ZooKeeper server; why kazoo's recipe is the peer is in the benchmark's docstring",
        "(`python -m benchmarks.semaphores --help`). Every measurement runs in freshly spawned processes, each with",
        "its own client, connected and warmed up before the clock and the counters start. *Packets* are",
        "ZooKeeper's `mntr` `zk_packets_received` divided by the acquisitions.",
        "",
        f"### Uncontended acquire + release: {args.rounds} rounds after {args.warmup} warm-up rounds",
        "",
        f"Both in one process, interleaved in blocks of {BLOCK} rounds. distlock: `with client.semaphore(name,",
        f"limit={LIMIT}, ttl=30): pass`. kazoo: `client.Semaphore(path, max_leases={LIMIT})`, `acquire()`,",
        "`release()`.",
        "",
        *uncontended_table(LABELS, results.uncontended, "packets", "name"),
        "",
        f"### Contention: N processes on one semaphore of limit {LIMIT} for {args.duration:g} s",
        "",
        "Each process loops acquire -> count itself in (under a lock shared by the processes), bump a counter,",
        "count itself out -> release; all start together at a barrier. *Exclusion* is ok when the counter",
        f"equals the acquisitions and no process ever counted more than {LIMIT} inside. kazoo's waiters all",
        "watch the list of leases (every release wakes them); distlock's waiters on ZooKeeper watch the queue's",
        "list of children, and each holder has a fencing token. *Nodes left*: distlock's queue nodes still there",
        "after the clients closed (kazoo's recipe nodes are not counted).",
        f"`acquire()` has a {args.duration + GRACE / 2:g} s timeout; *failures* are those that returned False.",
        "",
        *contended_table(LABELS, results.contended, "packets", "name", "nodes left"),
        "",
        "### Ratios",
        "",
        *results.peer_lines(args.processes, "kazoo", "kazoo `Semaphore`"),
        *errors_lines(results.errors),
    ]
    return section(NAME, lines)


def main(argv: Sequence[str] | None = None) -> int:
    run = Run.begin("benchmarks.semaphores", argv)
    parser = argparse.ArgumentParser(run.prog, description=summary(__doc__))
    add_lock_arguments(parser, list(LABELS), rounds=500, warmup=50)
    parser.add_argument("--zookeeper-url", help="use this ZooKeeper (zk://HOST:PORT) instead of starting one")
    args = parse_lock_arguments(parser, run, list(LABELS))
    return lock_benchmark(run, args, zookeeper_server(args, run.id), PACKAGES, PLAN, NAME, render)


if __name__ == "__main__":
    sys.exit(main())
