"""The pytest plugins for users' test suites (``distlock.testing._plugin``, and Django's fixture in
``distlock_django._pytest_plugin``), tested as pytest plugins are: pytester writes a small users' project and runs
pytest on it in a subprocess, which loads the plugins through their ``pytest11`` entry points exactly as a user's
pytest does (``-p`` only where the installed metadata predates an entry point, see `DJANGO_PLUGIN`).

Each project's last word is the server's: no key is left on it, checked inside the session (the throwaway server
is gone after it) or, with ``--distlock-url``/``$DISTLOCK_TEST_URL`` pointing at this test's own server, after it.
"""

from __future__ import annotations

import os
import tomllib
import uuid
from importlib.metadata import entry_points
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from _support import REPO

import distlock.testing
from distlock.testing._plugin import THROWAWAY

pytest_plugins = ["pytester"]

# Lists every key on the server the URL names (etcdctl for etcd, redis-py for Redis), from inside the project.
SERVER_KEYS = """
import subprocess

import redis

from distlock.testing import find_etcdctl


def keys_on_server(url):
    if url.startswith("redis://"):
        with redis.Redis.from_url(url) as server:
            return sorted(key.decode() for key in server.keys("*"))
    endpoint = url.removeprefix("etcd://")
    command = [find_etcdctl(), f"--endpoints={endpoint}", "get", "", "--prefix", "--keys-only"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()
"""

PLAIN_TESTS = """
import distlock
from serverkeys import keys_on_server

SEEN = {}


def test_locks_and_tokens(distlock_client, distlock_prefix, distlock_url):
    SEEN["prefix"] = distlock_prefix
    with distlock_client.lock("order:42", ttl=10) as lock:
        first = lock.token
        assert distlock_client.holder("order:42").token == first
    with distlock_client.lock("order:42", ttl=10) as lock:
        assert lock.token > first
    distlock_client.lock("left-held", ttl=30).acquire()  # still held when the test ends
    SEEN["forgotten"] = distlock.connect(distlock_url, prefix=distlock_prefix)  # never closed by the test
    SEEN["forgotten"].lock("forgotten", ttl=30).acquire()
    keys = keys_on_server(distlock_url)
    assert keys and all(key.startswith(distlock_prefix) for key in keys)


def test_the_first_test_left_nothing(distlock_client, distlock_prefix, distlock_url):
    assert SEEN["prefix"] != distlock_prefix
    assert keys_on_server(distlock_url) == []
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """An empty users' project, run without this process's Django settings or distlock URL."""
    for name in ("DJANGO_SETTINGS_MODULE", "DISTLOCK_TEST_URL"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeini("[pytest]\npythonpath = .\n")
    pytester.makepyfile(serverkeys=SERVER_KEYS)
    return pytester


def keys_on(server: distlock.testing.EtcdServer | distlock.testing.RedisServer) -> list[str]:
    if isinstance(server, distlock.testing.RedisServer):
        with server.client() as redis:
            return sorted(key.decode() for key in redis.keys("*"))
    return server.etcdctl("get", "", "--prefix", "--keys-only").split()


def test_pytest_help_lists_the_options(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(
        [
            "distlock: lock servers and clients for tests:",
            "*--distlock-url=URL*",
            f"*--distlock-backend={{{','.join(THROWAWAY)}}}*",
            "*--distlock-etcd-bin=PATH*",
            "*--distlock-redis-bin=PATH*",
            "*--distlock-prefix=PREFIX*",
        ]
    )
    for ini_key in ("distlock_url", "distlock_backend", "distlock_etcd_bin", "distlock_redis_bin", "distlock_prefix"):
        result.stdout.fnmatch_lines([f"*{ini_key} (string)*"])


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_a_throwaway_server_per_session_and_nothing_left_by_a_test(project: pytest.Pytester, backend: str) -> None:
    project.makepyfile(test_plain=PLAIN_TESTS)
    result = project.runpytest_subprocess(f"--distlock-backend={backend}")
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_an_existing_server_is_left_without_keys(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, backend: str, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue(f"{backend}_server")
    project.makepyfile(test_plain=PLAIN_TESTS)
    monkeypatch.setenv("DISTLOCK_TEST_URL", server.url)
    result = project.runpytest_subprocess()
    result.assert_outcomes(passed=2)
    assert keys_on(server) == []


GIVEN_URL_TESTS = """
import re

import distlock


