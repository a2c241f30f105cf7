"""The process-wide distlock client for Django, made lazily from ``DISTLOCK["URL"]`` and ``["OPTIONS"]``.

One client per process serves every request thread (clients are thread-safe and fork-safe: a gunicorn or Celery
prefork child opens its own connection); it lives in a :class:`distlock.ClientCache`, which ``reset_client()``
empties. ``client_if_configured()`` is what the app hands to Celery's tasks (see ``apps.py``). What can go wrong: the
lock service is unreachable on first use — ``BackendUnavailable`` from the first locked view, not at import time, so
``manage.py`` commands that take no lock keep working while the lock service is down; bad settings raise
``ConfigurationError`` from the first use. The client follows its settings: when the URL or ``OPTIONS`` change (an
assignment, ``override_settings``, a change in place) or a ``django://`` alias now means another database (a test
runner's test database, a ``--parallel`` worker's clone), the old client is closed and the next use connects anew; a
change of other keys keeps it. Django's test database teardown closes it (``_database.py``).
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings

import distlock

from ._conf import conf
from ._database import close_with_test_databases, database_url

__all__ = ["client_if_configured", "get_client", "reset_client"]

_clients = distlock.ClientCache()
_mutex = threading.Lock()
#: The (URL, options) the shared client was made for: another one closes it.
_made_for: tuple[str, dict[str, Any]] | None = None


def get_client() -> distlock.Client:
    """The shared client (connecting on first use, and anew when its settings or its ``django://`` database change)."""
    global _made_for
    configured = conf()
    wanted = (database_url(configured["URL"]), dict(configured["OPTIONS"]))
    if wanted != _made_for:
        with _mutex:
            if wanted != _made_for:
                _clients.clear()
                _made_for = wanted
                close_with_test_databases(reset_client)  # also without the app in INSTALLED_APPS
    return _clients.get(*wanted)


def reset_client() -> None:
    """Close the shared client (its locks are released); the next use connects again with current settings."""
    _clients.clear()


def client_if_configured() -> distlock.Client | None:
    """The shared client if the settings have a ``DISTLOCK`` dict, else None: what Celery's tasks fall back to."""
    return None if getattr(settings, "DISTLOCK", None) is None else get_client()
