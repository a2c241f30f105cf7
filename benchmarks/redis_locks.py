"""Benchmark distlock's Redis lock against redis-py's ``Lock``, python-redis-lock and a two-command floor.

One run against one redis-server (started here by :class:`distlock.testing.RedisServer`, or an existing one given
by ``--redis-url``) measures, with the machinery of :mod:`benchmarks.etcd_locks` (spawned processes, barriers,
interleaved latency blocks, bounded waits):

* **uncontended** acquire + release latency (median, p99) and Redis commands per acquisition, for distlock,
  redis-py's ``Lock``, python-redis-lock's ``Lock``, and the floor: ``SET key id NX PX`` and a Lua
  compare-and-delete, with no library around them;
* **contention**: N processes loop acquire -> tiny critical section -> release on one lock name for a fixed
  time: acquisitions/s, commands per acquisition, wait percentiles, per-process fairness (fewest / most).

Commands are Redis's own counters (``INFO commandstats``): every command a script runs counts, as does the
script call itself; ``INFO`` and connection set-up (``HELLO``, ``CLIENT ...``) do not. Results are printed and
written into ``docs/BENCHMARKS.md`` between the ``redis-locks`` markers; the rest of that file is left alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import math
import multiprocessing
import platform
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
import redis_lock  # type: ignore[import-untyped]

import distlock
from benchmarks.etcd_locks import (
    GRACE,
    NA,
    BlockingSession,
    Contended,
    ContentionJob,
    DistlockSession,
    Etcd,
    LatencyJob,
    Metrics,
    Plan,
    Run,
    Session,
    Sessions,
    Uncontended,
    _breakdown,
    _checkout,
    _machine,
    _ms,
    _per,
    _percentile,
    _ratio,
    add_arguments,
    measure,
    parse_arguments,
    publish,
)
from distlock.testing import RedisServer

TTL = 30
MARKERS = ("<!-- redis-locks:begin -->", "<!-- redis-locks:end -->")
LABELS = {
    "raw": "raw `SET NX PX` + Lua delete (floor)",
    "redis-py": "redis-py `Lock`",
    "python-redis-lock": "python-redis-lock `Lock`",
    "distlock": "distlock (Redis)",
}
CONTENDERS = ("redis-py", "python-redis-lock", "distlock")
#: Commands that are not lock traffic: the counting itself and connection set-up.
_NOT_LOCK_TRAFFIC = ("info", "hello", "auth", "select", "client|")
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


# --- the four locks, each used the way an application would ------------------------------------------------


class _ClientSession:
    """A redis-py client and a Redis lock library, used the way an application uses it (one lock per attempt)."""

    def __init__(self, url: str, name: str) -> None:
        self._client = redis.Redis.from_url(url)
        self._name = name
        self._held: Any = None

    def _lock(self) -> Any:
        raise NotImplementedError

    def _acquire(self, lock: Any, timeout: float | None) -> bool:
        """``lock.acquire`` waiting at most ``timeout`` s (None: as long as it takes)."""
        raise NotImplementedError

    def cycle(self) -> None:
        lock = self._lock()
        if not self._acquire(lock, None):
            raise RuntimeError(f"{type(self).__name__}: acquire() failed without contention")
        lock.release()

    def acquire(self, timeout: float) -> bool:
        lock = self._lock()
        if not self._acquire(lock, timeout):
            return False
        self._held = lock
        return True

    def release(self) -> None:
        self._held.release()
        self._held = None

    def close(self) -> None:
        self._client.close()


class RedisPySession(_ClientSession):
    """redis-py's ``Lock``: ``SET NX PX``; a waiter polls every 0.1 s (its default ``sleep``)."""

    def _lock(self) -> Any:
        return self._client.lock(self._name, timeout=TTL)

    def _acquire(self, lock: Any, timeout: float | None) -> bool:
        return bool(lock.acquire(blocking_timeout=timeout))


class PythonRedisLockSession(_ClientSession):
    """python-redis-lock: ``SET NX EX``; waiters ``BLPOP`` one signal list that each release pushes once."""

    def _lock(self) -> Any:
        return redis_lock.Lock(self._client, self._name, expire=TTL)

    def _acquire(self, lock: Any, timeout: float | None) -> bool:
        return bool(lock.acquire(timeout=timeout))


