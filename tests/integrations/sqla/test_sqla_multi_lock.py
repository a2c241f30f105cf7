"""A transfer between two fenced rows under one multi-lock: each row written with its own lock's token."""

from __future__ import annotations

import pytest
from sqla.models import Counter
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

import distlock
from distlock_sqla import StaleFenceToken, claim_one


def _rows(engine: Engine, *ids: int) -> dict[int, tuple[int, int]]:
    with engine.connect() as conn:
        found = conn.execute(select(Counter.id, Counter.value, Counter.fence_token).where(Counter.id.in_(ids)))
        return {row.id: (row.value, row.fence_token) for row in found}


def test_a_transfer_writes_each_row_with_its_own_token_and_a_stale_one_is_refused(
    client: distlock.Client, sessions: sessionmaker[Session], engine: Engine, row_id: int
) -> None:
    source, target = row_id, row_id + 1
    with sessions.begin() as session:
        session.add_all([Counter(id=source, value=100), Counter(id=target, value=0)])
    names = {source: f"counter:{source}", target: f"counter:{target}"}
    # Given in the "wrong" order: the multi-lock sorts them.
    with client.multi_lock([names[target], names[source]], ttl=10) as both, sessions() as session:
        tokens = both.tokens
        frm, to = claim_one(session, Counter, source), claim_one(session, Counter, target)
        frm.value -= 30
        to.value += 30
        session.commit()
    assert _rows(engine, source, target) == {source: (70, tokens[names[source]]), target: (30, tokens[names[target]])}

    # A multi-lock whose lock on the target was taken over by a newer holder: its write of that row is refused, and
    # the transaction writes neither row.
    stale = client.multi_lock(names.values(), ttl=10)
    assert stale.acquire()
    stale_tokens = stale.tokens
    with sessions() as session:
        frm, to = claim_one(session, Counter, source), claim_one(session, Counter, target)
        session.commit()
        assert client.force_release(names[target], stale_tokens[names[target]])
        with client.lock(names[target], ttl=10) as newer, sessions.begin() as other:
            claim_one(other, Counter, target)  # the newer holder claims the row
            newer_token = newer.token
        frm.value -= 10
        to.value += 10
        with pytest.raises(StaleFenceToken):
            session.commit()
    with pytest.raises(distlock.LockLost):
        stale.release()
    # Neither row changed: the source still has the stale claim's token, the target the newer holder's.
    assert _rows(engine, source, target) == {source: (70, stale_tokens[names[source]]), target: (30, newer_token)}
