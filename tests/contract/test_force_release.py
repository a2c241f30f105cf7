"""Force release: an operator removes a stuck holder at the token they saw, the next waiter gets the lock, the holder
finds out (``lost``, ``ensure_held()``, ``on_lost``), and a token that is not the holder's any more changes nothing.

Every test runs on each backend (``client``/``backend_url``). Two freeze a holder in another process with SIGSTOP and
force-release it from the command line (``python -m distlock``), as an operator would. On a Redis Cluster:
``tests/backends/redis/test_redis_cluster.py``.
"""

from __future__ import annotations

import contextvars
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support import Worker, child_env, queued, wait_until
from sqla.models import Base, Counter, make_engine
from sqla.test_sqla_races import SqlaWorker
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

import distlock
from distlock_sqla import claim_one

#: Long enough that no lease in these tests expires while its holder is frozen: what ends a hold here is the force
#: release, never the TTL. Refreshes (and so the holder's check of its keys) come every TTL/3 = 5 s.
TTL = 15
#: Where no holder is frozen: the holder finds its key removed at its next refresh, within UNFROZEN_TTL / 3 = 2 s.
UNFROZEN_TTL = 6
FORCED = "its key was removed while its lease lived"


@pytest.fixture
def operator(backend_url: str) -> Iterator[distlock.Client]:
    """The operator's own client, as the CLI or the admin would have it."""
    with distlock.connect(backend_url) as client:
        yield client


def _wait_in_thread(lock: distlock.Lock) -> tuple[threading.Thread, threading.Event]:
    acquired = threading.Event()

    def wait() -> None:
        if lock.acquire(timeout=30):
            acquired.set()

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, acquired


def test_the_holders_token_releases_it_the_next_waiter_gets_it_and_the_holder_sees_lost(
    client: distlock.Client, operator: distlock.Client, backend_url: str, lock_name: str
) -> None:
    lost: list[distlock.Lock] = []
    other = client.lock(f"{lock_name}/other", ttl=UNFROZEN_TTL)  # on the same lease as the holder
    holder = client.lock(lock_name, ttl=UNFROZEN_TTL, on_lost=lost.append)
    assert other.acquire() and holder.acquire()
    with distlock.connect(backend_url) as waiting:
        waiter = waiting.lock(lock_name, ttl=UNFROZEN_TTL)
        thread, acquired = _wait_in_thread(waiter)
        wait_until(lambda: queued(operator, lock_name, 1), 10, "the waiter to queue")

        assert operator.force_release(lock_name, holder.token) is True

        assert acquired.wait(10), "the next waiter did not get the lock"
        thread.join(10)
        assert waiter.token > holder.token
        wait_until(lambda: holder.lost, UNFROZEN_TTL, "the holder to see its lock lost")
        assert holder.lost_event.is_set()
        with pytest.raises(distlock.LockLost, match=FORCED):
            holder.ensure_held()
        wait_until(lambda: lost == [holder], 5, "on_lost to run")
        # The lease lives on: the client's other lock is untouched.
        assert not other.lost
        other.ensure_held(verify=True)
        with pytest.raises(distlock.LockLost, match=FORCED):
            holder.release()
        current = operator.holder(lock_name)
        assert current is not None and current.token == waiter.token
        waiter.release()
    other.release()


def test_a_token_that_is_not_the_holders_changes_nothing(
    client: distlock.Client, operator: distlock.Client, lock_name: str
) -> None:
    assert operator.force_release(lock_name, 1) is False  # nobody holds it
    first = client.lock(lock_name, ttl=TTL)
    assert first.acquire()
    old_token = first.token
    first.release()
    holder = client.lock(lock_name, ttl=TTL)
    assert holder.acquire()
    waiter = client.lock(lock_name, ttl=TTL)
    thread, acquired = _wait_in_thread(waiter)
    wait_until(lambda: queued(operator, lock_name, 1), 10, "the waiter to queue")
    try:
        waiter_token = max(w.token for s in operator.inspect() if s.name == lock_name for w in s.waiters)
        # An earlier holder's token, a waiter's token, a token nobody ever had: all refused, nothing removed.
        for token in (old_token, waiter_token, holder.token + 10**9):
            assert operator.force_release(lock_name, token) is False
        current = operator.holder(lock_name)
        assert current is not None and (current.token, current.waiters) == (holder.token, 1)
        holder.ensure_held(verify=True)
        assert not acquired.is_set()
    finally:
        holder.release()
        thread.join(30)
    assert acquired.is_set() and waiter.token == waiter_token
    waiter.release()