class RawSession:
    """The floor: what any Redis lock with an owner check must at least send, through redis-py's client."""

    def __init__(self, url: str, name: str) -> None:
        self._client = redis.Redis.from_url(url)
        self._key = f"bench:raw:{name}"
        self._release = self._client.register_script(_RELEASE)

    def cycle(self) -> None:
        owner = uuid.uuid4().hex
        if not self._client.set(self._key, owner, nx=True, px=TTL * 1000):
            raise RuntimeError("raw lock key already exists")
        self._release(keys=[self._key], args=[owner])

    def close(self) -> None:
        self._client.close()


SESSIONS: dict[str, Callable[[str, str], Session]] = {
    "raw": RawSession,
    "redis-py": RedisPySession,
    "python-redis-lock": PythonRedisLockSession,
    "distlock": DistlockSession,
}
BLOCKING_SESSIONS: dict[str, Callable[[str, str], BlockingSession]] = {
    "redis-py": RedisPySession,
    "python-redis-lock": PythonRedisLockSession,
    "distlock": DistlockSession,
}


# --- the etcd benchmark's jobs and server, pointed at Redis ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CommandStats(Metrics):
    """Redis's ``INFO commandstats``, in the shape of the etcd benchmark's RPC counters (by command)."""

    def rpcs(self) -> Counter[str]:
        with redis.Redis.from_url(self.url) as client:
            stats = client.info("commandstats")
        counts: Counter[str] = Counter()
        for key, value in stats.items():
            command = key.removeprefix("cmdstat_")
            if not command.startswith(_NOT_LOCK_TRAFFIC):
                counts[command.upper()] = int(value["calls"])
        return counts


class RedisUnderTest(Etcd):
    """The server under test, as the etcd benchmark's orchestration (``_run``) uses it."""

    def __init__(self, url: str, description: str, run_id: str) -> None:
        super().__init__(url, CommandStats(url), description)
        self.run_id = run_id

    def version(self) -> str:
        with redis.Redis.from_url(self.url) as client:
            return str(client.info("server")["redis_version"])

    def revoke_leases(self) -> int:
        """Delete and count this run's keys still on the server: distlock leases and queues, the others' lock
        keys and signal lists (all but distlock's token counters, which are kept by design)."""
        with redis.Redis.from_url(self.url) as client:
            keys = [bytes(k) for k in client.scan_iter(count=1000)]
            left = [k for k in keys if (self.run_id.encode() in k and not k.endswith(b":token")) or b":lease:" in k]
            if left:
                client.delete(*left)
        return len(left)


@dataclasses.dataclass
class RedisLatencyJob(LatencyJob):
    def open(self) -> Sessions:
        sessions = Sessions({})
        try:
            for lock in self.locks:
                session = sessions.by_lock[lock] = SESSIONS[lock](self.url, f"{self.name}-{lock}")
                for _ in range(self.warmup):
                    session.cycle()
        except BaseException:
            sessions.close()
            raise
        return sessions


@dataclasses.dataclass
class RedisContentionJob(ContentionJob):
    def open(self) -> BlockingSession:
        session = BLOCKING_SESSIONS[self.lock](self.url, self.name)
        # Warm up with one acquisition: distlock makes its session lease here, once per client.
        if not session.acquire(timeout=self.acquire_timeout):
            raise RuntimeError(f"warm-up acquire() timed out after {self.acquire_timeout:g} s")
        session.release()
        return session


# --- report ------------------------------------------------------------------------------------------------


def _uncontended_row(u: Uncontended) -> str:
    samples = u.samples
    cells = [
        LABELS[u.result.lock],
        str(len(samples)),
        _ms(u.median),
        _ms(u.p99),
        _ms(max(samples, default=math.nan)),
        f"{u.rpcs_per_acquisition:.2f}",
        _breakdown(u.result.rpcs, len(samples)),
    ]
    return f"| {' | '.join(cells)} |"


