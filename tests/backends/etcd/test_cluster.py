"""A 3-member etcd cluster whose leader is killed while locks are held and waited on."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from _support import wait_until

import distlock
from distlock.backends.etcd._backend import EtcdBackend
from distlock.testing import EtcdCluster, EtcdServer

pytestmark = pytest.mark.cluster


def test_killing_the_leader_keeps_exclusion_and_order(
    etcd_cluster: EtcdCluster, lock_name: str, tmp_path: Path
) -> None:
    marker = tmp_path / "inside"
    tokens: list[int] = []
    violations: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    barrier = threading.Barrier(5)

    def worker() -> None:
        # fail_fast=0: a worker tries again at once after an error; a client failing fast would make it spin.
        with distlock.connect(etcd_cluster.url, request_timeout=15, fail_fast=0) as client:
            lock = client.lock(lock_name, ttl=10, timeout=30)
            barrier.wait()
            while not stop.is_set():
                try:
                    with lock:
                        # Exclusion is checked by the file system, not by our own bookkeeping: O_EXCL fails if
                        # another holder is inside.
                        try:
                            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                        except FileExistsError:
                            violations.append(f"two holders at once (token {lock.token})")
                            continue
                        tokens.append(lock.token)
                        time.sleep(0.002)
                        os.close(fd)
                        marker.unlink()
                except distlock.BackendUnavailable as e:  # the whole cluster briefly without a leader
                    errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    barrier.wait()
    wait_until(lambda: len(tokens) >= 20, 30, "the workers to get going")
    leader = etcd_cluster.leader
    before_kill = len(tokens)
    leader.kill()
    etcd_cluster.wait_for_leader(timeout=15)
    wait_until(lambda: len(tokens) >= before_kill + 30, 60, "waiters to proceed after the leader was killed")
    stop.set()
    for thread in threads:
        thread.join(60)
    assert not violations, violations
    assert tokens == sorted(tokens), "fencing tokens went backwards"
    assert len(set(tokens)) == len(tokens), "a fencing token was handed out twice"
    assert len(errors) <= 4, errors


def _member_of(cluster: EtcdCluster, client: distlock.Client) -> EtcdServer:
    """The cluster member ``client`` sends its requests to now."""
    backend = client._backend
    assert isinstance(backend, EtcdBackend)
    address = backend._channels.member().address
    (member,) = [m for m in cluster.members if m.endpoint == address]
    return member


def test_a_frozen_member_costs_no_error_while_a_quorum_is_healthy(etcd_cluster: EtcdCluster, lock_name: str) -> None:
    # The member freezes for longer than the whole request_timeout: a request that waited for it would fail.
    with distlock.connect(etcd_cluster.url, request_timeout=2) as client:
        frozen = _member_of(etcd_cluster, client)
        frozen.pause()
        try:
            acquired = 0
            until = time.monotonic() + 3
            while time.monotonic() < until:
                with client.lock(lock_name, ttl=2, timeout=2):
                    acquired += 1
            assert frozen.paused  # every acquisition above happened while the member was frozen
        finally:
            frozen.resume()
    assert acquired > 0


def test_a_waiter_watching_a_frozen_member_still_gets_the_lock(etcd_cluster: EtcdCluster, lock_name: str) -> None:
    with distlock.connect(etcd_cluster.url) as holder, distlock.connect(etcd_cluster.url) as waiter:
        held = holder.lock(lock_name, ttl=5)
        held.acquire()
        got_it = threading.Event()

        def wait_for_it() -> None:
            with waiter.lock(lock_name, ttl=5, timeout=20):
                got_it.set()

        thread = threading.Thread(target=wait_for_it)
        thread.start()
        wait_until(lambda: (h := holder.holder(lock_name)) is not None and h.waiters == 1, 10, "the waiter to queue")
        frozen = _member_of(etcd_cluster, waiter)  # the member its watch is on
        frozen.pause()
        try:
            held.release()
            # A watch on the frozen member never reports the release; the waiter must notice the silence and read
            # its place from another member while this one is still frozen.
            assert got_it.wait(8), "the waiter stayed on the frozen member's watch"
        finally:
            frozen.resume()
            thread.join(30)
