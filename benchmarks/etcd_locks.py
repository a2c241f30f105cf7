"""Benchmark distlock's etcd lock against python-etcd3's ``Lock`` and a raw-transaction floor.

One run against one etcd server (started here by :class:`distlock.testing.EtcdServer`, or an existing one
given by ``--etcd-url``) measures:

* **uncontended** acquire + release latency (median, p99) and etcd RPCs per acquisition, for distlock, for
  python-etcd3's ``Lock``, and for the floor: one ``Txn`` (put if absent, with a lease granted once) and one
  ``DeleteRange`` on the raw gRPC stubs, with no library logic at all;
* **contention**: N processes loop acquire -> tiny critical section -> release on one lock name for a fixed
  time: acquisitions/s, RPCs per acquisition, wait percentiles, fairness (fewest / most acquisitions).

This module holds the three locks and the report; :mod:`benchmarks._harness.processes` runs them. Every measurement
runs in child processes started with "spawn" (gRPC channels do not survive ``fork()``), each with its own client,
connected and warmed up before anything is timed or counted. RPCs are etcd's own counters
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
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import etcd3
import grpc
from etcd3 import etcdrpc

from benchmarks._harness.figures import ratio, verdict
from benchmarks._harness.locks import TTL, DistlockSession, LockSession, Plan
from benchmarks._harness.machine import ETCD_PACKAGES
from benchmarks._harness.processes import BLOCK, GRACE, lock_benchmark
from benchmarks._harness.report import errors_lines, section
from benchmarks._harness.results import LockResults, contended_table, uncontended_table
from benchmarks._harness.run import Run, add_etcd_arguments, add_lock_arguments, parse_lock_arguments, summary
from benchmarks._harness.servers import REQUEST_TIMEOUT, endpoint_of, etcd_server

NAME = "etcd-locks"
LABELS = {
    "raw": "raw `Txn` + `DeleteRange` (floor)",
    "python-etcd3": "python-etcd3 `Lock`",
    "distlock": "distlock",
}


# --- the three locks, each used the way an application would ----------------------------------------------


class Etcd3Session(LockSession):
    """python-etcd3's ``Lock``: one key, a lease per attempt (not revoked), all waiters woken per release."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__()
        host, port = endpoint_of(url).rsplit(":", 1)
        self._client = etcd3.client(host, int(port), timeout=REQUEST_TIMEOUT)
        self._name = name

    def new_lock(self) -> Any:
        return self._client.lock(self._name, ttl=TTL)

    def take(self, lock: Any, timeout: float | None) -> bool:
        return bool(lock.acquire(timeout=timeout))

    def close(self) -> None:
        # Its watcher thread dies with NameError ("six") when the stream closes: a known bug of python3-etcd3,
        # harmless here, so keep it off the benchmark's output.
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
        self._channel = grpc.insecure_channel(endpoint_of(url))
        self._kv = etcdrpc.KVStub(self._channel)
        self._leases = etcdrpc.LeaseStub(self._channel)
        self._lease_id = self._leases.LeaseGrant(etcdrpc.LeaseGrantRequest(TTL=TTL), timeout=REQUEST_TIMEOUT).ID
        key = f"/bench/raw/{name}".encode()
        not_created = etcdrpc.Compare(
            key=key, result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.CREATE, create_revision=0
        )
        put = etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=b"held", lease=self._lease_id))
        self._acquire = etcdrpc.TxnRequest(compare=[not_created], success=[put])
        self._release = etcdrpc.DeleteRangeRequest(key=key)
        self._revoke = etcdrpc.LeaseRevokeRequest(ID=self._lease_id)

    def cycle(self) -> None:
        if not self._kv.Txn(self._acquire, timeout=REQUEST_TIMEOUT).succeeded:
            raise RuntimeError("raw lock key already exists")
        self._kv.DeleteRange(self._release, timeout=REQUEST_TIMEOUT)

    def close(self) -> None:
        self._leases.LeaseRevoke(self._revoke, timeout=REQUEST_TIMEOUT)
        self._channel.close()


PLAN = Plan(
    LABELS,
    sessions={"raw": RawSession, "python-etcd3": Etcd3Session, "distlock": DistlockSession},
    contenders={"python-etcd3": Etcd3Session, "distlock": DistlockSession},
)


# --- report -----------------------------------------------------------------------------------------------


