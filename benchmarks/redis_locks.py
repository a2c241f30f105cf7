"""Benchmark distlock's Redis lock against redis-py's ``Lock``, python-redis-lock and a two-command floor.

One run against one redis-server (started here by :class:`distlock.testing.RedisServer`, or an existing one given
by ``--redis-url``) measures, with the machinery of :mod:`benchmarks._harness.processes` (spawned processes, barriers,
interleaved latency blocks, bounded waits):

* **uncontended** acquire + release latency (median, p99) and Redis commands per acquisition, for distlock,
  redis-py's ``Lock``, python-redis-lock's ``Lock``, and the floor: ``SET key id NX PX`` and a Lua
  compare-and-delete, with no library around them;
* **contention**: N processes loop acquire -> tiny critical section -> release on one lock name for a fixed
  time: acquisitions/s, commands per acquisition, wait percentiles, per-process fairness (fewest / most).

Commands are Redis's own counters (``INFO commandstats``): every command a script runs counts, as does the
script call itself; ``INFO`` and connection set-up (``HELLO``, ``CLIENT ...``) do not. Results are printed and
written into ``docs/BENCHMARKS.md`` between the ``redis-locks`` markers; the rest of that file is left alone.

What can go wrong is bounded by the harness: a process that fails or hangs is killed a grace period after its
window and reported as an error in the section, and the run then exits with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
import redis_lock  # type: ignore[import-untyped]

from benchmarks._harness.figures import ms, percentile, ratio, verdict
from benchmarks._harness.locks import TTL, DistlockSession, LockSession, Plan
from benchmarks._harness.processes import BLOCK, GRACE, lock_benchmark
from benchmarks._harness.report import errors_lines, section
from benchmarks._harness.results import LockResults, contended_table, uncontended_table
from benchmarks._harness.run import Run, add_lock_arguments, parse_lock_arguments, summary
from benchmarks._harness.servers import ServerUnderTest
from distlock.testing import RedisServer

NAME = "redis-locks"
PACKAGES = {"redis-py": "redis", "python-redis-lock": "python-redis-lock", "hiredis": "hiredis"}
LABELS = {
    "raw": "raw `SET NX PX` + Lua delete (floor)",
    "redis-py": "redis-py `Lock`",
    "python-redis-lock": "python-redis-lock `Lock`",
    "distlock": "distlock (Redis)",
}
#: Commands that are not lock traffic: the counting itself and connection set-up.
_NOT_LOCK_TRAFFIC = ("info", "hello", "auth", "select", "client|")
#: What the Redis lock aims at: commands per uncontended acquire + release, and under contention acquisitions/s as a
#: share of redis-py `Lock`'s while every process still gets its turn.
_COMMANDS_TARGET = 8
_RATE_TARGET = 0.8
_FAIRNESS_TARGET = 0.9
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


# --- the four locks, each used the way an application would ------------------------------------------------


class _ClientSession(LockSession):
    """A redis-py client and a Redis lock library on it."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__()
        self._client = redis.Redis.from_url(url)
        self._name = name

    def close(self) -> None:
        self._client.close()


class RedisPySession(_ClientSession):
    """redis-py's ``Lock``: ``SET NX PX``; a waiter polls every 0.1 s (its default ``sleep``)."""

    def new_lock(self) -> Any:
        return self._client.lock(self._name, timeout=TTL)

    def take(self, lock: Any, timeout: float | None) -> bool:
        return bool(lock.acquire(blocking_timeout=timeout))


class PythonRedisLockSession(_ClientSession):
    """python-redis-lock: ``SET NX EX``; waiters ``BLPOP`` one signal list that each release pushes once."""

    def new_lock(self) -> Any:
        return redis_lock.Lock(self._client, self._name, expire=TTL)

    def take(self, lock: Any, timeout: float | None) -> bool:
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


PLAN = Plan(
    LABELS,
    sessions={
        "raw": RawSession,
        "redis-py": RedisPySession,
        "python-redis-lock": PythonRedisLockSession,
        "distlock": DistlockSession,
    },
    contenders={"redis-py": RedisPySession, "python-redis-lock": PythonRedisLockSession, "distlock": DistlockSession},
)


# --- the server and its counters ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CommandStats:
    """Redis's ``INFO commandstats``: the commands received so far, by name (the harness's ``Counters``)."""

    url: str

    def requests(self) -> Counter[str]:
        with redis.Redis.from_url(self.url) as client:
            stats = client.info("commandstats")
        counts: Counter[str] = Counter()
        for key, value in stats.items():
            command = key.removeprefix("cmdstat_")
            if not command.startswith(_NOT_LOCK_TRAFFIC):
                counts[command.upper()] = int(value["calls"])
        return counts


