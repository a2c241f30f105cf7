"""Nothing grows with use on Redis: after every holder and waiter of a name is gone, Redis holds nothing for it.

Locks, semaphores and read/write locks taken and released (one server; locks on a Cluster too) leave no key; names
whose holder was SIGKILLed are cleared by the next join, and a name nobody touches again expires with its keys
(``QUEUE_LIVES`` lease TTLs after the last script run for it), while a held lock's keys live as long as its lease,
whatever blocks the keeper's cleaner; tokens keep increasing across the deletion (the
server clock floor, and the last token kept while it is ahead of the clock); an earlier client's entry is refused
with the upgrade step, and an earlier client refuses to queue behind a new one; a semaphore slot's and a reader's
acquisition costs the same number of commands with 1 or 32 holders. Real redis-servers; counts, not timings.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from _support import child_env, wait_until, waiters

import distlock
from benchmarks.redis_locks import CommandStats
from distlock.testing import RedisServer

TTL = 1.0
#: A lock's keys expire this many lease TTLs after the last script run for one of its entries (the documented bound,
#: docs/operations/redis.md; ``_backend.QUEUE_LIVES``).
QUEUE_LIVES = 3


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _keys(url: str) -> list[bytes]:
    with redis.Redis.from_url(url) as admin:
        return sorted(admin.scan_iter(match="*", count=1000))


def _use_every_kind(client: distlock.Client, names: int) -> None:
    """Take and release ``names`` locks (one with an owner record, one given up by a waiter), a semaphore with three
    slots held and one waiting, and a read/write lock with two readers, a waiting writer and a reader behind it."""
    for i in range(names):
        with client.lock(f"order:{i}", ttl=30, owner=f"worker-{i}" if i == 0 else None):
            pass
    holder = client.lock("order:given-up", ttl=30)
    assert holder.acquire()
    assert not client.lock("order:given-up", ttl=30).acquire(timeout=0.2)
    holder.release()

    slots = [client.semaphore("pool", 3, ttl=30) for _ in range(3)]
    for slot in slots:
        assert slot.acquire()
    fourth = client.semaphore("pool", 3, ttl=30)
    thread = threading.Thread(target=lambda: fourth.acquire(timeout=30))
    thread.start()
    wait_until(lambda: waiters(client, "pool") == 1, 10, "the fourth slot to queue")
    for slot in slots:
        slot.release()
    thread.join(30)
    assert fourth.owned()
    fourth.release()

    rw = client.rwlock("table", ttl=30)
    readers = [rw.read(), rw.read()]
    for reader in readers:
        assert reader.acquire()
    writer, late_reader = rw.write(), rw.read()
    threads = [threading.Thread(target=lambda: writer.acquire(timeout=30))]
    threads[0].start()
    wait_until(lambda: waiters(client, "table") == 1, 10, "the writer to queue")
    threads.append(threading.Thread(target=lambda: late_reader.acquire(timeout=30)))
    threads[1].start()
    wait_until(lambda: waiters(client, "table") == 2, 10, "the late reader to queue")
    for reader in readers:
        reader.release()
    threads[0].join(30)
    assert writer.owned()
    writer.release()
    threads[1].join(30)
    assert late_reader.owned()
    late_reader.release()


def test_names_taken_and_released_leave_nothing(server: RedisServer) -> None:
    with distlock.connect(server.url) as client:
        _use_every_kind(client, 300)
        left = [key for key in _keys(server.url) if b":lease:" not in key]
        assert left == [], left[:10]
    assert _keys(server.url) == [], "the closed client's lease key is left"


def test_locks_taken_and_released_on_a_cluster_leave_nothing(
    redis_cluster: list[RedisServer], cluster_url: str
) -> None:
    with distlock.connect(cluster_url + "?prefix=residue") as client:
        for i in range(200):
            with client.lock(f"order:{i}", ttl=30):
                pass
        holder = client.lock("order:waited", ttl=30)
        assert holder.acquire()
        waiter = client.lock("order:waited", ttl=30)
        thread = threading.Thread(target=lambda: waiter.acquire(timeout=30))
        thread.start()
        wait_until(lambda: waiters(client, "order:waited") == 1, 10, "the waiter to queue")
        holder.release()
        thread.join(30)
        assert waiter.owned()
        waiter.release()
    left = [key for server in redis_cluster for key in _keys(server.url) if key.startswith(b"residue:")]
    assert left == [], left[:10]


_KILLED_HOLDER = """
import sys, threading, distlock
client = distlock.connect(sys.argv[1])
held = [client.lock(f"dead:{{i}}", ttl={ttl}) for i in range({names})]
held += [client.semaphore("dead:pool", 2, ttl={ttl}) for _ in range(2)]
held += [client.rwlock("dead:table", ttl={ttl}).read()]
held += [client.lock("dead:waited", ttl={ttl})]
for lock in held:
    assert lock.acquire()
