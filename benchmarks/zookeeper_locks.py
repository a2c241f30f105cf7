"""Benchmark distlock's ZooKeeper lock against kazoo's ``Lock`` and a three-request floor.

One run against one ZooKeeper server (started here by :class:`distlock.testing.ZooKeeperServer`, or an existing one
given by ``--zookeeper-url``) measures, with the machinery of :mod:`benchmarks._harness.processes` (spawned processes,
barriers, interleaved latency blocks, bounded waits):

* **uncontended** acquire + release latency (median, p99) and packets per acquisition, for distlock, kazoo's
  ``Lock`` and the floor: create an ephemeral sequential node, list its parent, delete the node, with no library
  around them (what any fair ZooKeeper lock sends at least);
* **contention**: N processes loop acquire -> tiny critical section -> release on one lock name for a fixed time:
  acquisitions/s, packets per acquisition, wait percentiles, per-process fairness (fewest / most).

Packets are the server's own count (``mntr``'s ``zk_packets_received``): every request, and every session's pings,
which kazoo sends a third of a session timeout after the last request. Results are printed and written into
``docs/BENCHMARKS.md`` between the ``zookeeper-locks`` markers; the rest of that file is left alone.

What can go wrong is bounded by the harness: a process that fails or hangs is killed a grace period after its
window and reported as an error in the section, and the run then exits with status 1. A server whose ``mntr`` is not
whitelisted (``4lw.commands.whitelist``) cannot be counted: the run fails at its first count.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from kazoo.client import KazooClient

from benchmarks._harness.locks import TTL, DistlockSession, LockSession, Plan
from benchmarks._harness.processes import BLOCK, GRACE, lock_benchmark
from benchmarks._harness.report import errors_lines, section
from benchmarks._harness.results import LockResults, contended_table, uncontended_table
from benchmarks._harness.run import Run, add_lock_arguments, parse_lock_arguments, summary
from benchmarks._harness.servers import ServerUnderTest
from distlock.testing import ZooKeeperServer

NAME = "zookeeper-locks"
PACKAGES = {"kazoo": "kazoo"}
LABELS = {
    "raw": "raw create + list + delete (floor)",
    "kazoo": "kazoo `Lock`",
    "distlock": "distlock (ZooKeeper)",
}
#: Where kazoo's locks and the floor's nodes live (distlock's live under its prefix, /distlock).
_ROOT = "/bench"
_RATE_TARGET = 0.8
_FAIRNESS_TARGET = 0.9


def _hosts(url: str) -> str:
    """``host:port,...`` of a ``zk://host:port,...`` URL, for kazoo."""
    return urlsplit(url).netloc


def kazoo_client(url: str) -> KazooClient:
    """A started kazoo client of ``url`` with a session of the benchmarks' TTL."""
    client = KazooClient(hosts=_hosts(url), timeout=TTL)
    client.start(timeout=10)
    return client


