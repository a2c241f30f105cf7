"""Where singleton tasks find their lock service: ``app.conf``, else Django's ``DISTLOCK``, one client per process.

Settings, in the Celery app's configuration::

    app.conf.distlock_url = "etcd://127.0.0.1:2379"              # any distlock.connect() URL
    app.conf.distlock_options = {"connect_timeout": 2.0}          # more connect() keyword options (optional)

Without ``distlock_url``, and only when the process already uses Django settings (``django.conf`` is imported) or
``DJANGO_SETTINGS_MODULE`` is set, and those settings have a ``DISTLOCK`` dict, the client of ``distlock_django``
(``DISTLOCK["URL"]``/``["OPTIONS"]``) is used, so a Django project configures distlock once. ``distlock.celery``
imports ``django.conf`` only then, never otherwise (kombu itself imports ``django.utils`` whenever Django is
installed; that is not ours).

One client per URL and options serves every task of the process; clients are fork-safe, so each prefork child
opens its own connection and leases on first use and never touches its parent's. What can go wrong: no setting at
all raises ``ConfigurationError`` saying what to set; an unreachable lock service raises ``BackendUnavailable``
(within the client's ``connect_timeout``) from the first call that needs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

import distlock
from distlock import ConfigurationError

__all__ = ["get_client"]

_mutex = threading.Lock()
_clients: dict[tuple[str, str], distlock.Client] = {}


def get_client(app: Any) -> distlock.Client:
    """The distlock client for tasks of Celery app ``app`` (connecting on first use)."""
    conf = app.conf
    url = conf.get("distlock_url")
    if url is None:
        django_client = _django_client()
        if django_client is not None:
            return django_client
        raise ConfigurationError(
            f"no lock service configured for Celery app {app.main!r}: set app.conf.distlock_url = "
            "'etcd://HOST:2379' (or, in a Django project, settings.DISTLOCK = {'URL': ...})"
        )
    options = conf.get("distlock_options") or {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"app.conf.distlock_options must be a dict of connect() options, not {options!r}")
    cache_key = (str(url), json.dumps(dict(options), sort_keys=True, default=repr))
    client = _clients.get(cache_key)
    if client is not None and not client.closed:
        return client
    with _mutex:
        client = _clients.get(cache_key)
        if client is None or client.closed:
            client = _clients[cache_key] = distlock.connect(url, **dict(options))
        return client


def _django_client() -> distlock.Client | None:
    # "django.conf", not "django": kombu imports django.utils on its own whenever Django is installed.
    if "django.conf" not in sys.modules and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return None
    if importlib.util.find_spec("django") is None:  # DJANGO_SETTINGS_MODULE set, Django not installed
        return None
    from django.conf import settings

    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return None
    if getattr(settings, "DISTLOCK", None) is None:
        return None
    import distlock_django

    return distlock_django.get_client()
