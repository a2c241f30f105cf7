"""``distlock_sqla.fence_guard``: the trigger refusing any UPDATE that lowers ``fence_token``, installed the
SQLAlchemy ways, on real SQLite, PostgreSQL and MariaDB (PyMySQL).

With the table (``listen()`` and ``metadata.create_all()``), on an existing table (``create()``/``drop()``), and as
an Alembic migration runs it (``op.execute()`` of ``create_ddl()``'s elements: executed online, compiled to text
with ``--sql``; Alembic itself is not installed here). Each time a raw ``UPDATE … SET fence_token = fence_token -
1`` is refused and changes nothing, and the fenced writes of ``distlock_sqla`` still land under the guard.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql
from sqla.models import make_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import distlock
from distlock.testing import MariaDBServer
from distlock_sqla import FencedMixin, claim_one, fence_guard, fenced_table, fenced_update

REFUSED = "distlock fence guard: refused an UPDATE lowering"


class GuardBase(DeclarativeBase):
    pass


class Guarded(FencedMixin, GuardBase):
    __tablename__ = "guarded_counters"
    fence_lock = "guarded:{id}"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(default=0)


fence_guard(Guarded).listen()  # created by create_all() with the table, dropped before it by drop_all()


def _refusal(engine: sa.Engine) -> type[sa.exc.DBAPIError]:
    return sa.exc.OperationalError if engine.dialect.name in ("mysql", "mariadb") else sa.exc.IntegrityError


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    """An empty database: a SQLite file, a fresh PostgreSQL schema, or MariaDB's test database (PyMySQL)."""
    schema = None
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'guard.sqlite3'}")
    elif request.param == "postgresql":
        dsn: str = request.getfixturevalue("postgres_dsn")
        schema = f"guard_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        url = sa.make_url(dsn).set(drivername="postgresql+psycopg")
        engine = sa.create_engine(url.update_query_dict({"options": f"-csearch_path={schema}"}))
    else:
        server: MariaDBServer = request.getfixturevalue("mariadb_server")
        engine = sa.create_engine(server.sqlalchemy_url)
    yield engine
    engine.dispose()
    if schema is not None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def guarded(engine: sa.Engine) -> Iterator[sa.Engine]:
    """``Guarded``'s table made by ``create_all()``, so with its guard; row 1 at token 5. Dropped by ``drop_all()``."""
    GuardBase.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(sa.insert(Guarded).values(id=1, value=0, fence_token=5))
    try:
        yield engine
    finally:
        GuardBase.metadata.drop_all(engine)


def _row(engine: sa.Engine, table: sa.FromClause, row_id: int = 1) -> tuple[int, int]:
    with engine.connect() as connection:
        value, token = connection.execute(
            sa.select(table.c.value, table.c.fence_token).where(table.c.id == row_id)
        ).one()
    return value, token


def test_create_all_installs_the_guard_and_a_raw_lowering_update_is_refused(guarded: sa.Engine) -> None:
    table = Guarded.__table__
    with pytest.raises(_refusal(guarded), match=REFUSED), guarded.begin() as connection:
        connection.execute(sa.text("UPDATE guarded_counters SET fence_token = fence_token - 1, value = 9"))
    assert _row(guarded, table) == (0, 5)
    with guarded.begin() as connection:
        connection.execute(sa.text("UPDATE guarded_counters SET value = 1, fence_token = 5"))
        connection.execute(sa.text("UPDATE guarded_counters SET value = 2, fence_token = fence_token + 1"))
        connection.execute(sa.text("UPDATE guarded_counters SET value = 3"))
    assert _row(guarded, table) == (3, 6)


def test_an_unfenced_bulk_update_lowering_the_token_is_refused(guarded: sa.Engine) -> None:
    with pytest.raises(_refusal(guarded), match=REFUSED), Session(guarded) as session, session.begin():
        session.execute(sa.update(Guarded).values(value=7, fence_token=0))
    assert _row(guarded, Guarded.__table__) == (0, 5)


