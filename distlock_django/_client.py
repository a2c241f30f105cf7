"""The process-wide distlock client for Django, made lazily from ``DISTLOCK["URL"]`` and ``["OPTIONS"]``.

One client per process serves every request thread (clients are thread-safe and fork-safe: a gunicorn or Celery
prefork child opens its own connection); it lives in a :class:`distlock.ClientCache`, which ``reset_client()``
(called when ``DISTLOCK`` changes) empties. ``client_if_configured()`` is what the app hands to Celery's tasks (see
``apps.py``). What can go wrong: the lock service is unreachable on first use — ``BackendUnavailable`` from the first
locked view, not at import time, so ``manage.py`` commands that take no lock keep working while the lock service is
down; bad settings raise ``ConfigurationError`` from the first use. When ``settings.DISTLOCK`` changes (tests'
``override_settings``), the client is closed and the next use connects with the new settings.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

import distlock

from ._conf import conf

__all__ = ["client_if_configured", "get_client", "reset_client"]

_clients = distlock.ClientCache()


def get_client() -> distlock.Client:
    """The shared client (connecting on first use)."""
    configured = conf()
    return _clients.get(configured["URL"], configured["OPTIONS"])


def reset_client() -> None:
    """Close the shared client (its locks are released); the next use connects again with current settings."""
    _clients.clear()


def client_if_configured() -> distlock.Client | None:
    """The shared client if the settings have a ``DISTLOCK`` dict, else None: what Celery's tasks fall back to."""
    return None if getattr(settings, "DISTLOCK", None) is None else get_client()


@receiver(setting_changed)
def _reconnect(*, setting: str, **kwargs: Any) -> None:
    if setting == "DISTLOCK":
        reset_client()
