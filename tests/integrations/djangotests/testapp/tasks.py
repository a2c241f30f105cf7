"""Singleton tasks for test_django_tasks.py, run by django_tasks_db's worker (``db_worker``) in a process of its own.

``deposit`` adds 1 to an account's balance with a fenced ``save()`` under the task's lock (``account:{pk}``: the
row's own lock name), after saying it started (``<gate>/started-<pk>``, holding the token) and waiting until the
test lets it finish (``<gate>/go-<pk>``): the test decides what happens while it runs. ``drain`` stops on loss.
"""

from __future__ import annotations

import time
from pathlib import Path

from djangotests.testapp.models import Account

import distlock
from distlock_django import singleton_task

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]


@singleton_task("account:{pk}", ttl=3)
@task()
def deposit(pk: int, gate: str) -> int:
    token = distlock.current_token()
    (Path(gate) / f"started-{pk}").write_text(str(token))
    while not (Path(gate) / f"go-{pk}").exists():
        time.sleep(0.02)  # waits for the test's word, not for luck
    account = Account.objects.get(pk=pk)
    account.balance += 1
    account.save()
    return int(account.fence_token)


@singleton_task("drain:{pk}", ttl=1, stop_on_lost=True)
@task()
def drain(pk: int, gate: str) -> str:
    """Writes a beat (a count, in ``<gate>/beat-<token>``) every 0.02 s until stopped (``LockLost``) or ``go-<pk>``."""
    token = distlock.current_token()
    (Path(gate) / f"started-{pk}").write_text(str(token))
    beats = 0
    while not (Path(gate) / f"go-{pk}").exists():
        beats += 1
        beat = Path(gate) / f"beat-{token}"
        beat.with_suffix(".new").write_text(str(beats))
        beat.with_suffix(".new").replace(beat)  # whole: a reader never sees the file emptied by a write in progress
        time.sleep(0.02)
    return "finished"


@task()
def note(pk: int) -> None:
    """A plain task, for the decorator's checks."""
