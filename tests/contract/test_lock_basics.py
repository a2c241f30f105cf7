"""The lock contract on one real server of each backend (etcd, Redis): exclusion, tokens, key namespace, timeouts,
context, asyncio."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from _support import wait_until, waiters

import distlock

pytestmark = pytest.mark.every_database


def test_acquire_release_and_token(client: distlock.Client, lock_name: str) -> None:
    lock = client.lock(lock_name, ttl=5)
    assert not lock.locked()
    assert lock.acquire() is True
    assert lock.owned() and lock.locked() and not lock.lost
    token = lock.token
    holder = client.holder(lock_name)
    assert holder is not None and holder.token == token and holder.waiters == 0
    lock.release()
    assert not lock.owned() and not lock.locked()
    with pytest.raises(distlock.LockNotOwned):
        _ = lock.token
    with pytest.raises(distlock.LockNotOwned):
        lock.release()


def test_tokens_strictly_increase_across_holders_and_clients(backend_url: str, lock_name: str) -> None:
    tokens: list[int] = []
    for _ in range(3):
        with distlock.connect(backend_url) as client:  # a client restart between holders
            for _ in range(3):
                with client.lock(lock_name, ttl=5) as lock:
                    tokens.append(lock.token)
    assert tokens == sorted(set(tokens)), tokens


def test_holder_and_inspect_report_owner_ids_in_queue_order(client: distlock.Client, lock_name: str) -> None:
    holder = client.lock(lock_name, ttl=5, owner="task-42")
    assert holder.acquire()
    waiter = client.lock(lock_name, ttl=5, owner="task-43")

    def wait() -> None:
        with waiter:
            pass

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: waiters(client, lock_name) == 1, 5, "the waiter to queue")
    current = client.holder(lock_name)
    assert current is not None and current.owner == "task-42" and current.token == holder.token
    [state] = [s for s in client.inspect() if s.name == lock_name]
    assert state.holder.owner == "task-42" and state.holder.token == holder.token
    assert [w.owner for w in state.waiters] == ["task-43"]
    assert state.holder.ttl_left is not None and 0 < state.holder.ttl_left <= 5
    holder.release()
    thread.join(10)
    assert not thread.is_alive()


def test_a_holder_given_no_owner_is_named_by_its_lease_and_seat(client: distlock.Client, lock_name: str) -> None:
    first = client.lock(lock_name, ttl=5)
    assert first.acquire()
    second = client.lock(lock_name, ttl=5)  # the same lease, waiting beside it: the next seat

    def wait() -> None:
        with second:
            pass

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: waiters(client, lock_name) == 1, 5, "the waiter to queue")
    [state] = [s for s in client.inspect() if s.name == lock_name]
    lease = state.holder.lease_id
    assert (state.holder.owner, [w.owner for w in state.waiters]) == (f"{lease:x}-0", [f"{lease:x}-1"])
    first.release()
    thread.join(10)
    assert not thread.is_alive()


def test_two_threads_on_one_client_exclude_each_other(client: distlock.Client, lock_name: str) -> None:
    first = client.lock(lock_name, ttl=5)
    second = client.lock(lock_name, ttl=5)
    assert first.acquire()
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(second.acquire(timeout=0.3)))
    thread.start()
    thread.join(10)
    assert outcome == [False], "a second thread acquired a lock held by the first"

    acquired = threading.Event()

    def wait() -> None:
        if second.acquire(timeout=10):
            acquired.set()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: waiters(client, lock_name) == 1, 5, "the second thread to queue")
    assert not acquired.is_set()
    first.release()
    thread.join(10)
    assert acquired.is_set() and second.token > 0
    second.release()


def test_many_threads_never_overlap(client: distlock.Client, lock_name: str) -> None:
    inside = 0
    overlaps = 0
    total = 0
    guard = threading.Lock()
    barrier = threading.Barrier(4)

    def worker() -> None:
        nonlocal inside, overlaps, total
        lock = client.lock(lock_name, ttl=5)
        barrier.wait()
        for _ in range(15):
            with lock:
                with guard:
                    inside += 1
                    overlaps += inside > 1
                # Let the other threads run while we hold the lock.
                threading.Event().wait(0.001)
                with guard:
                    inside -= 1
                    total += 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert total == 60 and overlaps == 0


@pytest.mark.parametrize(
    ("held", "other"),
    [("a", "a/b"), ("a/b", "a"), ("a/b", "a%2Fb"), ("a%2Fb", "a/b"), ("a", "a/"), ("a%", "a%25"), ("x/y/z", "x/y")],
)
def test_lock_names_do_not_share_queues(client: distlock.Client, lock_name: str, held: str, other: str) -> None:
    base = lock_name.replace("/", "_")
    holder = client.lock(f"{base}:{held}", ttl=5)
    contender = client.lock(f"{base}:{other}", ttl=5)
    assert holder.acquire()
    assert contender.acquire(blocking=False), f"{other!r} was blocked by {held!r}"
    contender.release()
    holder.release()


def test_timeout_returns_false_and_removes_the_waiter(client: distlock.Client, lock_name: str) -> None:
    holder = client.lock(lock_name, ttl=5)
    assert holder.acquire()
    waiter = client.lock(lock_name, ttl=5)
    assert waiter.acquire(timeout=0.2) is False
    assert waiter.acquire(blocking=False) is False
    assert waiters(client, lock_name) == 0, "a waiter that gave up left its key behind"
    with pytest.raises(distlock.LockNotAcquired, match="not acquired within"):
        with client.lock(lock_name, ttl=5, timeout=0.1):
            pass
    assert waiters(client, lock_name) == 0
    holder.release()


def test_closing_the_client_interrupts_a_waiter_and_removes_its_key(backend_url: str, lock_name: str) -> None:
    with distlock.connect(backend_url) as observer:
        holder = observer.lock(lock_name, ttl=5)
        assert holder.acquire()
        client = distlock.connect(backend_url)
        result: list[object] = []

        def wait() -> None:
            try:
                result.append(client.lock(lock_name, ttl=5).acquire(timeout=30))
            except distlock.DistlockError as e:
                result.append(e)

        thread = threading.Thread(target=wait)
        thread.start()
        wait_until(lambda: waiters(observer, lock_name) == 1, 5, "the waiter to queue")
        client.close()
        thread.join(10)
        assert not thread.is_alive()
        assert len(result) == 1 and isinstance(result[0], distlock.ClientClosed), result
        # etcd and Redis revoke the lease before close() returns; ZooKeeper deletes a closed session's nodes when it
        # processes the close, which close() waits for at most request_timeout (a hung server must not hang it).
        wait_until(lambda: waiters(observer, lock_name) == 0, 10, "the closed client's waiter to be gone")
        holder.release()


def test_locks_are_not_reentrant_per_handle(client: distlock.Client, lock_name: str) -> None:
    lock = client.lock(lock_name, ttl=5)
    with lock:
        with pytest.raises(distlock.LockError, match="not re-entrant"):
            lock.acquire()


def test_current_token_follows_the_innermost_lock(client: distlock.Client, lock_name: str) -> None:
    assert distlock.current_token() is None
    with client.lock(f"{lock_name}/outer", ttl=5) as outer:
        assert distlock.current_token() == outer.token
        with client.lock(f"{lock_name}/inner", ttl=5) as inner:
            assert distlock.current_lock() is inner
            assert distlock.current_token(f"{lock_name}/outer") == outer.token
            seen: list[int | None] = []
            thread = threading.Thread(target=lambda: seen.append(distlock.current_token()))
            thread.start()
            thread.join()
            assert seen == [None], "another thread saw this thread's lock"
        assert distlock.current_token() == outer.token
    assert distlock.current_lock() is None


def test_max_hold_releases_a_hung_holder(client: distlock.Client, lock_name: str) -> None:
    lost: list[distlock.Lock] = []
    lock = client.lock(lock_name, ttl=5, max_hold=0.5, on_lost=lost.append)
    assert lock.acquire()
    token = lock.token
    other = client.lock(lock_name, ttl=5)
    assert other.acquire(timeout=10), "the lock was not freed after max_hold"
    assert other.token > token
    assert lock.lost and lost == [lock] and lock.lost_event.is_set()
    with pytest.raises(distlock.LockLost, match="max_hold"):
        lock.ensure_held()
    with pytest.raises(distlock.LockLost):
        lock.release()
    assert other.owned()
    other.release()


def test_ensure_held_verify_asks_the_server(client: distlock.Client, lock_name: str) -> None:
    lock = client.lock(lock_name, ttl=5)
    with lock:
        lock.ensure_held(verify=True)


@pytest.fixture
def aclient(backend_url: str) -> Iterator[distlock.Client]:
    with distlock.connect(backend_url) as client:
        yield client


def test_async_lock_excludes_and_sets_context(aclient: distlock.Client, lock_name: str) -> None:
    async def main() -> list[str]:
        events: list[str] = []

        async def worker(tag: str) -> None:
            async with aclient.async_lock(lock_name, ttl=5) as lock:
                assert distlock.current_token() == lock.token
                events.append(f"{tag}+")
                await asyncio.sleep(0.05)
                events.append(f"{tag}-")
            assert distlock.current_token() is None

        await asyncio.gather(*(worker(str(i)) for i in range(4)))
        return events

    events = asyncio.run(main())
    assert len(events) == 8
    for i in range(0, 8, 2):  # every enter is followed by its own exit: no interleaving
        assert events[i][:-1] == events[i + 1][:-1] and events[i].endswith("+")


def test_cancelling_an_async_waiter_removes_its_key(aclient: distlock.Client, lock_name: str) -> None:
    async def main() -> None:
        holder = aclient.async_lock(lock_name, ttl=5)
        assert await holder.acquire()
        task = asyncio.create_task(aclient.async_lock(lock_name, ttl=5).acquire(timeout=30))
        while await asyncio.to_thread(waiters, aclient, lock_name) != 1:
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(waiters, aclient, lock_name) == 0
        await holder.release()

    asyncio.run(main())