def test_drop_all_drops_the_guard_with_the_table(guarded: sa.Engine) -> None:
    GuardBase.metadata.drop_all(guarded)
    with guarded.connect() as connection:
        if guarded.dialect.name == "postgresql":  # the trigger goes with the table; the function is dropped too
            functions = "SELECT count(*) FROM pg_proc WHERE proname = 'distlock_fence_guard_guarded_counters'"
            assert connection.execute(sa.text(functions)).scalar_one() == 0
        elif guarded.dialect.name == "sqlite":
            triggers = "SELECT count(*) FROM sqlite_master WHERE type = 'trigger'"
            assert connection.execute(sa.text(triggers)).scalar_one() == 0
        else:
            triggers = (
                "SELECT count(*) FROM information_schema.triggers WHERE trigger_schema = DATABASE() "
                "AND trigger_name = 'distlock_fence_guard_guarded_counters'"
            )
            assert connection.execute(sa.text(triggers)).scalar_one() == 0
    GuardBase.metadata.create_all(guarded)  # for the fixture's drop_all


@pytest.mark.parametrize("how", ["create", "alembic-online"])
def test_a_guard_added_to_an_existing_table_refuses_and_drops(engine: sa.Engine, how: str) -> None:
    # A plain Core table with a % in its name: DDL's formatting must hand it to the driver whole.
    table = fenced_table(
        sa.Table(
            f"ledger%{uuid.uuid4().hex[:6]}",
            sa.MetaData(),
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("value", sa.Integer, nullable=False),
            sa.Column("fence_token", sa.BigInteger, nullable=False, default=0),
        ),
        "ledger:{id}",
    )
    table.create(engine)
    guard = fence_guard(table)
    lower = sa.update(table).values(fence_token=table.c.fence_token - 1)
    try:
        with engine.begin() as connection:
            connection.execute(sa.insert(table).values(id=1, value=0, fence_token=5))
            connection.execute(lower)  # no guard yet: lands
            for _ in range(2):  # installing twice is fine
                if how == "create":
                    guard.create(connection)
                else:  # what op.execute(ddl) does in an online Alembic migration
                    for ddl in fence_guard(table.name).create_ddl(connection.dialect):
                        connection.execute(ddl)
        with pytest.raises(_refusal(engine), match=REFUSED), engine.begin() as connection:
            connection.execute(lower)
        assert _row(engine, table) == (0, 4)
        with engine.begin() as connection:
            guard.drop(connection)
            guard.drop(connection)
            connection.execute(lower)
        assert _row(engine, table) == (0, 3)
    finally:
        table.drop(engine)


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite", "mysql", "mariadb"])
def test_alembic_offline_sql_is_the_guard_sql(dialect: str) -> None:
    """``alembic upgrade --sql`` prints each element compiled for the dialect (Alembic's ``paramstyle="named"``)."""
    guard = fence_guard("accounts")
    dialect_class: Any = sa.make_url(f"{dialect}://").get_dialect()
    compiled_dialect = dialect_class(paramstyle="named")
    expected = distlock.fence_guard_sql(dialect, "accounts")
    assert [str(ddl.compile(dialect=compiled_dialect)) for ddl in guard.create_ddl(dialect)] == list(expected.create)
    assert [str(ddl.compile(dialect=compiled_dialect)) for ddl in guard.drop_ddl(dialect)] == list(expected.drop)


# distlock_sqla's claims and fenced writes are tested on SQLite and PostgreSQL (tests/integrations/sqla): here under the
# guard.
@pytest.mark.parametrize("engine", ["sqlite", "postgresql"], indirect=True)
def test_fenced_writes_still_land_under_the_guard(guarded: sa.Engine, client: distlock.Client, row_id: int) -> None:
    with Session(guarded) as session, session.begin():
        session.add(Guarded(id=row_id, value=0))
    with client.lock(f"guarded:{row_id}", ttl=30) as lock, Session(guarded) as session, session.begin():
        first = lock.token
        counter = claim_one(session, Guarded, row_id)
        counter.value += 1
    assert _row(guarded, Guarded.__table__, row_id) == (1, first)
    with client.lock(f"guarded:{row_id}", ttl=30) as lock, Session(guarded) as session, session.begin():
        second = lock.token
        fenced_update(session, Guarded, {"value": 2}, Guarded.id == row_id)
    assert second > first
    assert _row(guarded, Guarded.__table__, row_id) == (2, second)


def test_a_guard_needs_a_table_with_the_column() -> None:
    with pytest.raises(distlock.ConfigurationError, match="no column"):
        fence_guard(sa.Table("t", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True)))
    with pytest.raises(distlock.ConfigurationError, match="listen"):
        fence_guard("accounts").listen()
    with pytest.raises(distlock.ConfigurationError, match="fenced model"):
        fence_guard(42)
    with pytest.raises(distlock.ConfigurationError, match="no fence guard"):
        fence_guard("accounts").create_ddl("oracle")
