"""Smoke test of ``distlock-fenced[etcd]`` installed alone: connect, lock, read the token; and, with no framework
installed, each integration raises ``ModuleNotFoundError`` naming the extra to install. Argument: an etcd URL."""

import importlib
import sys

import distlock
import distlock_django  # imports without Django: its pytest plugin is loaded by every pytest run

with distlock.connect(sys.argv[1]) as client, client.lock("smoke/etcd", ttl=5, timeout=10) as lock:
    assert lock.token > 0 and distlock.current_token() == lock.token


def import_error(module: str) -> str:
    """What using ``module`` without its framework says."""
    try:
        if module == "distlock_django":
            distlock_django.distributed_lock  # noqa: B018  (its names import Django, the package does not)
        else:
            importlib.import_module(module)
    except ModuleNotFoundError as e:
        return str(e)
    return f"{module} imported without its extra"


for module, extra in [("distlock_django", "django"), ("distlock_sqla", "sqlalchemy"), ("distlock.celery", "celery")]:
    said = import_error(module)
    assert said.startswith(f"{module} needs the '{extra}' extra: pip install 'distlock-fenced[{extra}]'"), said
print("ok")
