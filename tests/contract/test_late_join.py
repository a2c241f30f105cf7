"""A late copy of a join must not leave a key that blocks the lock for as long as its client lives.

A join (``enqueue``) that timed out may still be executed later: a frozen etcd member reads the request when it
resumes, a paused Redis runs what waits in its socket. If the waiter has released (or given up) by then, the copy
makes its key again, on the client's live lease, and nobody will ever release it. This was seen on a 3-member etcd
cluster with the leader frozen for 3 s: every waiter timed out behind such a key for more than 10 s.

These tests replay the late copy by hand (the same join, sent again after the lock is done with it) on a real
server, and check that the next waiter still gets the lock: the keeper finds the key and removes it. With the sweep
turned off (``Keeper._sweep_strays`` a no-op) the first two fail: the other client's acquire times out.

A join's nonce is a seat its session reuses from one acquisition to the next (``Keeper.join_started``), so the key
of a stray must never be the key of a later acquisition: a seat that had a stray is retired, and the sweep removes
only the stray's key, never the live one of the acquisition after it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from _support import wait_until

import distlock

TTL = 1  # refreshed three times a second: the sweep follows a refresh


def _record_joins(client: distlock.Client, monkeypatch: pytest.MonkeyPatch, after: Callable[[Any], Any]) -> list[Any]:
    """Make ``client``'s joins go through ``after(result)``; return the list their arguments are recorded in."""
    backend = client._backend
    real = backend.enqueue
    calls: list[Any] = []

    def enqueue(*args: Any) -> Any:
        calls.append(args)
        return after(real(*args))

    monkeypatch.setattr(backend, "enqueue", enqueue)
    return calls


def _next_waiter_gets_it(backend_url: str, lock_name: str, after: int) -> None:
    """Another client gets the lock, with a token newer than ``after`` (the stray key's), before its timeout."""
    with distlock.connect(backend_url) as other:
        waiter = other.lock(lock_name, ttl=TTL)
        assert waiter.acquire(timeout=10), "the stray key still blocks the lock"
        assert waiter.token > after
        waiter.release()


def test_a_late_copy_of_a_retried_join_after_release_does_not_block_the_next_waiter(
    client: distlock.Client, backend_url: str, lock_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The join is answered, but "was sent twice" (as after an attempt that timed out on a frozen member).
    calls = _record_joins(client, monkeypatch, lambda result: (dataclasses.replace(result[0], resent=True), result[1]))
    lock = client.lock(lock_name, ttl=TTL)
    assert lock.acquire(timeout=5)
    token = lock.token
    lock.release()

    # The first copy arrives now, after the release: it makes the key again.
    ghost, _ = client._backend.enqueue(*calls[0])
    assert ghost.token > token
    holder = client.holder(lock_name)
    assert holder is not None and holder.token == ghost.token

    _next_waiter_gets_it(backend_url, lock_name, after=ghost.token)


def test_a_join_that_failed_after_landing_does_not_block_the_next_waiter(
    client: distlock.Client, backend_url: str, lock_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def lost_answer(result: Any) -> Any:
        raise distlock.BackendUnavailable("simulated: the join landed but its answer never came")

    _record_joins(client, monkeypatch, lost_answer)
    with pytest.raises(distlock.BackendUnavailable):
        client.lock(lock_name, ttl=TTL).acquire(timeout=5)
    with distlock.connect(backend_url) as observer:  # ``client`` fails fast now (its circuit breaker), its keeper not
        holder = observer.holder(lock_name)
    assert holder is not None, "the failed join's key should be there (it landed)"

    # Nobody waits on that key, and the client lives on: only the keeper can remove it.
    _next_waiter_gets_it(backend_url, lock_name, after=holder.token)


def test_a_join_answered_at_once_is_never_looked_for(
    client: distlock.Client, lock_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked: list[str] = []
    real = client._backend.discard

    def discard(name: str, lease: Any, nonce: str) -> Any:
        looked.append(name)
        return real(name, lease, nonce)

    monkeypatch.setattr(client._backend, "discard", discard)
    for _ in range(3):
        with client.lock(lock_name, ttl=TTL):
            pass
    session = client._keeper.session(TTL)
    assert session.strays == []
    assert looked == []


def test_a_seat_that_had_a_stray_is_never_reused_and_the_sweep_takes_only_the_stray(
    client: distlock.Client, backend_url: str, lock_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def first_resent(result: Any) -> Any:
        return (dataclasses.replace(result[0], resent=True), result[1]) if len(calls) == 1 else result

    calls = _record_joins(client, monkeypatch, first_resent)
    first = client.lock(lock_name, ttl=TTL)
    assert first.acquire(timeout=5)
    first.release()

    # The next acquisition on this session takes another seat: seat 0 had a stray.
    second = client.lock(lock_name, ttl=TTL)
    assert second.acquire(timeout=5)
    assert [call[2] for call in calls] == ["0", "1"]

    # The late copy of the first join arrives while the second holds: it makes the stray's key, behind the holder.
    ghost, position = client._backend.enqueue(*calls[0])
    assert not position.held and ghost.token > second.token
    wait_until(lambda: client._backend.position(ghost).gone, 15, "the sweep to remove the late copy's key")

    # The sweep took the stray's key only: the live holder still holds, under the newest token.
    second.ensure_held(verify=True)
    holder = client.holder(lock_name)
    assert holder is not None and holder.token == second.token and holder.waiters == 0
    token = second.token
    second.release()
    _next_waiter_gets_it(backend_url, lock_name, after=token)


def test_a_seat_is_reused_once_its_key_is_gone_and_tokens_keep_increasing(
    client: distlock.Client, lock_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _record_joins(client, monkeypatch, lambda result: result)
    tokens = []
    for _ in range(5):
        with client.lock(lock_name, ttl=TTL) as lock:
            tokens.append(lock.token)
    assert [call[2] for call in calls] == ["0"] * 5, "a re-acquire after release takes the same seat"
    assert tokens == sorted(set(tokens))
