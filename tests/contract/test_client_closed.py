"""A closed client raises ``ClientClosed`` from every call, the same on every backend, and so does a call that was
waiting in another thread when the client closed (whatever the backend raised in that race)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from _support import wait_until, waiters

import distlock

#: Closes raced against a waiter: enough to land in each of its steps (joining the queue, waiting, re-reading).
RACES = 20


def _acquire_on_a_thread(client: distlock.Client, name: str) -> tuple[threading.Thread, list[object]]:
    """Start acquiring ``name`` on a thread; the list gets what ``acquire()`` returned or raised."""
    outcome: list[object] = []

    def acquire() -> None:
        try:
            outcome.append(client.lock(name, ttl=5).acquire(timeout=30))
        except Exception as e:
            outcome.append(e)

    thread = threading.Thread(target=acquire)
    thread.start()
    return thread, outcome


def test_a_waiter_gets_client_closed_when_another_thread_closes_the_client(backend_url: str, lock_name: str) -> None:
    with distlock.connect(backend_url) as observer:
        holder = observer.lock(lock_name, ttl=5)
        assert holder.acquire()
        outcomes: list[object] = []
        for attempt in range(RACES):
            client = distlock.connect(backend_url)
            waiter = client.lock(lock_name, ttl=5)
            start = threading.Barrier(2)

            def wait(waiter: distlock.Lock = waiter, start: threading.Barrier = start) -> None:
                start.wait()
                try:
                    outcomes.append(waiter.acquire(timeout=30))
                except Exception as e:
                    outcomes.append(e)

            thread = threading.Thread(target=wait)
            thread.start()
            start.wait()
            if attempt % 4 == 3:  # close once the waiter is queued
                wait_until(lambda: waiters(observer, lock_name) == 1, 5, "the waiter to queue")
            else:  # or at once, or while it is granting a lease or joining the queue
                time.sleep(attempt * 0.0005)
            client.close()
            thread.join(10)
            assert not thread.is_alive(), "the waiter was not woken by close()"
        wrong = [o for o in outcomes if not isinstance(o, distlock.ClientClosed)]
        assert not wrong, f"{len(wrong)} of {RACES} waiters did not get ClientClosed: {wrong[:3]}"
        wait_until(lambda: waiters(observer, lock_name) == 0, 10, "the closed clients' waiters to go")
        holder.release()


@pytest.mark.parametrize("error", [distlock.BackendError("CANCELLED: Stream removed"), ValueError("Channel closed!")])
def test_whatever_the_backend_raises_once_closed_a_waiter_gets_client_closed(
    backend_url: str, lock_name: str, error: Exception
) -> None:
    with distlock.connect(backend_url) as observer:
        holder = observer.lock(lock_name, ttl=5)
        assert holder.acquire()
        client = distlock.connect(backend_url)
        backend: Any = client._backend
        waiting = threading.Event()

        def wait(*args: object) -> None:  # a wait that ends the way a closed connection ends it
            waiting.set()
            wait_until(lambda: client.closed, 10, "the client to close")
            raise error

        backend.wait = wait
        thread, outcome = _acquire_on_a_thread(client, lock_name)
        assert waiting.wait(10)
        client.close()
        thread.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], distlock.ClientClosed), outcome
        holder.release()


def test_every_call_on_a_closed_client_raises_client_closed(backend_url: str, lock_name: str) -> None:
    client = distlock.connect(backend_url)
    held = client.lock(f"{lock_name}/held", ttl=5)
    assert held.acquire()
    idle = client.lock(lock_name, ttl=5)
    client.close()
    client.close()  # closing twice is fine
    calls: dict[str, Callable[[], object]] = {
        "lock()": lambda: client.lock(lock_name),
        "async_lock()": lambda: client.async_lock(lock_name),
        "holder()": lambda: client.holder(lock_name),
        "inspect()": client.inspect,
        "acquire()": idle.acquire,
        "acquire(blocking=False)": lambda: idle.acquire(blocking=False),
        "locked()": idle.locked,
        "release() of a lock the close released": held.release,
        "async acquire()": lambda: asyncio.run(distlock.AsyncLock(idle).acquire()),
    }
    outcomes: dict[str, str] = {}
    for what, call in calls.items():
        try:
            call()
            outcomes[what] = "returned"
        except Exception as e:
            outcomes[what] = type(e).__name__
    assert outcomes == dict.fromkeys(calls, "ClientClosed")
    assert held.lost and not held.owned()


def test_a_waiter_that_leaves_its_session_before_the_revoke_leaves_no_key(
    backend_url: str, lock_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() wakes a waiter, then revokes its lease. The woken waiter may leave its session (and stop being one of
    its members, whose tickets the revoke names) before the revoke reads them: its key must go all the same. Here
    the revoke waits until the waiter has left, an interleaving a loaded machine makes by itself; on Redis, whose
    revoke removes only the tickets it is given, the key stayed and counted as a waiter of the lock for good."""
    with distlock.connect(backend_url) as observer:
        holder = observer.lock(lock_name, ttl=5)
        assert holder.acquire()
        client = distlock.connect(backend_url)
        keeper: Any = client._keeper
        left = threading.Event()
        detach, revoke = keeper.detach, keeper._revoke

        def detach_and_tell(session: object, member: object) -> None:
            detach(session, member)
            left.set()

        def revoke_once_the_waiter_left(session: object) -> None:
            left.wait(10)
            revoke(session)

        monkeypatch.setattr(keeper, "detach", detach_and_tell)
        monkeypatch.setattr(keeper, "_revoke", revoke_once_the_waiter_left)
        thread, outcome = _acquire_on_a_thread(client, lock_name)
        wait_until(lambda: waiters(observer, lock_name) == 1, 10, "the waiter to queue")
        client.close()
        thread.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], distlock.ClientClosed), outcome
        assert left.is_set(), "the waiter never left its session"
        assert waiters(observer, lock_name) == 0, "the closed client's waiter is still in the queue"
        holder.release()


def test_a_join_under_way_when_the_client_closes_leaves_no_key(
    backend_url: str, lock_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() while a join is under way: the join lands on the live lease, the revoke starts before the join has
    answered (it cannot name a ticket it has not seen: it waits for the join), then the join answers. The key must
    not outlive the close (Redis removes a lease's keys only when the revoke names them)."""
    with distlock.connect(backend_url) as observer:
        holder = observer.lock(lock_name, ttl=5)
        assert holder.acquire()
        client = distlock.connect(backend_url)
        backend: Any = client._backend
        keeper: Any = client._keeper
        joined, revoking = threading.Event(), threading.Event()
        enqueue, revoke = backend.enqueue, keeper._revoke

        def enqueue_answered_once_the_revoke_started(*args: object) -> object:
            answer = enqueue(*args)
            joined.set()
            assert revoking.wait(10), "the revoke never started"
            return answer

        def revoke_after_telling(session: object) -> None:
            revoking.set()
            revoke(session)

        monkeypatch.setattr(backend, "enqueue", enqueue_answered_once_the_revoke_started)
        monkeypatch.setattr(keeper, "_revoke", revoke_after_telling)
        thread, outcome = _acquire_on_a_thread(client, lock_name)
        assert joined.wait(10)
        client.close()
        thread.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], distlock.ClientClosed), outcome
        assert waiters(observer, lock_name) == 0, "the closed client's join is still in the queue"
        holder.release()
