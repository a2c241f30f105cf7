"""distlock_django: distributed locks and fenced writes for Django.

- ``@distributed_lock("order:{order_id}")`` on views (sync, async, class-based) and functions, or
  ``with distributed_lock("name"):``;
- ``DistributedLockMiddleware`` locking around views chosen by ``DISTLOCK["RULES"]``;
- ``FencedModel``: claim-on-read (``.fenced()``), fenced ``save()``/``delete()``/``create()``/``fenced_update()``;
- ``@singleton_task("report:{user_id}")`` above Django's ``@task``: one call per key queued or running
  (``django.tasks``; on Django 5.2 the ``django-tasks`` backport);
- ``get_client()`` / ``reset_client()``: the process's shared client; ``conf()`` / ``lock_name()``: the settings;
- ``manage.py distlock`` and a staff-only page (``distlock_django.urls``): the lock inspector.

Add ``"distlock_django"`` to ``INSTALLED_APPS`` for the system checks (and, with Celery installed, so that
``distlock.celery`` tasks use the same client); configure with one ``DISTLOCK`` dict (``_conf.py``). Only public
names of :mod:`distlock` are used here.

What can go wrong: a name of this package used without Django installed raises ``ModuleNotFoundError`` naming the
``django`` extra (the package itself imports without it), and ``singleton_task`` on Django 5.2 without the backport
names the ``django-tasks`` extra; bad settings raise ``ConfigurationError`` when first used
(``manage.py check`` reports them first); an unreachable lock service raises ``BackendUnavailable`` from the first lock,
not at import time; a busy lock, a lost lock or a refused write in a view become 423/409 responses (see
``_decorators.py``); a stale write outside a view raises ``StaleFenceToken``.
"""

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._client import get_client, reset_client
    from ._conf import conf, lock_name
    from ._decorators import distributed_lock
    from ._middleware import DistributedLockMiddleware
    from ._models import FencedManager, FencedModel, FencedQuerySet, fence_of
    from ._tasks import DuplicateTask, singleton_task
    from .operations import InstallFenceGuard

# Every name is imported on first use: models can only be defined once the app registry is ready (and this package is
# itself an installed app), and the package must import without Django, for its pytest plugin (_pytest_plugin.py)
# is loaded by every pytest run where distlock-fenced is installed.
_HOMES = {
    "get_client": "_client",
    "reset_client": "_client",
    "conf": "_conf",
    "lock_name": "_conf",
    "distributed_lock": "_decorators",
    "DuplicateTask": "_tasks",
    "singleton_task": "_tasks",
    "DistributedLockMiddleware": "_middleware",
    "FencedManager": "_models",
    "FencedModel": "_models",
    "FencedQuerySet": "_models",
    "fence_of": "_models",
    "InstallFenceGuard": "operations",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        from distlock import require_extra

        require_extra("django", extra="django", integration="distlock_django")
        if _HOMES[name] == "_tasks" and importlib.util.find_spec("django.tasks") is None:
            require_extra("django_tasks", extra="django-tasks", integration="distlock_django.singleton_task")
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "DistributedLockMiddleware",
    "DuplicateTask",
    "FencedManager",
    "FencedModel",
    "FencedQuerySet",
    "InstallFenceGuard",
    "conf",
    "distributed_lock",
    "fence_of",
    "get_client",
    "lock_name",
    "reset_client",
    "singleton_task",
]
