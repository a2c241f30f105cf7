"""The Redis backend on a real 3-master Redis Cluster (``redis+cluster://``): scripts stay in one slot, tokens and
FIFO order hold, a lock whose holder's lease (in another slot, often on another master) is gone is free, a
force release loses the one lock released, a mark shares its lock's slot, and a holder cut off from its lock's master
gives the lock up."""

from __future__ import annotations

import time

import pytest
import redis
from _support import queue_and_record, wait_until

import distlock
from distlock.backends.redis._keys import Keys
from distlock.testing import RedisServer

SLOTS = redis.crc.REDIS_CLUSTER_HASH_SLOTS


def _master_of(key: str) -> int:
    """Which of the three masters serves ``key`` (by the slot ranges the fixture assigned)."""
    slot = redis.crc.key_slot(key.encode())
    return next(i for i in (2, 1, 0) if slot >= i * SLOTS // 3)


def _queue_of(name: str) -> str:
    """Lock ``name``'s queue key (its name escaped: ``/`` is ``%2F`` in a key)."""
    return Keys("distlock").lock(name) + "q"


def _names_on_every_master(prefix: str, per_master: int) -> list[str]:
    """Lock names whose keys live on each of the three masters (by the slot ranges the fixture assigned)."""
    by_master: dict[int, list[str]] = {0: [], 1: [], 2: []}
    i = 0
    while min(len(names) for names in by_master.values()) < per_master:
        name = f"{prefix}/{i}/{time.monotonic_ns()}"
        by_master[_master_of(_queue_of(name))].append(name)
        i += 1
    return sorted(name for names in by_master.values() for name in names[:per_master])


def test_the_lock_contract_holds_on_a_cluster(cluster_url: str) -> None:
    names = _names_on_every_master("cluster", 3)
    with distlock.connect(cluster_url) as client:
        assert client.description.startswith("Redis Cluster at 127.0.0.1:")
        for name in names:
            tokens = []
            for _ in range(2):
                with client.lock(name, ttl=5) as lock:
                    holder = client.holder(name)
                    assert holder is not None and holder.token == lock.token
                    assert not client.lock(name, ttl=5).acquire(blocking=False)
                    tokens.append(lock.token)
            assert tokens == sorted(set(tokens))
            assert client.holder(name) is None


def test_waiters_acquire_in_arrival_order_on_a_cluster(cluster_url: str, lock_name: str) -> None:
    with distlock.connect(cluster_url) as client:
        assert queue_and_record(client, lock_name, 4) == [0, 1, 2, 3]


def test_a_lock_whose_holders_lease_is_gone_is_free_on_a_cluster(
    cluster_url: str, redis_cluster: list[RedisServer], lock_name: str
) -> None:
    with distlock.connect(cluster_url) as first, distlock.connect(cluster_url) as second:
        lock = first.lock(lock_name, ttl=30)
        assert lock.acquire()
        held = first.holder(lock_name)
        assert held is not None
        lease_key = f"distlock:lease:{held.lease_id:x}"
        for server in redis_cluster:  # the lease key lives on whichever master serves its slot
            with server.client() as node:
                if node.cluster("COUNTKEYSINSLOT", redis.crc.key_slot(lease_key.encode())):
                    node.delete(lease_key)
        other = second.lock(lock_name, ttl=30)
        assert other.acquire(timeout=5)
        assert other.token > lock.token
        with pytest.raises(distlock.LockLost):
            lock.ensure_held(verify=True)
        other.release()
        # Our own lease gone behind our back on a cluster: the next acquisition notices and takes a new lease.
        again = first.lock(lock_name, ttl=30)
        assert again.acquire(timeout=5)
        now = first.holder(lock_name)
        assert now is not None and now.token == again.token and now.lease_id != held.lease_id
        again.release()


def test_marks_live_in_their_locks_slot_on_a_cluster(cluster_url: str) -> None:
    names = _names_on_every_master("marks", 1)
    with distlock.connect(cluster_url) as client:
        for name in names:
            mark = Keys("distlock").mark(name, "task/{1}")
            assert redis.crc.key_slot(mark.encode()) == redis.crc.key_slot(_queue_of(name).encode())
            with client.lock(name, ttl=10) as lock:
                lock.write_mark("task/{1}", b"done", ttl=60)
            assert client.read_mark(name, "task/{1}") == b"done"
            assert client.holder(name) is None


def test_inspect_lists_the_locks_of_every_master(cluster_url: str) -> None:
    names = _names_on_every_master("inspect", 2)
    with distlock.connect(cluster_url) as client:
        locks = [client.lock(name, ttl=10) for name in names]
        for lock in locks:
            assert lock.acquire()
        listed = [state.name for state in client.inspect() if state.name in names]
        assert listed == names
        for lock in locks:
            lock.release()


def test_on_a_redis_cluster_only_the_released_lock_is_lost(redis_cluster: list[RedisServer]) -> None:
    """A Cluster checks each held lock with a script of its own (one slot per script): locks spread over every
    master, one of them force-released, only that one is lost."""
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{server.port}" for server in redis_cluster)
    names = _names_on_every_master("force", 1)
    with distlock.connect(url) as client, distlock.connect(url) as operator:
        locks = [client.lock(name, ttl=3) for name in names]
        assert all(lock.acquire() for lock in locks)
        released, *kept = locks
        assert operator.force_release(released.name, released.token) is True
        wait_until(lambda: released.lost, 10, "the released lock to be lost")
        assert not any(lock.lost for lock in kept)
        assert operator.force_release(kept[0].name, released.token) is False
        assert operator.holder(released.name) is None
        for lock in kept:
            lock.ensure_held(verify=True)
            lock.release()


def test_a_holder_cut_off_from_its_locks_master_gives_the_lock_up(
    redis_cluster: list[RedisServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock's keys expire unless its holder's lease refresh extends them: a client that still reaches its lease's
    master but no longer its lock's fails its refreshes, and its session (every lock on that lease) is lost within
    the TTL, before the keys, extended two TTLs or more past the last full refresh, expire."""
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{server.port}" for server in redis_cluster)
    with distlock.connect(url) as client:
        anchor = client.lock("anchor", ttl=2)
        assert anchor.acquire()
        held = client.holder("anchor")
        assert held is not None
        lease_master = _master_of(f"distlock:lease:{held.lease_id:x}")
        names = _names_on_every_master("cut-off", 1)
        name = next(n for n in names if _master_of(_queue_of(n)) != lease_master)
        lock_master = _master_of(_queue_of(name))
        lock = client.lock(name, ttl=2)
        assert lock.acquire()
        target = client._backend._target  # type: ignore[attr-defined]
        reachable = target.pool_for

        def cut_off(key: str) -> object:
            if _master_of(key) == lock_master:
                raise redis.exceptions.ConnectionError("cut off from this master (test)")
            return reachable(key)

        monkeypatch.setattr(target, "pool_for", cut_off)
        wait_until(lambda: lock.lost, 10, "the lock whose master is out of reach to be lost")
        assert anchor.lost, "the session is lost as a whole (one deadline per lease)"
        monkeypatch.undo()


def test_semaphores_and_rwlocks_are_refused_where_they_are_asked_for(cluster_url: str) -> None:
    """A Cluster script may touch one slot, and the grant rule of semaphores and read/write locks reads every
    holder's lease: the client says so when the handle is asked for, before any join (plain locks work)."""
    with distlock.connect(cluster_url) as client:
        for make in (
            lambda: client.semaphore("jobs", 2),
            lambda: client.rwlock("doc"),
            lambda: client.async_rwlock("d"),
        ):
            with pytest.raises(distlock.ConfigurationError, match=r"is not available on .*one Redis server"):
                make()
        with client.lock("plain", ttl=5, timeout=5):
            pass
