"""Holders and waiters that crash, pause or fork, and a server that restarts or stalls, on every backend with a server
(or a file) to stop: real processes, real signals."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _support import LockServer, Worker, wait_until, waiters

import distlock
from distlock import _clock

pytestmark = pytest.mark.every_database

TTL = 2  # etcd's smallest lease with its default election timeout


@pytest.fixture
def worker(backend_url: str) -> Iterator[Worker]:
    w = Worker(backend_url)
    yield w
    w.close()


@pytest.mark.real_server
def test_sigkilled_holder_frees_the_lock_within_ttl(client: distlock.Client, worker: Worker, lock_name: str) -> None:
    answer = worker.call(op="acquire", name=lock_name, ttl=TTL)
    assert answer["acquired"]
    waiter = client.lock(lock_name, ttl=TTL)
    result: list[float] = []

    def wait() -> None:
        if waiter.acquire(timeout=30):
            result.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: waiters(client, lock_name) == 1, 5, "our waiter to queue behind the worker")
    killed_at = time.monotonic()
    worker.kill()
    thread.join(30)
    assert result, "the next waiter never got the lock"
    assert result[0] - killed_at <= TTL + 1, f"took {result[0] - killed_at:.2f} s"
    assert waiter.token > answer["token"]
    waiter.release()


@pytest.mark.real_server
def test_sigstopped_holder_loses_the_lock_and_cannot_release_the_new_one(
    client: distlock.Client, worker: Worker, lock_name: str
) -> None:
    first = worker.call(op="acquire", name=lock_name, ttl=TTL)
    assert first["acquired"]
    worker.stop()
    second = client.lock(lock_name, ttl=TTL)
    try:
        assert second.acquire(timeout=TTL + 5), "the lease of a stopped holder did not expire"
        assert second.token > first["token"]
    finally:
        worker.cont()
    assert worker.call(op="status") == {"owned": False, "lost": True}
    assert worker.call(op="ensure_held")["error"] == "LockLost"
    assert worker.call(op="release")["error"] == "LockLost"
    holder = client.holder(lock_name)
    assert holder is not None and holder.token == second.token, "the stale release touched the new holder's key"
    second.ensure_held(verify=True)
    second.release()


@pytest.mark.real_server
def test_a_waiter_whose_lease_expires_does_not_get_the_lock(
    backend_url: str, client: distlock.Client, worker: Worker, lock_name: str
) -> None:
    holder = client.lock(lock_name, ttl=TTL)
    assert holder.acquire()
    worker.send(op="acquire", name=lock_name, ttl=TTL, timeout=60)
    wait_until(lambda: waiters(client, lock_name) == 1, 10, "the worker to queue")
    with distlock.connect(backend_url) as other:
        behind = other.lock(lock_name, ttl=TTL)
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(behind.acquire(timeout=30)))
        thread.start()
        wait_until(lambda: waiters(client, lock_name) == 2, 10, "a second waiter to queue behind the worker")
        worker.stop()
        try:
            # The stopped worker's lease expires; its key goes, and the waiter behind moves up.
            wait_until(lambda: waiters(client, lock_name) == 1, TTL + 5, "the stopped waiter's key to expire")
            holder.release()
            thread.join(10)
            assert got == [True], "the waiter behind an expired waiter did not get the lock"
        finally:
            worker.cont()
        # Resumed, the worker finds its key gone and queues again: it does not hold the lock.
        wait_until(lambda: waiters(client, lock_name) == 1, 10, "the resumed worker to queue again")
        current = client.holder(lock_name)
        assert current is not None and current.token == behind.token
        behind_token = behind.token
        behind.release()
        answer = worker.read(timeout=10)
        assert answer["acquired"] and answer["token"] > behind_token
        assert worker.call(op="release") == {"ok": True}


def test_tokens_and_waiters_survive_a_server_restart(lock_server: LockServer, lock_name: str) -> None:
    # A request may wait out the whole restart (a JVM's start on a loaded machine takes a while): a minute. The leases
    # outlive it (30 s): a restart longer than the lease is the next test's outage.
    with distlock.connect(lock_server.url, request_timeout=60) as client:
        with client.lock(lock_name, ttl=30) as lock:
            before = lock.token
        holder = client.lock(lock_name, ttl=30)
        assert holder.acquire()
        waiter = client.lock(lock_name, ttl=30)
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=150)))
        thread.start()
        wait_until(lambda: waiters(client, lock_name) == 1, 5, "the waiter to queue")
        lock_server.restart()  # the waiter's watch stream (etcd) or blocked BLPOP (Redis) breaks here
        assert not holder.lost
        held = holder.token
        holder.release()
        thread.join(160)
        assert got == [True], "the waiter did not resume waiting after the server restarted"
        waited = waiter.token
        assert waited > held > before
        waiter.release()
    lock_server.restart()
    with distlock.connect(lock_server.url) as client, client.lock(lock_name, ttl=30) as lock:
        assert lock.token > waited


def test_a_wait_outlives_an_outage_longer_than_its_lease(lock_server: LockServer, lock_name: str) -> None:
    """A server that stalls for three times the lease: the holder may lose the lock (its lease ran out on the
    server), and a waiter whose lease ran out too queues again with a new one: it gets the lock within its own
    timeout, not an error, once the service answers again and the holder is gone."""
    ttl = TTL  # the outage, 3 x ttl, outlasts connect_timeout too: a session opened in it waits for the server
    with distlock.connect(lock_server.url, request_timeout=30, connect_timeout=2) as client:
        holder = client.lock(lock_name, ttl=ttl)
        assert holder.acquire()
        waiter = client.lock(lock_name, ttl=ttl)
        got: list[object] = []

        def wait() -> None:
            try:
                got.append(waiter.acquire(timeout=90))
            except distlock.DistlockError as e:  # pragma: no cover - the failure this test is for
                got.append(e)

        thread = threading.Thread(target=wait)
        thread.start()
        with distlock.connect(lock_server.url) as observer:  # ours reads nothing but its own tickets' places
            wait_until(lambda: waiters(observer, lock_name) == 1, 10, "the waiter to queue")
        lock_server.pause()
        try:
            time.sleep(3 * ttl)
        finally:
            lock_server.resume()
        held = holder.token
        with contextlib.suppress(distlock.LockLost):  # its lease ran out while the server stood still
            holder.release()
        thread.join(100)
        assert got == [True], f"the waiter did not queue again after the outage: {got}"
        assert waiter.token > held
        waiter.release()


def _child_uses_inherited_client(client: distlock.Client, parent_lock: distlock.Lock, name: str, queue: object) -> None:
    q: multiprocessing.Queue[object] = queue  # type: ignore[assignment]
    try:
        parent_lock.release()
        q.put("released the parent's lock")
    except distlock.LockNotOwned:
        q.put("refused")
    with client.lock(name, ttl=TTL) as lock:
        q.put(lock.token)


def test_a_forked_child_gets_its_own_connection_and_leaves_the_parent_alone(
    client: distlock.Client, lock_name: str
) -> None:
    # A longer lease than the other tests': a 2 s one can lapse when a loaded machine starves the keeper thread,
    # which is not what this test is about.
    parent_lock = client.lock(f"{lock_name}/parent", ttl=3 * TTL)
    assert parent_lock.acquire()
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[object] = context.Queue()
    children = [
        context.Process(target=_child_uses_inherited_client, args=(client, parent_lock, f"{lock_name}/child", queue))
        for _ in range(2)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    answers = [queue.get(timeout=5) for _ in range(4)]
    assert answers.count("refused") == 2
    assert all(isinstance(a, int) for a in answers if a != "refused")
    # The parent's keeper refreshes its lease after the children are gone, and the server still has its key: the
    # children neither revoked its lease nor broke its connection.
    session = parent_lock._session
    assert session is not None
    exited = _clock.now()
    wait_until(lambda: session.sent_at > exited, 3 * TTL, "the parent's keep-alive after the children exited")
    parent_lock.ensure_held(verify=True)
    parent_lock.release()


def test_a_waiter_that_gives_up_during_an_outage_is_removed_later(lock_server: LockServer, lock_name: str) -> None:
    with distlock.connect(lock_server.url) as observer, distlock.connect(lock_server.url, request_timeout=1) as client:
        holder = observer.lock(lock_name, ttl=30)
        assert holder.acquire()
        result: list[bool] = []
        # Pause only once the waiter waits: its join is done (on ZooKeeper, a join is a create and then a read,
        # and the node shows before the read is answered).
        waiting = threading.Event()
        backend = client._backend
        wait = backend.wait

        def waits(*args: Any) -> Any:
            waiting.set()
            return wait(*args)

        backend.wait = waits  # type: ignore[method-assign,assignment]
        thread = threading.Thread(target=lambda: result.append(client.lock(lock_name, ttl=30).acquire(timeout=1.5)))
        thread.start()
        assert waiting.wait(5), "the waiter did not start waiting"
        lock_server.pause()  # the waiter's timeout strikes while the server cannot answer its delete
        try:
            thread.join(15)
            assert result == [False]
        finally:
            lock_server.resume()
        wait_until(lambda: waiters(observer, lock_name) == 0, 10, "the background retry to remove the waiter's key")
        holder.release()
