"""The Redis backend tests' fixtures: a real 3-master Redis Cluster (``redis_cluster``, ``cluster_url``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from distlock.testing import RedisServer

SLOTS = redis.crc.REDIS_CLUSTER_HASH_SLOTS


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[list[RedisServer]]:
    """Three cluster-enabled redis-servers, each master of a third of the slots, no replicas."""
    args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"]
    servers = [RedisServer(extra_args=args) for _ in range(3)]
    try:
        for server in servers:
            server.start()
        clients = [server.client() for server in servers]
        for i, client in enumerate(clients):
            client.cluster("ADDSLOTSRANGE", i * SLOTS // 3, (i + 1) * SLOTS // 3 - 1)
        for server in servers[1:]:
            clients[0].cluster("MEET", "127.0.0.1", server.port)
        deadline = time.monotonic() + 30
        while not all(c.cluster("INFO")["cluster_state"] == "ok" for c in clients):
            assert time.monotonic() < deadline, "the cluster did not reach cluster_state:ok"
            time.sleep(0.05)
        for client in clients:
            client.close()
        yield servers
    finally:
        for server in servers:
            server.close()


@pytest.fixture
def cluster_url(redis_cluster: list[RedisServer]) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{server.port}" for server in redis_cluster[:2])
