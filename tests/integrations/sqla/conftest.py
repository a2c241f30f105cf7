"""Fixtures for the SQLAlchemy integration: each database test runs on SQLite and on PostgreSQL, its locks on etcd.

``db`` gives a fresh database per test: a SQLite file in the test's temporary directory, or a schema of its own in
the session's PostgreSQL (``postgres_dsn``: a real server the root fixtures start), selected with ``search_path``
in the URL so that worker processes and async engines see the same tables. Row ids and tenants are random, since
their lock names live in the etcd shared by the whole session.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql
from sqla.models import Base, make_async_engine, make_engine
from sqlalchemy import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session, sessionmaker


@dataclass(frozen=True)
class Database:
    kind: str  # "sqlite" or "postgresql"
    url: str  # a SQLAlchemy URL (pysqlite, or psycopg 3 with the test's schema on the search path)

    def engine(self, **kwargs: object) -> Engine:
        return make_engine(self.url, **kwargs)

    def async_engine(self) -> AsyncEngine:
        return make_async_engine(self.url)

    def url_with(self, *, sqlite_timeout: float | None = None, **pg_settings: str) -> str:
        """This database's URL with SQLite's busy timeout (seconds) or PostgreSQL settings (``lock_timeout="200"``)."""
        url = make_url(self.url)
        if self.kind == "sqlite":
            return self.url if sqlite_timeout is None else f"{self.url}?timeout={sqlite_timeout}"
        options = " ".join([str(url.query["options"]), *(f"-c {k}={v}" for k, v in pg_settings.items())])
        return url.update_query_dict({"options": options}).render_as_string(hide_password=False)


def _postgres_url(dsn: str, schema: str) -> str:
    url = make_url(dsn).set(drivername="postgresql+psycopg")
    return url.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """A fresh database with the test models' tables, on SQLite or PostgreSQL."""
    yield from fresh_database(request, tmp_path_factory)


def fresh_database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """What the ``db`` fixture yields (on ``request.param``'s database), for fixtures of other scopes to share."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("sqla") / "db.sqlite3"
        database = Database("sqlite", f"sqlite:///{path}")
        schema = None
    else:
        dsn: str = request.getfixturevalue("postgres_dsn")
        schema = f"sqla_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        database = Database("postgresql", _postgres_url(dsn, schema))
    engine = database.engine()
    Base.metadata.create_all(engine)
    engine.dispose()
    yield database
    if schema is not None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def engine(db: Database) -> Iterator[Engine]:
    engine = db.engine()
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    """Sessions on the test database (objects not expired on commit, so a test can look at what it wrote)."""
    return sessionmaker(engine, expire_on_commit=False)


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> str:
    """The lock service of a test (``backend_url``, ``client``): the session's etcd, or the backend a test names by
    indirect parametrization (``@pytest.mark.parametrize("backend", ["redis", "zookeeper"], indirect=True)``) for
    the races run on each."""
    return str(getattr(request, "param", "etcd"))


@pytest.fixture
def row_id() -> int:
    """A row id no other test's lock name uses."""
    return secrets.randbelow(2**31 - 2) + 1


@pytest.fixture
def tenant() -> str:
    return f"t-{secrets.token_hex(6)}"
