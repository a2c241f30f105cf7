"""Hand-over: a holder leaves its lock to a successor in another process (``hand_over``), the successor queues behind
it and then removes its key (``take_over``), and nobody else can take the lock in between.

Every test runs on each backend (``client``/``backend_url``); the two sides use two clients, so two leases, as two
processes would.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from _support import queued, wait_until

import distlock

#: Refreshes, and so the old holder's check of its keys, come every TTL/3 = 1 s.
TTL = 3


@pytest.fixture
def successor(backend_url: str) -> Iterator[distlock.Client]:
    with distlock.connect(backend_url) as client:
        yield client


def test_a_handed_over_lock_passes_to_its_successor_and_the_old_holder_ends_quietly(
    client: distlock.Client, successor: distlock.Client, lock_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = client.lock(lock_name, ttl=TTL)
    assert old.acquire()
    old.hand_over(60)
    assert old.owned() and distlock.current_lock() is None  # held, but no longer the caller's lock
    new = successor.lock(lock_name, ttl=TTL)
    with caplog.at_level(logging.WARNING, logger="distlock"):
        assert new.take_over(old.token, timeout=10)
        holder = successor.holder(lock_name)
        assert holder is not None and holder.token == new.token > old.token
        wait_until(lambda: not old.owned(), 3 * TTL, "the old holder to see its hold taken over")
    assert not old.lost  # taken over, not lost
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    new.release()
    assert client.holder(lock_name) is None


def test_a_handed_over_hold_ends_quietly_when_its_client_closes_before_its_next_check(
    backend_url: str, successor: distlock.Client, lock_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A process that hands its hold over and exits at once (an enqueue from a script): its client's close ends the
    hold it gave away, not a lost lock to warn about; the successor keeps it."""
    with distlock.connect(backend_url) as client:
        old = client.lock(lock_name, ttl=TTL)
        assert old.acquire()
        old.hand_over(60)
        new = successor.lock(lock_name, ttl=TTL)
        assert new.take_over(old.token, timeout=10)
        with caplog.at_level(logging.WARNING, logger="distlock"):
            client.close()  # before its next check of its keys (a third of its TTL away)
    assert not old.lost and not old.owned()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert new.owned() and successor.holder(lock_name) is not None
    new.release()


def test_a_waiter_queued_before_the_successor_runs_first_and_nobody_finds_the_lock_free(
    client: distlock.Client, successor: distlock.Client, lock_name: str
) -> None:
    old = client.lock(lock_name, ttl=TTL)
    assert old.acquire()
    old_token = old.token  # read now: once its key goes, the old handle has no token (its next check sees that)
    old.hand_over(60)
    stranger = successor.lock(lock_name, ttl=TTL)
    got: list[int] = []

    def wait() -> None:
        if stranger.acquire(timeout=30):
            got.append(stranger.token)

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: queued(client, lock_name, 1), 10, "the stranger to queue")
    new = successor.lock(lock_name, ttl=TTL)
    taken = threading.Thread(target=lambda: new.take_over(old_token, timeout=30))
    taken.start()
    thread.join(10)
    assert got and got[0] > old_token  # the stranger got it straight from the old holder, and the successor had
    assert queued(client, lock_name, 1)  # queued before the old key went: the lock was never free in between
    stranger.release()
    taken.join(10)
    assert new.owned() and new.token > got[0]
    new.release()


def test_take_over_of_a_hold_that_ended_leaves_the_new_holder_alone(
    client: distlock.Client, successor: distlock.Client, lock_name: str
) -> None:
    old = client.lock(lock_name, ttl=TTL)
    assert old.acquire()
    token = old.token
    old.release()
    other = client.lock(lock_name, ttl=TTL)
    assert other.acquire()
    late = successor.lock(lock_name, ttl=TTL)
    assert late.take_over(token, timeout=10) is False  # at once, and out of the queue
    assert queued(client, lock_name, 0)
    assert other.owned()
    other.ensure_held(verify=True)
    other.release()
    assert late.take_over(token, timeout=10) is True  # nothing left to take over: the free lock is simply taken
    late.release()


def test_a_hold_nobody_takes_over_ends_after_its_timeout(
    client: distlock.Client, lock_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = client.lock(lock_name, ttl=TTL)
    assert old.acquire()
    with caplog.at_level(logging.WARNING, logger="distlock"):
        old.hand_over(0.5)
        wait_until(lambda: client.holder(lock_name) is None, 10, "the hold to end")
    assert not old.owned() and not old.lost
    assert "was not taken over in time" in caplog.text


def test_take_over_rejects_a_token_that_is_not_one(client: distlock.Client, lock_name: str) -> None:
    with pytest.raises(distlock.ConfigurationError, match="positive int"):
        client.lock(lock_name).take_over(0)
    with pytest.raises(distlock.LockNotOwned):
        client.lock(lock_name).hand_over(1)