class KazooSession(LockSession):
    """kazoo's ``Lock``: the same recipe (ephemeral sequential nodes, a watch on the node ahead), no token."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__()
        self._client = kazoo_client(url)
        self._path = f"{_ROOT}/kazoo/{name}"

    def new_lock(self) -> Any:
        return self._client.Lock(self._path)

    def take(self, lock: Any, timeout: float | None) -> bool:
        return bool(lock.acquire(timeout=timeout))

    def close(self) -> None:
        self._client.stop()
        self._client.close()


class RawSession:
    """The floor: join (create an ephemeral sequential node), see that it is first (list the parent), leave."""

    def __init__(self, url: str, name: str) -> None:
        self._client = kazoo_client(url)
        self._parent = f"{_ROOT}/raw/{name}"
        self._client.ensure_path(self._parent)

    def cycle(self) -> None:
        path = self._client.create(f"{self._parent}/n-", ephemeral=True, sequence=True)
        if len(self._client.get_children(self._parent)) != 1:
            raise RuntimeError("raw lock node is not alone")
        self._client.delete(path)

    def close(self) -> None:
        self._client.stop()
        self._client.close()


PLAN = Plan(
    LABELS,
    sessions={"raw": RawSession, "kazoo": KazooSession, "distlock": DistlockSession},
    contenders={"kazoo": KazooSession, "distlock": DistlockSession},
)


def mntr(url: str) -> dict[str, str]:
    """ZooKeeper's ``mntr`` four-letter command: the statistics of the first server of ``url``, by name."""
    host, _, port = _hosts(url).split(",")[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(b"mntr")
        reply = b""
        while chunk := connection.recv(4096):
            reply += chunk
    pairs = (line.split("\t", 1) for line in reply.decode().splitlines() if "\t" in line)
    return dict(pairs)


@dataclasses.dataclass(frozen=True)
class PacketCount:
    """ZooKeeper's ``mntr``: packets received so far (the harness's ``Counters``; ``mntr`` is not a packet)."""

    url: str

    def requests(self) -> Counter[str]:
        stats = mntr(self.url)
        if "zk_packets_received" not in stats:
            raise RuntimeError(f"ZooKeeper at {self.url} did not answer mntr (is it whitelisted?)")
        return Counter({"PACKETS": int(stats["zk_packets_received"])})


class ZooKeeperUnderTest(ServerUnderTest):
    """A ZooKeeper server, its lock traffic counted by ``mntr``."""

    product = "ZooKeeper"

    def __init__(self, url: str, description: str, run_id: str) -> None:
        super().__init__(url, PacketCount(url), description)
        self.run_id = run_id

    def version(self) -> str:
        return mntr(self.url).get("zk_version", "?").split(",")[0]

    def remove_leftovers(self) -> int:
        """Delete and count this run's nodes still on the server: waiters' nodes under distlock's lock nodes and
        kazoo's and the floor's parents (the empty lock nodes themselves stay, as they do in use)."""
        client = kazoo_client(self.url)
        try:
            left = 0
            for parent in ("/distlock", f"{_ROOT}/kazoo", f"{_ROOT}/raw"):
                if client.exists(parent) is None:
                    continue
                for lock in client.get_children(parent):
                    if self.run_id not in lock:
                        continue
                    for child in client.get_children(f"{parent}/{lock}"):
                        left += 1
                        client.delete(f"{parent}/{lock}/{child}", recursive=True)
            return left
        finally:
            client.stop()
            client.close()


def _targets(processes: list[int], results: LockResults) -> list[str]:
    """distlock against kazoo's ``Lock``: the uncontended ratio, and acquisitions/s with fairness under contention."""
    target = (_RATE_TARGET, _FAIRNESS_TARGET)
    return [*results.floor_lines(), *results.peer_lines(processes, "kazoo", "kazoo `Lock`", target)]


def render(run: Run, machine: list[str], args: argparse.Namespace, results: LockResults) -> str:
    lines = [
        *run.heading("## ZooKeeper locks: distlock, kazoo `Lock`", machine),
        "One run against one ZooKeeper server. Every measurement runs in freshly spawned processes, each with its",
        "own client, connected and warmed up (under contention: one acquisition each) before the clock and the",
        "counters start. *Packets* are ZooKeeper's `mntr` `zk_packets_received` (requests and pings) divided by the",
        "acquisitions.",
        "",
        f"### Uncontended acquire + release: {args.rounds} rounds after {args.warmup} warm-up rounds",
        "",
        f"All locks in one process, interleaved in blocks of {BLOCK} rounds (the order rotating from block to",
        "block). distlock: `with client.lock(name, ttl=30): pass` (a session of its own per TTL, opened once).",
        "kazoo: `client.Lock(path)`, `acquire()`, `release()` on a client with a 30 s session. Floor: create an",
        "ephemeral sequential node, list its parent, delete the node.",
        "",
        *uncontended_table(LABELS, results.uncontended, "packets", "name"),
        "",
        f"### Contention: N processes on one lock name for {args.duration:g} s",
        "",
        "Each process loops acquire -> increment a shared counter that no other lock guards -> release; all",
        "start together at a barrier. Both locks queue their waiters in arrival order and wake one per release;",
        "distlock adds a token (the holder node's zxid) and its lease keeper.",
        f"`acquire()` has a {args.duration + GRACE / 2:g} s timeout; *failures* are those that returned False.",
        "",
        *contended_table(LABELS, results.contended, "packets", "name", "nodes left"),
        "",
        "### Ratios",
        "",
        *_targets(args.processes, results),
        *errors_lines(results.errors),
    ]
    return section(NAME, lines)


@contextmanager
def zookeeper_server(args: argparse.Namespace, run_id: str) -> Iterator[ZooKeeperUnderTest]:
    """The ZooKeeper of ``--zookeeper-url``, or one started for the run."""
    if args.zookeeper_url:
        yield ZooKeeperUnderTest(args.zookeeper_url, "an existing server", run_id)
        return
    with ZooKeeperServer() as server:
        description = "started by `distlock.testing.ZooKeeperServer` on loopback, 64 MB heap, no fsync"
        yield ZooKeeperUnderTest(server.url, description, run_id)


def _parse_args(run: Run) -> argparse.Namespace:
    parser = argparse.ArgumentParser(run.prog, description=summary(__doc__))
    add_lock_arguments(parser, list(LABELS), rounds=1000, warmup=100)
    parser.add_argument("--zookeeper-url", help="use this ZooKeeper (zk://HOST:PORT) instead of starting one")
    return parse_lock_arguments(parser, run, list(LABELS))


def main(argv: Sequence[str] | None = None) -> int:
    run = Run.begin("benchmarks.zookeeper_locks", argv)
    args = _parse_args(run)
    return lock_benchmark(run, args, zookeeper_server(args, run.id), PACKAGES, PLAN, NAME, render)


if __name__ == "__main__":
    sys.exit(main())
