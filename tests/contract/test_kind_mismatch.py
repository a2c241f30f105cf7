"""One name, one kind at a time, on each backend, under concurrent joins: while a holder of one kind holds a name,
twelve clients that join it at once as another kind (a lock and a semaphore, semaphores of two limits, a lock and a
read/write lock) all raise ``LockKindMismatch``, none holds beside the holder, and none leaves an entry behind; readers
that join at once while a writer holds (and writers while readers hold) wait and never hold beside it. And
``holder(name)`` counts apart the entries that wait (``waiters``) and those that hold (``holders``: a semaphore's
slots, readers), as ``inspect()`` lists them, and ``distlock force-release`` names the first of several holders.

The joins really race: each joiner has its own client (its own connection, lease or session), and they start
together at a barrier."""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Callable, Iterator

import pytest
from _support import wait_until

import distlock
from distlock._cli import main

pytestmark = pytest.mark.every_database

#: Concurrent joiners per case (the issue: "ten clients join a name at once").
JOINERS = 12
TTL = 10

Make = Callable[[distlock.Client, str], distlock.Lock]

#: The kinds a name can be used as, by how a user asks for them.
KINDS: dict[str, Make] = {
    "lock": lambda client, name: client.lock(name, ttl=TTL),
    "semaphore(1)": lambda client, name: client.semaphore(name, limit=1, ttl=TTL),
    "semaphore(2)": lambda client, name: client.semaphore(name, limit=2, ttl=TTL),
    "semaphore(10)": lambda client, name: client.semaphore(name, limit=10, ttl=TTL),
    "reader": lambda client, name: client.rwlock(name, ttl=TTL).read(),
    "writer": lambda client, name: client.rwlock(name, ttl=TTL).write(),
}

#: Which kinds may share a name: those of one family.
FAMILY = {
    "lock": "lock",
    "semaphore(1)": "semaphore(1)",
    "semaphore(2)": "semaphore(2)",
    "semaphore(10)": "semaphore(10)",
    "reader": "rwlock",
    "writer": "rwlock",
}

#: (the holder's kind, the joiners' kind): pairs that may not share a name.
MISMATCHED = [
    ("lock", "semaphore(10)"),
    ("semaphore(10)", "lock"),
    ("semaphore(2)", "semaphore(10)"),
    ("semaphore(10)", "semaphore(2)"),
    ("lock", "reader"),
    ("writer", "lock"),
    ("reader", "semaphore(10)"),
]
#: Pairs of one read/write lock: the joiners wait for the holder.
EXCLUDED = [("writer", "reader"), ("reader", "writer")]


@pytest.fixture(scope="module")
def clients(backend_url: str) -> Iterator[list[distlock.Client]]:
    """One client per joiner, connected before the race starts (closed, leases revoked, after the module)."""
    opened: list[distlock.Client] = []
    try:
        for _ in range(JOINERS):
            opened.append(distlock.connect(backend_url))
        yield opened
    finally:
        for each in opened:
            each.close()


def _race(clients: list[distlock.Client], name: str, make: Make) -> tuple[list[str], list[distlock.Lock]]:
    """Every client joins ``name`` at once (a barrier) as ``make`` makes it, without waiting; returns each join's
    outcome ("mismatch", "held" or "waited") and the handles that hold (still held: the caller releases them)."""
    handles = [make(each, name) for each in clients]
    barrier = threading.Barrier(len(handles), timeout=30)
    outcomes: list[str] = [""] * len(handles)
    failures: list[BaseException] = []

    def join(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = "held" if handles[i].acquire(timeout=0) else "waited"
        except distlock.LockKindMismatch:
            outcomes[i] = "mismatch"
        except BaseException as e:  # reported below, in the test's thread
            failures.append(e)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(handles))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, f"a join failed otherwise: {failures[0]!r}"
    assert all(outcomes), "a join did not finish"
    return outcomes, [handle for handle, outcome in zip(handles, outcomes, strict=True) if outcome == "held"]


def _state(client: distlock.Client, name: str) -> distlock.LockState | None:
    return next((state for state in client.inspect() if state.name == name), None)


def _count(outcomes: list[str]) -> dict[str, int]:
    return {outcome: outcomes.count(outcome) for outcome in sorted(set(outcomes))}


@pytest.mark.parametrize(("ours", "theirs"), MISMATCHED, ids=[f"{a}-then-{b}" for a, b in MISMATCHED])
def test_concurrent_joins_of_another_kind_are_all_refused(
    client: distlock.Client, clients: list[distlock.Client], lock_name: str, ours: str, theirs: str
) -> None:
    holder = KINDS[ours](client, lock_name)
    assert holder.acquire(timeout=0)
    try:
        outcomes, held = _race(clients, lock_name, KINDS[theirs])
        try:
            assert outcomes == ["mismatch"] * JOINERS, (
                f"{theirs} joining a name held as {ours}: {_count(outcomes)} of {JOINERS} joins "
                "(every one must raise LockKindMismatch)"
            )
        finally:
            for handle in held:
                handle.release()
        holder.ensure_held()
        now = client.holder(lock_name)
        assert now is not None and now.token == holder.token
        assert now.waiters == 0
        # Nothing of the refused joins is left in the queue: the holder alone.
        state = _state(client, lock_name)
        assert state is not None
        assert [entry.token for entry in state.holders] == [holder.token] and state.waiters == ()
    finally:
        holder.release()
    assert client.holder(lock_name) is None
    # With the holder gone, the name is free for the other kind at once: no refused entry lingers to block it.
    late = KINDS[theirs](client, lock_name)
    assert late.acquire(timeout=5)
    late.release()


