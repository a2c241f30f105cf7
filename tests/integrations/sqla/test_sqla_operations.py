"""Claim-on-read and the fenced Core/ORM helpers on SQLite and PostgreSQL, with real etcd locks.

Every refusal is checked for what it must leave behind: nothing read as if it were safe, nothing written.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqla.models import Account, Car, Counter, Plain, ledger
from sqlalchemy import Engine, select, update
from sqlalchemy.exc import NoResultFound
from sqlalchemy.orm import Session, sessionmaker

import distlock
from distlock_sqla import StaleFenceToken, claim, claim_one, fenced_delete, fenced_insert, fenced_update

ROWS = 40


def accounts(engine: Engine, tenant: str) -> dict[int, tuple[int, int]]:
    """id -> (balance, fence_token) of the tenant's accounts, read on a connection of its own."""
    with engine.connect() as conn:
        rows = conn.execute(select(Account.id, Account.balance, Account.fence_token).where(Account.tenant == tenant))
        return {r.id: (r.balance, r.fence_token) for r in rows}


def set_token(engine: Engine, model: Any, row_id: int, token: int) -> None:
    """A newer holder's claim of one row, committed at once."""
    with engine.begin() as conn:
        conn.execute(update(model.__table__).where(model.__table__.c.id == row_id).values(fence_token=token))


@pytest.fixture
def tenant_rows(sessions: sessionmaker[Session], tenant: str, row_id: int) -> list[int]:
    ids = [row_id + i for i in range(ROWS)]
    with sessions.begin() as session:
        session.add_all(Account(id=i, tenant=tenant, balance=100) for i in ids)
    return ids


# -- claim --------------------------------------------------------------------------------------------------------


def test_claim_takes_every_selected_row_then_reads_it_fresh(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, tenant: str, tenant_rows: list[int]
) -> None:
    with sessions() as session:
        early = session.get(Account, tenant_rows[0])
        assert early is not None
        session.commit()
        with engine.begin() as conn:  # changed behind the session's back before the lock was taken
            conn.execute(update(Account).where(Account.id == early.id).values(balance=7))
        with client.lock(f"tenant:{tenant}", ttl=10) as lock:
            claimed = claim(session, select(Account).where(Account.tenant == tenant).order_by(Account.id)).scalars()
            found = claimed.all()
            token = lock.token
            session.commit()
    assert [a.id for a in found] == tenant_rows
    assert found[0] is early and early.balance == 7  # the session's object was refreshed by the read
    assert {t for _, t in accounts(engine, tenant).values()} == {token}


def test_claim_of_a_row_a_newer_holder_claimed_raises_and_reads_and_keeps_nothing(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, tenant: str, tenant_rows: list[int]
) -> None:
    with client.lock(f"tenant:{tenant}", ttl=10) as lock, sessions() as session:
        token = lock.token
        set_token(engine, Account, tenant_rows[-1], token + 1)
        with pytest.raises(StaleFenceToken, match=rf"pk={tenant_rows[-1]}.*newer token {token + 1}") as caught:
            claim(session, select(Account).where(Account.tenant == tenant))
        session.commit()
    assert (caught.value.token, caught.value.row, caught.value.current) == (token, tenant_rows[-1], token + 1)
    tokens = {i: t for i, (_, t) in accounts(engine, tenant).items()}
    assert tokens == {i: (token + 1 if i == tenant_rows[-1] else 0) for i in tenant_rows}


def test_claim_and_fenced_update_of_a_core_table_through_a_connection(
    client: distlock.Client, engine: Engine, tenant_rows: list[int]
) -> None:
    account = tenant_rows[0]
    with engine.begin() as conn:
        conn.execute(ledger.insert(), [{"id": account + i, "account_id": account, "amount": i} for i in range(3)])
    with client.lock(f"ledger:{account}", ttl=10) as lock, engine.begin() as conn:
        rows = claim(conn, select(ledger).where(ledger.c.account_id == account).order_by(ledger.c.id)).all()
        assert fenced_update(conn, ledger, {"amount": ledger.c.amount + 10}, ledger.c.account_id == account) == 3
        token = lock.token
    assert [(r.amount, r.fence_token) for r in rows] == [(0, token), (1, token), (2, token)]
    with engine.connect() as conn:
        amounts = conn.execute(select(ledger.c.amount).where(ledger.c.account_id == account).order_by(ledger.c.id))
        assert amounts.scalars().all() == [10, 11, 12]


