"""A site made by ``django-admin startproject``, with ``DISTLOCK = {"URL": "django://default"}``, tested both ways.

What a team without a lock service does: the lock table in the site's own database, and the site's tests run by
``manage.py test`` (``TestCase``, ``TransactionTestCase``, ``--parallel``) and by pytest-django (``django_db``, with
and without ``transaction=True``), on SQLite as ``startproject`` writes it (the test database in memory), SQLite with
a test database file, PostgreSQL and MariaDB. In every test a locked view is called inside the test's transaction
after the test wrote a row, answers 200 twice, and 423 while another handle holds its lock. Each run must exit 0
without a warning and leave no test database and no lock file behind.

The site is made once per module (startproject, startapp, makemigrations) and copied per run; each run is a process of
its own, as a user runs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from _support import child_env

from distlock.testing import MariaDBServer

pytestmark = pytest.mark.real_server

_SETTINGS = """
INSTALLED_APPS += ["distlock_django", "shop"]
DISTLOCK = {"URL": "django://default", "TIMEOUT": 0}

import json, os  # noqa: E401
if os.environ.get("SITE_DATABASE"):
    DATABASES = {"default": json.loads(os.environ["SITE_DATABASE"])}
if DATABASES["default"]["ENGINE"].endswith("mysql"):  # PyMySQL standing in for mysqlclient, as its docs say
    import pymysql
    pymysql.version_info = (2, 2, 1, "final", 0)
    pymysql.install_as_MySQLdb()
"""

_MODELS = """
from django.db import models


class Order(models.Model):
    paid = models.BooleanField(default=False)
"""

_VIEWS = """
from django.http import HttpResponse

from distlock_django import distributed_lock

from .models import Order


@distributed_lock("order:{pk}")
def pay(request, pk):
    order = Order.objects.get(pk=pk)
    order.paid = True
    order.save()
    return HttpResponse("paid")


@distributed_lock("order:{pk}")
async def apay(request, pk):
    order = await Order.objects.aget(pk=pk)
    order.paid = True
    await order.asave()
    return HttpResponse("paid")
"""

_URLS = """
from django.urls import path

from shop import views

urlpatterns = [path("orders/<int:pk>/pay/", views.pay), path("orders/<int:pk>/apay/", views.apay)]
"""

_PAYS = """
from distlock_django import get_client, lock_name

from shop.models import Order


def pays(client, view="pay"):
    order = Order.objects.create()  # the test's transaction has written: SQLite's write lock is the test's now
    url = f"/orders/{order.pk}/{view}/"
    assert client.post(url).status_code == 200
    assert client.post(url).status_code == 200  # the first request's lock was released
    with get_client().lock(lock_name(f"order:{order.pk}"), ttl=30):  # another holder
        assert client.post(url).status_code == 423
    order.refresh_from_db()
    assert order.paid
"""

_DJANGO_TESTS = """
from django.test import TestCase, TransactionTestCase

from shop.pays import pays


class PayInATestCase(TestCase):
    def test_pay(self):
        pays(self.client)

    def test_pay_async(self):
        pays(self.client, "apay")


class PayInATransactionTestCase(TransactionTestCase):
    def test_pay(self):
        pays(self.client)


class PayAgain(TestCase):
    def test_pay(self):
        pays(self.client)
"""

_PYTEST_TESTS = """
import pytest

from shop.pays import pays


@pytest.mark.django_db
def test_pay(client):
    pays(client)


@pytest.mark.django_db
def test_pay_async(client):
    pays(client, "apay")


@pytest.mark.django_db(transaction=True)
def test_pay_committed(client):
    pays(client)
"""


@pytest.fixture(scope="module")
def site_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A startproject site with a ``shop`` app, its locked view, its migration and its tests (both kinds)."""
    root = tmp_path_factory.mktemp("site")
    env = child_env()
    bin_dir = Path(sys.executable).parent
    subprocess.run([bin_dir / "django-admin", "startproject", "mysite", root], check=True, env=env)
    subprocess.run([sys.executable, "manage.py", "startapp", "shop"], cwd=root, check=True, env=env)
    with (root / "mysite" / "settings.py").open("a") as settings:
        settings.write(_SETTINGS)
    (root / "mysite" / "urls.py").write_text(_URLS)
    shop = root / "shop"
    (shop / "models.py").write_text(_MODELS)
    (shop / "views.py").write_text(_VIEWS)
    (shop / "pays.py").write_text(_PAYS)
    (shop / "tests.py").write_text(_DJANGO_TESTS)
    (root / "test_pytest.py").write_text(_PYTEST_TESTS)
    (root / "pytest.ini").write_text("[pytest]\nDJANGO_SETTINGS_MODULE = mysite.settings\n")
    subprocess.run([sys.executable, "manage.py", "makemigrations", "shop"], cwd=root, check=True, env=env)
    return root