def test_every_kind_is_refused_on_a_name_held_as_another_family(client: distlock.Client, lock_name: str) -> None:
    # One join at a time, every pair: a join is refused exactly when its family differs from the holder's (a
    # semaphore of limit 1 is not a lock, nor one of limit 10), and a refused join leaves nothing.
    wrong = []
    for ours, our_family in FAMILY.items():
        for theirs, their_family in FAMILY.items():
            name = f"{lock_name}/{ours}/{theirs}"
            holder, join = KINDS[ours](client, name), KINDS[theirs](client, name)
            assert holder.acquire(timeout=0)
            try:
                outcome = "held" if join.acquire(timeout=0) else "waited"
            except distlock.LockKindMismatch:
                outcome = "mismatch"
            if outcome == "held":
                join.release()
            if (outcome == "mismatch") != (our_family != their_family):
                wrong.append(f"{theirs} on a name held as {ours}: {outcome}")
            state, token = _state(client, name), holder.token
            holder.release()
            assert state is not None and [entry.token for entry in state.holders] == [token]
            assert state.waiters == ()
    assert not wrong


@pytest.mark.parametrize(("ours", "theirs"), EXCLUDED, ids=[f"{a}-then-{b}" for a, b in EXCLUDED])
def test_concurrent_joins_that_conflict_wait_for_the_holder(
    client: distlock.Client, clients: list[distlock.Client], lock_name: str, ours: str, theirs: str
) -> None:
    holder = KINDS[ours](client, lock_name)
    assert holder.acquire(timeout=0)
    try:
        outcomes, held = _race(clients, lock_name, KINDS[theirs])
        for handle in held:
            handle.release()
        assert outcomes == ["waited"] * JOINERS, (
            f"{theirs} joining a name held as {ours}: {_count(outcomes)} of {JOINERS} joins (every one must wait)"
        )
        holder.ensure_held()
        state = _state(client, lock_name)
        assert state is not None
        assert [entry.token for entry in state.holders] == [holder.token] and state.waiters == ()
    finally:
        holder.release()
    assert client.holder(lock_name) is None


#: Three that hold together, then two that wait behind them (in that order), per shape.
SHARED: dict[str, tuple[Make, list[Make]]] = {
    "semaphore": (
        lambda client, name: client.semaphore(name, limit=3, ttl=TTL),
        [lambda client, name: client.semaphore(name, limit=3, ttl=TTL)] * 2,
    ),
    "readers": (KINDS["reader"], [KINDS["writer"], KINDS["reader"]]),
}


@pytest.mark.parametrize("shape", sorted(SHARED))
def test_holder_waiters_counts_only_the_entries_that_wait(client: distlock.Client, lock_name: str, shape: str) -> None:
    make_holder, make_waiters = SHARED[shape]
    holding = [make_holder(client, lock_name) for _ in range(3)]
    for handle in holding:
        assert handle.acquire(timeout=0)
    threads: list[threading.Thread] = []
    got: list[int] = []

    def take_turn(waiter: distlock.Lock) -> None:
        if waiter.acquire(timeout=30):
            got.append(waiter.token)
            waiter.release()

    try:
        now = client.holder(lock_name)
        assert now is not None and now.token == holding[0].token
        assert now.waiters == 0, f"holder().waiters counted the other {shape} holding as waiters"
        assert now.holders == 3
        for count, make in enumerate(make_waiters, start=1):
            waiter = make(client, lock_name)
            threads.append(threading.Thread(target=take_turn, args=(waiter,)))
            threads[-1].start()
            wait_until(functools.partial(_queued, client, lock_name, count), 10, f"waiter {count} to queue")
        state = _state(client, lock_name)
        assert state is not None and len(state.holders) == 3 and len(state.waiters) == 2
        now = client.holder(lock_name)
        assert now is not None and now.waiters == 2, "holder().waiters is not what inspect() lists as waiting"
        assert now.holders == 3
    finally:
        for handle in holding:
            handle.release()
        for thread in threads:
            thread.join(60)
    assert len(got) == 2, "a waiter did not get its turn"


def _queued(client: distlock.Client, name: str, count: int) -> bool:
    state = _state(client, name)
    return state is not None and len(state.waiters) == count


@pytest.mark.real_server  # the distlock command: another process, which cannot see memory://
def test_the_command_line_names_the_first_of_several_holders(
    client: distlock.Client, backend_url: str, lock_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    slots = [client.semaphore(lock_name, limit=3, ttl=TTL, owner=f"slot-{i}") for i in range(3)]
    for slot in slots:
        assert slot.acquire(timeout=0)
    try:
        # A second slot's token: force_release removes the first holder only, so this one changes nothing.
        stale = str(slots[1].token)
        assert main(["--url", backend_url, "force-release", lock_name, "--token", stale]) == 1
        err = capsys.readouterr().err
        assert f"its first holder's token is {slots[0].token} (owner slot-0; 3 hold it), not {stale}" in err
        assert main(["--url", backend_url, "force-release", lock_name, "--token", str(slots[0].token), "--json"]) == 0
        answer = json.loads(capsys.readouterr().out)
        assert answer["released"] is True
        assert answer["holder"]["token"] == slots[1].token
        assert (answer["holder"]["holders"], answer["holder"]["waiters"]) == (2, 0)
    finally:
        with contextlib.suppress(distlock.LockLost):  # force-released by the test
            slots[0].release()
        for slot in slots[1:]:
            slot.release()
