"""Throwaway real servers for tests (etcd, one or a cluster; Redis; PostgreSQL; MariaDB; ZooKeeper, one or an
ensemble; each on loopback), and ``MemoryBackend``, the in-memory reference backend (``memory://``).

Like kazoo's ZooKeeper harness, it lets your own tests (and distlock's) run against real servers, not mocks::

    with EtcdServer() as server:
        client = distlock.connect(server.url)
        server.kill()  # crash it
        server.start()  # same data, same ports

Every server gets free loopback ports, a private temporary directory and the same life cycle (``_base``): start,
stop, kill, pause/resume (SIGSTOP/SIGCONT), restart on the same ports with the same data, close, ``with``.
``python -m distlock.testing`` starts one from the command line. Where each binary comes from, and the pytest
plugin built on this: docs/testing.md.

What can go wrong: a missing binary (or ``trustme`` for a TLS etcd), or as root no user to run PostgreSQL as, is a
`ConfigurationError` saying what to install or pass; a server that exits or does not answer within its
``start_timeout`` raises `EtcdStartError` (etcd) or `ServerStartError` (the others), both `HarnessError`, with the
tail of its log. Only a Python process killed by a signal it does not handle leaves servers running, with their
directories under ``$TMPDIR/distlock-*``.
"""

from distlock.testing._base import HarnessError, ServerStartError, parse_prometheus_text
from distlock.testing._etcd import EtcdServer, EtcdStartError, etcd_version, find_etcd, find_etcdctl
from distlock.testing._etcdcluster import EtcdCluster
from distlock.testing._mariadb import MariaDBServer, find_mariadb_bin
from distlock.testing._memory import MemoryBackend
from distlock.testing._postgres import PostgresServer, find_postgres_bin
from distlock.testing._redis import RedisServer, find_redis_server
from distlock.testing._zookeeper import ZooKeeperEnsemble, ZooKeeperServer, find_zookeeper

__all__ = [
    "EtcdCluster",
    "EtcdServer",
    "EtcdStartError",
    "HarnessError",
    "MariaDBServer",
    "MemoryBackend",
    "PostgresServer",
    "RedisServer",
    "ServerStartError",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "etcd_version",
    "find_etcd",
    "find_etcdctl",
    "find_mariadb_bin",
    "find_postgres_bin",
    "find_redis_server",
    "find_zookeeper",
    "parse_prometheus_text",
]
