"""What the Redis backend adds to the backend-neutral lock suite: tokens across restarts with and without the
append-only file, what Redis keeps between locks, waiters that block instead of polling, and leases that vanish
behind a client's back; a semaphore of one. Real redis-servers; SIGKILL for crashes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from _support import Worker, acquire_in_background, wait_until, waiters

import distlock
from distlock.testing import RedisServer


def _queue(observer: distlock.Client, waiter: distlock.Lock, waiting: int) -> tuple[threading.Thread, list[float]]:
    """Start ``waiter.acquire()`` on a thread; return it once ``waiting`` waiters are queued (see
    ``acquire_in_background``)."""
    return acquire_in_background(
        waiter, lambda: waiters(observer, waiter.name) == waiting, f"{waiting} waiter(s) to queue"
    )


def _tokens(url: str, name: str, holders: int) -> list[int]:
    tokens = []
    with distlock.connect(url, request_timeout=20) as client:
        for _ in range(holders):
            with client.lock(name, ttl=5) as lock:
                tokens.append(lock.token)
    return tokens


def test_tokens_strictly_increase_across_a_crash_with_the_append_only_file(
    redis_server: RedisServer, lock_name: str
) -> None:
    assert redis_server.appendonly
    before = _tokens(redis_server.url, lock_name, 3)
    redis_server.kill()  # SIGKILL: only what the append-only file holds comes back
    redis_server.start()
    after = _tokens(redis_server.url, lock_name, 3)
    assert before + after == sorted(set(before + after)), (before, after)


@pytest.fixture
def redis_without_persistence() -> Iterator[RedisServer]:
    with RedisServer(appendonly=False) as server:
        yield server


def test_tokens_still_increase_when_a_restart_loses_the_counter(
    redis_without_persistence: RedisServer, lock_name: str
) -> None:
    """Without persistence the restarted Redis is empty, the counter included: the server clock in the token
    (max(counter + 1, microseconds)) is what keeps the next token above the last one."""
    server = redis_without_persistence
    before = _tokens(server.url, lock_name, 3)
    server.kill()
    server.start()
    with server.client() as admin:
        assert admin.dbsize() == 0, "the restarted server kept data: this test shows nothing"
    after = _tokens(server.url, lock_name, 3)
    assert before + after == sorted(set(before + after)), (before, after)


def test_nothing_outlives_the_locks(redis_server: RedisServer, lock_name: str) -> None:
    """The last entry to leave takes the lock's keys with it, its token counter too (the clock floor keeps the
    next token above it), and a closed client's lease key goes with the client."""
    with distlock.connect(redis_server.url) as client:
        holder = client.lock(lock_name, ttl=5)
        assert holder.acquire()
        waiter = client.lock(lock_name, ttl=5)
        thread, got = _queue(client, waiter, 1)
        holder.release()
        thread.join(10)
        assert got
        waiter.release()
    with redis_server.client() as admin:
        assert admin.keys("*") == []


def test_a_waiter_blocks_instead_of_polling(redis_server: RedisServer, lock_name: str) -> None:
    """A waiter queued behind a holder that keeps its lock for 2 s sends a handful of commands, not one every
    100 ms (redis-py's Lock polls at 10 per second by default)."""
    with distlock.connect(redis_server.url) as holder_client, distlock.connect(redis_server.url) as waiter_client:
        holder = holder_client.lock(lock_name, ttl=30)
        assert holder.acquire()
        waiter = waiter_client.lock(lock_name, ttl=30)
        thread, got = _queue(holder_client, waiter, 1)
        with redis_server.client() as admin:
            before = sum(v["calls"] for k, v in admin.info("commandstats").items() if k != "cmdstat_info")
            time.sleep(2)
            during = sum(v["calls"] for k, v in admin.info("commandstats").items() if k != "cmdstat_info") - before
        holder.release()
        thread.join(10)
        assert got
        waiter.release()
    assert during <= 3, f"{during} commands while one waiter waited 2 s"


def _lease_key(lease_id: int) -> str:
    return f"distlock:lease:{lease_id:x}"


def _delete_leases(server: RedisServer, keep: int | None = None) -> None:
    """Delete lease keys behind their clients' backs (as an operator, or a clock jump on the server, would)."""
    with server.client() as admin:
        for key in admin.keys("distlock:lease:*"):
            if keep is None or key != _lease_key(keep).encode():
                admin.delete(key)