@pytest.mark.parametrize("token", [-1, 0, "12", 1.5, True, None])
def test_a_token_that_cannot_be_one_is_refused_before_anything_is_sent(
    operator: distlock.Client, token: object
) -> None:
    with pytest.raises(distlock.ConfigurationError, match="positive int"):
        operator.force_release("job", token)  # type: ignore[arg-type]


def test_a_bad_lock_name_is_refused(operator: distlock.Client) -> None:
    with pytest.raises(distlock.InvalidLockName):
        operator.force_release("", 5)


def _force_release_from_the_cli(url: str, name: str, token: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distlock", "--url", url, "force-release", name, "--token", str(token)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )


@pytest.mark.real_server
def test_a_holder_frozen_by_sigstop_released_from_the_cli_sees_lost_when_resumed(
    client: distlock.Client, backend_url: str, lock_name: str
) -> None:
    frozen = Worker(backend_url)
    try:
        token = frozen.call(op="acquire", name=lock_name, ttl=TTL)["token"]
        frozen.stop()
        waiter = client.lock(lock_name, ttl=TTL)
        thread, acquired = _wait_in_thread(waiter)
        wait_until(lambda: queued(client, lock_name, 1), 10, "the waiter to queue")

        wrong = _force_release_from_the_cli(backend_url, lock_name, token + 1)
        assert wrong.returncode == 1 and "nothing changed" in wrong.stderr
        assert not acquired.is_set()
        done = _force_release_from_the_cli(backend_url, lock_name, token)
        assert done.returncode == 0, done.stderr
        assert acquired.wait(10), "the next waiter did not get the lock"
        assert waiter.token > token

        frozen.cont()
        wait_until(lambda: frozen.call(op="status")["lost"], TTL, "the resumed holder to see its lock lost")
        answer = frozen.call(op="ensure_held")
        assert answer["error"] == "LockLost" and FORCED in answer["message"]
        waiter.ensure_held(verify=True)
        thread.join(10)
        waiter.release()
    finally:
        frozen.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.mark.real_server
def test_a_frozen_holders_fenced_write_is_refused_after_a_force_release_from_the_cli(
    client: distlock.Client, backend_url: str, engine: Engine
) -> None:
    """A holds ``counter:<id>``, claims the row and is frozen (a live but hung holder: its lease would outlast the
    test). The operator force-releases it from the command line; B, queued behind, gets the lock and claims the row.
    A resumes and writes with its token: the database refuses it, and A's lock says lost."""
    row_id = secrets.randbelow(2**31)
    with Session(engine) as session, session.begin():
        session.add(Counter(id=row_id, value=0))
    name = f"counter:{row_id}"
    a = SqlaWorker(backend_url, str(engine.url))
    try:
        a_token = a.call(op="acquire", name=name, ttl=TTL)["token"]
        assert a.call(op="read", id=row_id, claim=True, commit=True)["value"] == 0
        a.stop()
        b_token: list[int] = []

        def b_claims_and_increments() -> None:
            with client.lock(name, ttl=TTL, timeout=30) as lock, Session(engine) as session:
                claim_one(session, Counter, row_id).value += 1
                session.commit()
                b_token.append(lock.token)

        thread = threading.Thread(target=contextvars.copy_context().run, args=(b_claims_and_increments,))
        thread.start()
        wait_until(lambda: queued(client, name, 1), 10, "B to queue behind the frozen A")
        released = _force_release_from_the_cli(backend_url, name, a_token)
        assert released.returncode == 0, released.stderr
        thread.join(30)
        assert b_token and b_token[0] > a_token

        a.cont()
        answer = a.call(op="write", guard="flush", commit=True)
        assert answer["error"] == "StaleFenceToken", answer
        assert a.call(op="release")["error"] == "LockLost"
    finally:
        a.close()
    with engine.connect() as conn:
        value, token = conn.execute(select(Counter.value, Counter.fence_token).where(Counter.id == row_id)).one()
    assert (value, token) == (1, b_token[0])  # B's increment stands, A's late write did not land
