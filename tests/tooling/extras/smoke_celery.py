"""Smoke test of ``distlock-fenced[etcd,celery]`` installed alone (no Django): a singleton task run eagerly holds its
lock. Argument: an etcd URL."""

import sys

from celery import Celery

import distlock
from distlock.celery import SingletonTask

app = Celery("smoke", broker="memory://", backend="cache+memory://")
app.conf.task_always_eager = True
app.conf.distlock_url = sys.argv[1]


@app.task(base=SingletonTask, bind=True, unique_on=["customer_id"], lock_ttl=10)
def report(self: SingletonTask, customer_id: int) -> int:
    assert self.lock.name and distlock.current_token() == self.lock.token
    return self.lock.token


assert report.delay(7).get() > 0
assert "django" not in sys.modules
print("ok")
