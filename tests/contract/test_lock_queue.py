"""Queue behaviour on each backend: first come first served, one wake-up per release, exact counts under
multi-process contention."""

from __future__ import annotations

import functools
import multiprocessing
import threading
from pathlib import Path

import pytest
from _support import POLLING, LockServer, queue_and_record, queued, wait_until

import distlock

pytestmark = pytest.mark.every_database


def _hold_once(client: distlock.Client, name: str) -> None:
    # A lease far longer than the test: no keep-alive, and no waiter's look at whether the one ahead has expired,
    # falls among the requests counted.
    with client.lock(name, ttl=120, timeout=60):
        pass


def test_waiters_acquire_in_arrival_order(client: distlock.Client, lock_name: str) -> None:
    order = queue_and_record(client, lock_name, 8)
    assert order == list(range(8))


# Requests per acquisition that a hand-over may cost at most (see the comment in the test).
REQUEST_BOUND = {"etcd": 4, "redis": 14, "zookeeper": 4, "sqltable": 11}


def test_a_release_wakes_only_the_next_waiter(lock_server: LockServer, lock_name: str) -> None:
    """Requests per acquisition (etcd RPCs from etcd's own /metrics; Redis commands from INFO commandstats) do not
    grow with the number of waiters."""
    if lock_server.kind in POLLING:
        pytest.skip("the SQL lock table on MariaDB and SQLite polls (no notifications): its reads grow with waiters")
    per_acquisition: dict[int, float] = {}
    with distlock.connect(lock_server.url) as client:
        for count in (2, 16):
            name = f"{lock_name}/{count}"
            holder = client.lock(name, ttl=120)
            assert holder.acquire()
            threads = []
            for i in range(count):
                thread = threading.Thread(target=_hold_once, args=(client, name))
                thread.start()
                threads.append(thread)
                wait_until(functools.partial(queued, client, name, i + 1), 10, f"waiter {i} to queue")
            before = lock_server.requests()
            holder.release()
            for thread in threads:
                thread.join(60)
            per_acquisition[count] = (lock_server.requests() - before) / count
    # Each hand-over costs the releaser's delete, the woken waiter's queue read, and its release; a thundering herd
    # would make every waiter read on every release (~count/2 reads per acquisition). On Redis the delete is one
    # script of 8 commands and the read one of 2, and each EVALSHA counts too: 12 per hand-over. The SQL lock table on
    # PostgreSQL counts statements: the release's BEGIN, DELETE, SELECT (is anyone left, else the name's row goes),
    # NOTIFY, COMMIT, the woken waiter's UNLISTEN and its read's BEGIN, SELECT, COMMIT: 9, and the run's own few
    # statements (9.5 measured); the bound leaves room for a stray look on a loaded machine (one is 3/16), where a herd
    # would add ~count/2 reads of 3 statements each.
    print(f"{lock_server.kind} requests per acquisition: {per_acquisition}")
    assert per_acquisition[16] <= per_acquisition[2] + 0.5, per_acquisition
    assert per_acquisition[16] <= REQUEST_BOUND[lock_server.family], per_acquisition


def _increment(url: str, name: str, path: str, rounds: int, barrier: object) -> None:
    sync: threading.Barrier = barrier  # type: ignore[assignment]
    with distlock.connect(url) as client:
        lock = client.lock(name, ttl=10, timeout=120)
        sync.wait()
        for _ in range(rounds):
            with lock:
                counter = Path(path)
                value = int(counter.read_text())
                counter.write_text(str(value + 1))


@pytest.mark.real_server
def test_eight_processes_increment_a_counter_exactly(backend_url: str, lock_name: str, tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    counter.write_text("0")
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(8)
    processes = [
        context.Process(target=_increment, args=(backend_url, lock_name, str(counter), 25, barrier)) for _ in range(8)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(180)
        assert process.exitcode == 0
    assert int(counter.read_text()) == 8 * 25
