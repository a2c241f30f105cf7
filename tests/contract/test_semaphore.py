"""Semaphores on each backend: at most ``limit`` holders, FIFO, a token per holder; a name keeps one kind; waiters
time out and are cancelled like a lock's; and, across processes frozen and killed, never more than ``limit``
unexpired holders with every acknowledged fenced write present."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _support import Worker, acquire_in_background, child_env, load_module, wait_until

import distlock

pytestmark = pytest.mark.every_database


def _holders(client: distlock.Client, name: str) -> list[int]:
    return [entry.token for state in client.inspect() if state.name == name for entry in state.holders]


def test_limit_holders_at_once_then_fifo(client: distlock.Client, lock_name: str) -> None:
    slots = [client.semaphore(lock_name, limit=3, ttl=10) for _ in range(3)]
    for slot in slots:
        assert slot.acquire(timeout=0)
    tokens = [slot.token for slot in slots]
    assert tokens == sorted(set(tokens))
    assert _holders(client, lock_name) == tokens
    fourth = client.semaphore(lock_name, limit=3, ttl=10)
    assert not fourth.acquire(timeout=0), "a fourth holder of a semaphore of limit 3"
    got = threading.Event()

    def wait() -> None:
        if fourth.acquire(timeout=30):
            got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: len(client.inspect()[0].waiters) == 1 if client.inspect() else False, 10, "the fourth to queue")
    assert not got.is_set()
    slots[1].release()
    thread.join(30)
    assert got.is_set(), "a released slot did not go to the waiter"
    assert fourth.token > max(tokens)
    assert _holders(client, lock_name) == [tokens[0], tokens[2], fourth.token]
    for slot in (slots[0], slots[2], fourth):
        slot.release()
    assert client.holder(lock_name) is None


def test_a_name_keeps_one_kind(client: distlock.Client, lock_name: str) -> None:
    with client.semaphore(lock_name, limit=3, timeout=0):
        with pytest.raises(distlock.LockKindMismatch, match="semaphore of limit 3"):
            client.semaphore(lock_name, limit=2, timeout=0).acquire()
        with pytest.raises(distlock.LockKindMismatch):
            client.lock(lock_name, timeout=0).acquire()
        with pytest.raises(distlock.LockKindMismatch):
            client.rwlock(lock_name, timeout=0).read().acquire()
        # The refused joins left nothing behind: the slots are still there for the semaphore.
        with client.semaphore(lock_name, limit=3, timeout=0), client.semaphore(lock_name, limit=3, timeout=0):
            pass
    with client.lock(lock_name, timeout=0), pytest.raises(distlock.LockKindMismatch, match="in use as a lock"):
        client.semaphore(lock_name, limit=3, timeout=0).acquire()


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "3", 10_001])
def test_a_bad_limit_is_refused_where_it_is_given(client: distlock.Client, lock_name: str, limit: object) -> None:
    with pytest.raises(distlock.ConfigurationError, match="limit"):
        client.semaphore(lock_name, limit=limit)  # type: ignore[arg-type]


def test_a_waiter_times_out_and_leaves_the_queue(client: distlock.Client, lock_name: str) -> None:
    holder = client.semaphore(lock_name, limit=2, ttl=10)
    other = client.semaphore(lock_name, limit=2, ttl=10)
    assert holder.acquire() and other.acquire()
    waiter = client.semaphore(lock_name, limit=2, ttl=10)
    assert not waiter.acquire(timeout=0.3)
    state = next(s for s in client.inspect() if s.name == lock_name)
    assert state.waiters == ()
    holder.release()
    other.release()


def test_a_cancelled_async_waiter_leaves_the_queue(client: distlock.Client, lock_name: str) -> None:
    asyncio.run(_cancel_a_waiter(client, lock_name))


async def _cancel_a_waiter(client: distlock.Client, lock_name: str) -> None:
    held = [client.async_semaphore(lock_name, limit=2, ttl=10) for _ in range(2)]
    for slot in held:
        assert await slot.acquire()
    waiter = client.async_semaphore(lock_name, limit=2, ttl=10)
    task = asyncio.ensure_future(waiter.acquire(timeout=30))
    await asyncio.to_thread(
        wait_until, lambda: any(s.waiters for s in client.inspect() if s.name == lock_name), 10, "the waiter to queue"
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = next(s for s in client.inspect() if s.name == lock_name)
    assert state.waiters == ()
    assert [h.token for h in state.holders] == [slot.token for slot in held]
    for slot in held:
        await slot.release()


TTL = 2  # etcd's smallest lease with its default election timeout


@pytest.mark.real_server
def test_a_killed_holders_slot_frees_within_its_ttl(client: distlock.Client, backend_url: str, lock_name: str) -> None:
    worker = Worker(backend_url)
    try:
        assert worker.call(op="acquire", name=lock_name, ttl=TTL, limit=2)["acquired"]
        with client.semaphore(lock_name, limit=2, ttl=TTL):
            waiter = client.semaphore(lock_name, limit=2, ttl=TTL)
            thread, got = acquire_in_background(waiter, lambda: _waiting(client, lock_name) == 1, "our waiter to queue")
            killed_at = time.monotonic()
            worker.kill()
            thread.join(30)
            assert got, "the killed holder's slot never freed"
            assert got[0] - killed_at <= TTL + 1, f"took {got[0] - killed_at:.2f} s"
            waiter.release()
    finally:
        worker.close()


def _waiting(client: distlock.Client, name: str) -> int:
    return sum(len(state.waiters) for state in client.inspect() if state.name == name)


SLOTWORKER = Path(__file__).with_name("slotworker.py")
slotworker = load_module("slotworker", SLOTWORKER)


def start_workers(url: str, db: str, name: str, kinds: list[str]) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, str(SLOTWORKER), url, db, name, kind, str(TTL)], env=child_env())
        for kind in kinds
    ]


def stop_workers(db: str, processes: list[subprocess.Popen[bytes]]) -> None:
    Path(db + ".stop").touch()
    for process in processes:
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGCONT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def holds(
    db: sqlite3.Connection, signals: dict[int, list[float]], unexpired_after_signal: float
) -> list[tuple[float, float, int, int]]:
    """Every hold in the log as (start, end, token, pid): from its ``enter`` to its ``exit``, or, for a holder frozen
    or killed meanwhile (``signals``: when, by pid), to the signal plus ``unexpired_after_signal`` (a time its lease
    certainly outlived: it was refreshed at most a third of its TTL before the signal) when that comes first."""
    events = db.execute("SELECT pid, token, what, at FROM events ORDER BY at").fetchall()
    entered: dict[tuple[int, int], float] = {}
    result = []
    for pid, token, what, at in events:
        if what == "enter":
            entered[pid, token] = at
        elif what == "exit":
            start = entered.pop((pid, token))
            end = min([at, *(s + unexpired_after_signal for s in signals.get(pid, []) if start <= s <= at)])
            result.append((start, end, token, pid))
    for (pid, token), start in entered.items():  # killed holders never log their exit
        end = min([math.inf, *(s + unexpired_after_signal for s in signals.get(pid, []) if start <= s)])
        result.append((start, end, token, pid))
    return result


def most_at_once(spans: list[tuple[float, float, int, int]]) -> tuple[int, list[int]]:
    """The most holds that covered one moment, and their tokens."""
    # A sweep over the starts and ends in time order (an end before a start at the same moment).
    edges = sorted([(s, 1, token) for s, _, token, _ in spans] + [(e, 0, token) for _, e, token, _ in spans])
    active: set[int] = set()
    best: tuple[int, list[int]] = (0, [])
    for _, starts, token in edges:
        if starts:
            active.add(token)
            if len(active) > best[0]:
                best = (len(active), sorted(active))
        else:
            active.discard(token)
    return best


@pytest.mark.real_server
def test_many_processes_on_limit_three_under_stop_and_kill(backend_url: str, lock_name: str, tmp_path: Path) -> None:
    """Twelve processes contend for three slots (six on SQLite: its writers wait in SQLite's busy handler, which serves
    them in no particular order, and on a loaded CI machine one of twelve once waited over two minutes to join the
    queue at all; docs/operations/sql-table.md says so)."""
    on_sqlite = backend_url.startswith("sql+sqlite")
    db_path = str(tmp_path / "log.db")
    slotworker.setup(db_path)
    processes = start_workers(backend_url, db_path, lock_name, ["s3"] * (6 if on_sqlite else 12))
    first = [p.pid for p in processes]
    db = sqlite3.connect(db_path, timeout=60, isolation_level=None)
    signalled: dict[int, list[float]] = {}

    def entered() -> set[int]:
        return {pid for (pid,) in db.execute("SELECT DISTINCT pid FROM events WHERE what = 'enter'")}

    def holding_now() -> list[int]:
        recent = "SELECT pid, what FROM events WHERE rowid > (SELECT MAX(rowid) - 100 FROM events) ORDER BY rowid"
        state = dict(db.execute(recent).fetchall())
        return [pid for pid, what in state.items() if what == "enter" and pid not in signalled]

    try:
        wait_until(lambda: entered() >= set(first), 120, "every process to hold the semaphore once")
        # Fairness first, while every process runs: a window of a few seconds of FIFO turns.
        window_start = time.monotonic()
        time.sleep(8)
        window_end = time.monotonic()
        faults = 0
        deadline = time.monotonic() + 120
        while faults < 3:  # a holder frozen past its lease, another, then one killed
            assert time.monotonic() < deadline, "no holder to freeze or kill for two minutes"
            victims = [pid for pid in holding_now() if any(p.pid == pid and p.poll() is None for p in processes)]
            if not victims:
                time.sleep(0.02)
                continue
            pid = victims[0]
            kill = faults % 3 == 2
            faults += 1
            # (Kept here, not in the database: a holder frozen mid-transaction holds SQLite's write lock.)
            os.kill(pid, signal.SIGKILL if kill else signal.SIGSTOP)
            signalled.setdefault(pid, []).append(time.monotonic())
            if kill:
                processes.extend(start_workers(backend_url, db_path, lock_name, ["s3"]))
            else:
                time.sleep(TTL + 1)  # frozen past its lease: its slot goes to a waiter meanwhile
                os.kill(pid, signal.SIGCONT)
    finally:
        stop_workers(db_path, processes)
    spans = holds(db, signalled, unexpired_after_signal=TTL / 2)
    count, tokens = most_at_once(spans)
    assert count <= 3, f"{count} unexpired holders at once, tokens {tokens}"
    assert count == 3, "the semaphore never had three holders at once"
    assert len({token for _, _, token, _ in spans}) == len(spans), "two holds with one token"
    value = db.execute("SELECT value FROM counter").fetchone()[0]
    acks = db.execute("SELECT value FROM acks ORDER BY value").fetchall()
    assert [v for (v,) in acks] == list(range(1, value + 1)), "an acknowledged fenced write is missing"
    assert value > 0
    counts = [
        db.execute(
            "SELECT COUNT(*) FROM events WHERE pid = ? AND what = 'enter' AND at BETWEEN ? AND ?",
            (pid, window_start, window_end),
        ).fetchone()[0]
        for pid in first
    ]
    if on_sqlite:
        # The queue is FIFO, but the order in which the processes get into it is SQLite's: a writer waits for the
        # file's write lock in SQLite's busy handler, which sleeps longer the longer it waited, so newcomers win
        # (fairness measured 0.84 to 0.96 here). Safety above holds all the same.
        return
    # FIFO turns give each process the same count, give or take the turns a process loses when the machine schedules
    # it late to rejoin the queue (or it waits for the log database's write lock): 0.88-1.0 measured on a loaded
    # two-core machine, 0.72 in a CI run with three suites on two cores. A queue that lets newcomers or the fastest
    # process win starves some (well under 0.5).
    assert min(counts) / max(counts) >= 0.6, f"acquisitions per process {counts}"
