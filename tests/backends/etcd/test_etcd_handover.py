"""etcd only: what a hand-over costs. A release wakes the next waiter through its watch, and the waiter reads where
it stands once, from the member that reported the release; a waiter whose watch starts after the key ahead went
learns it from the read it makes then, without a second one. Counted with etcd's own gRPC counters, per method."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from _support import wait_until

import distlock
from distlock._protocol import Interrupt
from distlock.backends.etcd._backend import EtcdBackend
from distlock.testing import EtcdServer


@pytest.fixture(params=["etcd", pytest.param("etcd-3.4", marks=pytest.mark.etcd34)])
def server(request: pytest.FixtureRequest) -> Iterator[EtcdServer]:
    """A private etcd 3.5, or Debian's 3.4: each test here runs on both."""
    binary = request.getfixturevalue("etcd34_binary") if request.param == "etcd-3.4" else None
    with EtcdServer(binary=binary) as etcd:
        yield etcd


def _received(server: EtcdServer) -> dict[str, int]:
    """gRPC messages etcd received so far, by method."""
    counts: dict[str, int] = {}
    for sample, value in server.metrics().items():
        if sample.startswith("grpc_server_msg_received_total{"):
            method = sample.split('grpc_method="', 1)[1].split('"', 1)[0]
            counts[method] = counts.get(method, 0) + int(value)
    return counts


def _since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Lock traffic between two counts: a lease refresh that happens to fall between them is not part of it."""
    return {
        method: after[method] - before.get(method, 0)
        for method in after
        if after[method] != before.get(method, 0) and method != "LeaseKeepAlive"
    }


def _watchers(server: EtcdServer) -> float:
    return server.metrics().get("etcd_debugging_mvcc_watcher_total", 0.0)


def test_a_hand_over_costs_the_release_and_one_read(server: EtcdServer, lock_name: str) -> None:
    with distlock.connect(server.url) as first, distlock.connect(server.url) as second:
        holder = first.lock(lock_name, ttl=30)
        waiter = second.lock(lock_name, ttl=30)
        assert holder.acquire()
        acquired = threading.Event()
        proceed = threading.Event()

        def wait_for_turn() -> None:
            assert waiter.acquire(timeout=30)
            acquired.set()
            proceed.wait(30)
            waiter.release()

        thread = threading.Thread(target=wait_for_turn)
        thread.start()
        try:
            wait_until(lambda: _watchers(server) >= 1, 10, "the waiter's watch on the holder's key")
            before = _received(server)
            holder.release()
            assert acquired.wait(30), "the waiter did not get the lock"
            spent = _since(before, _received(server))
        finally:
            proceed.set()
            thread.join(30)
        # The release (one Txn) and the waiter's read of its own place (one Range): no second read, no new watch.
        assert spent == {"Txn": 1, "Range": 1}, spent


def test_a_wait_that_starts_after_the_key_ahead_went_returns_the_read_it_made(
    server: EtcdServer, lock_name: str
) -> None:
    with distlock.connect(server.url) as client:
        backend = client._backend
        assert isinstance(backend, EtcdBackend)
        lease = backend.grant_lease(30)
        first, _ = backend.enqueue(lock_name, lease, "first", b"")
        second, position = backend.enqueue(lock_name, lease, "second", b"")
        assert not position.held and position.ahead == first.key
        assert backend.dequeue(first)  # the store moves on: the watch starts after the read that found `first`
        before = _received(server)
        seen = backend.wait(second, position, 10, Interrupt())
        spent = _since(before, _received(server))
        # The watch's start is later than the read, so the waiter reads again (once) before it blocks; that read
        # shows it holds the lock, and the caller gets it instead of having to read a second time.
        assert seen is not None and seen.held, seen
        assert spent == {"Watch": 1, "Range": 1}, spent
        backend.revoke_lease(lease, [])
