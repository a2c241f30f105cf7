"""Where singleton tasks find their lock service: ``app.conf``, else a client factory registered by the process.

Settings, in the Celery app's configuration::

    app.conf.distlock_url = "etcd://127.0.0.1:2379"              # any distlock.connect() URL
    app.conf.distlock_options = {"connect_timeout": 2.0}          # more connect() keyword options (optional)

Without ``distlock_url``, the factory given to :func:`set_client_factory` supplies the client, if one was given and
it returns one. ``distlock_django`` registers its ``get_client`` there when Django starts its apps (with Celery
installed), answering only when the settings have a ``DISTLOCK`` dict, so a Django project configures distlock once
and a Celery worker started with Django settings (Celery's Django fixup runs ``django.setup()``) uses that client.
This module never imports Django or ``distlock_django``.

One client per URL and options serves every task of the process (a :class:`distlock.ClientCache`); clients are
fork-safe, so each prefork child opens its own connection and leases on first use and never touches its parent's.
What can go wrong: no setting at all raises ``ConfigurationError`` saying what to set; an unreachable lock service
raises ``BackendUnavailable`` (within the client's ``connect_timeout``) from the first call that needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import distlock
from distlock import ConfigurationError

__all__ = ["get_client", "set_client_factory"]

_clients = distlock.ClientCache()
_factory: Callable[[], distlock.Client | None] | None = None


def get_client(app: Any) -> distlock.Client:
    """The distlock client for tasks of Celery app ``app`` (connecting on first use)."""
    conf = app.conf
    url = conf.get("distlock_url")
    if url is None:
        factory = _factory
        client = None if factory is None else factory()
        if client is not None:
            return client
        raise ConfigurationError(
            f"no lock service configured for Celery app {app.main!r}: set app.conf.distlock_url = "
            "'etcd://HOST:2379' (or, in a Django project with distlock_django installed, settings.DISTLOCK = "
            "{'URL': ...})"
        )
    options = conf.get("distlock_options") or {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"app.conf.distlock_options must be a dict of connect() options, not {options!r}")
    return _clients.get(str(url), options)


def set_client_factory(factory: Callable[[], distlock.Client | None] | None) -> None:
    """Let ``factory()`` supply the client of every app without ``app.conf.distlock_url`` (None: no fallback).

    It is called whenever such an app needs its client, so it should return a shared client (a
    :class:`distlock.ClientCache` keeps one), or None when it has no configuration either. One factory per process:
    a second call replaces the first.
    """
    global _factory
    _factory = factory
