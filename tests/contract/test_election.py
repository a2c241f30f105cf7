"""Leader election on every backend: one leader, the term a fencing token, candidates in order, followers told."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time

import pytest
from _support import wait_until
from sqla.models import Counter
from sqla.test_sqla_races import SqlaWorker
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session
from test_force_release import engine  # noqa: F401 (a fixture, used by name)

import distlock
from distlock import Leader
from distlock._protocol import Interrupt
from distlock_sqla import claim_one

TTL = 3


def test_one_candidate_leads_the_next_leads_after_it_resigns_with_a_larger_term(
    client: distlock.Client, lock_name: str
) -> None:
    first = client.election(lock_name, value="alpha", ttl=10)
    second = client.election(lock_name, value="beta", ttl=10)
    assert first.leader() is None
    assert first.campaign()
    assert first.is_leader()
    assert second.leader() == Leader("alpha", first.term)
    assert not second.campaign(timeout=0.2)
    term = first.term
    first.resign()
    assert second.campaign(timeout=10)
    assert second.term > term
    assert first.leader() == Leader("beta", second.term)
    assert distlock.current_lock(lock_name) is second.lock  # the leader's writes are fenced with its term
    with pytest.raises(distlock.LockNotOwned):
        _ = first.term
    second.resign()
    assert first.leader() is None


def test_a_follower_observes_every_change_of_leader(client: distlock.Client, lock_name: str) -> None:
    seen: list[Leader | None] = []
    stop = threading.Event()
    follower = client.election(lock_name, value="follower")
    thread = threading.Thread(target=lambda: seen.extend(follower.observe(poll=0.05, stop=stop)))
    thread.start()
    try:
        wait_until(lambda: seen == [None], 10, "the follower to see nobody leading")
        with client.election(lock_name, value="alpha", ttl=10) as alpha:
            wait_until(lambda: len(seen) == 2, 10, "the follower to see alpha")
            assert seen[1] == Leader("alpha", alpha.term)
        with client.election(lock_name, value="beta", ttl=10) as beta:
            wait_until(lambda: Leader("beta", beta.term) in seen, 10, "the follower to see beta")
    finally:
        stop.set()
        thread.join(10)
    assert seen[0] is None and [leader.value for leader in seen if leader is not None] == ["alpha", "beta"]


#: A change of leader shows this soon on a watch (well under ``POLL``: without the watch, observe() would not see it).
WATCHED_WITHIN = 5.0
POLL = 30.0


@pytest.mark.parametrize("backend", ["memory", "etcd", "zookeeper", "redis"], indirect=True)
def test_a_follower_waits_on_the_service_watch_and_polls_without_one(
    client: distlock.Client, lock_name: str, backend: str
) -> None:
    # etcd, ZooKeeper and memory watch the head (poll is only a safety net: 30 s here); Redis has no watch and
    # reads every poll (0.2 s here): both see each change well within WATCHED_WITHIN.
    poll = 0.2 if backend == "redis" else POLL
    seen: list[Leader | None] = []
    stop = threading.Event()
    follower = client.election(lock_name, value="follower")
    thread = threading.Thread(target=lambda: seen.extend(follower.observe(poll=poll, stop=stop)))
    thread.start()
    took = []
    try:
        wait_until(lambda: seen == [None], WATCHED_WITHIN, "the follower to see nobody leading")
        alpha = client.election(lock_name, value="alpha", ttl=10)
        beta = client.election(lock_name, value="beta", ttl=10)
        assert alpha.campaign()
        took.append(wait_until(lambda: len(seen) == 2, WATCHED_WITHIN, "the follower to see alpha lead"))
        waiting = threading.Thread(target=beta.campaign, args=(10,))
        waiting.start()
        wait_until(lambda: getattr(client.holder(lock_name), "waiters", 0) == 1, 10, "beta to wait behind alpha")
        alpha.resign()
        took.append(wait_until(lambda: len(seen) == 3, WATCHED_WITHIN, "the follower to see beta lead"))
        waiting.join(10)
        assert seen[1:] == [Leader("alpha", seen[1].term), Leader("beta", beta.term)]  # type: ignore[union-attr]
        beta.resign()
        took.append(wait_until(lambda: len(seen) == 4, WATCHED_WITHIN, "the follower to see nobody lead"))
    finally:
        stop.set()
        thread.join(WATCHED_WITHIN)
    assert not thread.is_alive(), "stop ends a follower's watch at once, not after poll"
    assert seen[-1] is None
    print(f"{backend}: changes of leader observed after {', '.join(f'{t:.3f}' for t in took)} s (poll={poll:g})")


@pytest.mark.parametrize("backend", ["memory", "etcd", "zookeeper"], indirect=True)
def test_a_head_watch_returns_at_once_when_the_head_changed_before_it_was_armed(
    client: distlock.Client, lock_name: str
) -> None:
    # The race a watch must not lose: the follower reads the head, the head changes, then the watch is armed.
    alpha = client.election(lock_name, value="alpha", ttl=10)
    assert alpha.campaign()
    seen = client._context.head(lock_name)
    assert seen is not None
    alpha.resign()
    started = time.monotonic()
    assert client._context.watch_head(lock_name, seen.ticket, POLL, Interrupt())
    assert time.monotonic() - started < WATCHED_WITHIN


def test_asyncio_candidates_and_followers(client: distlock.Client, lock_name: str) -> None:
    async def main() -> None:
        alpha = client.async_election(lock_name, value="alpha", ttl=10)
        beta = client.async_election(lock_name, value="beta", ttl=10, timeout=0.2)
        async with alpha:
            assert await beta.leader() == Leader("alpha", alpha.term)
            assert not await beta.campaign()
            seen = [leader async for leader in beta.observe(timeout=0.3, poll=0.05)]
            assert seen == [Leader("alpha", alpha.term)]
        assert await beta.campaign(timeout=10)
        await beta.resign()

    asyncio.run(main())


def test_the_record_is_written_only_by_the_leader_and_read_by_the_next(client: distlock.Client, lock_name: str) -> None:
    first = client.election(lock_name, value="alpha", ttl=10)
    second = client.election(lock_name, value="beta", ttl=10)
    assert first.recorded() is None
    with pytest.raises(distlock.LockNotOwned):
        first.record(b"not leading")
    assert first.campaign()
    first.record(b"tick 1")
    first.record("tick 2")
    assert second.recorded() == b"tick 2"
    assert client.force_release(lock_name, first.term)  # deposed behind its back: it still believes it leads
    assert second.campaign(timeout=10)
    second.record(b"tick 3")
    with pytest.raises(distlock.LockLost):
        first.record(b"tick 2 again")  # the server refuses it: the key it led with is gone
    assert first.lost
    assert first.recorded() == b"tick 3"
    states = [state for state in client.inspect() if state.name.startswith(lock_name)]
    assert [(state.name, state.holder.owner) for state in states] == [(lock_name, "beta")]  # the record is not a lock
    second.resign()
    assert second.recorded() == b"tick 3"  # the record outlives every term
    assert all(state.name != lock_name for state in client.inspect())


def test_asyncio_record(client: distlock.Client, lock_name: str) -> None:
    async def main() -> None:
        async with client.async_election(lock_name, value="alpha", ttl=10) as alpha:
            await alpha.record("ledger")
            assert await alpha.recorded() == b"ledger"

    asyncio.run(main())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda c, n: c.election(n, value=""), "owner must be a printable str"),
        (lambda c, n: c.election(n, owner="x"), "value=..., not owner=..."),
        (lambda c, n: c.election(n).observe(poll=0), "poll"),
        (lambda c, n: c.election(n).observe(timeout=-1), "timeout"),
        (lambda c, n: c.election(n).record(b""), "1 byte to 512 KiB"),
        (lambda c, n: c.election(n).record(b"x" * (512 * 1024 + 1)), "1 byte to 512 KiB"),
        (lambda c, n: c.election(n).record(7), "bytes or str, not int"),
    ],
)
def test_bad_input_is_refused_where_it_is_given(client: distlock.Client, lock_name: str, make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(distlock.ConfigurationError, match=message):
        make(client, lock_name)


@pytest.mark.real_server
def test_a_frozen_leader_is_deposed_within_its_ttl_and_its_late_write_is_refused(
    client: distlock.Client,
    backend_url: str,
    engine: Engine,  # noqa: F811 (the fixture imported above)
) -> None:
    """The leader (another process) claims the row it guards and is frozen by SIGSTOP. A candidate here leads once
    the frozen leader's lease runs out: within TTL + 1 s of the freeze, in a larger term. It writes the row; the old
    leader, resumed, writes too, with its old term: the database refuses it."""
    row_id = secrets.randbelow(2**31)
    with Session(engine) as session, session.begin():
        session.add(Counter(id=row_id, value=0))
    name = f"counter:{row_id}"
    old = SqlaWorker(backend_url, str(engine.url))
    try:
        old_term = old.call(op="elect", name=name, value="old", ttl=TTL)["token"]
        assert old.call(op="read", id=row_id, claim=True, commit=True)["value"] == 0
        candidate = client.election(name, value="new", ttl=TTL, timeout=TTL + 10)
        assert candidate.leader() == Leader("old", old_term)
        old.stop()
        frozen_at = time.monotonic()
        assert candidate.campaign()
        took = time.monotonic() - frozen_at
        assert took <= TTL + 1, f"the new leader took {took:.2f} s (ttl {TTL} s)"
        assert candidate.term > old_term
        with Session(engine) as session:
            claim_one(session, Counter, row_id).value += 1
            session.commit()
        old.cont()
        answer = old.call(op="write", guard="flush", commit=True)
        assert answer["error"] == "StaleFenceToken", answer
        assert old.call(op="release")["error"] == "LockLost"
        new_term = candidate.term
        candidate.resign()
    finally:
        old.close()
    with engine.connect() as conn:
        value, token = conn.execute(select(Counter.value, Counter.fence_token).where(Counter.id == row_id)).one()
    assert (value, token) == (1, new_term)  # the new leader's write stands, the old leader's did not land
