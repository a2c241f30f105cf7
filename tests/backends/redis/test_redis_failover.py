"""What a Redis failover does to a lock, shown on a real master and replica: a grant the replica never received is
lost (two holders at once), and the fencing token still increases (the server clock in the token) so that the
database refuses the old holder's write (distlock_sqla, unchanged, on SQLite). This backs docs/GUARANTEES.md; etcd
does not have this failure."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import distlock
from distlock.testing import RedisServer
from distlock_sqla import FencedMixin, StaleFenceToken, fenced_update


class Base(DeclarativeBase):
    pass


class Stock(FencedMixin, Base):
    __tablename__ = "stock"
    fence_lock = "stock:{id}"
    id: Mapped[int] = mapped_column(primary_key=True)
    count: Mapped[int] = mapped_column(default=0)


@pytest.fixture
def master_and_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    with RedisServer(extra_args=["--repl-diskless-sync-delay", "0"]) as master:
        with RedisServer(extra_args=["--replicaof", "127.0.0.1", str(master.port)]) as replica:
            deadline = time.monotonic() + 20
            while replica.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica did not connect to its master"
                time.sleep(0.05)
            yield master, replica


def test_a_failover_can_lose_a_grant_but_tokens_keep_increasing(
    master_and_replica: tuple[RedisServer, RedisServer], tmp_path: Path
) -> None:
    """A partition: the replica is promoted while the old master, cut off from it, still serves its clients."""
    master, replica = master_and_replica
    engine = create_engine(f"sqlite:///{tmp_path / 'stock.sqlite3'}")
    Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add(Stock(id=1, count=0))
    lock_name = "stock:1"
    with distlock.connect(master.url) as old_side, distlock.connect(replica.url) as new_side:
        with old_side.lock(lock_name, ttl=30) as first:
            replicated = first.token
        with master.client() as admin:
            assert admin.wait(1, 5000) == 1, "the replica did not acknowledge the first hold"
        with replica.client() as admin:
            admin.replicaof("NO", "ONE")  # the failover, while the old master keeps running on its side
        on_old_master = old_side.lock(lock_name, ttl=30)
        assert on_old_master.acquire(blocking=False)
        on_new_master = new_side.lock(lock_name, ttl=30)
        assert on_new_master.acquire(blocking=False), "the promoted replica knew of the old master's grant"
        # Two holders at once: the lock alone is not exclusive across a failover. The tokens still tell them
        # apart: the new master's counter is behind (it never saw the second grant), but the server clock in
        # the token is not, so the later grant has the larger token and a fenced write of the other is refused.
        assert on_old_master.owned() and on_new_master.owned()
        assert on_new_master.token > on_old_master.token > replicated
        with Session(engine) as session, session.begin():
            assert fenced_update(session, Stock, {"count": 1}, Stock.id == 1, fence=on_new_master.fence) == 1
        with pytest.raises(StaleFenceToken), Session(engine) as session, session.begin():
            fenced_update(session, Stock, {"count": 99}, Stock.id == 1, fence=on_old_master.fence)
        with Session(engine) as session:
            assert session.get_one(Stock, 1).count == 1
        on_new_master.release()
        on_old_master.release()
    engine.dispose()
