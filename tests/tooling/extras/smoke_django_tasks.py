"""Smoke test of ``distlock-fenced[etcd,django-tasks]`` installed alone: a ``@singleton_task`` over ``@task`` on
Django's ImmediateBackend (django.tasks on Django 6, the django-tasks backport on 5.2) runs holding its lock, with a
token, and frees it. Argument: an etcd URL."""

import importlib.util
import sys

import django
from django.conf import settings

BACKPORT = importlib.util.find_spec("django.tasks") is None
PACKAGE = "django_tasks" if BACKPORT else "django.tasks"
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "distlock_django"]
    + (["django_tasks"] if BACKPORT else []),
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    DISTLOCK={"URL": sys.argv[1], "TTL": 10, "TIMEOUT": 5, "KEY_PREFIX": "smoke:"},
    TASKS={"default": {"BACKEND": f"{PACKAGE}.backends.immediate.ImmediateBackend"}},
)
django.setup()

import distlock  # noqa: E402
from distlock_django import get_client, lock_name, singleton_task  # noqa: E402

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]

tokens: list[int | None] = []


@singleton_task("job:{n}")
@task()
def job(n: int) -> int:
    tokens.append(distlock.current_token())
    return n * 2


result = job.enqueue(3)
assert str(result.status).endswith("SUCCESSFUL"), result.status
assert result.return_value == 6
assert tokens and tokens[0] is not None and tokens[0] > 0, tokens
assert get_client().holder(lock_name("job:3")) is None
get_client().close()
print("ok")