def _per_process(c: Contended) -> tuple[int, int]:
    counts = [len(r.seconds) for r in c.outcome.results]
    return min(counts, default=0), max(counts, default=0)


def _contended_row(c: Contended) -> str:
    low, high = _per_process(c)
    samples = c.outcome.samples
    cells = [
        LABELS[c.lock],
        str(c.processes),
        f"{c.rate:.1f}",
        f"{_per(c.outcome.rpcs.total(), c.acquisitions):.2f}",
        _ms(_percentile(samples, 50)),
        _ms(_percentile(samples, 99)),
        f"{low}..{high}",
        f"{low / high:.2f}" if high else NA,
        str(sum(r.failures for r in c.outcome.results)),
        c.exclusion,
        _breakdown(c.outcome.rpcs, c.acquisitions),
        str(c.outcome.leftover_leases),
    ]
    return f"| {' | '.join(cells)} |"


def _targets(processes: list[int], uncontended: list[Uncontended], contended: list[Contended]) -> list[str]:
    """The issue's targets, each with its measured figure and whether it was met."""
    by_lock = {u.result.lock: u for u in uncontended}
    lines = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    if "distlock" in by_lock and "raw" in by_lock:
        floor = _ratio(by_lock["distlock"].median, by_lock["raw"].median)
        lines.append(f"- Uncontended, distlock median ÷ raw floor median: {floor}")
    if "distlock" in by_lock and "redis-py" in by_lock:
        ours, theirs = by_lock["distlock"], by_lock["redis-py"]
        ratio = ours.median / theirs.median if theirs.median else math.nan
        lines.append(
            f"- Target: uncontended within 1.3x of redis-py `Lock`: median {_ratio(ours.median, theirs.median)}, "
            f"p99 {_ratio(ours.p99, theirs.p99)} — {verdict(ratio <= 1.3)}"
        )
    by_run = {(c.lock, c.processes): c for c in contended}
    for n in processes:
        ours_c = by_run.get(("distlock", n))
        if ours_c is None:
            continue
        low, high = _per_process(ours_c)
        fairness = low / high if high else math.nan
        line = f"- {n} processes: distlock fairness {fairness:.2f}"
        if n == max(processes):
            line += f" (target >= 0.8: {verdict(fairness >= 0.8)})"
        theirs_c = by_run.get(("redis-py", n))
        if theirs_c is not None:
            ours_p99 = _percentile(ours_c.outcome.samples, 99)
            theirs_p99 = _percentile(theirs_c.outcome.samples, 99)
            line += f"; wait p99 {_ms(ours_p99)} ms vs redis-py `Lock` {_ms(theirs_p99)} ms"
            if n == max(processes):
                line += f" (target: below: {verdict(ours_p99 < theirs_p99)})"
            line += f"; acquisitions/s {_ratio(ours_c.rate, theirs_c.rate)} of redis-py `Lock`'s"
        lines.append(line)
    return lines


def _machine_lines(server: RedisUnderTest) -> list[str]:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    cpu = _machine(server)[0]  # the etcd benchmark's CPU line; its other lines are about etcd
    return [
        cpu,
        f"- Python {platform.python_version()}, redis-py {version('redis')}, "
        f"python-redis-lock {version('python-redis-lock')}, hiredis {version('hiredis')}, "
        f"distlock {distlock.__version__} ({_checkout()})",
        f"- Redis {server.version()}: {server.description}",
    ]


