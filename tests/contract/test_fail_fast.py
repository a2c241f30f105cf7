"""The circuit breaker: after the lock service did not answer, new work fails fast; held locks and releases go on.

In process, on the in-memory backend made unreachable at will (``Outage``: every call raises ``BackendUnavailable``
while ``down``, and is counted), so a test can say that a call made no request at all. The breaker with a stopped
and a frozen real service is tested through Django's views (tests/integrations/djangotests/test_django_unavailable.py).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from _support import wait_until

import distlock
from distlock.testing import MemoryBackend
from distlock.testing._memory import _Server


class Outage(MemoryBackend):
    """The in-memory backend, unreachable while ``down``; ``calls`` counts every call that reached it."""

    def __init__(self) -> None:
        self.name = f"outage-{uuid.uuid4().hex[:8]}"
        super().__init__(self.name, request_timeout=0.5)
        self.down = False
        self.calls = 0

    @contextlib.contextmanager
    def _state(self) -> Iterator[_Server]:
        self.calls += 1
        if self.down:
            raise distlock.BackendUnavailable(f"{self.description} is down (a test's outage)")
        with super()._state() as server:
            yield server


def test_after_an_outage_new_work_fails_fast_without_a_request_then_one_probe_recovers() -> None:
    backend = Outage()
    with distlock.Client(backend, fail_fast=0.3) as client:
        backend.down = True
        with pytest.raises(distlock.BackendUnavailable, match="is down"):
            client.lock("a").acquire()
        calls = backend.calls
        with pytest.raises(distlock.BackendUnavailable, match=r"failing fast since .* until .*is down") as failed:
            client.lock("a").acquire()
        with pytest.raises(distlock.BackendUnavailable, match="failing fast"):
            client.holder("a")
        assert backend.calls == calls, "an open breaker asked the service"
        assert isinstance(failed.value.__cause__, distlock.BackendUnavailable)
        backend.down = False
        time.sleep(0.3)  # the interval: then one call probes
        with client.lock("a") as lock:
            assert lock.token > 0
        assert client.holder("a") is None


def test_a_probe_that_waits_for_a_busy_lock_closes_the_breaker_once_it_is_queued() -> None:
    backend = Outage()
    with distlock.Client(backend, fail_fast=0.2) as client, distlock.Client(MemoryBackend(backend.name)) as other:
        backend.down = True
        with pytest.raises(distlock.BackendUnavailable, match="is down"):
            client.holder("a")
        backend.down = False
        busy = other.lock("busy")
        busy.acquire()
        time.sleep(0.2)  # the interval: the next call probes
        probe = threading.Thread(target=lambda: client.lock("busy").acquire(timeout=10))
        probe.start()
        wait_until(lambda: getattr(other.holder("busy"), "waiters", 0) == 1, 5, "the probe to queue")
        assert client.holder("a") is None  # not failing fast while the probe waits for the lock
        busy.release()
        probe.join(10)


def test_a_failed_probe_opens_the_breaker_again() -> None:
    backend = Outage()
    with distlock.Client(backend, fail_fast=0.2) as client:
        backend.down = True
        for _ in range(2):
            with pytest.raises(distlock.BackendUnavailable, match="is down"):  # a first failure, then the probe's
                client.holder("a")
            time.sleep(0.2)
        calls = backend.calls
        with pytest.raises(distlock.BackendUnavailable, match="is down"):
            client.holder("a")  # the interval passed again: a probe
        with pytest.raises(distlock.BackendUnavailable, match="failing fast"):
            client.holder("a")
        assert backend.calls == calls + 1


def test_a_held_lock_is_kept_alive_and_released_while_new_work_fails_fast() -> None:
    backend = Outage()
    with distlock.Client(backend, fail_fast=60) as client:
        lock = client.lock("held", ttl=1)
        lock.acquire()
        backend.down = True
        with pytest.raises(distlock.BackendUnavailable, match="is down"):
            client.holder("other")
        backend.down = False
        calls = backend.calls
        wait_until(lambda: backend.calls > calls + 1, 5, "the keeper refreshing the lease")
        with pytest.raises(distlock.BackendUnavailable, match="failing fast"):
            client.lock("other").acquire()
        assert not lock.lost
        lock.release()  # goes to the service: the breaker refuses new work only
        assert backend.head("held") is None


def test_fail_fast_zero_asks_the_service_every_time() -> None:
    backend = Outage()
    with distlock.Client(backend, fail_fast=0) as client:
        backend.down = True
        for _ in range(2):
            with pytest.raises(distlock.BackendUnavailable, match="is down"):
                client.holder("a")


@pytest.mark.parametrize("bad", [-1, "5", float("nan"), True])
def test_a_bad_fail_fast_is_refused_where_it_enters(bad: object) -> None:
    with pytest.raises(distlock.ConfigurationError, match="fail_fast"):
        distlock.connect("memory://", fail_fast=bad)


def test_a_client_cache_fails_fast_after_a_failed_connect() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cache = distlock.ClientCache()
    url = f"etcd://127.0.0.1:{port}"
    with pytest.raises(distlock.BackendUnavailable) as first:
        cache.get(url, {"connect_timeout": 0.3, "fail_fast": 60})
    assert "failing fast" not in str(first.value)
    with pytest.raises(distlock.BackendUnavailable, match=r"^connect: failing fast"):
        cache.get(url, {"connect_timeout": 0.3, "fail_fast": 60})
    cache.clear()
