"""The shared client follows its settings and its ``django://`` database: what the test runners rely on.

The runners themselves run in tests/integrations/test_django_site.py (a startproject site, both ways); these are the
rules under them, in this process: ``django://<alias>`` means the alias's database as it is at each use (SQLite:
a lock file beside it, or in a directory of the process's own for an in-memory one; its marks there too), a change
of the URL or ``OPTIONS`` (assigned or in place) closes the old client, and a change of other keys keeps it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections
from django.test.utils import override_settings

import distlock_django
from distlock_django import conf, get_client
from distlock_django._database import database_url


@pytest.fixture
def default_name() -> Iterator[dict[str, object]]:
    """``DATABASES["default"]``, its NAME put back after the test."""
    database = connections.settings["default"]
    name = database["NAME"]
    try:
        yield database
    finally:
        database["NAME"] = name
        distlock_django.reset_client()


def test_a_sqlite_database_keeps_its_locks_in_a_file_beside_it(default_name: dict[str, object]) -> None:
    default_name["NAME"] = "/srv/app/db.sqlite3"
    assert (
        database_url("django://default?prefix=app_locks")
        == "sql+sqlite:////srv/app/db.sqlite3-distlock?prefix=app_locks"
    )


def test_an_in_memory_database_keeps_its_locks_in_a_directory_of_the_process(default_name: dict[str, object]) -> None:
    default_name["NAME"] = "file:memorydb_default?mode=memory&cache=shared"  # Django's test database on SQLite
    url = database_url("django://default")
    path = Path(url.removeprefix("sql+sqlite:///"))
    assert path.name == "memorydb_default.sqlite3" and path.parent.name.startswith("distlock-django-")
    assert database_url("django://default") == url  # one directory per process
    default_name["NAME"] = "file:memorydb_default_2?mode=memory&cache=shared"  # a --parallel clone
    assert Path(database_url("django://default").removeprefix("sql+sqlite:///")).parent == path.parent


def test_the_client_follows_its_database_and_its_url(default_name: dict[str, object], tmp_path: Path) -> None:
    default_name["NAME"] = str(tmp_path / "one.sqlite3")
    with override_settings(DISTLOCK={"URL": "django://default"}):
        first = get_client()
        assert get_client() is first
        default_name["NAME"] = str(tmp_path / "two.sqlite3")  # what a test runner does to the alias
        second = get_client()
        assert first.closed and not second.closed
        assert (tmp_path / "two.sqlite3-distlock").exists()


def test_marks_of_a_django_lock_table_are_kept_beside_its_lock_tables(
    default_name: dict[str, object], tmp_path: Path
) -> None:
    """``django://``: the marks table is made where the lock tables are (SQLite: the lock file beside the database),
    at the first use, as they are: no migration of Django's."""
    default_name["NAME"] = str(tmp_path / "app.sqlite3")
    with override_settings(DISTLOCK={"URL": "django://default"}):
        client = get_client()
        with client.lock("invoice:42", ttl=10) as lock:
            lock.write_mark("sent", b"2026-11-28", ttl=60)
        assert client.read_mark("invoice:42", "sent") == b"2026-11-28"
    with contextlib.closing(sqlite3.connect(tmp_path / "app.sqlite3-distlock")) as lock_file:
        tables = {name for (name,) in lock_file.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"distlock_locks", "distlock_marks"} <= tables


def test_a_change_in_place_is_seen_and_other_keys_keep_the_client() -> None:
    with override_settings(DISTLOCK={"URL": "memory://follows", "TIMEOUT": 5}):
        from django.conf import settings

        client = get_client()
        settings.DISTLOCK["TIMEOUT"] = 0  # in place: no setting_changed
        assert conf()["TIMEOUT"] == 0
        assert get_client() is client and not client.closed
        settings.DISTLOCK = {"URL": "memory://follows", "TIMEOUT": 1}  # assigned: the same service
        assert get_client() is client and not client.closed
        settings.DISTLOCK["URL"] = "memory://elsewhere"
        assert get_client() is not client and client.closed
    distlock_django.reset_client()