def test_claim_one_claims_and_loads_one_row(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, tenant: str, tenant_rows: list[int]
) -> None:
    with client.lock(f"tenant:{tenant}", ttl=10) as lock, sessions() as session:
        found = claim_one(session, Account, tenant_rows[3])  # the lock name needs a column: read it first
        token = lock.token
        assert (found.id, found.fence_token) == (tenant_rows[3], token)
        with pytest.raises(NoResultFound):
            claim_one(session, Account, -1)
        session.commit()
    assert accounts(engine, tenant)[tenant_rows[3]] == (100, token)


def test_claim_one_of_a_row_a_newer_holder_claimed_raises(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, row_id: int
) -> None:
    with sessions.begin() as session:
        session.add(Counter(id=row_id, value=1))
    with client.lock(f"counter:{row_id}", ttl=10) as lock, sessions() as session:
        set_token(engine, Counter, row_id, lock.token + 1)
        with pytest.raises(StaleFenceToken, match="claim of Counter"):
            claim_one(session, Counter, row_id)


def test_a_joined_inheritance_row_is_claimed_and_flushed_through_its_base_table(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, row_id: int
) -> None:
    with sessions.begin() as session:
        session.add(Car(id=row_id, miles=10, seats=2))
    with client.lock(f"vehicle:{row_id}", ttl=10) as lock, sessions() as session:
        car = claim_one(session, Car, row_id)
        assert isinstance(car, Car) and car.fence_token == lock.token
        car.miles += 1  # the base table, where the fence is
        car.seats += 1  # the subclass table
        session.commit()
        token = lock.token
    with engine.connect() as conn:
        row = conn.execute(select(Car.miles, Car.seats, Car.fence_token).where(Car.id == row_id)).one()
    assert tuple(row) == (11, 3, token)


# -- fenced bulk writes ---------------------------------------------------------------------------------------------


def test_fenced_update_writes_every_row_with_its_locks_token(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, tenant: str, tenant_rows: list[int]
) -> None:
    with client.lock(f"tenant:{tenant}", ttl=10) as lock, sessions() as session:
        held = session.get(Account, tenant_rows[0])
        assert held is not None
        count = fenced_update(session, Account, {"balance": Account.balance + 5}, Account.tenant == tenant)
        assert held.balance == 105  # the session's object was expired and reloads the written row
        session.commit()
        token = lock.token
    assert count == ROWS
    assert accounts(engine, tenant) == dict.fromkeys(tenant_rows, (105, token))


