"""The same fencing through ``AsyncSession`` (aiosqlite, psycopg async), with ``client.async_lock``.

SQLAlchemy runs an async session's flush in a greenlet; these tests show that the lock held by the awaiting task
is the one that flush sees, and that two tasks holding two locks at once each write with their own token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from sqla.conftest import Database
from sqla.models import Account, Counter
from sqlalchemy import Engine, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import distlock
from distlock_sqla import STRICT, StaleFenceToken, claim, claim_one, fenced_update

T = TypeVar("T")


def run(db: Database, body: Callable[[async_sessionmaker[AsyncSession]], Awaitable[T]]) -> T:
    """Run ``body(sessions)`` in an event loop with an async engine on the test database."""

    async def main() -> T:
        engine = db.async_engine()
        try:
            return await body(async_sessionmaker(engine, expire_on_commit=False))
        finally:
            await engine.dispose()

    return asyncio.run(main())


def rows(engine: Engine, model: Any, *ids: int) -> list[tuple[int, int]]:
    with engine.connect() as conn:
        found = conn.execute(select(model.id, model.fence_token).where(model.id.in_(ids)).order_by(model.id))
        return [(r.id, r.fence_token) for r in found]


@pytest.fixture
def counters(engine: Engine, row_id: int) -> list[int]:
    ids = [row_id, row_id + 1]
    with engine.begin() as conn:
        conn.execute(insert(Counter), [{"id": i, "value": 0} for i in ids])
    return ids


def test_an_async_flush_inside_async_with_writes_the_tasks_token(
    client: distlock.Client, db: Database, engine: Engine, counters: list[int]
) -> None:
    async def body(sessions: async_sessionmaker[AsyncSession]) -> int:
        async with client.async_lock(f"counter:{counters[0]}", ttl=10) as lock, sessions() as session:
            found = (await claim(session, select(Counter).where(Counter.id == counters[0]))).scalar_one()
            assert found.fence_token == lock.token
            found.value += 1
            await session.commit()
            return lock.token

    token = run(db, body)
    assert rows(engine, Counter, counters[0]) == [(counters[0], token)]


def test_two_tasks_holding_two_locks_each_write_with_their_own_token(
    client: distlock.Client, db: Database, engine: Engine, counters: list[int]
) -> None:
    async def body(sessions: async_sessionmaker[AsyncSession]) -> list[int]:
        both_held = asyncio.Barrier(2)

        async def increment(row: int) -> int:
            async with client.async_lock(f"counter:{row}", ttl=10) as lock, sessions() as session:
                found = await session.get(Counter, row)
                assert found is not None
                await session.commit()  # no read transaction left open: SQLite could not upgrade two of them
                await both_held.wait()  # both locks held at once, in two tasks' contexts
                found.value += 1
                await session.commit()
                return lock.token

        return list(await asyncio.gather(increment(counters[0]), increment(counters[1])))

    tokens = run(db, body)
    assert tokens[0] != tokens[1]
    assert rows(engine, Counter, *counters) == [(counters[0], tokens[0]), (counters[1], tokens[1])]


def test_an_async_flush_after_a_newer_claim_raises_and_writes_nothing(
    client: distlock.Client, db: Database, engine: Engine, counters: list[int]
) -> None:
    row = counters[0]

    async def body(sessions: async_sessionmaker[AsyncSession]) -> int:
        async with client.async_lock(f"counter:{row}", ttl=10) as lock, sessions() as session:
            found = await claim_one(session, Counter, row)
            await session.commit()
            async with sessions.begin() as newer:  # a newer holder's claim
                await newer.execute(update(Counter).where(Counter.id == row).values(fence_token=lock.token + 1))
            found.value = 99
            with pytest.raises(StaleFenceToken, match=f"newer token {lock.token + 1}"):
                await session.commit()
            return lock.token

    token = run(db, body)
    with engine.connect() as conn:
        assert tuple(conn.execute(select(Counter.value, Counter.fence_token).where(Counter.id == row)).one()) == (
            0,
            token + 1,
        )


def test_a_strict_async_session_refuses_a_flush_outside_the_lock(
    db: Database, engine: Engine, counters: list[int]
) -> None:
    async def body(sessions: async_sessionmaker[AsyncSession]) -> None:
        async with sessions(info={STRICT: True}) as session:
            found = await session.get(Counter, counters[0])
            assert found is not None
            found.value = 5
            with pytest.raises(distlock.UnfencedWrite, match=f"counter:{counters[0]}"):
                await session.commit()

    run(db, body)
    assert rows(engine, Counter, counters[0]) == [(counters[0], 0)]
    with engine.connect() as conn:
        assert conn.execute(select(Counter.value).where(Counter.id == counters[0])).scalar() == 0


def test_an_async_fenced_bulk_update_with_one_newer_row_writes_nothing(
    client: distlock.Client, db: Database, engine: Engine, tenant: str, row_id: int
) -> None:
    ids = [row_id + i for i in range(10)]
    with engine.begin() as conn:
        conn.execute(insert(Account), [{"id": i, "tenant": tenant, "balance": 1} for i in ids])

    async def body(sessions: async_sessionmaker[AsyncSession]) -> int:
        async with client.async_lock(f"tenant:{tenant}", ttl=10) as lock, sessions() as session:
            await session.execute(update(Account).where(Account.id == ids[-1]).values(fence_token=2**62))
            await session.commit()
            with pytest.raises(StaleFenceToken, match=f"pk={ids[-1]}"):
                await fenced_update(session, Account, {"balance": 0}, Account.tenant == tenant)
            await session.commit()
            return lock.token

    run(db, body)
    with engine.connect() as conn:
        assert conn.execute(select(Account.balance).where(Account.tenant == tenant)).scalars().all() == [1] * 10
