"""Django under test: settings from ``testsettings.py``, real etcd, SQLite and PostgreSQL (router-selected).

Django is configured when this file is imported (test modules import models at the top); the session fixture then
points it at the real servers the fixtures started, before any database connection or lock exists.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import django
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ["DJANGO_SETTINGS_MODULE"] = "djangotests.testsettings"
os.environ.setdefault("DISTLOCK_DJANGO_SQLITE", str(Path(tempfile.mkdtemp(prefix="distlock-django-")) / "db.sqlite3"))
django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from djangotests.testapp import router  # noqa: E402
from djangotests.testapp.models import Account, Plain  # noqa: E402
from djangotests.testsettings import DISTLOCK, _pg  # noqa: E402

import distlock_django  # noqa: E402


@pytest.fixture(scope="session")
def django_servers(etcd_url: str, postgres_dsn: str) -> Iterator[dict[str, str]]:
    """Point Django at the session's etcd and PostgreSQL, and create the tables on both databases."""
    env = {"DISTLOCK_DJANGO_ETCD_URL": etcd_url, "DISTLOCK_DJANGO_PG": postgres_dsn}
    os.environ.update(env)  # for server processes
    connections.settings["pg"].update(_pg(postgres_dsn))
    override = override_settings(DISTLOCK={**DISTLOCK, "URL": etcd_url})
    override.enable()
    for alias in ("default", "pg"):
        call_command("migrate", run_syncdb=True, database=alias, verbosity=0)
    yield {**env, "DISTLOCK_DJANGO_SQLITE": os.environ["DISTLOCK_DJANGO_SQLITE"]}
    distlock_django.reset_client()
    override.disable()
    connections.close_all()


@pytest.fixture(params=["default", "pg"], ids=["sqlite", "postgres"])
def db_alias(request: pytest.FixtureRequest, django_servers: dict[str, str]) -> Iterator[str]:
    """Run the test on SQLite and on PostgreSQL; rows are removed afterwards."""
    alias: str = request.param
    router.CURRENT[0] = alias
    try:
        yield alias
    finally:
        Account.objects.using(alias).all().delete()
        Plain.objects.using(alias).all().delete()
        User.objects.using(alias).all().delete()
        router.CURRENT[0] = "default"
        connections.close_all()
