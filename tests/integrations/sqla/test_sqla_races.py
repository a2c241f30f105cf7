"""The races the fence exists for, with real processes, real etcd leases, SIGSTOP and real databases.

Holder A is a second process (``sqlaworker.py``) frozen with SIGSTOP past its lease; holder B is this test, which
gets the lock once A's lease has lapsed (its ``acquire()`` returns exactly then: no sleeps). What happens next is
decided by the database, not by timing.
"""

from __future__ import annotations

import contextvars
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from _support import Worker, child_env, wait_until
from sqla.conftest import Database
from sqla.models import Counter, make_engine
from sqlalchemy import Engine, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

import distlock
from distlock_sqla import StaleFenceToken, claim_one, fenced_update

HERE = Path(__file__).resolve().parent
TTL = 2  # etcd's smallest lease with the test harness's election timeout


class SqlaWorker(Worker):
    """``sqlaworker.py`` in its own process, on the test's lock service and database."""

    def __init__(self, lock_url: str, db_url: str, session: str = "kept") -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "sqlaworker.py"), lock_url, db_url, session],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        assert self.read(timeout=60) == {"ready": True}


@pytest.fixture
def start_worker(backend_url: str, db: Database) -> Iterator[Callable[..., SqlaWorker]]:
    started: list[SqlaWorker] = []

    def start(db_url: str | None = None, session: str = "kept") -> SqlaWorker:
        worker = SqlaWorker(backend_url, db_url or db.url, session)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.close()


@pytest.fixture
def counter(sessions: sessionmaker[Session], row_id: int) -> int:
    with sessions.begin() as session:
        session.add(Counter(id=row_id, value=0))
    return row_id


def final(engine: Engine, row_id: int) -> tuple[int, int]:
    with engine.connect() as conn:
        row = conn.execute(select(Counter.value, Counter.fence_token).where(Counter.id == row_id)).one()
        return row.value, row.fence_token


def b_write(session: Session, row: Counter, value: int, guard: str) -> bool:
    """Holder B writes ``value`` the way A does; False when the database refused it."""
    try:
        if guard == "write-only":
            fenced_update(session, Counter, {"value": value}, Counter.id == row.id)
        else:
            row.value = value
        session.commit()
    except StaleFenceToken:
        session.rollback()
        return False
    return True


@pytest.mark.parametrize(
    ("guard", "newer_writes_first", "session"),
    [
        pytest.param("claim", True, "default", id="claim-newer-writes-first"),
        pytest.param("claim", False, "default", id="claim"),
        pytest.param("write-only", False, "default", id="write-only-guard"),
        pytest.param("flush-without-claim", False, "default", id="flush-without-claim"),
        # The one path where what a session keeps after commit decides which token the write compares.
        pytest.param("flush-without-claim", False, "kept", id="flush-without-claim-expire_on_commit=False"),
    ],
)
def test_the_lost_update_race_of_a_paused_holder(
    client: distlock.Client,
    start_worker: Callable[..., SqlaWorker],
    engine: Engine,
    counter: int,
    guard: str,
    newer_writes_first: bool,
    session: str,
) -> None:
    """A write-only fence's lost update: A reads, pauses past its lease; B locks and reads; A wakes, writes; B writes.

    With claim-on-read A's write is refused and B's value stands. With the write-only guard (``UPDATE ... WHERE
    fence_token <= :t`` after a plain read) both writes pass and one increment is lost: the test catches the bug
    it guards against. A flush without a claim compares the token it read, so nothing is lost either — but the
    holder refused is B, the rightful one, because A wrote first: claiming is what makes the stale holder lose.

    Both holders' sessions are SQLAlchemy's default (``expire_on_commit=True``: the commit after the read expires
    the row, and the write loads it again); the flush without a claim, which compares the token the object was read
    with, also with sessions that keep their objects (``expire_on_commit=False``): the outcome is the same. (The
    other lock services' run below keeps them.)
    """
    sessions = sessionmaker(engine, expire_on_commit=session == "default")
    _paused_holder_race(client, start_worker, sessions, engine, counter, guard, newer_writes_first, session)