def render(run: Run, machine: list[str], args: argparse.Namespace, results: LockResults) -> str:
    lines = [
        *run.heading(
            "## etcd locks: distlock, python-etcd3 `Lock`, raw transactions",
            machine,
            " (what `scripts/bench.sh etcd` runs)",
        ),
        "One run against one etcd server. Every measurement runs in freshly spawned processes, each with",
        "its own client, connected and warmed up (under contention: one acquisition each) before the clock",
        "and the RPC counters start. *RPCs* are the gRPC messages etcd received",
        "(`grpc_server_msg_received_total`; on a watch stream each create and cancel request counts) divided",
        "by the acquisitions. *Leases left* are leases still on the server after the clients closed; the",
        "benchmark revokes them before the next measurement.",
        "",
        f"### Uncontended acquire + release: {args.rounds} rounds after {args.warmup} warm-up rounds",
        "",
        f"All locks in one process, interleaved in blocks of {BLOCK} rounds (the order rotating",
        "from block to block), so a slow spell of the machine hits them alike; RPCs are counted between",
        "blocks.",
        "distlock: `with client.lock(name, ttl=30): pass`. python-etcd3: `lock = client.lock(name,",
        "ttl=30)`, `lock.acquire()`, `lock.release()`. Floor: one `Txn` putting the key with a lease granted",
        "once if its `create_revision` is 0, then one `DeleteRange`, on the raw gRPC stubs.",
        "",
        *uncontended_table(LABELS, results.uncontended, "RPCs", "method"),
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
        *contended_table(LABELS, results.contended, "RPCs", "method", "leases left"),
        "",
        "What a contended distlock acquisition sends: the `Txn` that queues it (and reads the key just",
        "ahead), one `Watch` create on that key, one `Range` once the watch reports its deletion (the",
        "waiter's own key and what is still ahead, from that member's copy of the store), and the `Txn`",
        "that releases it: 4. One more `Range` when another write landed between the queueing `Txn` and",
        "the watch's start (the watch would not see a deletion before its start); that share is the",
        "`Range` above 1.00.",
        "",
        "### Ratios",
        "",
        *_ratios(args.processes, results),
        *errors_lines(results.errors),
    ]
    return section(NAME, lines)


#: The targets: uncontended cost over the raw floor, contended rate over python-etcd3's unfair `Lock` at each
#: process count (with fairness), and requests per contended acquisition.
_FLOOR_TARGET = 1.15
_RATE_TARGETS = {8: 1.0, 32: 3.5}
_FAIRNESS_TARGET = 0.9
_RPC_TARGET = 4.0


def _ratios(processes: list[int], results: LockResults) -> list[str]:
    by_lock = results.uncontended_by_lock
    lines = results.floor_lines(_FLOOR_TARGET)
    if "distlock" in by_lock and "python-etcd3" in by_lock:
        ours, theirs = by_lock["distlock"], by_lock["python-etcd3"]
        lines.append(
            f"- Uncontended, distlock ÷ python-etcd3 `Lock`: median {ratio(ours.median, theirs.median)}, "
            f"p99 {ratio(ours.p99, theirs.p99)}, "
            f"RPCs {ratio(ours.requests_per_acquisition, theirs.requests_per_acquisition)}"
        )
    runs = {(c.lock, c.processes): c for c in results.contended}
    for n in processes:
        if ("distlock", n) in runs and ("python-etcd3", n) in runs:
            ours_c, theirs_c = runs["distlock", n], runs["python-etcd3", n]
            rate = ratio(ours_c.rate, theirs_c.rate)
            line = f"- {n} processes, acquisitions/s of distlock ÷ python-etcd3 `Lock`: {rate}"
            if n in _RATE_TARGETS:
                met = ours_c.rate >= _RATE_TARGETS[n] * theirs_c.rate and ours_c.fairness >= _FAIRNESS_TARGET
                line += (
                    f", fairness {ours_c.fairness:.2f} (target ≥ {_RATE_TARGETS[n]:g}x with fairness ≥ "
                    f"{_FAIRNESS_TARGET:g}: {verdict(met)})"
                )
            lines.append(line)
        if ("distlock", n) in runs:
            rpcs = runs["distlock", n].requests_per_acquisition
            lines.append(
                f"- {n} processes, distlock RPCs per contended acquisition: {rpcs:.2f} "
                f"(target ≤ {_RPC_TARGET:g}: {verdict(rpcs <= _RPC_TARGET)})"
            )
    return lines


# --- main -------------------------------------------------------------------------------------------------


def _parse_args(run: Run) -> argparse.Namespace:
    parser = argparse.ArgumentParser(run.prog, description=summary(__doc__))
    add_lock_arguments(parser, list(LABELS), rounds=500, warmup=50)
    add_etcd_arguments(parser)
    return parse_lock_arguments(parser, run, list(LABELS))


def main(argv: Sequence[str] | None = None) -> int:
    run = Run.begin("benchmarks.etcd_locks", argv)
    args = _parse_args(run)
    return lock_benchmark(run, args, etcd_server(args), ETCD_PACKAGES, PLAN, NAME, render)


if __name__ == "__main__":
    sys.exit(main())
