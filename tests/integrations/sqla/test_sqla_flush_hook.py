"""What the flush hook (``distlock_sqla._flush``) relies on in SQLAlchemy, tested directly.

The hook turns a fenced flush's 0-row UPDATE/DELETE into ``StaleFenceToken`` naming the row. It recognises the ORM's
statements by the primary-key bind parameters of their WHERE clause. If a SQLAlchemy release stops emitting
versioned writes that way, the tests here fail by name (``..._by_primary_key_binds``) instead of the end-to-end
tests failing with a bare ``StaleDataError``. On SQLite and PostgreSQL, like the other database tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from sqla.models import Account, Car, Counter
from sqlalchemy import Delete, Engine, Update, event, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapper, Session, sessionmaker

import distlock
from distlock_sqla import StaleFenceToken, claim
from distlock_sqla._flush import _pk_bind_names


@dataclass
class Emitted:
    statement: Any
    parameter_sets: Sequence[Mapping[str, Any]]
    rowcount: int


@pytest.fixture
def emitted(engine: Engine) -> Iterator[list[Emitted]]:
    """Every UPDATE and DELETE executed on ``engine``, with its parameter sets and row count."""
    found: list[Emitted] = []

    def record(conn: Connection, statement: Any, multiparams: Any, params: Any, options: Any, result: Any) -> None:
        if isinstance(statement, Update | Delete):
            found.append(Emitted(statement, list(multiparams) or [params], result.rowcount))

    event.listen(engine, "after_execute", record)
    yield found
    event.remove(engine, "after_execute", record)


def counters(sessions: sessionmaker[Session], first: int, n: int) -> list[int]:
    ids = list(range(first, first + n))
    with sessions.begin() as session:
        session.add_all(Counter(id=i, value=0) for i in ids)
    return ids


def test_the_orm_writes_each_versioned_row_by_primary_key_binds(
    sessions: sessionmaker[Session], emitted: list[Emitted], row_id: int
) -> None:
    """One UPDATE per row; each DELETE parameter set names its row; the pk is in the parameters under its bind."""
    ids = counters(sessions, row_id, 3)
    pk_columns = Counter.__fence_spec__.pk_columns
    with sessions() as session:
        found = session.scalars(select(Counter).where(Counter.id.in_(ids))).all()
        for counter in found:
            counter.value += 1
        session.flush()
        updates = [e for e in emitted if isinstance(e.statement, Update)]
        assert [len(e.parameter_sets) for e in updates] == [1, 1, 1]
        written = []
        for e in updates:
            assert e.statement.table is Counter.__table__
            names = _pk_bind_names(e.statement, pk_columns)
            assert names is not None, f"no primary-key binds in {e.statement}"
            assert e.rowcount == 1
            written.append(e.parameter_sets[0][names[0]])
        assert sorted(written) == ids
        emitted.clear()
        for counter in found:
            session.delete(counter)
        session.flush()
        written.clear()
        for e in emitted:  # one executemany, or one DELETE per row where the driver cannot count an executemany
            assert isinstance(e.statement, Delete) and e.statement.table is Counter.__table__
            names = _pk_bind_names(e.statement, pk_columns)
            assert names is not None, f"no primary-key binds in {e.statement}"
            written += [p[names[0]] for p in e.parameter_sets]
        assert sorted(written) == ids
        assert sum(e.rowcount for e in emitted) == 3


def test_a_joined_inheritance_row_is_written_by_its_base_tables_primary_key_binds(
    client: distlock.Client, sessions: sessionmaker[Session], emitted: list[Emitted], row_id: int
) -> None:
    with sessions.begin() as session:
        session.add(Car(id=row_id, kind="car", miles=0, seats=4))
    spec = Car.__fence_spec__
    with client.lock(f"vehicle:{row_id}", ttl=10), sessions.begin() as session:
        car = session.get(Car, row_id)
        assert car is not None
        car.miles, car.seats = 1, 5
    (versioned,) = [e for e in emitted if e.statement.table is spec.table]
    names = _pk_bind_names(versioned.statement, spec.pk_columns)
    assert names is not None
    assert [p[names[0]] for p in versioned.parameter_sets] == [row_id]


def test_the_stale_row_among_several_is_the_one_named(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, row_id: int
) -> None:
    ids = counters(sessions, row_id, 3)
    for delete in (False, True):
        with sessions() as session:
            found = session.scalars(select(Counter).where(Counter.id.in_(ids)).order_by(Counter.id)).all()
            session.commit()
            with engine.begin() as conn:  # a lock holder wrote the middle row since this session read it
                conn.execute(update(Counter).where(Counter.id == ids[1]).values(fence_token=7))
            for counter in found:
                if delete:
                    session.delete(counter)
                else:
                    counter.value += 1
            with pytest.raises(StaleFenceToken, match=f"pk={ids[1]}") as caught:
                session.commit()
            assert (caught.value.row, caught.value.current) == (found[1], 7)
        with engine.begin() as conn:
            conn.execute(update(Counter).where(Counter.id == ids[1]).values(fence_token=0))


def test_a_statement_of_the_applications_own_during_a_flush_is_not_taken_for_the_flushs(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, tenant: str, row_id: int
) -> None:
    """An UPDATE of the same table from a listener, between the flush's own and matching no row, is not a stale row
    (statements are matched to rows by primary key, not by the order they come in)."""
    ids = [row_id, row_id + 1]
    with sessions.begin() as session:
        session.add_all(Account(id=i, tenant=tenant, balance=0) for i in ids)

    def audit(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
        accounts = Account.metadata.tables["accounts"]
        connection.execute(update(accounts).where(accounts.c.id == -1).values(balance=0))

    event.listen(Account, "before_update", audit)
    try:
        with client.lock(f"tenant:{tenant}", ttl=10) as lock, sessions() as session:
            for account in claim(session, select(Account).where(Account.id.in_(ids))).scalars():
                account.balance += 1
            session.commit()
            token = lock.token
    finally:
        event.remove(Account, "before_update", audit)
    with engine.connect() as conn:
        written = conn.execute(select(Account.balance, Account.fence_token).where(Account.id.in_(ids))).all()
    assert [tuple(r) for r in written] == [(1, token), (1, token)]