@pytest.mark.parametrize("backend", ["redis", "zookeeper", "postgres-table"], indirect=True)
def test_the_paused_holder_loses_on_every_lock_service(
    client: distlock.Client,
    start_worker: Callable[..., SqlaWorker],
    sessions: sessionmaker[Session],
    engine: Engine,
    counter: int,
) -> None:
    """The race above with claim-on-read, on the other lock services (etcd runs every variant): the fence is the
    database's, whatever hands out the tokens."""
    _paused_holder_race(client, start_worker, sessions, engine, counter, "claim", False, "kept")


def _paused_holder_race(
    client: distlock.Client,
    start_worker: Callable[..., SqlaWorker],
    sessions: sessionmaker[Session],
    engine: Engine,
    counter: int,
    guard: str,
    newer_writes_first: bool,
    session_kind: str,
) -> None:
    claiming = guard == "claim"
    a = start_worker(session=session_kind)
    name = f"counter:{counter}"
    a_token = a.call(op="acquire", name=name, ttl=TTL)["token"]
    assert a.call(op="read", id=counter, claim=claiming, commit=True)["value"] == 0
    a.stop()
    try:
        with client.lock(name, ttl=10, timeout=20) as lock, sessions() as session:
            assert lock.token > a_token  # A's lease lapsed while it was stopped
            b_token = lock.token
            row = claim_one(session, Counter, counter) if claiming else session.get(Counter, counter)
            assert row is not None and row.value == 0
            session.commit()
            b_ok = b_write(session, row, 1, guard) if newer_writes_first else None
            a.cont()
            a_answer = a.call(op="write", guard="write-only" if guard == "write-only" else "flush", commit=True)
            if not newer_writes_first:
                b_ok = b_write(session, row, 1, guard)
    finally:
        a.cont()
    value, token = final(engine, counter)
    if guard == "claim" and session_kind == "default" and engine.dialect.name == "sqlite":
        # A's default session read the row after its commit (the worker answers with the row's value), which began a
        # read transaction on the snapshot before B's claim. SQLite (WAL) refuses to make that transaction a writer
        # (SQLITE_BUSY_SNAPSHOT) before the fence's statement runs: refused all the same, with SQLite's own error
        # (docs/integrations/sqlalchemy.md, "Transactions").
        assert a_answer["error"] == "OperationalError" and "database is locked" in a_answer["message"], a_answer
        assert b_ok is True
        assert (value, token) == (1, b_token)
    elif guard == "claim":
        assert a_answer["error"] == "StaleFenceToken", a_answer
        assert f"newer token {b_token}" in a_answer["message"]
        assert b_ok is True
        assert (value, token) == (1, b_token)  # the newer holder's value stands
    elif guard == "write-only":
        assert a_answer == {"ok": True} and b_ok is True  # both increments were accepted...
        assert value == 1  # ...and one of them is lost
    else:
        assert a_answer == {"ok": True} and b_ok is False
        assert (value, token) == (1, a_token)


def test_eight_processes_times_fifty_increments_through_the_orm_are_exact(
    start_worker: Callable[..., SqlaWorker], engine: Engine, counter: int
) -> None:
    processes, increments = 8, 50
    with ThreadPoolExecutor(processes) as pool:
        workers = list(pool.map(lambda _: start_worker(), range(processes)))
    for worker in workers:  # all are connected and waiting: they start within microseconds of each other
        worker.send(op="increments", id=counter, count=increments, ttl=10)
    assert [worker.read(timeout=240) for worker in workers] == [{"done": increments}] * processes
    assert final(engine, counter)[0] == processes * increments


def _waiting_on_a_lock(db: Database) -> bool:
    url = db.url.replace("postgresql+psycopg://", "postgresql://", 1).split("?", 1)[0]
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()
        return row is not None and row[0] > 0


