"""ORM flush integration on SQLite and PostgreSQL, with real etcd locks: what a flush writes and what it refuses.

A "newer holder" here is simulated by writing the row's token directly (on another connection); the races with real
second processes are in ``test_sqla_races.py``. Sessions commit after reading so that SQLite's single writer is free
for that other connection, as in the autocommit path.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqla.models import Counter, Plain, StrictCounter
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

import distlock
from distlock_sqla import STRICT, StaleFenceToken, claim_one


def row(engine: Engine, model: Any, row_id: int) -> tuple[int, int]:
    """(value, fence_token) of a row, read on a connection of its own."""
    with engine.connect() as conn:
        found = conn.execute(select(model.value, model.fence_token).where(model.id == row_id)).one()
        return found.value, found.fence_token


def write_behind(engine: Engine, model: Any, row_id: int, **values: Any) -> None:
    """Another writer changes the row (as a newer lock holder would), committed at once."""
    with engine.begin() as conn:
        conn.execute(update(model.__table__).where(model.__table__.c.id == row_id).values(**values))


@pytest.fixture
def counter(sessions: sessionmaker[Session], row_id: int) -> int:
    with sessions.begin() as session:
        session.add(Counter(id=row_id, value=10))
    return row_id


def test_a_flush_inside_the_lock_writes_the_locks_token(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, counter: int
) -> None:
    with client.lock(f"counter:{counter}", ttl=10) as lock, sessions() as session:
        found = claim_one(session, Counter, counter)
        found.value += 1
        session.commit()
        found.value += 1  # a second flush in the same lock: its read token is now the lock's
        session.commit()
        token = lock.token
        assert found.fence_token == token
    assert row(engine, Counter, counter) == (12, token)


def test_an_insert_inside_the_lock_stores_its_token(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, row_id: int
) -> None:
    with client.lock(f"counter:{row_id}", ttl=10) as lock, sessions.begin() as session:
        session.add(Counter(id=row_id, value=1))
        token = lock.token
    assert row(engine, Counter, row_id) == (1, token)


def test_a_flush_after_a_newer_holder_claimed_raises_and_writes_nothing(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, counter: int
) -> None:
    with client.lock(f"counter:{counter}", ttl=10) as lock, sessions() as session:
        found = claim_one(session, Counter, counter)
        session.commit()
        write_behind(engine, Counter, counter, value=99, fence_token=lock.token + 1)
        found.value += 1
        token = lock.token
        with pytest.raises(StaleFenceToken, match=rf"newer token {token + 1}") as caught:
            session.commit()
    assert isinstance(caught.value, StaleDataError)
    assert (caught.value.token, caught.value.current, caught.value.row) == (token, token + 1, found)
    assert row(engine, Counter, counter) == (99, token + 1)


def test_an_object_read_before_its_claim_is_refused_once_the_row_changed(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, counter: int
) -> None:
    """The flush compares the token the object was read with: a write based on old data is refused even when the
    token that overwrote it is older than ours (it was written before we took the lock)."""
    with sessions() as session:
        found = session.get(Counter, counter)
        assert found is not None
        session.commit()
        write_behind(engine, Counter, counter, value=50, fence_token=1)
        with client.lock(f"counter:{counter}", ttl=10):
            found.value += 1
            with pytest.raises(StaleFenceToken, match="written after this session read it"):
                session.commit()
    assert row(engine, Counter, counter) == (50, 1)


def test_an_object_read_before_the_lock_is_written_if_the_row_is_unchanged(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, counter: int
) -> None:
    with sessions() as session:
        found = session.get(Counter, counter)
        assert found is not None
        with client.lock(f"counter:{counter}", ttl=10) as lock:
            found.value += 1
            session.commit()
            token = lock.token
    assert row(engine, Counter, counter) == (11, token)


def test_outside_a_lock_a_flush_is_unfenced_but_never_overwrites_a_fenced_write(
    sessions: sessionmaker[Session], engine: Engine, counter: int
) -> None:
    with sessions() as session:
        found = session.get(Counter, counter)
        assert found is not None
        found.value += 1
        session.commit()
        assert row(engine, Counter, counter) == (11, 0)  # written, token untouched
        write_behind(engine, Counter, counter, value=70, fence_token=5)  # a lock holder wrote since our read
        found.value += 1
        with pytest.raises(StaleFenceToken, match="without a fencing token"):
            session.commit()
    assert row(engine, Counter, counter) == (70, 5)


def test_an_object_with_no_net_change_is_not_written(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, counter: int
) -> None:
    with client.lock(f"counter:{counter}", ttl=10), sessions() as session:
        found = session.get(Counter, counter)
        assert found is not None
        found.value = 10  # the same value: no UPDATE, so no token either
        session.commit()
    assert row(engine, Counter, counter) == (10, 0)


def test_a_fenced_delete_after_a_newer_claim_raises_and_keeps_the_row(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, counter: int
) -> None:
    with client.lock(f"counter:{counter}", ttl=10) as lock, sessions() as session:
        found = claim_one(session, Counter, counter)
        session.commit()
        token = lock.token
        write_behind(engine, Counter, counter, fence_token=token + 1)
        session.delete(found)
        with pytest.raises(StaleFenceToken, match="delete of Counter"):
            session.commit()
    assert row(engine, Counter, counter) == (10, token + 1)


def test_a_fenced_delete_inside_the_lock_deletes(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, counter: int
) -> None:
    with client.lock(f"counter:{counter}", ttl=10), sessions() as session:
        session.delete(claim_one(session, Counter, counter))
        session.commit()
    with engine.connect() as conn:
        assert conn.execute(select(Counter.id).where(Counter.id == counter)).first() is None


def test_flushing_a_row_while_holding_only_another_lock_is_refused(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, counter: int
) -> None:
    with client.lock(f"counter:{counter}-other", ttl=10), sessions() as session:
        found = session.get(Counter, counter)
        assert found is not None
        found.value += 1
        with pytest.raises(distlock.LockNotOwned, match=rf"guarded by lock 'counter:{counter}'"):
            session.commit()
    assert row(engine, Counter, counter) == (10, 0)


def test_strict_model_refuses_flushes_outside_its_lock_and_writes_nothing(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, row_id: int
) -> None:
    with sessions() as session:
        session.add(StrictCounter(id=row_id, value=1))
        with pytest.raises(distlock.UnfencedWrite, match="strict"):
            session.commit()
    with client.lock(f"strict:{row_id}", ttl=10) as lock, sessions.begin() as session:
        session.add(StrictCounter(id=row_id, value=1))
        token = lock.token
    with sessions() as session:
        found = session.get(StrictCounter, row_id)
        assert found is not None
        found.value = 2
        with pytest.raises(distlock.UnfencedWrite, match=f"strict:{row_id}"):
            session.commit()
    assert row(engine, StrictCounter, row_id) == (1, token)


def test_a_strict_session_refuses_unfenced_flushes_and_bulk_statements(
    engine: Engine, counter: int, row_id: int
) -> None:
    with Session(engine, info={STRICT: True}) as session:
        found = session.get(Counter, counter)
        assert found is not None
        found.value += 1
        with pytest.raises(distlock.UnfencedWrite):
            session.commit()
        session.rollback()
        with pytest.raises(distlock.UnfencedWrite, match="fenced_update"):
            session.execute(update(Counter).where(Counter.id == counter).values(value=0))
        session.add(Plain(id=row_id, value=1))  # not fenced: strict mode does not concern it
        session.commit()
    assert row(engine, Counter, counter) == (10, 0)
    with engine.connect() as conn:
        assert conn.execute(select(Plain.value).where(Plain.id == row_id)).scalar() == 1