class RedisUnderTest(ServerUnderTest):
    """A redis-server, its lock traffic counted by ``INFO commandstats``."""

    product = "Redis"

    def __init__(self, url: str, description: str, run_id: str) -> None:
        super().__init__(url, CommandStats(url), description)
        self.run_id = run_id

    def version(self) -> str:
        with redis.Redis.from_url(self.url) as client:
            return str(client.info("server")["redis_version"])

    def remove_leftovers(self) -> int:
        """Delete and count this run's keys still on the server: distlock leases and lock keys, the others' lock
        keys and signal lists. A distlock lock's keys go with its last entry (but for a queue whose last token is
        ahead of the server clock, which expires when the clock passes it), so those left belong to holders or
        waiters that did not leave: none is kept by design any more."""
        with redis.Redis.from_url(self.url) as client:
            keys = [bytes(k) for k in client.scan_iter(count=1000)]
            left = [k for k in keys if self.run_id.encode() in k or b":lease:" in k]
            if left:
                client.delete(*left)
        return len(left)


# --- report ------------------------------------------------------------------------------------------------


def _targets(processes: list[int], results: LockResults) -> list[str]:
    """The issue's targets, each with its measured figure and whether it was met."""
    by_lock = results.uncontended_by_lock
    lines = results.floor_lines()
    if "distlock" in by_lock:
        commands = by_lock["distlock"].requests_per_acquisition
        beside = (
            f" (redis-py `Lock`: {by_lock['redis-py'].requests_per_acquisition:.2f})" if "redis-py" in by_lock else ""
        )
        lines.append(
            f"- Target: Redis commands per uncontended acquire + release <= {_COMMANDS_TARGET}: distlock "
            f"{commands:.2f}{beside} — {verdict(commands <= _COMMANDS_TARGET)}"
        )
    if "distlock" in by_lock and "redis-py" in by_lock:
        ours, theirs = by_lock["distlock"], by_lock["redis-py"]
        within = ours.median / theirs.median if theirs.median else math.nan
        lines.append(
            f"- Target: uncontended within 1.3x of redis-py `Lock`: median {ratio(ours.median, theirs.median)}, "
            f"p99 {ratio(ours.p99, theirs.p99)} — {verdict(within <= 1.3)}"
        )
    by_run = {(c.lock, c.processes): c for c in results.contended}
    for n in processes:
        ours_c = by_run.get(("distlock", n))
        if ours_c is None:
            continue
        line = f"- {n} processes: distlock fairness {ours_c.fairness:.2f}"
        if n == max(processes):
            line += f" (target >= 0.8: {verdict(ours_c.fairness >= 0.8)})"
        theirs_c = by_run.get(("redis-py", n))
        if theirs_c is not None:
            ours_p99 = percentile(ours_c.outcome.samples, 99)
            theirs_p99 = percentile(theirs_c.outcome.samples, 99)
            line += f"; wait p99 {ms(ours_p99)} ms vs redis-py `Lock` {ms(theirs_p99)} ms"
            if n == max(processes):
                line += f" (target: below: {verdict(ours_p99 < theirs_p99)})"
            line += f"; acquisitions/s {ratio(ours_c.rate, theirs_c.rate)} of redis-py `Lock`'s"
            met = ours_c.rate >= _RATE_TARGET * theirs_c.rate and ours_c.fairness >= _FAIRNESS_TARGET
            line += f" (target >= {_RATE_TARGET:g}x with fairness >= {_FAIRNESS_TARGET:g}: {verdict(met)})"
        lines.append(line)
    return lines


def render(run: Run, machine: list[str], args: argparse.Namespace, results: LockResults) -> str:
    lines = [
        *run.heading("## Redis locks: distlock, redis-py `Lock`, python-redis-lock", machine),
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
        f"All locks in one process, interleaved in blocks of {BLOCK} rounds (the order rotating",
        "from block to block), so a slow spell of the machine hits them alike; commands are counted between",
        "blocks. distlock: `with client.lock(name, ttl=30): pass`. redis-py: `lock = r.lock(name, timeout=30)`,",
        "`acquire()`, `release()`. python-redis-lock: `Lock(r, name, expire=30)`, `acquire()`, `release()`.",
        "Floor: `SET key id NX PX 30000`, then a registered Lua script deleting the key if it holds the id.",
        "",
        *uncontended_table(LABELS, results.uncontended, "commands", "name"),
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
        *contended_table(LABELS, results.contended, "commands", "name", "keys left"),
        "",
        "### Targets and ratios",
        "",
        *_targets(args.processes, results),
        *errors_lines(results.errors),
    ]
    return section(NAME, lines)


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


def _parse_args(run: Run) -> argparse.Namespace:
    parser = argparse.ArgumentParser(run.prog, description=summary(__doc__))
    add_lock_arguments(parser, list(LABELS), rounds=1000, warmup=100)
    parser.add_argument("--redis-url", help="use this Redis (redis://HOST:PORT/DB) instead of starting one")
    return parse_lock_arguments(parser, run, list(LABELS))


def main(argv: Sequence[str] | None = None) -> int:
    run = Run.begin("benchmarks.redis_locks", argv)
    args = _parse_args(run)
    return lock_benchmark(run, args, _server(args, run.id), PACKAGES, PLAN, NAME, render)


if __name__ == "__main__":
    sys.exit(main())
