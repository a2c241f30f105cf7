"""Read/write locks on each backend: readers hold together, a writer alone; FIFO between them, so a writer waits for
the readers ahead of it only; writers' tokens fence writes; and across processes no writer overlaps any holder."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest
from _support import wait_until
from test_semaphore import TTL, holds, most_at_once, slotworker, start_workers, stop_workers

import distlock

pytestmark = pytest.mark.every_database


def _state(client: distlock.Client, name: str) -> distlock.LockState | None:
    return next((state for state in client.inspect() if state.name == name), None)


def test_readers_hold_together_and_a_writer_alone(client: distlock.Client, lock_name: str) -> None:
    rw = client.rwlock(lock_name, ttl=10, timeout=0)
    readers = [rw.read() for _ in range(3)]
    # Three threads meet at a barrier while each holds a read: they can only meet if they hold at once.
    barrier = threading.Barrier(3, timeout=10)
    results: list[bool] = []

    def read(reader: distlock.Lock) -> None:
        with reader:
            barrier.wait()
            results.append(True)

    threads = [threading.Thread(target=read, args=(reader,)) for reader in readers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert results == [True] * 3, "three readers did not hold at once"
    with rw.read(), rw.read():
        state = _state(client, lock_name)
        assert state is not None and len(state.holders) == 2
        assert not rw.write().acquire(timeout=0), "a writer held beside readers"
    writer = rw.write()
    assert writer.acquire(timeout=0)
    assert not rw.read().acquire(timeout=0), "a reader held beside a writer"
    assert not rw.write().acquire(timeout=0), "two writers held at once"
    writer.release()


def _acquire_then_set(lock: distlock.Lock, event: threading.Event) -> None:
    if lock.acquire():
        event.set()


def test_a_reader_that_comes_after_a_waiting_writer_waits_behind_it(client: distlock.Client, lock_name: str) -> None:
    rw = client.rwlock(lock_name, ttl=10, timeout=30)
    first = rw.read()
    assert first.acquire()
    writer, late = rw.write(), rw.read()
    wrote, read = threading.Event(), threading.Event()
    threading.Thread(target=_acquire_then_set, args=(writer, wrote)).start()
    wait_until(lambda: len(getattr(_state(client, lock_name), "waiters", ())) == 1, 10, "the writer to queue")
    assert not late.acquire(timeout=0), "a reader overtook a waiting writer"
    threading.Thread(target=_acquire_then_set, args=(late, read)).start()
    wait_until(lambda: len(getattr(_state(client, lock_name), "waiters", ())) == 2, 10, "the late reader to queue")
    first.release()
    assert wrote.wait(10), "the writer did not get the lock when the reader ahead of it left"
    state = _state(client, lock_name)
    assert state is not None and [h.token for h in state.holders] == [writer.token]
    assert not read.is_set()
    late_token_ahead = writer.token
    writer.release()
    assert read.wait(10)
    assert late.token > late_token_ahead
    late.release()


def test_a_writer_waits_for_one_generation_of_a_steady_stream_of_readers(
    client: distlock.Client, lock_name: str
) -> None:
    rw = client.rwlock(lock_name, ttl=10, timeout=30)
    log: list[tuple[str, int]] = []
    mutex = threading.Lock()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            with rw.read() as lock:
                with mutex:
                    log.append(("enter", lock.token))
                with mutex:
                    log.append(("exit", lock.token))

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for thread in readers:
        thread.start()
    wait_until(lambda: len(log) > 20, 20, "the readers to get going")
    writer = rw.write()
    try:
        assert writer.acquire(), "a writer starved behind a stream of readers"
        token = writer.token
        with mutex:
            log.append(("writer", token))
        writer.release()
    finally:
        stop.set()
        for thread in readers:
            thread.join(30)
    at = log.index(("writer", token))
    # Readers that queued after the writer (larger tokens) entered only once the writer was done.
    assert all(ahead < token for what, ahead in log[:at] if what == "enter")
    # While the writer held, no reader did: every reader that entered before it had left.
    entered = {token for what, token in log[:at] if what == "enter"}
    left = {token for what, token in log[:at] if what == "exit"}
    assert entered == left


def test_writers_tokens_fence_writes(client: distlock.Client, lock_name: str, tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "rows.db", isolation_level=None)
    db.execute("CREATE TABLE row (id INTEGER PRIMARY KEY, value INTEGER, fence INTEGER)")
    db.execute("INSERT INTO row VALUES (1, 0, 0)")

    def claim(token: int) -> bool:
        return db.execute("UPDATE row SET fence = ? WHERE id = 1 AND fence <= ?", (token, token)).rowcount == 1

    def write(token: int, value: int) -> bool:
        return db.execute("UPDATE row SET value = ? WHERE id = 1 AND fence = ?", (value, token)).rowcount == 1

    rw = client.rwlock(lock_name, ttl=10, timeout=10)
    stale = rw.write()
    assert stale.acquire()
    assert claim(stale.token)
    # The stale writer's hold ends behind its back (an operator's force release; a pause past its lease alike).
    assert client.force_release(lock_name, stale.token)
    with rw.write() as fresh:
        assert fresh.token > stale.token
        assert claim(fresh.token)
        assert not write(stale.token, 1), "the stale writer's write was accepted"
        assert write(fresh.token, 2)
    assert db.execute("SELECT value FROM row").fetchone()[0] == 2
    with pytest.raises(distlock.LockLost):
        stale.release()


def test_async_rwlock(client: distlock.Client, lock_name: str) -> None:
    async def run() -> None:
        rw = client.async_rwlock(lock_name, ttl=10, timeout=0)
        async with rw.read() as first, rw.read() as second:
            assert first.token < second.token
            assert not await rw.write().acquire()
        async with rw.write():
            assert not await rw.read().acquire()

    asyncio.run(run())


@pytest.mark.real_server
def test_no_writer_overlaps_any_holder_across_processes(backend_url: str, lock_name: str, tmp_path: Path) -> None:
    db_path = str(tmp_path / "log.db")
    slotworker.setup(db_path)
    db = sqlite3.connect(db_path, timeout=60, isolation_level=None)

    def reader_spans() -> list[tuple[float, float, int, int]]:
        writers = {token for (token,) in db.execute("SELECT token FROM acks")}
        return [span for span in holds(db, {}, unexpired_after_signal=TTL / 2) if span[2] not in writers]

    # The readers start alone, until two of them have held at once across processes; the writers join after. (With
    # all six started together, whether readers ever meet depends on the order the processes reach the FIFO queue:
    # readers that each arrive between two writers hold alone, as they should.)
    processes = start_workers(backend_url, db_path, lock_name, ["r", "r", "r", "r"])
    try:
        wait_until(lambda: most_at_once(reader_spans())[0] > 1, 120, "two reader processes to hold at once")
        processes += start_workers(backend_url, db_path, lock_name, ["w", "w"])
        wait_until(
            lambda: db.execute("SELECT COUNT(DISTINCT pid) FROM events WHERE what = 'enter'").fetchone()[0] == 6,
            120,
            "every process to hold once",
        )
        wait_until(lambda: db.execute("SELECT COUNT(*) FROM acks").fetchone()[0] >= 50, 120, "50 writes")
    finally:
        stop_workers(db_path, processes)
    spans = holds(db, {}, unexpired_after_signal=TTL / 2)
    writers = {token for (token,) in db.execute("SELECT token FROM acks")}
    for start, end, token, _ in spans:
        if token in writers:
            overlapping = [t for s, e, t, _ in spans if t != token and s < end and start < e]
            assert not overlapping, f"writer {token} overlapped holds {overlapping}"
    value = db.execute("SELECT value FROM counter").fetchone()[0]
    acks = [v for (v,) in db.execute("SELECT value FROM acks ORDER BY value")]
    assert acks == list(range(1, value + 1)), "an acknowledged fenced write is missing"
