"""What one lock costs Redis, counted by the server itself (``INFO commandstats``: every command a script runs
counts, and so does the script call): an uncontended acquire + release, and a hand-over to a waiter that needs no
read after its wake-up. Counts, not timings; each test has a private redis-server."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from _support import wait_until, waiters

import distlock
from benchmarks.redis_locks import CommandStats
from distlock.testing import RedisServer


def _commands(server: RedisServer) -> Counter[str]:
    """The server's commands so far, by name (the Redis benchmark's count: set-up and ``INFO`` left out)."""
    return CommandStats(server.url).requests()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_an_uncontended_acquire_and_release_sends_at_most_ten_commands(server: RedisServer) -> None:
    """The join: PTTL of our lease, TIME, ZRANGE, ZADD, PEXPIRE (the lock's keys expire); the release: ZRANGE, TIME
    (is the last token behind the clock?), DEL (the lock's last entry takes every key of the lock with it)."""
    with distlock.connect(server.url) as client:
        with client.lock("counted", ttl=30):  # the lease, the scripts' first load
            pass
        before = _commands(server)
        with client.lock("counted", ttl=30) as lock:
            assert lock.owned()
        sent = _commands(server) - before
    assert sum(sent.values()) <= 10, dict(sent)
    assert sent["EVALSHA"] == 2, dict(sent)  # one script to join, one to leave


def test_a_waiter_handed_the_lock_holds_it_without_another_read(server: RedisServer) -> None:
    """The holder's release script tells the waiter just behind it that it now holds the lock: between the release
    and the waiter holding, no script runs but the release (the waiter used to read its place once more)."""
    with distlock.connect(server.url) as first, distlock.connect(server.url) as second:
        for client in (first, second):
            with client.lock("warm-up", ttl=30):  # the scripts loaded, the leases granted
                pass
        holder = first.lock("handed", ttl=30)
        assert holder.acquire()
        waiter = second.lock("handed", ttl=30)
        got = threading.Event()

        def wait() -> None:
            if waiter.acquire(timeout=30):
                got.set()

        thread = threading.Thread(target=wait)
        thread.start()
        wait_until(lambda: waiters(first, "handed") == 1, 10, "the waiter to queue")
        before = _commands(server)
        holder.release()
        thread.join(30)
        assert got.is_set() and waiter.owned()
        sent = _commands(server) - before
        waiter.release()
    assert sent["EVALSHA"] + sent["EVAL"] == 1, dict(sent)
