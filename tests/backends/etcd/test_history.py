"""etcd only: what a lock's reads step over does not grow with the number of times the lock was taken, and nothing
is left under the prefix once every holder and waiter is gone.

etcd keeps, until the operator compacts, an index entry for every key name ever made, and a range read over a lock's
prefix (every join's and every waiter's read) walks the entries of every name in the range, deleted or not. With a
fresh key per acquisition a lock on an etcd that never compacts (etcd's default) got slower with every grant: 1.43 ->
4.61 ms median over 20,000 rounds of one name (issue 24). A join's key is now ``<lease hex>-<seat>``, its seat reused
from one acquisition to the next (``Keeper.join_started``), so the key names under a prefix grow with sessions times
holders at once, not with acquisitions.

The count here is structural, not timed: a watch of the lock's prefix from the revision before the test replays every
put made under it since, and the distinct key names among them are the index entries a read of the prefix steps over
(no compaction runs on the test's etcd). Before seats, 300 acquisitions left 300 names.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pytest
from etcd3 import etcdrpc
from etcd3.etcdrpc.kv_pb2 import Event

import distlock
from distlock.backends.etcd._backend import EtcdBackend, prefix_end

ROUNDS = 300
THREADS = 3
TURNS = 20
#: The kinds of queue entry each shape makes: the seats of each are numbered on their own.
SHAPES: dict[str, Callable[[distlock.Client, str, int], distlock.Lock]] = {
    "lock": lambda client, name, i: client.lock(name, ttl=10, timeout=30),
    "semaphore": lambda client, name, i: client.semaphore(name, 2, ttl=10, timeout=30),
    "rwlock": lambda client, name, i: (client.rwlock(name, ttl=10, timeout=30).read, client.rwlock(name).write)[
        i % 2
    ](),
}
KINDS = {"lock": 1, "semaphore": 1, "rwlock": 2}


def _revision(backend: EtcdBackend) -> int:
    response, _ = backend._channels.unary("read revision", "Range", etcdrpc.RangeRequest(key=b"\0", count_only=True))
    return int(response.header.revision)


def _key_names_made(backend: EtcdBackend, name: str, since: int) -> set[bytes]:
    """The key names put under lock ``name``'s prefix from revision ``since`` on (a watch replays them)."""
    prefix = backend._lock_prefix(name)
    sentinel = prefix + b"~end-of-test"  # put last: once the watch reports it, it has reported everything before
    kv = backend._channels.member().kv
    kv.Put(etcdrpc.PutRequest(key=sentinel, value=b""), timeout=10)
    stop = threading.Event()

    def requests() -> object:
        create = etcdrpc.WatchCreateRequest(key=prefix, range_end=prefix_end(prefix), start_revision=since)
        yield etcdrpc.WatchRequest(create_request=create)
        stop.wait(30)

    names: set[bytes] = set()
    responses = backend._channels.member().watch.Watch(requests(), timeout=30, metadata=backend._channels.metadata())
    try:
        for response in responses:
            assert not response.compact_revision, "the test's etcd was compacted: the count would be short"
            for event in response.events:
                if event.type == Event.PUT:
                    names.add(bytes(event.kv.key))
            if sentinel in names:
                break
    finally:
        stop.set()
        responses.cancel()
        kv.DeleteRange(etcdrpc.DeleteRangeRequest(key=sentinel), timeout=10)
    names.discard(sentinel)
    return names


@pytest.mark.parametrize("shape", SHAPES)
def test_a_lock_taken_hundreds_of_times_leaves_its_reads_few_key_names(
    etcd_url: str, lock_name: str, shape: str
) -> None:
    handle = SHAPES[shape]
    with distlock.connect(etcd_url) as client:
        backend = client._backend
        assert isinstance(backend, EtcdBackend)
        since = _revision(backend) + 1
        tokens = []
        for i in range(ROUNDS):
            with handle(client, lock_name, i) as lock:
                tokens.append(lock.token)
        assert tokens == sorted(set(tokens)), "tokens strictly increase while the key is reused"
        # One lease, one holder at a time: one key name per kind, reused by every acquisition.
        assert len(_key_names_made(backend, lock_name, since)) == KINDS[shape]

        # Threads sharing the client (so its lease) take turns: a seat each at most.
        def take_turns(first: int) -> None:
            for i in range(first, first + TURNS):
                with handle(client, lock_name, i):
                    pass

        threads = [threading.Thread(target=take_turns, args=(n * TURNS,)) for n in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        names = _key_names_made(backend, lock_name, since)
    assert KINDS[shape] <= len(names) <= KINDS[shape] * THREADS, sorted(names)


def test_tokens_of_threads_sharing_a_lease_strictly_increase_in_grant_order(etcd_url: str, lock_name: str) -> None:
    granted: list[int] = []

    def take_turns() -> None:
        for _ in range(TURNS):
            with client.lock(lock_name, ttl=10, timeout=30) as lock:
                granted.append(lock.token)  # under the lock: the list is in grant order

    with distlock.connect(etcd_url) as client:
        threads = [threading.Thread(target=take_turns) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert len(granted) == THREADS * TURNS
    assert granted == sorted(set(granted))


def test_names_taken_and_released_leave_nothing(etcd_url: str) -> None:
    prefix = f"residue-{uuid.uuid4().hex[:8]}"

    def stored(backend: EtcdBackend) -> int:
        start = f"{prefix}/".encode()
        request = etcdrpc.RangeRequest(key=start, range_end=prefix_end(start), count_only=True)
        response, _ = backend._channels.unary("count keys", "Range", request)
        return int(response.count)

    with distlock.connect(etcd_url) as operator:
        checker = operator._backend
        assert isinstance(checker, EtcdBackend)
        with distlock.connect(f"{etcd_url}?prefix={prefix}") as client:
            for number in range(300):
                with client.lock(f"order:{number}", ttl=10):
                    pass
            with client.semaphore("pool", 2, ttl=10), client.semaphore("pool", 2, ttl=10):
                assert not client.semaphore("pool", 2, ttl=10).acquire(blocking=False)  # given up: its key leaves
            rwlock = client.rwlock("document", ttl=10)
            with rwlock.read(), rwlock.read():
                assert not rwlock.write().acquire(blocking=False)
            with rwlock.write():
                pass
            assert stored(checker) == 0
            assert client.lock("held-at-close", ttl=10).acquire()
            assert stored(checker) == 1
        assert stored(checker) == 0, "the close revoked the lease, and the held key with it"