def render(
    *,
    run: Run,
    machine: list[str],
    args: argparse.Namespace,
    uncontended: list[Uncontended],
    contended: list[Contended],
    errors: list[str],
) -> str:
    lines = [
        MARKERS[0],
        "## Redis locks: distlock, redis-py `Lock`, python-redis-lock",
        "",
        run.when(),
        "",
        *machine,
        run.load_line(),
        "",
        "One run against one redis-server. Every measurement runs in freshly spawned processes, each with its",
        "own client, connected and warmed up (under contention: one acquisition each) before the clock and the",
        "counters start. *Commands* are Redis's `INFO commandstats` calls (a script's own commands count, and so",
        "does the `EVALSHA`; `INFO` and connection set-up do not) divided by the acquisitions. *Keys left* are",
        "keys of the measured locks still on the server after the clients closed (distlock's token counters,",
        "kept by design, aside; python-redis-lock's signal lists expire 1 s after a release); the benchmark",
        "deletes them before the next measurement.",
        "",
        f"### Uncontended acquire + release: {args.rounds} rounds after {args.warmup} warm-up rounds",
        "",
        f"All locks in one process, interleaved in blocks of {RedisLatencyJob.block} rounds (the order rotating",
        "from block to block), so a slow spell of the machine hits them alike; commands are counted between",
        "blocks. distlock: `with client.lock(name, ttl=30): pass`. redis-py: `lock = r.lock(name, timeout=30)`,",
        "`acquire()`, `release()`. python-redis-lock: `Lock(r, name, expire=30)`, `acquire()`, `release()`.",
        "Floor: `SET key id NX PX 30000`, then a registered Lua script deleting the key if it holds the id.",
        "",
        "| Lock | rounds | median ms | p99 ms | max ms | commands / acq. | commands by name / acq. |",
        "|---|---:|---:|---:|---:|---:|---|",
        *(_uncontended_row(u) for u in uncontended),
        "",
        f"### Contention: N processes on one lock name for {args.duration:g} s",
        "",
        "Each process loops acquire -> increment a shared counter that no other lock guards -> release; all",
        "start together at a barrier. Only acquisitions inside the window count; waiters still queued when it",
        "closes get the lock after it. *Wait* is the time spent in `acquire()`, *fairness* the fewest ÷ the",
        "most acquisitions of one process, *exclusion* that the counter equals the acquisitions made.",
        f"`acquire()` has a {args.duration + GRACE / 2:g} s timeout; *failures* are those that returned False.",
        "redis-py's `Lock` polls every 0.1 s (its default), so a process that has just released usually takes",
        "the lock again before any poller looks; python-redis-lock wakes one `BLPOP` per release but keeps no",
        "queue; distlock hands the lock to the longest waiter.",
        "",
        "| Lock | processes | acq./s | commands / acq. | wait p50 ms | wait p99 ms | acq. per process "
        "| fairness | failures | exclusion | commands by name / acq. | keys left |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|---:|",
        *(_contended_row(c) for c in contended),
        "",
        "### Targets and ratios",
        "",
        *_targets(args.processes, uncontended, contended),
    ]
    if errors:
        lines += ["", "### Errors", "", *(f"- {e}" for e in errors)]
    lines.append(MARKERS[1])
    return "\n".join(lines) + "\n"


# --- main -------------------------------------------------------------------------------------------------


@contextmanager
def _server(args: argparse.Namespace, run_id: str) -> Iterator[RedisUnderTest]:
    if args.redis_url:
        yield RedisUnderTest(args.redis_url, "an existing server", run_id)
        return
    # No persistence, as for a Redis used as a cache: fsync (the harness's appendonly=True) would slow every
    # lock's writes alike and measure the disk.
    with RedisServer() as server:
        yield RedisUnderTest(
            server.url, "started by `distlock.testing.RedisServer` on loopback, no persistence", run_id
        )


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser("python -m benchmarks.redis_locks", description=__doc__.split("\n\n")[0])
    add_arguments(parser, list(LABELS), rounds=1000, warmup=100)
    parser.add_argument("--redis-url", help="use this Redis (redis://HOST:PORT/DB) instead of starting one")
    return parse_arguments(parser, argv, list(LABELS))


PLAN = Plan(LABELS, CONTENDERS, RedisLatencyJob, RedisContentionJob, _uncontended_row, _contended_row)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parse_args(argv)
    run = Run.begin("benchmarks.redis_locks", argv)
    run_id = uuid.uuid4().hex[:8]

    with _server(args, run_id) as server:
        machine = _machine_lines(server)
        print("\n".join(machine), flush=True)
        uncontended, contended, errors = measure(multiprocessing.get_context("spawn"), server, args, run_id, PLAN)

    section = render(
        run=run,
        machine=machine,
        args=args,
        uncontended=uncontended,
        contended=contended,
        errors=errors,
    )
    publish(args.out, section, MARKERS)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
