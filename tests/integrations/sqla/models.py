"""Models and engines shared by the SQLAlchemy tests, their worker process and the benchmark.

``make_engine(url)`` applies SQLAlchemy's documented set-up for SQLite with pysqlite/aiosqlite — the driver's own
transaction handling off, an explicit ``BEGIN`` from SQLAlchemy — so that transactions and SAVEPOINTs (which the
all-or-nothing fenced writes use) behave as on PostgreSQL; plus WAL, so readers do not wait for a writer.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Column, Engine, ForeignKey, Integer, String, Table, create_engine, event, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column, relationship

from distlock_sqla import FencedMixin, fenced_mapper_args, fenced_table


class Base(DeclarativeBase):
    pass


class Counter(FencedMixin, Base):
    """One lock per row."""

    __tablename__ = "counters"
    fence_lock = "counter:{id}"
    id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(default=0)


class Account(FencedMixin, Base):
    """One lock per tenant: many rows behind one lock name."""

    __tablename__ = "accounts"
    fence_lock = "tenant:{tenant}"
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str] = mapped_column(String(40))
    balance: Mapped[int] = mapped_column(default=0)


class Entry(FencedMixin, Base):
    """A child guarded by its parent's lock: moving it to another parent moves it to another lock."""

    __tablename__ = "entries"
    fence_lock = "entries:{account_id}"
    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    account: Mapped[Account] = relationship()
    amount: Mapped[int] = mapped_column(default=0)


class StrictCounter(FencedMixin, Base):
    """Strict per model: no flush outside its lock."""

    __tablename__ = "strict_counters"
    fence_lock = "strict:{id}"
    fence_strict = True
    id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(default=0)


class Vehicle(FencedMixin, Base):
    """Joined-table inheritance: the fence lives in the base table."""

    __tablename__ = "vehicles"
    fence_lock = "vehicle:{id}"
    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(10))
    miles: Mapped[int] = mapped_column(default=0)

    @declared_attr.directive
    def __mapper_args__(cls) -> dict[str, Any]:  # noqa: N805
        return fenced_mapper_args(cls, polymorphic_on=cls.__table__.c.kind, polymorphic_identity="vehicle")


class Car(Vehicle):
    __tablename__ = "cars"
    __mapper_args__ = {"polymorphic_identity": "car"}  # noqa: RUF012
    id: Mapped[int] = mapped_column(ForeignKey("vehicles.id"), primary_key=True)
    seats: Mapped[int] = mapped_column(default=4)


class Plain(Base):
    """Not fenced."""

    __tablename__ = "plain"
    id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(default=0)


# A Core table, fenced without the ORM.
ledger = fenced_table(
    Table(
        "ledger",
        Base.metadata,
        Column("id", Integer, primary_key=True),
        Column("account_id", Integer, ForeignKey("accounts.id")),
        Column("amount", Integer, nullable=False, default=0),
        Column("fence_token", BigInteger, nullable=False, default=0, server_default="0"),
    ),
    "ledger:{account_id}",
)


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")


def make_engine(url: str, **kwargs: Any) -> Engine:
    """A sync engine; for SQLite, waiting for a writer up to ``?timeout=`` seconds in the URL (default 30)."""
    if url.startswith("sqlite"):
        parsed = make_url(url)
        timeout = float(parsed.query.get("timeout", 30))  # type: ignore[arg-type]
        engine = create_engine(parsed.difference_update_query(["timeout"]), connect_args={"timeout": timeout}, **kwargs)
        _sqlite_setup(engine)
        return engine
    return create_engine(url, **kwargs)


def make_async_engine(url: str) -> AsyncEngine:
    """The asyncio engine of the same database: aiosqlite for SQLite, psycopg's async mode for PostgreSQL."""
    if url.startswith("sqlite"):
        engine = create_async_engine(url.replace("sqlite://", "sqlite+aiosqlite://", 1), connect_args={"timeout": 30})
        _sqlite_setup(engine.sync_engine)
        return engine
    return create_async_engine(url)
