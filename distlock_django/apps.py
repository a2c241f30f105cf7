"""The Django app: add ``"distlock_django"`` to ``INSTALLED_APPS`` to get the system checks.

When Django starts the app, and Celery is installed, the app also gives Celery's singleton tasks its client
(:func:`distlock.celery.set_client_factory`): a Celery app without ``app.conf.distlock_url`` then uses the client
of ``DISTLOCK``, if the settings have one. Without Celery installed nothing of it is imported.

It also has Django's test database teardown close the shared client first (``_database.close_with_test_databases``),
so that a ``django://`` lock table's pooled connection does not keep the test database from being dropped.

What can go wrong: nothing at start-up — neither the checks nor the hook connect to the lock service; a bad
``DISTLOCK`` is reported by ``manage.py check`` (``checks.py``) and raised where it is first used.
"""

from __future__ import annotations

import importlib.util

from django.apps import AppConfig


class DistlockConfig(AppConfig):
    """Registers the system checks, and hands this app's client to ``distlock.celery`` when Celery is installed."""

    name = "distlock_django"
    verbose_name = "distlock"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from ._client import reset_client
        from ._database import close_with_test_databases

        close_with_test_databases(reset_client)

        if importlib.util.find_spec("celery") is not None:
            from distlock.celery import set_client_factory

            from ._client import client_if_configured

            set_client_factory(client_if_configured)
