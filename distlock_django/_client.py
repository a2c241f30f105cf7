"""The process-wide distlock client for Django, made lazily from ``DISTLOCK["URL"]``.

One client per process serves every request thread (clients are thread-safe and fork-safe: a gunicorn or Celery
prefork child opens its own connection). What can go wrong: the lock service is unreachable on first use —
``BackendUnavailable`` from the first locked view, not at import time, so ``manage.py`` commands that take no lock
keep working while etcd is down.
"""

from __future__ import annotations

import threading

import distlock

from ._conf import conf

__all__ = ["get_client", "reset_client"]

_mutex = threading.Lock()
_client: distlock.Client | None = None


def get_client() -> distlock.Client:
    """The shared client (connecting on first use)."""
    global _client
    client = _client
    if client is not None and not client.closed:
        return client
    with _mutex:
        if _client is None or _client.closed:
            settings = conf()
            _client = distlock.connect(settings["URL"], **dict(settings["OPTIONS"]))
        return _client


def reset_client() -> None:
    """Close the shared client (its locks are released); the next use connects again with current settings."""
    global _client
    with _mutex:
        client, _client = _client, None
    if client is not None:
        client.close()
