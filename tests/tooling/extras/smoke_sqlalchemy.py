"""The README's SQLAlchemy example, whole, for ``distlock-fenced[etcd,sqlalchemy]`` installed alone (no greenlet:
SQLAlchemy 2.1 no longer installs it, and sync sessions must not need it). Argument: an etcd URL."""

import sys

from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import distlock
from distlock_sqla import FencedMixin, StaleFenceToken, claim_one


class Base(DeclarativeBase):
    pass


class Account(FencedMixin, Base):
    __tablename__ = "accounts"
    fence_lock = "account:{id}"
    id: Mapped[int] = mapped_column(primary_key=True)
    balance: Mapped[int]


engine = create_engine("sqlite://")
Base.metadata.create_all(engine)
with Session(engine) as session, session.begin():
    session.add(Account(id=1, balance=0))

client = distlock.connect(sys.argv[1])
pk, amount = 1, 10
with client.lock(f"account:{pk}", ttl=30), Session(engine) as session, session.begin():
    account = claim_one(session, Account, pk)
    account.balance += amount
    token = account.fence_token

with Session(engine) as session:
    account = session.get_one(Account, pk)
    assert (account.balance, account.fence_token) == (10, token), (account.balance, account.fence_token)

stale = distlock.Fence(name=f"account:{pk}", token=token - 1)
try:
    with Session(engine) as session, session.begin():
        claim_one(session, Account, pk, fence=stale)
except StaleFenceToken:
    pass
else:
    raise AssertionError("a stale token claimed the row")
client.close()
assert "greenlet" not in sys.modules
print("ok")