def test_a_waiter_whose_lease_key_vanishes_requeues_instead_of_holding_without_a_lease(
    redis_server: RedisServer, lock_name: str
) -> None:
    with distlock.connect(redis_server.url) as holder_client, distlock.connect(redis_server.url) as waiter_client:
        holder = holder_client.lock(lock_name, ttl=30)
        assert holder.acquire()
        held = holder_client.holder(lock_name)
        assert held is not None
        waiter = waiter_client.lock(lock_name, ttl=30)
        thread, got = _queue(holder_client, waiter, 1)
        # Every lease but the holder's goes: the waiter's own deadline is 30 s away, so only the scripts' lease
        # check can tell.
        _delete_leases(redis_server, keep=held.lease_id)
        holder.release()
        thread.join(20)
        assert got
        now = waiter_client.holder(lock_name)
        assert now is not None and now.token == waiter.token, "the waiter holds the lock on a lease that is gone"
        with redis_server.client() as admin:
            assert admin.exists(_lease_key(now.lease_id)), "the holder's lease key does not exist"
        waiter.ensure_held(verify=True)
        waiter.release()


def test_a_holder_whose_lease_key_vanishes_frees_the_lock_and_learns_it(
    redis_server: RedisServer, lock_name: str
) -> None:
    with distlock.connect(redis_server.url) as first, distlock.connect(redis_server.url) as second:
        lock = first.lock(lock_name, ttl=30)
        assert lock.acquire()
        _delete_leases(redis_server)
        other = second.lock(lock_name, ttl=30)
        assert other.acquire(timeout=5), "a lock whose holder's lease is gone must count as free"
        assert other.token > lock.token
        with pytest.raises(distlock.LockLost):
            lock.ensure_held(verify=True)
        with pytest.raises(distlock.LockLost):
            lock.release()
        other.ensure_held(verify=True)
        other.release()


def test_a_sigkilled_waiter_in_the_middle_of_the_queue_is_skipped(redis_server: RedisServer, lock_name: str) -> None:
    ttl = 2
    worker = Worker(redis_server.url)
    try:
        with distlock.connect(redis_server.url) as client:
            holder = client.lock(lock_name, ttl=ttl)
            assert holder.acquire()
            worker.send(op="acquire", name=lock_name, ttl=ttl, timeout=60)
            wait_until(lambda: waiters(client, lock_name) == 1, 10, "the worker to queue")
            behind = client.lock(lock_name, ttl=ttl)
            thread, got = _queue(client, behind, 2)
            worker.kill()
            killed = time.monotonic()
            holder.release()
            thread.join(30)
            assert got, "the waiter behind a dead waiter never got the lock"
            assert got[0] - killed <= ttl + 1, f"took {got[0] - killed:.2f} s"
            behind.release()
    finally:
        worker.close()


def test_a_semaphore_of_one_admits_one_holder_and_hands_over_in_order(
    redis_server: RedisServer, lock_name: str
) -> None:
    """A slot of a semaphore of limit 1 is a slot like any other (its scripts once took it for a reader)."""
    with distlock.connect(redis_server.url) as client, distlock.connect(redis_server.url) as other:
        first = client.semaphore(lock_name, 1, ttl=10)
        assert first.acquire()
        assert not other.semaphore(lock_name, 1, ttl=10).acquire(timeout=0), "two holders of a semaphore of 1"
        second = other.semaphore(lock_name, 1, ttl=10)
        thread, _ = _queue(client, second, 1)
        token = first.token
        first.release()
        thread.join(30)
        assert second.owned() and second.token > token
        second.release()


def test_the_keys_of_one_lock_share_one_cluster_slot(redis_server: RedisServer) -> None:
    """The keys of a lock share its {hash tag}, whatever the name (braces are escaped)."""
    with distlock.connect(redis_server.url) as client, redis_server.client() as admin:
        for name in ["plain", "a/b", "with{brace}", "}{", "%7B", "ünï"]:
            known = set(admin.keys("*"))
            with client.lock(name, ttl=5, owner="someone"):
                new = [key for key in admin.keys("*") if key not in known and b":lease:" not in key]
            assert len(new) == 2, (name, new)  # the queue (with the token) and the owner records
            assert len({redis.crc.key_slot(key) for key in new}) == 1, (name, new)
