"""distlock.celery: singleton Celery tasks on distlock leases — one call per lock name at a time.

    from celery import Celery
    from distlock.celery import SingletonTask

    app = Celery("proj", broker="redis://127.0.0.1:6379/0")
    app.conf.distlock_url = "etcd://127.0.0.1:2379"

    @app.task(base=SingletonTask, bind=True, unique_on=["customer_id"], lock_ttl=30)
    def rebuild_report(self, customer_id, full=False):
        ...
        save(report, fence_token=self.lock.token)   # the database refuses a stale run's write

The lease is kept alive while the task runs and lapses within ``lock_ttl`` when the worker dies; release is checked
against the lock's token. ``lock_on="run"`` (default) allows one running call per lock name, ``"enqueue"`` one
queued-or-running call; ``once=True`` remembers which task ids ran (a mark of the lock), so a redelivered message
of a finished one is acknowledged without running. ``LeaderScheduler`` runs beat on a leader. The client:
``app.conf.distlock_url``, else ``set_client_factory()`` (Django's ``DISTLOCK`` with ``distlock_django``);
``get_client(app)`` returns it; ``app.conf.distlock_key_prefix`` goes in front of every lock name. Options,
duplicates, hand-over races: docs/integrations/celery.md.

What can go wrong: importing it without Celery raises ``ModuleNotFoundError`` naming the ``celery`` extra; a bad
``unique_on`` or option raises ``ConfigurationError`` when Celery creates the task class (per call: from
``apply_async``, before sending). An unreachable lock service raises ``BackendUnavailable`` from ``apply_async`` in
enqueue mode (nothing sent), else fails the run. A lock lost mid-run stops the body only with
``abort_on_lost=True`` (prefork and solo pools); otherwise ``self.lock.ensure_held()`` raises ``LockLost``, and
fenced writes stay safe either way.
"""

from distlock import require_extra

require_extra("celery", extra="celery", integration="distlock.celery")

from ._beat import LeaderScheduler
from ._config import get_client, set_client_factory
from ._handover import RESERVATIONS
from ._task import DuplicateTask, SingletonTask

__all__ = ["RESERVATIONS", "DuplicateTask", "LeaderScheduler", "SingletonTask", "get_client", "set_client_factory"]
