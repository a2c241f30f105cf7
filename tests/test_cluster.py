"""A 3-member etcd cluster whose leader is killed while locks are held and waited on."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from _support import wait_until

import distlock
from distlock.testing import EtcdCluster

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
        with distlock.connect(etcd_cluster.url, request_timeout=15) as client:
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
