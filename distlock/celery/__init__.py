"""distlock.celery: singleton Celery tasks on distlock leases — one call per lock name at a time.

    from celery import Celery
    from distlock.celery import SingletonTask

    app = Celery("proj", broker="redis://127.0.0.1:6379/0")
    app.conf.distlock_url = "etcd://127.0.0.1:2379"

    @app.task(base=SingletonTask, bind=True, unique_on=["customer_id"], lock_ttl=30)
    def rebuild_report(self, customer_id, full=False):
        ...
        save(report, fence_token=self.lock.token)   # the database refuses a stale run's write

The lock is a distlock lease kept alive while the task runs and revoked by the server when the worker dies, so a
SIGKILLed or OOM-killed worker frees it within ``lock_ttl``, and no expiry has to be guessed longer than the task.
Release is checked against the lock's fencing token: a run never deletes another run's lock. ``lock_on="run"``
(default) allows one running call per lock name, ``lock_on="enqueue"`` one queued-or-running call; duplicates are
skipped, retried, refused with :class:`DuplicateTask`, or answered with the existing task's ``AsyncResult``.
``self.retry()`` keeps the lock for the retry. See :class:`SingletonTask` for the options, ``_task`` for the life
cycle, ``_handover`` for how a lock passes from the sending process to the worker and the races that involves, and
``_config`` for settings (``app.conf.distlock_url``, else the client of a factory given to ``set_client_factory()``:
``distlock_django`` gives its own, configured by Django's ``DISTLOCK``). Django is never imported here.
``get_client(app)`` is the client the tasks of ``app`` use (for ``holder()`` checks);
``RESERVATIONS.held()`` lists the reservations this process still holds for tasks it sent.

What can go wrong: a ``unique_on`` naming no parameter, or a bad option, raises ``ConfigurationError`` when Celery
creates the task class; a bad per-call option raises it from ``apply_async`` before anything is sent. An
unreachable lock service raises ``BackendUnavailable``: from ``apply_async`` with ``lock_on="enqueue"`` (the task is
not sent, and the caller knows), else from the run in the worker (the task fails with it; add
``autoretry_for=(distlock.BackendUnavailable,)`` to retry instead). A lock lost while the task runs (the worker was
paused or cut off from the lock service past ``lock_ttl``) cannot stop the task: ``self.lock.lost`` turns true,
``self.lock.ensure_held()`` raises ``LockLost``, the end of the run logs an error, and only fenced writes stay safe.
"""

from ._beat import LeaderScheduler
from ._config import get_client, set_client_factory
from ._handover import RESERVATIONS
from ._task import DuplicateTask, SingletonTask

__all__ = ["RESERVATIONS", "DuplicateTask", "LeaderScheduler", "SingletonTask", "get_client", "set_client_factory"]
