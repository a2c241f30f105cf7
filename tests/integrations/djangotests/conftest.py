"""Django under test with pytest-django: settings from ``testsettings.py``, real etcd, SQLite and PostgreSQL.

pytest-django configures Django only when it is given a settings module. This file gives it one, in
``pytest_configure`` (pytest calls it when it loads this file, before it imports the test modules here, which import
models at the top): so ``pytest tests/integrations/celery`` or ``pytest tests/tooling/test_demo.py`` never configure
Django, and in a whole run the variable this sets is stripped from child processes by ``_support.child_env``.

pytest-django then creates the test databases (``django_db_setup``): the ``pg`` alias on the session's throwaway
PostgreSQL (``postgres_dsn``), ``default`` in a SQLite file (not in memory: ``fenceworker.py`` processes open it too).
Tests that touch a database say so with ``pytest.mark.django_db(transaction=True, databases=[...])`` and run on
both databases through the ``db_alias`` fixture; committed transactions (``transactional_db``), because their locks
are taken by threads, processes and a live server that must see what the test wrote. pytest-django flushes both
databases after each of them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import django
import pytest
from _support import child_env
from django.test import Client
from django.test.utils import override_settings
from pytest_django import DjangoDbBlocker


def pytest_configure(config: pytest.Config) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "djangotests.testsettings"
    django.setup()
    _load_mysql_backend_on_pymysql()


def _load_mysql_backend_on_pymysql() -> None:
    """Django's MySQL backend (the ``maria`` alias) on PyMySQL when mysqlclient is missing, loaded once, now.

    As ``test_django_guard.py`` does it: a *copy* of PyMySQL named ``MySQLdb`` while the backend is imported, then
    removed (``pymysql.install_as_MySQLdb()`` would let the ``MySQLdb.*`` submodules Django imports replace
    ``pymysql.err``, and later PyMySQL users would miss the exceptions PyMySQL raises)."""
    import importlib.util
    import types

    if importlib.util.find_spec("MySQLdb") is not None:
        return
    try:
        import pymysql
    except ImportError:  # without the sqltable-mysql extra no test can name the maria alias
        return
    shim = types.ModuleType("MySQLdb")
    shim.__dict__.update({k: v for k, v in vars(pymysql).items() if k not in ("__name__", "__spec__", "__loader__")})
    shim.version_info = (2, 2, 1, "final", 0)  # type: ignore[attr-defined]  # Django's minimum mysqlclient
    sys.modules["MySQLdb"] = shim
    try:
        import django.db.backends.mysql.base  # noqa: F401
    finally:
        for name in [name for name in sys.modules if name == "MySQLdb" or name.startswith("MySQLdb.")]:
            del sys.modules[name]


@pytest.fixture
def django_client() -> Client:
    """Django's test client (pytest-django's ``client``: in tests/, ``client`` is a distlock client everywhere)."""
    return Client()


@pytest.fixture(scope="session", autouse=True)
def _database_access_blocked(django_db_blocker: DjangoDbBlocker) -> Iterator[None]:
    """Database access only in tests that ask for it, also when this file was loaded after pytest-django had set up
    (``pytest tests``: Django was not configured yet when pytest-django looked)."""
    with django_db_blocker.block():
        yield


def _names_maria(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("django_db")
    return marker is not None and "maria" in (marker.kwargs.get("databases") or ())


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None,
    postgres_dsn: str,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    """Before pytest-django creates the test databases: ``pg`` on the session's PostgreSQL, SQLite in a file, and
    ``maria`` on the session's MariaDB when a selected test names it (the write-path matrix); pytest-django creates
    only the databases the selected tests name."""
    from django.db import connections
    from djangotests.testsettings import _maria, _pg

    connections.settings["pg"].update(_pg(postgres_dsn))
    sqlite = connections.settings["default"]
    sqlite["TEST"] = {**sqlite.get("TEST", {}), "NAME": str(tmp_path_factory.mktemp("django") / "test.sqlite3")}
    if any(_names_maria(item) for item in request.session.items):
        server = request.getfixturevalue("mariadb_server")
        # Django creates (and drops) test_djangotests itself: a user of its own may.
        server.sql(
            "CREATE USER IF NOT EXISTS 'django'@'127.0.0.1' IDENTIFIED BY 'django'; "
            # (``test_djangotests_gw0`` under pytest-xdist: pytest-django names a worker's databases so)
            "GRANT ALL PRIVILEGES ON `test_djangotests%`.* TO 'django'@'127.0.0.1';"
        )
        connections.settings["maria"].update(_maria(server.port))


@pytest.fixture(scope="session")
def django_servers(etcd_url: str, postgres_dsn: str) -> Iterator[dict[str, str]]:
    """Point ``DISTLOCK`` at the session's etcd; the variables a Django process started by a test needs."""
    from djangotests.testsettings import DISTLOCK

    import distlock_django

    override = override_settings(DISTLOCK={**DISTLOCK, "URL": etcd_url})
    override.enable()
    yield {"DISTLOCK_DJANGO_ETCD_URL": etcd_url, "DISTLOCK_DJANGO_PG": postgres_dsn}
    distlock_django.reset_client()
    override.disable()


@pytest.fixture(params=["default", "pg"], ids=["sqlite", "postgres"])
def db_alias(request: pytest.FixtureRequest, django_servers: dict[str, str]) -> Iterator[str]:
    """Run the test on SQLite and on PostgreSQL (the test databases pytest-django made).

    The test's ``django_db`` mark names both databases and says how: ``transaction=True`` (real commits, both
    flushed afterwards) or not (inside the atomic blocks of a ``TestCase``, rolled back afterwards).
    """
    from djangotests.testapp import router

    alias: str = request.param
    router.CURRENT[0] = alias
    try:
        yield alias
    finally:
        router.CURRENT[0] = "default"


@pytest.fixture
def django_child_env(db_alias: str, django_servers: dict[str, str]) -> dict[str, str]:
    """The environment of a Django process a test starts: the test databases, the test's alias, the session's etcd."""
    from django.db import connections

    env = child_env()
    env.update(django_servers)
    test_pg = urlsplit(django_servers["DISTLOCK_DJANGO_PG"])._replace(
        path="/" + connections["pg"].settings_dict["NAME"]
    )
    env.update(
        {
            "DISTLOCK_DJANGO_PG": test_pg.geturl(),
            "DISTLOCK_DJANGO_SQLITE": str(connections["default"].settings_dict["NAME"]),
            "DISTLOCK_DJANGO_DB": db_alias,
        }
    )
    return env
