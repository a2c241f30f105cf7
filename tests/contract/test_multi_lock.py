"""Multi-locks: all or nothing, one canonical order (no deadlock), a token per name; on every backend."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from typing import Any

import pytest
from _support import wait_until

import distlock


def test_names_are_taken_once_each_in_sorted_order(client: distlock.Client, lock_name: str) -> None:
    names = [f"{lock_name}/b", f"{lock_name}/a", f"{lock_name}/b"]
    multi = client.multi_lock(names, ttl=10)
    assert multi.names == (f"{lock_name}/a", f"{lock_name}/b")
    with multi:
        tokens = multi.tokens
        assert set(tokens) == set(multi.names)
        for name in multi.names:
            holder = client.holder(name)
            assert holder is not None and holder.token == tokens[name]
            assert multi.fence(name) == distlock.Fence(name, tokens[name])
            # Each lock is the current one for its own name: fenced rows find their own token.
            assert distlock.current_lock(name) is multi[name]
    assert all(client.holder(name) is None for name in multi.names)
    assert distlock.current_lock(multi.names[0]) is None


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ("ab", "a list of lock names, not one name"),
        ([], "at least one lock name"),
        ([1, "a"], "lock names are str"),
        (None, "a list of lock names"),
    ],
)
def test_bad_names_are_refused_when_the_multi_lock_is_made(client: distlock.Client, names: Any, message: str) -> None:
    with pytest.raises(distlock.ConfigurationError, match=message):
        client.multi_lock(names)


def test_a_bad_name_among_good_ones_is_an_invalid_lock_name(client: distlock.Client, lock_name: str) -> None:
    with pytest.raises(distlock.InvalidLockName):
        client.multi_lock([lock_name, ""])


def test_a_timeout_leaves_nothing_held(client: distlock.Client, lock_name: str) -> None:
    first, second = f"{lock_name}/a", f"{lock_name}/b"
    with client.lock(second, ttl=10) as other:
        multi = client.multi_lock([second, first], ttl=10)
        assert not multi.acquire(timeout=0.3)
        assert client.holder(first) is None, "the lock taken before the timeout was not given back"
        assert not multi.acquire(blocking=False)
        assert client.holder(first) is None
        with (
            pytest.raises(distlock.LockNotAcquired, match="none is held"),
            client.multi_lock([first, second], timeout=0.2),
        ):
            pass
        assert client.holder(first) is None
        holder = client.holder(second)
        assert holder is not None and holder.token == other.token
    with multi:
        assert multi.owned()


def test_a_lost_lock_marks_the_set_lost_and_release_still_frees_the_others(
    client: distlock.Client, backend_url: str, lock_name: str
) -> None:
    first, second = f"{lock_name}/a", f"{lock_name}/b"
    multi = client.multi_lock([first, second], ttl=3)
    assert multi.acquire()
    with distlock.connect(backend_url) as operator:
        assert operator.force_release(second, multi.tokens[second])
    wait_until(lambda: multi.lost, 10, "the keeper to find the force-released key gone")
    with pytest.raises(distlock.LockLost):
        multi.ensure_held()
    with pytest.raises(distlock.LockLost):
        multi.release()
    assert client.holder(first) is None


def test_asyncio_cancel_while_waiting_gives_back_what_was_taken(client: distlock.Client, lock_name: str) -> None:
    first, second = f"{lock_name}/a", f"{lock_name}/b"

    other = client.lock(second, ttl=10)
    assert other.acquire()

    async def main() -> None:
        multi = client.async_multi_lock([first, second], ttl=10, timeout=30)
        task = asyncio.create_task(multi.acquire())
        await asyncio.to_thread(wait_until, lambda: client.holder(first) is not None, 10, "the first lock")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(client.holder, first) is None
        await asyncio.to_thread(other.release)
        async with multi as held:
            assert set(held.tokens) == {first, second}
            assert distlock.current_lock(first) is multi.sync[first]
        assert distlock.current_lock(first) is None

    asyncio.run(main())


def _transfers(url: str, names: list[str], rounds: int, start: Any, out: Any) -> None:
    """One process: take ``names`` (in the order given) ``rounds`` times; report how many it got and failed."""
    got = failed = 0
    with distlock.connect(url) as client:
        multi = client.multi_lock(names, ttl=10, timeout=10)
        start.wait(60)
        for _ in range(rounds):
            if multi.acquire():
                got += 1
                multi.release()
            else:
                failed += 1
    out.put((got, failed))


def test_two_processes_asking_in_opposite_orders_never_deadlock(backend_url: str, lock_name: str) -> None:
    """{a, b} against {b, a}, 500 times each: a multi-lock taking the names in the order given deadlocks within a
    few rounds here (each holds one and waits 10 s for the other), so this fails on failures and on the deadline."""
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    a, b = f"{lock_name}/a", f"{lock_name}/b"
    procs = [ctx.Process(target=_transfers, args=(backend_url, order, 500, start, out)) for order in ([a, b], [b, a])]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + 240
    results = [out.get(timeout=max(deadline - time.monotonic(), 1)) for _ in procs]
    for proc in procs:
        proc.join(10)
    assert results == [(500, 0), (500, 0)], results


def test_threads_of_one_process_exclude_each_other_on_every_name(client: distlock.Client, lock_name: str) -> None:
    names = [f"{lock_name}/{n}" for n in "abc"]
    inside = dict.fromkeys(names, 0)
    overlaps: list[str] = []
    guard = threading.Lock()

    def work(mine: list[str]) -> None:
        multi = client.multi_lock(mine, ttl=10, timeout=30)
        for _ in range(20):
            with multi:
                with guard:
                    for name in mine:
                        inside[name] += 1
                        if inside[name] > 1:
                            overlaps.append(name)
                time.sleep(0.001)
                with guard:
                    for name in mine:
                        inside[name] -= 1

    threads = [
        threading.Thread(target=work, args=(subset,))
        for subset in ([names[0], names[1]], [names[2], names[1]], [names[2], names[0]])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not overlaps
