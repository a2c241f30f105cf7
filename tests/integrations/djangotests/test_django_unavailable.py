"""A lock service that is down is an answer: locked views answer 503 with Retry-After, at once while the client
fails fast, and work again once the service is back.

A private etcd per test, stopped or frozen (SIGSTOP); a short ``request_timeout`` so that the first request, the one
that finds the service gone, answers within a second. That the next ones ask nothing is read from the answer logged
(the breaker's "failing fast"), not from timings; the breaker's interval is long (60 s) and the test moves the
breaker's clock past it (``breaker_clock``) instead of waiting it out.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import types
from collections.abc import Callable

import pytest
from _support import wait_until
from django.http import HttpResponseBase
from django.test import AsyncClient, Client
from djangotests.testapp import views
from djangotests.testsettings import DISTLOCK
from pytest_django.fixtures import Settings

import distlock
from distlock import _breaker, _clock
from distlock.testing import EtcdServer
from distlock_django import get_client

#: The views: the decorator on a sync view (``timeout=0``; its gate open) and on an async view, and the middleware's
#: rule ``^/mw/``. After a freeze, a join sent before it may land after it: a key nobody waits on, which keeps
#: ``/gate/down/`` busy until the client sweeps it; the sync view is asked again on another name (``SYNC_AGAIN``).
SYNC, ASYNC, MIDDLEWARE, SYNC_AGAIN = "/gate/down/", "/async/3/", "/mw/down/", "/gate/up/"
for _gate in ("down", "up"):
    views.GATES.setdefault(_gate, threading.Event()).set()


@pytest.fixture
def breaker_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """A function that moves the circuit breakers' clock (only theirs) ``seconds`` ahead."""
    ahead = [0.0]
    monkeypatch.setattr(_breaker, "_clock", types.SimpleNamespace(now=lambda: _clock.now() + ahead[0]))

    def move(seconds: float) -> None:
        ahead[0] += seconds

    return move


def _answers(client: distlock.Client) -> bool:
    """Whether the client's backend answers a call of its own (past the breaker, which counts only the client's)."""
    try:
        client._context.backend.check()
    except distlock.DistlockError:
        return False
    return True


def _request(path: str) -> tuple[int, str | None]:
    response: HttpResponseBase
    if path == ASYNC:
        response = asyncio.run(AsyncClient().get(path))
    elif path == MIDDLEWARE:
        response = Client().post(path)  # the rule's default methods: the unsafe ones
    else:
        response = Client().get(path)
    return response.status_code, response.get("Retry-After")


@pytest.mark.parametrize("outage", ["stop", "pause"])
def test_a_down_lock_service_answers_503_at_once_then_recovers(
    outage: str,
    etcd_server: EtcdServer,
    settings: Settings,
    breaker_clock: Callable[[float], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = {"request_timeout": 0.5, "connect_timeout": 0.5, "fail_fast": 60}
    settings.DISTLOCK = {**DISTLOCK, "URL": etcd_server.url, "OPTIONS": options, "UNAVAILABLE_RETRY_AFTER": 7}
    assert _request(SYNC) == (200, None)
    getattr(etcd_server, outage)()
    try:
        caplog.set_level(logging.WARNING, "distlock.django")
        assert _request(SYNC) == (503, "7")  # found out, within request_timeout
        assert "failing fast" not in caplog.text
        for path in (SYNC, ASYNC, MIDDLEWARE):
            caplog.clear()
            assert _request(path) == (503, "7")
            assert "failing fast since" in caplog.text, f"{path} asked the lock service again"
    finally:
        etcd_server.start() if outage == "stop" else etcd_server.resume()
    # The server answers again; the client's own connection comes back after gRPC's reconnect backoff (up to 1 s,
    # longer than this test's request_timeout), which moving the breaker's clock does not wait for.
    wait_until(lambda: _answers(get_client()), 30, "the client's connection to the etcd that came back")
    breaker_clock(60)
    assert [_request(path)[0] for path in (SYNC_AGAIN, ASYNC, MIDDLEWARE)] == [200, 200, 200]


def test_a_lock_service_down_from_the_start_answers_503_and_connects_once_per_interval(
    etcd_server: EtcdServer, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    options = {"request_timeout": 0.5, "connect_timeout": 0.5, "fail_fast": 60}
    settings.DISTLOCK = {**DISTLOCK, "URL": etcd_server.url, "OPTIONS": options}
    etcd_server.stop()
    caplog.set_level(logging.WARNING, "distlock.django")
    assert _request(SYNC) == (503, "5")  # the default UNAVAILABLE_RETRY_AFTER
    caplog.clear()
    assert _request(MIDDLEWARE) == (503, "5")
    assert "connect: failing fast since" in caplog.text
    settings.DISTLOCK = {**settings.DISTLOCK, "UNAVAILABLE_STATUS": None}  # raise, as before there was a 503
    with pytest.raises(distlock.BackendUnavailable):
        Client().get(SYNC)
