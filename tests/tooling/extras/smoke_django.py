"""Smoke test of ``distlock-fenced[etcd,django]`` installed alone: system checks, a decorated view, a fenced model's
claim and save on SQLite; ``singleton_task`` without the django-tasks extra names it. Argument: an etcd URL."""

import sys

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "distlock_django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    DISTLOCK={"URL": sys.argv[1], "TTL": 10, "TIMEOUT": 5, "KEY_PREFIX": "smoke:"},
)
django.setup()

from django.core import checks  # noqa: E402
from django.db import connection, models  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.test import RequestFactory  # noqa: E402

import distlock  # noqa: E402
from distlock_django import FencedModel, distributed_lock, get_client  # noqa: E402


class Account(FencedModel):
    balance = models.IntegerField(default=0)
    fence_lock = "account:{pk}"

    class Meta:
        app_label = "smoke"


@distributed_lock("account:{pk}")
def deposit(request: HttpRequest, pk: int) -> HttpResponse:
    account = Account.objects.filter(pk=pk).fenced().get()
    account.balance += 10
    account.save()
    return HttpResponse(str(account.balance))


assert not [m for m in checks.run_checks() if m.level >= checks.ERROR], checks.run_checks()
with connection.schema_editor() as editor:
    editor.create_model(Account)
Account.objects.create(pk=1)
request = RequestFactory().post("/deposit/1")
assert deposit(request, pk=1).content == b"10"
assert deposit(request, pk=1).content == b"20"
account = Account.objects.get(pk=1)
assert account.fence_token > 0
with distributed_lock("other"):
    assert distlock.current_lock() is not None
if sys.version_info < (3, 12):  # no django.tasks before Django 6, and its backport is the django-tasks extra's
    missing: Exception | None = None
    try:
        from distlock_django import singleton_task  # noqa: F401
    except ModuleNotFoundError as e:
        missing = e
    assert missing is not None and "distlock-fenced[django-tasks]" in str(missing), missing
get_client().close()
print("ok")