waiter = client.lock("dead:waited", ttl={ttl})
threading.Thread(target=lambda: waiter.acquire(timeout=600), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def _kill_a_holder(url: str, names: int) -> None:
    """A process that holds ``names`` locks, two semaphore slots, a read lock and a lock with a waiter of its own
    behind it, SIGKILLed: its lease expires, nobody removes its entries."""
    script = _KILLED_HOLDER.format(ttl=TTL, names=names)
    process = subprocess.Popen(
        [sys.executable, "-c", script, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env()
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        with distlock.connect(url) as client:
            wait_until(lambda: waiters(client, "dead:waited") == 1, 10, "the killed process's waiter to queue")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)


def test_the_next_join_clears_a_killed_holders_names(server: RedisServer) -> None:
    """The dead entries go when someone takes the name again (within the dead lease's TTL); the last to leave
    takes the keys with it."""
    _kill_a_holder(server.url, 20)
    with distlock.connect(server.url) as client:
        for i in range(20):
            with client.lock(f"dead:{i}", ttl=30, timeout=10):
                pass
        with client.lock("dead:waited", ttl=30, timeout=10):
            pass
        with client.semaphore("dead:pool", 2, ttl=30, timeout=10):
            pass
        with client.rwlock("dead:table", ttl=30, timeout=10).write():
            pass
    assert _keys(server.url) == []


def test_names_nobody_touches_again_expire_with_their_dead_holder(server: RedisServer) -> None:
    """Every key a SIGKILLed holder leaves has an expiry within QUEUE_LIVES lease TTLs, and goes by itself."""
    _kill_a_holder(server.url, 20)
    with redis.Redis.from_url(server.url) as admin:
        keys = _keys(server.url)
        assert any(key.endswith(b":q") for key in keys) and any(key.endswith(b":d") for key in keys), keys
        for key in keys:
            assert 0 <= admin.pttl(key) <= QUEUE_LIVES * TTL * 1000, (key, admin.pttl(key))
    wait_until(lambda: _keys(server.url) == [], 30, "the dead holder's keys to expire")


def test_held_locks_keep_their_keys_while_on_lost_callbacks_block_the_cleaner(server: RedisServer) -> None:
    """The lease refresh keeps a held lock's keys alive, not the keeper's check of held locks (which runs on the
    cleaner, behind ``on_lost`` callbacks): with the cleaner blocked for longer than the keys' expiry, a held lock
    and a held semaphore slot keep their keys, stay held, and another client still waits behind them."""
    unblock, blocked = threading.Event(), threading.Event()

    def block_the_cleaner(lock: distlock.Lock) -> None:
        blocked.set()
        unblock.wait(30)

    with distlock.connect(server.url) as client, distlock.connect(server.url) as other:
        held, slot = client.lock("held", ttl=TTL), client.semaphore("held:pool", 1, ttl=TTL)
        doomed = client.lock("doomed", ttl=TTL, max_hold=0.2, on_lost=block_the_cleaner)
        try:
            assert held.acquire() and slot.acquire() and doomed.acquire()
            assert blocked.wait(10), "max_hold did not fire"
            time.sleep((QUEUE_LIVES + 1) * TTL)  # past the keys' expiry, had nothing but the cleaner extended it
            with redis.Redis.from_url(server.url) as admin:
                for name in (b"held", b"held:pool"):
                    queue = [key for key in _keys(server.url) if b"{" + name + b"}" in key and key.endswith(b":q")]
                    assert queue and admin.pttl(queue[0]) > 0, (name, _keys(server.url))
            assert held.owned() and slot.owned() and not held.lost and not slot.lost
            assert not other.lock("held", ttl=TTL).acquire(timeout=0)
            assert not other.semaphore("held:pool", 1, ttl=TTL).acquire(timeout=0)
        finally:
            unblock.set()
        held.release()
        slot.release()


def test_tokens_keep_increasing_across_the_deletion_of_a_names_keys(server: RedisServer) -> None:
    with distlock.connect(server.url) as client:
        tokens = []
        for _ in range(5):
            with client.lock("order:1", ttl=30) as lock:
                tokens.append(lock.token)
            assert [key for key in _keys(server.url) if b":lease:" not in key] == []
        assert tokens == sorted(set(tokens)), tokens


def test_a_last_token_ahead_of_the_clock_stays_until_the_clock_passes_it(server: RedisServer) -> None:
    """A token counter ahead of the server clock (the clock stepped back) is kept, expiring when the clock passes
    it, so the next token is still larger; a counter behind the clock goes with the lock's last entry."""
    with distlock.connect(server.url) as client, redis.Redis.from_url(server.url) as admin:
        holder = client.lock("order:1", ttl=30)
        assert holder.acquire()
        queue = b"distlock:{order:1}:q"
        seconds, micros = admin.time()
        ahead = (seconds + 5) * 1_000_000 + micros  # 5 s ahead of the server clock
        admin.zadd(queue, {"~token": ahead})
        holder.release()
        assert admin.zrange(queue, 0, -1) == [b"~token"]
        assert 0 < admin.pttl(queue) <= 5001
        with client.lock("order:1", ttl=30) as lock:
            assert lock.token == ahead + 1
        assert admin.exists(queue) == 1 and admin.zrange(queue, 0, -1) == [b"~token"]


def _earlier_join(admin: redis.Redis, queue: bytes, member: bytes, lease: bytes) -> list[object]:
    """Join ``queue`` as a client of the earlier key layout (its script, unchanged) would."""
    source = "local LAST, WAKE_TTL_MS = '~token', 600000\n" + Path(__file__).with_name(
        "earlier_layout_enqueue.lua"
    ).read_text(encoding="utf-8")
    keys = [queue, queue[:-1] + b"token", queue[:-1] + b"owners", lease]
    return list(admin.eval(source, len(keys), *keys, member, "", "", b"distlock:lease:"))


def test_an_earlier_clients_live_entry_is_refused_with_the_upgrade_step(server: RedisServer) -> None:
    with distlock.connect(server.url) as client, redis.Redis.from_url(server.url) as admin:
        admin.set("distlock:lease:abc", "earlier", px=30_000)
        assert _earlier_join(admin, b"distlock:{order:1}:q", b"abc-0123", b"distlock:lease:abc")[1] == 1
        with pytest.raises(distlock.ConfigurationError, match=r"earlier Redis key layout.*Upgrading"):
            client.lock("order:1", ttl=30).acquire(timeout=1)
        # Its lease gone (the earlier client stopped or crashed), the entry is removed and the name used.
        admin.delete("distlock:lease:abc")
        with client.lock("order:1", ttl=30, timeout=1):
            pass
    assert _keys(server.url) == []


@pytest.mark.parametrize("kind", ["lock", "semaphore", "reader"])
def test_an_earlier_client_refuses_to_queue_behind_a_new_one(server: RedisServer, kind: str) -> None:
    with distlock.connect(server.url) as client, redis.Redis.from_url(server.url) as admin:
        handle = {
            "lock": lambda: client.lock("order:1", ttl=30),
            "semaphore": lambda: client.semaphore("order:1", 2, ttl=30),
            "reader": lambda: client.rwlock("order:1", ttl=30).read(),
        }[kind]()
        earlier = {"lock": b"abc-0123", "semaphore": b"abc-s2.0123", "reader": b"abc-r.0123"}[kind]
        with handle:
            admin.set("distlock:lease:abc", "earlier", px=30_000)
            answer = _earlier_join(admin, b"distlock:{order:1}:q", earlier, b"distlock:lease:abc")
            assert answer[:2] == [0, 4], answer  # LockKindMismatch in the earlier client: nothing joined
            assert earlier not in admin.zrange(b"distlock:{order:1}:q", 0, -1)


def _commands_of(url: str, take: object) -> int:
    before = CommandStats(url).requests()
    take()  # type: ignore[operator]
    return sum((CommandStats(url).requests() - before).values())


@pytest.mark.parametrize("kind", ["semaphore", "reader"])
def test_a_slots_acquisition_costs_the_same_with_1_or_32_holders(server: RedisServer, kind: str) -> None:
    """The commands of one uncontended acquire + release of a semaphore slot (or a read lock) do not grow with the
    holders already in: no walk over them, no PTTL per holder."""
    counts: Counter[int] = Counter()
    with distlock.connect(server.url) as client:

        def handle() -> distlock.Lock:
            if kind == "semaphore":
                return client.semaphore("pool", 64, ttl=30)
            return client.rwlock("pool", ttl=30).read()

        with handle():  # the scripts loaded, the lease granted
            pass
        held: list[distlock.Lock] = []
        for holders in (1, 32):
            while len(held) < holders:
                held.append(handle())
                assert held[-1].acquire()

            def take() -> None:
                with handle() as lock:
                    assert lock.owned()

            counts[holders] = _commands_of(server.url, take)
        for lock in held:
            lock.release()
    assert counts[32] <= counts[1], dict(counts)