def test_fenced_bulk_update_with_one_newer_row_raises_and_writes_nothing(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, tenant: str, tenant_rows: list[int]
) -> None:
    newer = tenant_rows[ROWS // 2]
    with client.lock(f"tenant:{tenant}", ttl=10) as lock, sessions() as session:
        token = lock.token
        set_token(engine, Account, newer, token + 1)
        with pytest.raises(StaleFenceToken, match=rf"pk={newer}.*nothing of this update of {ROWS} rows") as caught:
            fenced_update(session, Account, {"balance": 0}, Account.tenant == tenant)
        session.commit()  # whatever the session still holds is committed: the savepoint took the update back
    assert caught.value.current == token + 1
    assert accounts(engine, tenant) == {i: (100, token + 1 if i == newer else 0) for i in tenant_rows}


def test_fenced_update_over_rows_of_several_locks_needs_all_of_them(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, row_id: int
) -> None:
    ids = [row_id, row_id + 1]
    with sessions.begin() as session:
        session.add_all(Counter(id=i, value=0) for i in ids)
    with client.lock(f"counter:{ids[0]}", ttl=10), sessions() as session:
        with pytest.raises(distlock.LockNotOwned, match=f"counter:{ids[1]}"):
            fenced_update(session, Counter, {"value": 1}, Counter.id.in_(ids))
        session.commit()
    with client.lock(f"counter:{ids[0]}", ttl=10) as first, client.lock(f"counter:{ids[1]}", ttl=10) as second:
        with sessions.begin() as session:
            assert fenced_update(session, Counter, {"value": 2}, Counter.id.in_(ids)) == 2
        tokens = [first.token, second.token]
    with engine.connect() as conn:
        rows = conn.execute(select(Counter.value, Counter.fence_token).where(Counter.id.in_(ids)).order_by(Counter.id))
        assert [tuple(r) for r in rows] == [(2, tokens[0]), (2, tokens[1])]


def test_fenced_delete_is_all_or_nothing(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, tenant: str, tenant_rows: list[int]
) -> None:
    with client.lock(f"tenant:{tenant}", ttl=10) as lock, sessions() as session:
        set_token(engine, Account, tenant_rows[0], lock.token + 1)
        with pytest.raises(StaleFenceToken, match="delete of Account"):
            fenced_delete(session, Account, Account.tenant == tenant)
        session.commit()
        assert len(accounts(engine, tenant)) == ROWS
        assert fenced_delete(session, Account, Account.tenant == tenant, Account.id != tenant_rows[0]) == ROWS - 1
        session.commit()
    assert list(accounts(engine, tenant)) == [tenant_rows[0]]


def test_fenced_insert_stores_each_rows_token(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, tenant: str, row_id: int
) -> None:
    rows = [{"id": row_id + i, "tenant": tenant, "balance": i} for i in range(3)]
    with sessions() as session:
        with pytest.raises(distlock.UnfencedWrite, match=f"tenant:{tenant}"):
            fenced_insert(session, Account, rows)
        with pytest.raises(distlock.ConfigurationError, match="needs tenant"):
            fenced_insert(session, Account, {"id": row_id, "balance": 1})
        with client.lock(f"tenant:{tenant}", ttl=10) as lock:
            assert fenced_insert(session, Account, rows) == 3
            token = lock.token
        session.commit()
    assert accounts(engine, tenant) == {row_id + i: (i, token) for i in range(3)}


# -- bad input: a clear error, nothing written ------------------------------------------------------------------------


def test_fenced_operations_on_a_model_without_the_mixin_are_refused(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, row_id: int
) -> None:
    with sessions.begin() as session:
        session.add(Plain(id=row_id, value=1))
    with client.lock(f"plain:{row_id}", ttl=10), sessions() as session:
        with pytest.raises(distlock.ConfigurationError, match="'Plain' is not fenced"):
            fenced_update(session, Plain, {"value": 2}, Plain.id == row_id)
        with pytest.raises(distlock.ConfigurationError, match="'Plain' is not fenced"):
            fenced_delete(session, Plain, Plain.id == row_id)
        with pytest.raises(distlock.ConfigurationError, match="'Plain' is not fenced"):
            fenced_insert(session, Plain, {"id": row_id + 1, "value": 2})
        with pytest.raises(distlock.ConfigurationError, match="no fenced model or table"):
            claim(session, select(Plain))
        with pytest.raises(distlock.ConfigurationError, match="'Plain' is not fenced"):
            claim_one(session, Plain, row_id)
        session.commit()
    with engine.connect() as conn:
        assert conn.execute(select(Plain.id, Plain.value)).all() == [(row_id, 1)]


def test_a_token_of_another_lock_is_refused_and_nothing_is_written(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, tenant: str, tenant_rows: list[int]
) -> None:
    """Tokens are comparable across lock names: another, busier lock's larger token would pass the check."""
    with client.lock(f"tenant:{tenant}-elsewhere", ttl=10) as other, sessions() as session:
        with pytest.raises(distlock.LockNotOwned, match=f"guarded by lock 'tenant:{tenant}'"):
            fenced_update(session, Account, {"balance": 0}, Account.tenant == tenant, fence=other.fence)
        with pytest.raises(distlock.LockNotOwned, match=f"guarded by lock 'tenant:{tenant}'"):
            claim(session, select(Account).where(Account.tenant == tenant), fence=other)
        with pytest.raises(distlock.LockNotOwned):  # the only lock held here is the other one
            fenced_update(session, Account, {"balance": 0}, Account.tenant == tenant)
        session.commit()
    with sessions() as session:
        with pytest.raises(distlock.UnfencedWrite, match="not held here"):
            fenced_update(session, Account, {"balance": 0}, Account.tenant == tenant)
        with pytest.raises(distlock.ConfigurationError, match="fence_token is set by the fence"):
            fenced_update(session, Account, {"fence_token": 0}, Account.tenant == tenant)
        with pytest.raises(distlock.ConfigurationError, match="Engine"):
            fenced_update(engine, Account, {"balance": 0}, Account.tenant == tenant)  # type: ignore[call-overload]
    assert accounts(engine, tenant) == dict.fromkeys(tenant_rows, (100, 0))


def test_an_explicit_fence_is_used_outside_its_lock_context(
    client: distlock.Client, engine: Engine, tenant: str, tenant_rows: list[int]
) -> None:
    with client.lock(f"tenant:{tenant}", ttl=10) as lock:
        fence = lock.fence
    assert distlock.current_lock() is None
    with engine.begin() as conn:  # e.g. a worker thread handed the fence: nothing newer has claimed the rows
        assert fenced_update(conn, Account, {"balance": 1}, Account.tenant == tenant, fence=fence) == ROWS
    assert accounts(engine, tenant) == dict.fromkeys(tenant_rows, (1, fence.token))