@pytest.fixture(scope="module")
def site_mariadb() -> Iterator[MariaDBServer]:
    """A MariaDB of the site's own: what Django's runner does there (clones by mysqldump, drops) stays there."""
    with MariaDBServer() as server:
        yield server


def _postgres(dsn: str) -> dict[str, object]:
    parts = urlsplit(dsn)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": f"site_{uuid.uuid4().hex[:8]}",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname,
        "PORT": str(parts.port),
    }


def _mariadb(server: MariaDBServer) -> dict[str, object]:
    name = f"site_{uuid.uuid4().hex[:8]}"
    server.sql(
        "CREATE USER IF NOT EXISTS 'site'@'127.0.0.1' IDENTIFIED BY 'site'; "
        "GRANT ALL PRIVILEGES ON `test_site%`.* TO 'site'@'127.0.0.1';"
    )
    return {
        "ENGINE": "django.db.backends.mysql",
        "NAME": name,
        "USER": "site",
        "PASSWORD": "site",
        "HOST": "127.0.0.1",
        "PORT": str(server.port),
        "OPTIONS": {"charset": "utf8mb4"},
    }


@pytest.fixture(params=["sqlite-memory", "sqlite-file", "postgres", "mariadb"])
def database(request: pytest.FixtureRequest) -> dict[str, object] | None:
    """The site's ``DATABASES["default"]``: None keeps startproject's SQLite (its test database in memory)."""
    if request.param == "sqlite-memory":
        return None
    if request.param == "sqlite-file":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3", "TEST": {"NAME": "test_db.sqlite3"}}
    if request.param == "postgres":
        return _postgres(request.getfixturevalue("postgres_dsn"))
    return _mariadb(request.getfixturevalue("site_mariadb"))


@pytest.fixture
def site(site_template: Path, tmp_path: Path) -> Path:
    root = tmp_path / "site"
    shutil.copytree(site_template, root)
    return root


def _run(site: Path, database: dict[str, object] | None, *command: str) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env["TMPDIR"] = str(site.parent / "tmp")  # where an in-memory test database's lock file goes
    Path(env["TMPDIR"]).mkdir(exist_ok=True)
    if database is not None:
        env["SITE_DATABASE"] = json.dumps(database)
    return subprocess.run(
        [sys.executable, *command],
        cwd=site, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


def _left_behind(site: Path, database: dict[str, object] | None, request: pytest.FixtureRequest) -> list[str]:
    """Test databases and lock files the run left: files in the site and its TMPDIR, databases on the server."""
    files = [p.name for p in site.iterdir() if p.name.startswith("test_") and p.suffix != ".py"]
    files += [p.name for p in site.iterdir() if p.name.endswith("-distlock")]
    files += [p.name for p in (site.parent / "tmp").iterdir() if p.name.startswith("distlock-")]
    engine = str((database or {}).get("ENGINE", ""))
    if engine.endswith("postgresql"):
        import psycopg

        with psycopg.connect(request.getfixturevalue("postgres_dsn"), autocommit=True) as connection:
            rows = connection.execute("SELECT datname FROM pg_database WHERE datname LIKE 'test_site%'").fetchall()
        files += [row[0] for row in rows if str(database["NAME"]) in row[0]]  # type: ignore[index]
    if engine.endswith("mysql"):
        server: MariaDBServer = request.getfixturevalue("site_mariadb")
        listed = server.sql("SHOW DATABASES")
        files += [name for name in listed.split() if name.startswith(f"test_{database['NAME']}")]  # type: ignore[index]
    return files


def _clean(result: subprocess.CompletedProcess[str]) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "arning" not in output, output  # Warning, warnings summary, RuntimeWarning...


def test_manage_py_test(site: Path, database: dict[str, object] | None, request: pytest.FixtureRequest) -> None:
    # --parallel but on PostgreSQL: there, the test process's own client is the one that kept the database open.
    parallel = ["--parallel", "2"] if "postgres" not in request.node.name else []
    result = _run(site, database, "manage.py", "test", *parallel, "--noinput")
    _clean(result)
    assert "Ran 4 tests" in result.stderr, result.stderr
    assert _left_behind(site, database, request) == []


def test_pytest_django(site: Path, database: dict[str, object] | None, request: pytest.FixtureRequest) -> None:
    result = _run(site, database, "-m", "pytest", "-p", "no:cacheprovider", "-W", "error", "test_pytest.py")
    _clean(result)
    assert "3 passed" in result.stdout, result.stdout
    assert _left_behind(site, database, request) == []
