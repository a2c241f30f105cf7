"""The session keeper: refreshes scheduled from the TTL the server granted, a keeper thread that survives any error,
and clean-up work (revokes, deletions, ``on_lost`` callbacks) that never delays a lease refresh. Runs on each
backend."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest
from _support import wait_until

import distlock
from distlock._protocol import Lease, Ticket
from distlock.testing import EtcdServer

#: How long the keep-alive rate is sampled.
SAMPLE = 3.0


class _CountingKeepAlive:
    """Wraps a backend's ``keep_alive``: counts the calls, and raises ``fail_with`` from the next one when set."""

    def __init__(self, inner: Callable[[Lease, Sequence[Ticket], float], float]) -> None:
        self._inner = inner
        self.calls = 0
        self.fail_with: BaseException | None = None

    def __call__(self, lease: Lease, tickets: Sequence[Ticket], timeout: float) -> float:
        self.calls += 1
        failure, self.fail_with = self.fail_with, None
        if failure is not None:
            raise failure
        return self._inner(lease, tickets, timeout)


@pytest.fixture
def keep_alives(client: distlock.Client, monkeypatch: pytest.MonkeyPatch) -> _CountingKeepAlive:
    counter = _CountingKeepAlive(client._backend.keep_alive)
    monkeypatch.setattr(client._backend, "keep_alive", counter)
    return counter


def _granted_ttl(lock: distlock.Lock) -> float:
    session = lock._session
    assert session is not None
    return session.lease.ttl


@pytest.mark.parametrize("ttl", [0.001, 0.1])
def test_a_ttl_below_the_minimum_is_refreshed_at_the_granted_ttls_pace(
    client: distlock.Client, lock_name: str, keep_alives: _CountingKeepAlive, ttl: float
) -> None:
    with client.lock(lock_name, ttl=ttl) as lock:
        granted = _granted_ttl(lock)
        assert granted >= 1.0, "every backend grants a lease of at least a second"
        before = keep_alives.calls
        time.sleep(SAMPLE)
        rate = (keep_alives.calls - before) / SAMPLE
        assert not lock.lost
    assert lock.ttl == ttl, "Lock.ttl reports what was asked"
    assert rate <= 1 / (granted / 3) + 1, f"{rate:.1f} keep-alives/s for a {granted:g} s lease (asked {ttl:g} s)"


@pytest.mark.parametrize("ttl", [0.001, 0.1])
def test_etcd_receives_keep_alives_at_the_granted_ttls_pace(
    etcd_server: EtcdServer, lock_name: str, ttl: float
) -> None:
    with distlock.connect(etcd_server.url) as client, client.lock(lock_name, ttl=ttl) as lock:
        granted = _granted_ttl(lock)
        before = etcd_server.rpc_count()
        time.sleep(SAMPLE)
        rate = (etcd_server.rpc_count() - before) / SAMPLE
    # Each refresh of a lease that holds a lock is followed by one check that the held keys are still there.
    assert rate <= 2 / (granted / 3) + 1, f"etcd received {rate:.1f} messages/s for a {granted:g} s lease"


def test_the_keeper_survives_an_unexpected_keep_alive_error(
    client: distlock.Client, lock_name: str, keep_alives: _CountingKeepAlive
) -> None:
    lost: list[distlock.Lock] = []
    lock = client.lock(lock_name, ttl=1, on_lost=lost.append)
    assert lock.acquire()
    keep_alives.fail_with = RuntimeError("not a distlock error")
    calls = keep_alives.calls
    wait_until(lambda: keep_alives.fail_with is None, 5, "the keeper to hit the failing keep-alive")
    time.sleep(2.0)  # two granted TTLs: the lease must have been refreshed after the failure
    assert keep_alives.calls >= calls + 3, "the keeper stopped refreshing"
    assert not lock.lost
    # Lost signals still fire: the lease vanishes behind the client's back, the next refresh finds it gone.
    session = lock._session
    assert session is not None
    client._backend.revoke_lease(session.lease, [])
    assert lock.lost_event.wait(5), "the keeper no longer signals a lost lease"
    wait_until(lambda: lost == [lock], 5, "the on_lost callback")
    assert lock.lost and not lock.owned()
    with pytest.raises(distlock.LockLost):
        lock.release()
    assert client._keeper._thread is not None and client._keeper._thread.is_alive()


def test_a_slow_on_lost_callback_does_not_let_another_lease_lapse(client: distlock.Client, lock_name: str) -> None:
    started = threading.Event()

    def slow(lock: distlock.Lock) -> None:
        started.set()
        time.sleep(3)

    doomed = client.lock(f"{lock_name}/doomed", ttl=5, max_hold=0.2, on_lost=slow)
    healthy = client.lock(f"{lock_name}/healthy", ttl=1)
    assert healthy.acquire() and doomed.acquire()
    assert started.wait(5), "max_hold did not fire"
    time.sleep(3)  # the callback runs all this time; the one-second lease needs three refreshes meanwhile
    assert not healthy.lost, healthy
    assert doomed.lost
    healthy.release()
    other = client.lock(f"{lock_name}/doomed", ttl=5)
    assert other.acquire(timeout=5), "the key of the lock past max_hold was not deleted"
    other.release()


def test_on_lost_callbacks_of_locks_freed_by_close_have_run_when_close_returns(
    backend_url: str, lock_name: str
) -> None:
    lost: list[distlock.Lock] = []
    client = distlock.connect(backend_url)
    lock = client.lock(lock_name, ttl=5, on_lost=lost.append)
    assert lock.acquire()
    client.close()
    assert lost == [lock] and lock.lost
