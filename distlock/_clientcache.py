"""``ClientCache``: the clients a process shares, one per URL and options, for the integrations that hand one out.

The integrations' ``get_client()`` functions (Django's, Celery's) each keep theirs in one: connected on first
use (not at import time, so a process that takes no lock works while the service is down), connected again once
closed, safe to call from any thread. Each cache is its own: ``clear()`` closes only the clients it handed out.

Fork and exit need nothing more here: a client is fork-safe itself (in a child it opens its own connection and
leases on first use, leaving the parent's alone) and every client is closed at interpreter exit (see
:func:`distlock.connect`); a child also gets a fresh mutex, in case it was forked while another thread was
connecting. What can go wrong: ``get()`` raises what :func:`distlock.connect` raises (``ConfigurationError`` for bad
settings, ``BackendUnavailable`` for an unreachable service), on every call until it succeeds; after a
``BackendUnavailable`` it fails fast for the options' ``fail_fast`` seconds (a circuit breaker per URL and options,
``_breaker``), then the next call connects again.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from ._breaker import DEFAULT_FAIL_FAST, Breaker
from ._client import Client, connect
from .backends import scheme_of

__all__ = ["ClientCache"]


class ClientCache:
    """Shared clients, one per ``(url, options)``: ``get()`` connects on first use and after a ``close()``."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._clients: dict[tuple[str, str], Client] = {}
        self._breakers: dict[tuple[str, str], Breaker] = {}
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)

            def renew_mutex() -> None:
                cache = ref()
                if cache is not None:
                    cache._mutex = threading.Lock()

            os.register_at_fork(after_in_child=renew_mutex)

    def get(self, url: str, options: Mapping[str, Any] | None = None) -> Client:
        """The client for ``url`` and :func:`distlock.connect` keyword ``options``, connecting if there is none."""
        key = (str(url), json.dumps(dict(options or {}), sort_keys=True, default=repr))
        client = self._clients.get(key)
        if client is not None and not client.closed:
            return client
        with self._mutex:
            client = self._clients.get(key)
            if client is None or client.closed:
                options = dict(options or {})
                breaker = self._breakers.get(key)
                if breaker is None:
                    scheme = scheme_of(str(url).partition("://")[0])
                    fail_fast = options.get("fail_fast", DEFAULT_FAIL_FAST)
                    breaker = self._breakers[key] = Breaker(fail_fast, scheme.backend if scheme else "unknown")
                with breaker.call("connect"):
                    client = self._clients[key] = connect(url, **options)
            return client

    def clear(self) -> None:
        """Close every client of this cache (their locks are released); the next ``get()`` connects again."""
        with self._mutex:
            clients = list(self._clients.values())
            self._clients.clear()
            self._breakers.clear()
        for client in clients:
            client.close()