def test_a_lock(distlock_client, distlock_url, distlock_prefix, distlock_{backend}_noproc):
    assert distlock_{backend}_noproc == distlock_url
    with distlock.connect(distlock_url, prefix=distlock_prefix) as other:
        with distlock_client.lock("order:42", ttl=10) as lock:
            assert distlock_client.holder("order:42").token == lock.token
            assert not other.lock("order:42").acquire(timeout=0)
        assert other.lock("order:42").acquire(timeout=0)  # released
    if distlock_url.startswith("sql+"):
        assert re.fullmatch(r"distlock_test_[0-9a-f]{{16}}", distlock_prefix)  # a table prefix
"""


def given_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of a lock service of ``kind``, on the session's servers (SQLite: a file; memory: no server)."""
    if kind == "zookeeper":
        return str(request.getfixturevalue("zookeeper_url"))
    if kind == "postgresql":
        return f"sql+{request.getfixturevalue('postgres_dsn')}"
    return f"sql+sqlite:///{tmp_path / 'locks.db'}" if kind == "sqlite" else "memory://"


# etcd and Redis: test_an_existing_server_is_left_without_keys.
@pytest.mark.parametrize(
    ("kind", "backend"),
    [("zookeeper", "zookeeper"), ("postgresql", "sqltable"), ("sqlite", "sqltable"), ("memory", "memory")],
)
def test_a_given_url_of_each_backend_gives_a_working_client(
    project: pytest.Pytester, kind: str, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    project.makepyfile(test_given=GIVEN_URL_TESTS.format(backend=backend))
    url = given_url(kind, request, tmp_path)
    project.runpytest_subprocess(f"--distlock-url={url}").assert_outcomes(passed=1)


def test_a_missing_server_binary_fails_the_set_up_saying_what_to_install(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTLOCK_REDIS_BIN", str(project.path / "no-redis-server"))
    project.makepyfile("def test_needs_redis(distlock_redis_proc):\n    pass\n")
    result = project.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*distlock: cannot start a throwaway redis server: $DISTLOCK_REDIS_BIN is *"])


EVERY_BACKEND_TESTS = """
import pytest


BACKENDS = ["zookeeper", "postgres-table", "mariadb-table", "sqlite-table"]


@pytest.mark.parametrize("distlock_url", BACKENDS, indirect=True)
def test_a_lock(distlock_client, distlock_url):
    with distlock_client.lock("order:42", ttl=10) as lock:
        assert distlock_client.holder("order:42").token == lock.token
"""


def test_a_test_runs_on_each_throwaway_backend_it_names(project: pytest.Pytester) -> None:
    project.makepyfile(test_every=EVERY_BACKEND_TESTS)
    project.runpytest_subprocess().assert_outcomes(passed=4)


def test_noproc_without_a_url_says_what_to_pass(project: pytest.Pytester) -> None:
    project.makepyfile("def test_needs_a_server(distlock_etcd_noproc):\n    pass\n")
    result = project.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*distlock_etcd_noproc needs a running etcd: pass --distlock-url*"])


def test_noproc_refuses_a_url_of_the_other_backend(
    project: pytest.Pytester, redis_server: distlock.testing.RedisServer
) -> None:
    project.makepyfile("def test_needs_etcd(distlock_etcd_noproc):\n    pass\n")
    result = project.runpytest_subprocess(f"--distlock-url={redis_server.url}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*distlock_etcd_noproc: --distlock-url * is not a etcd URL*"])


def test_the_ini_file_sets_the_prefix(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\npythonpath = .\ndistlock_prefix = myapp-tests\n")
    project.makepyfile(
        "def test_prefix(distlock_client, distlock_prefix):\n    assert distlock_prefix.startswith('myapp-tests/')\n"
    )
    project.runpytest_subprocess().assert_outcomes(passed=1)


def test_the_etcd_binary_comes_from_the_ini_file(project: pytest.Pytester) -> None:
    etcd = str(project.path / "my-etcd")  # a name of its own: the harness would not find it without the ini key
    os.symlink(distlock.testing.find_etcd(), etcd)
    project.makeini(f"[pytest]\npythonpath = .\ndistlock_etcd_bin = {etcd}\n")
    project.makepyfile(
        f"""
def test_binary(distlock_etcd_proc):
    with open(f"/proc/{{distlock_etcd_proc.pid}}/cmdline") as cmdline:
        assert cmdline.read().split("\\0")[0] == {etcd!r}
"""
    )
    project.runpytest_subprocess().assert_outcomes(passed=1)


def test_a_binary_option_that_names_no_executable_says_so(project: pytest.Pytester) -> None:
    project.makepyfile("def test_needs_redis(distlock_redis_proc):\n    pass\n")
    result = project.runpytest_subprocess("--distlock-redis-bin=/nonexistent/redis-server")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--distlock-redis-bin '/nonexistent/redis-server' is not an executable file*"])


DJANGO_SETTINGS = """
SECRET_KEY = "shop-tests"
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "distlock_django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
ROOT_URLCONF = "shop.urls"
# The production URL: distlock_django (the fixture) points it at the test server for each test.
DISTLOCK = {"URL": "etcd://127.0.0.1:1", "TIMEOUT": 0.2}
"""

DJANGO_VIEWS = """
from django.http import HttpResponse

from distlock_django import distributed_lock


@distributed_lock("item:{pk}")
def item(request, pk):
    return HttpResponse(f"item {pk}")
"""

DJANGO_URLS = """
from django.urls import path

from shop.views import item

urlpatterns = [path("items/<int:pk>/", item)]
"""

DJANGO_TESTS = """
import pytest
from django.test import TestCase

from distlock_django import lock_name


# TestCase-style (this test and ItemTests): the test case's own atomic blocks never commit, so these two need
# distlock_django to release at the view's own end when the only open atomic blocks are the test case's.
@pytest.mark.django_db
def test_two_requests_in_one_test(client, distlock_django):
    assert client.get("/items/1/").status_code == 200
    assert client.get("/items/1/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_two_requests_in_one_transactional_test(client, distlock_django):
    assert client.get("/items/1/").status_code == 200
    assert client.get("/items/1/").status_code == 200


def test_a_held_lock_answers_423(client, distlock_django, distlock_client):
    with distlock_client.lock(lock_name("item:1"), ttl=10):
        assert client.get("/items/1/").status_code == 423
    assert client.get("/items/1/").status_code == 200


@pytest.mark.usefixtures("distlock_django")
class ItemTests(TestCase):
    def test_two_requests(self):
        assert self.client.get("/items/2/").status_code == 200
        assert self.client.get("/items/2/").status_code == 200
"""


#: How a project's pytest gets distlock_django's plugin: by its entry point, or by name where the installed metadata
#: predates that entry point (an editable install made before it; ``pip install -e .`` again registers it).
DJANGO_PLUGIN = (
    ()
    if any(ep.value == "distlock_django._pytest_plugin" for ep in entry_points(group="pytest11"))
    else ("-p", "distlock_django._pytest_plugin")
)


def test_each_plugin_is_an_entry_point_and_distlock_s_knows_no_django() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        plugins = tomllib.load(f)["project"]["entry-points"]["pytest11"]
    assert plugins == {"distlock": "distlock.testing._plugin", "distlock_django": "distlock_django._pytest_plugin"}
    assert "distlock_django" not in vars(distlock.testing._plugin)


# Two of its four tests are TestCase-style: they pass once distlock_django releases at the view's own end when the
# only open atomic blocks are the test case's own (see DJANGO_TESTS).
def test_django_views_under_pytest_django(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, etcd_server: distlock.testing.EtcdServer
) -> None:
    project.makeini("[pytest]\npythonpath = .\nDJANGO_SETTINGS_MODULE = shop.settings\n")
    project.mkpydir("shop")
    project.makepyfile(
        **{"shop/settings": DJANGO_SETTINGS, "shop/views": DJANGO_VIEWS, "shop/urls": DJANGO_URLS},
        test_views=DJANGO_TESTS,
    )
    monkeypatch.setenv("DISTLOCK_TEST_URL", etcd_server.url)
    result = project.runpytest_subprocess(*DJANGO_PLUGIN)
    result.assert_outcomes(passed=4)
    assert keys_on(etcd_server) == []


def test_distlock_django_without_pytest_django_says_what_to_install(project: pytest.Pytester) -> None:
    project.makepyfile("def test_view(distlock_django):\n    pass\n")
    result = project.runpytest_subprocess(*DJANGO_PLUGIN, "-p", "no:django")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*distlock_django needs pytest-django: pip install pytest-django*"])


# A project on the lock table of its own database, or on a production service, that installed no [etcd] extra.
OWN_BACKEND_CONFTEST = """
import sys

sys.modules["etcd3"] = sys.modules["grpc"] = None  # not installed: importing them fails, find_spec finds nothing
"""

OWN_BACKEND_TESTS = """
import pytest
from django.conf import settings as django_settings

from distlock_django import conf, get_client, lock_name

PROJECT_S = dict(django_settings.DISTLOCK)


def test_the_lock_service_is_a_test_one_of_the_project_s_backend(distlock_url):
    assert distlock_url.startswith("sql+") and "production" not in distlock_url  # the project's backend


def test_a_held_lock_answers_423_at_once(client, distlock_django, distlock_client):
    assert conf()["TIMEOUT"] == 0  # the project's is 10
    with distlock_client.lock(lock_name("item:1"), ttl=10):
        assert client.get("/items/1/").status_code == 423
    assert client.get("/items/1/").status_code == 200


@pytest.mark.django_db
def test_two_requests_in_a_test_case_transaction(client, distlock_django):
    assert client.get("/items/1/").status_code == 200
    assert client.get("/items/1/").status_code == 200


def test_assignments_keep_the_fixture_s_url_prefix_and_client(
    client, settings, distlock_django, distlock_url, distlock_prefix
):
    settings.DISTLOCK = {"TTL": 5}
    assert get_client() is distlock_django
    assert (conf()["URL"], conf()["OPTIONS"], conf()["TTL"]) == (distlock_url, {"prefix": distlock_prefix}, 5)
    with distlock_django.lock("after-an-assignment", ttl=5) as lock:
        assert lock.token > 0
    settings.DISTLOCK = {"OPTIONS": {"request_timeout": 5}}
    assert conf()["OPTIONS"] == {"prefix": distlock_prefix, "request_timeout": 5}
    assert client.get("/items/1/").status_code == 200


def test_an_in_place_change_takes_effect(client, settings, distlock_django, distlock_client):
    settings.DISTLOCK["KEY_PREFIX"] = "shop:"
    with distlock_client.lock("shop:item:1", ttl=10):
        assert client.get("/items/1/").status_code == 423


@pytest.mark.distlock_django(timeout=30)
def test_the_marker_sets_another_timeout(distlock_django):
    assert conf()["TIMEOUT"] == 30


def test_the_project_s_settings_are_back_after_the_fixture():
    assert django_settings.DISTLOCK == PROJECT_S
"""


@pytest.mark.parametrize(
    ("own_url", "given", "database"),
    [
        ("django://default", (), "sqlite"),  # the lock table in the test database: in memory, a file of the process
        ("django://default", (), "postgresql"),  # in the test database, dropped at the end with no warning
        ("sql+sqlite:///{tmp}/production-locks.db", (), "sqlite"),  # a throwaway of the same backend
        ("redis://production.invalid:6379/0", ("--distlock-url=django://default",), "sqlite"),  # the option wins
    ],
    ids=["django", "django-postgresql", "production-sqlite", "given-django"],
)
def test_distlock_django_on_the_project_s_own_backend_without_etcd(
    project: pytest.Pytester,
    own_url: str,
    given: tuple[str, ...],
    database: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    project.makeini("[pytest]\npythonpath = .\nDJANGO_SETTINGS_MODULE = shop.settings\n")
    project.mkpydir("shop")
    settings = DJANGO_SETTINGS.replace(
        '{"URL": "etcd://127.0.0.1:1", "TIMEOUT": 0.2}', repr({"URL": own_url.format(tmp=tmp_path), "TIMEOUT": 10})
    )
    name = f"shop_{uuid.uuid4().hex[:8]}"
    if database == "postgresql":
        server = urlsplit(str(request.getfixturevalue("postgres_dsn")))
        databases = {"ENGINE": "django.db.backends.postgresql", "NAME": name, "USER": server.username}
        databases |= {"HOST": server.hostname, "PORT": str(server.port)}
        settings = settings.replace('{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}', repr(databases))
    project.makepyfile(
        **{"shop/settings": settings, "shop/views": DJANGO_VIEWS, "shop/urls": DJANGO_URLS},
        conftest=OWN_BACKEND_CONFTEST,
        test_views=OWN_BACKEND_TESTS,
    )
    result = project.runpytest_subprocess(*DJANGO_PLUGIN, *given, "-W", "error")
    result.assert_outcomes(passed=7)
    assert not list(tmp_path.iterdir())  # nothing written to the production file
    if database == "postgresql":
        import psycopg

        with psycopg.connect(str(request.getfixturevalue("postgres_dsn")), autocommit=True) as connection:
            assert not connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [f"test_{name}"]).fetchall()