def test_a_claim_inside_a_stalled_transaction_holds_the_next_holder_at_the_database(
    client: distlock.Client,
    start_worker: Callable[..., SqlaWorker],
    db: Database,
    engine: Engine,
    counter: int,
) -> None:
    """The transaction path: A claims inside its transaction and is frozen past its lease. B has the lock, but its
    claim cannot pass A's row lock: the database serialises them, so it is safe, and not live until A's
    transaction ends. PostgreSQL's ``idle_in_transaction_session_timeout`` ends it (A's later write then fails);
    on SQLite B's busy timeout runs out and B retries once A has resumed and committed. Both on SQLAlchemy's default
    session (``expire_on_commit=True``)."""
    a = start_worker(db.url_with(idle_in_transaction_session_timeout="5000"), session="default")
    name = f"counter:{counter}"
    a.call(op="acquire", name=name, ttl=TTL)
    assert a.call(op="read", id=counter, claim=True, commit=False)["value"] == 0
    a.stop()
    try:
        with client.lock(name, ttl=10, timeout=20) as lock:
            b_token = lock.token
            if db.kind == "postgresql":
                claimed: list[int] = []
                session = Session(engine)  # SQLAlchemy's default session, as A's

                def claim_and_increment() -> None:
                    row = claim_one(session, Counter, counter)
                    claimed.append(row.value)
                    row.value += 1
                    session.commit()

                # The lock is found through a contextvar: the thread runs in a copy of this context.
                thread = threading.Thread(target=contextvars.copy_context().run, args=(claim_and_increment,))
                thread.start()
                wait_until(lambda: _waiting_on_a_lock(db), timeout=4, what="B's claim waiting on A's row lock")
                assert not claimed
                thread.join(timeout=30)  # until the server ends A's idle transaction
                session.close()
                assert claimed == [0]
                a.cont()
                a_answer = a.call(op="write", guard="flush", commit=True)
                assert "IdleInTransactionSessionTimeout" in a_answer.get("message", ""), a_answer  # nothing written
                assert final(engine, counter) == (1, b_token)
            else:
                impatient = make_engine(db.url_with(sqlite_timeout=0.3))
                with Session(impatient) as session, pytest.raises(OperationalError, match="locked"):
                    claim_one(session, Counter, counter)
                a.cont()
                assert a.call(op="write", guard="flush", commit=True) == {"ok": True}  # serialised: A first
                with Session(engine) as session:
                    row = claim_one(session, Counter, counter)
                    assert row.value == 1  # B reads A's committed write, never the old row
                    row.value += 1
                    session.commit()
                impatient.dispose()
                assert final(engine, counter) == (2, b_token)
    finally:
        a.cont()


def test_releasing_before_commit_does_not_let_the_next_holder_read_old_data(
    client: distlock.Client,
    start_worker: Callable[..., SqlaWorker],
    db: Database,
    engine: Engine,
    counter: int,
) -> None:
    """A claims and writes inside a transaction, releases the lock, and only then commits. B, holding the lock in
    between, would read the old row with a plain read; its claim cannot: it waits for A's commit (here it gives up
    after 0.3 s instead of waiting) and, after the commit, reads A's write. Both on SQLAlchemy's default session."""
    a = start_worker(session="default")
    name = f"counter:{counter}"
    a.call(op="acquire", name=name, ttl=TTL)
    a.call(op="read", id=counter, claim=True, commit=False)
    assert a.call(op="write", guard="flush", commit=False) == {"ok": True}
    assert a.call(op="release") == {"ok": True}
    impatient = make_engine(db.url_with(sqlite_timeout=0.3, lock_timeout="300"))
    try:
        with client.lock(name, ttl=10, timeout=5) as lock:
            with Session(impatient) as session:
                assert session.get(Counter, counter).value == 0  # type: ignore[union-attr]  # the hazard is real
                session.rollback()
                with pytest.raises(OperationalError):
                    claim_one(session, Counter, counter)
            assert a.call(op="commit") == {"ok": True}
            with Session(engine) as session:
                row = claim_one(session, Counter, counter)
                assert row.value == 1
                row.value += 1
                session.commit()
            b_token = lock.token
    finally:
        impatient.dispose()
    assert final(engine, counter) == (2, b_token)
