"""Django settings for distlock_django's tests and the test server processes; servers come from the environment.

``DISTLOCK_DJANGO_ETCD_URL``, ``DISTLOCK_DJANGO_SQLITE`` (a file path), ``DISTLOCK_DJANGO_PG`` (a libpq URL) and
``DISTLOCK_DJANGO_DB`` (``default`` for SQLite or ``pg``: where the router sends queries) are set by the fixtures.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any
from urllib.parse import unquote, urlsplit


def _created_alone() -> dict[str, Any]:
    """Django's test-database settings (all of them: conftest.py replaces these dicts after Django filled in its
    defaults), with no dependency on "default": a run of only this database's tests creates it alone."""
    return {"CHARSET": None, "COLLATION": None, "MIGRATE": True, "MIRROR": None, "NAME": None, "DEPENDENCIES": []}


def _pg(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/") or "postgres",
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or 5432),
        "CONN_MAX_AGE": 0,
        "TEST": _created_alone(),
    }


def _maria(port: int) -> dict[str, Any]:
    """A MariaDB of the session, through PyMySQL standing in for mysqlclient (``conftest.py`` loads Django's backend
    so): only the tests that name ``maria`` use it."""
    return {
        "ENGINE": "django.db.backends.mysql",
        "NAME": "djangotests",
        "USER": "django",
        "PASSWORD": "django",
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "CONN_MAX_AGE": 0,
        "OPTIONS": {"charset": "utf8mb4"},
        "TEST": _created_alone(),
    }


SECRET_KEY = "distlock-tests"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "distlock_django",
    "djangotests.testapp",
    "django_tasks_db",  # test_django_tasks.py: django.tasks on the database backend, run by its db_worker
]
if importlib.util.find_spec("django.tasks") is None:  # Django 5.2: the backport
    INSTALLED_APPS.append("django_tasks")
_TASKS = "django_tasks" if importlib.util.find_spec("django.tasks") is None else "django.tasks"
TASKS = {
    "default": {"BACKEND": "django_tasks_db.DatabaseBackend"},
    "immediate": {"BACKEND": f"{_TASKS}.backends.immediate.ImmediateBackend"},  # runs the task inside enqueue()
}
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DISTLOCK_DJANGO_SQLITE", ":memory:"),
        "OPTIONS": {"timeout": 30},
    },
    "pg": _pg(os.environ.get("DISTLOCK_DJANGO_PG", "postgresql://postgres@127.0.0.1:1/postgres")),
    "maria": _maria(1),
}
DATABASE_ROUTERS = ["djangotests.testapp.router.ContextRouter"]
ROOT_URLCONF = "djangotests.testapp.urls"
STATIC_URL = "static/"  # pytest-django's live_server serves static files under it
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "distlock_django.DistributedLockMiddleware",
]
DISTLOCK = {
    "URL": os.environ.get("DISTLOCK_DJANGO_ETCD_URL", "etcd://127.0.0.1:2379"),
    "TTL": 10,
    "TIMEOUT": 30,
    "KEY_PREFIX": "dj:",
    "RULES": [
        {"url_name": "stream", "methods": ["GET"], "key": "stream:{name}"},
        {"path": r"^/mw/", "key": "mw:{name}"},
    ],
}
LOGGING_CONFIG = None
