"""Where the time of one etcd hand-over goes: a holder releases, the next waiter (another process) holds.

A fair lock pays this on every contended acquisition, and an unfair one (python-etcd3's ``Lock``, whose releaser
usually takes the lock straight back) mostly does not, so it is what bounds the fair lock's contended rate. Two
ways of handing over are timed in alternating rounds against one etcd (fsync on), on one clock
(``CLOCK_MONOTONIC`` is shared by the processes of a machine):

* **the floor**, on the raw gRPC stubs: the waiter has a watch on the holder's key; the holder sends
  ``DeleteRange``; the waiter gets the event and sends the one ``Range`` a waiter must make before it may hold
  (is its own key still there, is anything still ahead); nothing else;
* **distlock**: ``Lock.release()`` in the holder, ``Lock.acquire()`` returning in the waiter.

Per round: the release request (sent to answered, in the holder), release sent to the waiter's watch event, the
waiter's read (sent to answered), and release sent to "holds" in the waiter. The gap between distlock's hand-over
and the floor's is what distlock's own code costs on that path.

Everything is bounded: the waiter process answers each round within :data:`ROUND_TIMEOUT` or the run stops with an
error. Results are printed and written into ``docs/BENCHMARKS.md`` between the ``etcd-handover`` markers.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import urllib.request
from collections.abc import Sequence
from multiprocessing.connection import Connection

import grpc
from etcd3 import etcdrpc

import distlock
from benchmarks._harness.figures import ms, percentile, ratio, table_row
from benchmarks._harness.locks import TTL
from benchmarks._harness.machine import ETCD_PACKAGES, machine
from benchmarks._harness.report import publish, section
from benchmarks._harness.run import Run, add_etcd_arguments, add_out_argument, summary
from benchmarks._harness.servers import REQUEST_TIMEOUT, EtcdMetrics, endpoint_of, etcd_server
from distlock.testing import parse_prometheus_text

NAME = "etcd-handover"
#: Longest wait for the other process in one round, s.
ROUND_TIMEOUT = 10.0
_WATCHERS = "etcd_debugging_mvcc_watcher_total"


def _waiter(url: str, prefix: str, pipe: Connection) -> None:
    """The waiting side, in its own process: for each order from the holder, wait one way and report the times."""
    channel = grpc.insecure_channel(endpoint_of(url))
    kv = etcdrpc.KVStub(channel)
    watch = etcdrpc.WatchStub(channel)
    end = (prefix[:-1] + chr(ord(prefix[-1]) + 1)).encode()
    with distlock.connect(url) as client:
        while (order := pipe.recv()) is not None:
            kind, arg = order
            if kind == "distlock":
                lock = client.lock(arg, ttl=TTL)
                pipe.send("queued")
                lock.acquire(timeout=ROUND_TIMEOUT)
                held = time.perf_counter()
                lock.release()
                pipe.send({"held": held})
            else:  # the floor: a watch on the holder's key, one read when it goes
                requests = iter([etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(key=arg))])
                responses = watch.Watch(requests, timeout=ROUND_TIMEOUT)
                next(responses)  # created
                pipe.send("queued")
                for response in responses:
                    if response.events:
                        break
                event = time.perf_counter()
                read = etcdrpc.RangeRequest(key=prefix.encode(), range_end=end, limit=2, keys_only=True)
                kv.Range(read, timeout=REQUEST_TIMEOUT)
                held = time.perf_counter()
                responses.cancel()
                pipe.send({"event": event, "held": held})
    channel.close()


def _watching(metrics_url: str) -> bool:
    """Does etcd have a watcher (the waiter's)? Read over HTTP, so the read does not touch the measured path."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(metrics_url, timeout=REQUEST_TIMEOUT) as response:
        return parse_prometheus_text(response.read().decode()).get(_WATCHERS, 0.0) >= 1


def _until_watching(metrics_url: str) -> None:
    deadline = time.monotonic() + ROUND_TIMEOUT
    while not _watching(metrics_url):
        if time.monotonic() > deadline:
            raise RuntimeError("the waiter's watch did not start")
        time.sleep(0.0005)


def main(argv: Sequence[str] | None = None) -> int:
    run = Run.begin("benchmarks.etcd_handover", argv)
    parser = argparse.ArgumentParser(run.prog, description=summary(__doc__))
    parser.add_argument("--rounds", type=int, default=300, help="hand-overs of each kind (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up rounds of each kind (default 20)")
    add_out_argument(parser)
    add_etcd_arguments(parser)
    args = parser.parse_args(run.argv)
    times: dict[str, list[float]] = {k: [] for k in ("raw-rpc", "raw-event", "raw-read", "raw", "rpc", "distlock")}
    ctx = multiprocessing.get_context("spawn")
    with etcd_server(args) as server:
        lines = machine(server, ETCD_PACKAGES)
        print("\n".join(lines), flush=True)
        assert isinstance(server.counters, EtcdMetrics)
        metrics_url = server.counters.url
        prefix = f"/bench/handover-{run.id}/"
        here, there = ctx.Pipe()
        waiter = ctx.Process(target=_waiter, args=(server.url, prefix, there), daemon=True)
        waiter.start()
        channel = grpc.insecure_channel(server.endpoint)
        kv = etcdrpc.KVStub(channel)
        lease = etcdrpc.LeaseStub(channel).LeaseGrant(etcdrpc.LeaseGrantRequest(TTL=TTL), timeout=REQUEST_TIMEOUT).ID

        def answer() -> object:
            if not here.poll(ROUND_TIMEOUT):
                raise RuntimeError("the waiting process did not answer")
            return here.recv()

        try:
            with distlock.connect(server.url) as client:
                for i in range(args.warmup + args.rounds):
                    key = f"{prefix}raw-{i}".encode()
                    kv.Put(etcdrpc.PutRequest(key=key, value=b"held", lease=lease), timeout=REQUEST_TIMEOUT)
                    here.send(("raw", key))
                    answer()
                    sent = time.perf_counter()
                    kv.DeleteRange(etcdrpc.DeleteRangeRequest(key=key), timeout=REQUEST_TIMEOUT)
                    answered = time.perf_counter()
                    raw = answer()
                    name = f"handover-{run.id}-{i}"
                    lock = client.lock(name, ttl=TTL)
                    lock.acquire()
                    here.send(("distlock", name))
                    answer()
                    _until_watching(metrics_url)
                    start = time.perf_counter()
                    lock.release()
                    released = time.perf_counter()
                    ours = answer()
                    if i < args.warmup:
                        continue
                    assert isinstance(raw, dict)
                    assert isinstance(ours, dict)
                    times["raw-rpc"].append(answered - sent)
                    times["raw-event"].append(raw["event"] - sent)
                    times["raw-read"].append(raw["held"] - raw["event"])
                    times["raw"].append(raw["held"] - sent)
                    times["rpc"].append(released - start)
                    times["distlock"].append(ours["held"] - start)
        finally:
            here.send(None)
            waiter.join(ROUND_TIMEOUT)
            channel.close()
    publish(args.out, NAME, section(NAME, _render(run, lines, times)))
    return 0


def _render(run: Run, machine_lines: list[str], times: dict[str, list[float]]) -> list[str]:
    def cells(label: str, key: str) -> str:
        samples = times[key]
        return table_row([label, ms(percentile(samples, 50)), ms(percentile(samples, 90))])

    floor, ours = percentile(times["raw"], 50), percentile(times["distlock"], 50)
    return [
        *run.heading("## etcd: one hand-over, step by step", machine_lines),
        f"{len(times['raw'])} hand-overs of each kind, alternating.",
        "",
        "| step | p50 ms | p90 ms |",
        "|---|---:|---:|",
        cells("floor: `DeleteRange`, sent to answered (in the holder)", "raw-rpc"),
        cells("floor: release sent → the waiter's watch event", "raw-event"),
        cells("floor: the waiter's one `Range`, sent to answered", "raw-read"),
        cells("**floor: release sent → the waiter may hold**", "raw"),
        cells("distlock: `release()` in the holder", "rpc"),
        cells("**distlock: `release()` called → `acquire()` returns in the waiter**", "distlock"),
        "",
        f"- distlock's hand-over ÷ the floor's, median: {ratio(ours, floor)} (+{ms(ours - floor)} ms)",
    ]


if __name__ == "__main__":
    sys.exit(main())
