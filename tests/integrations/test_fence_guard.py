"""The fence guard's SQL (``distlock.fence_guard_sql``) on real PostgreSQL, SQLite and MariaDB, through the plain
DB-API drivers (psycopg, sqlite3, PyMySQL): no framework in between.

A raw ``UPDATE … SET fence_token = fence_token - 1`` is refused with the documented error and changes nothing;
UPDATEs that keep or raise the token, or leave it alone, pass; dropping removes the guard; installing twice is
fine. ``tests/integrations/sqla/test_sqla_guard.py`` and ``tests/integrations/djangotests/test_django_guard.py``
install it the integrations' ways.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

import distlock
from distlock.testing import MariaDBServer

REFUSED = "distlock fence guard: refused an UPDATE lowering"


class Database:
    """One autocommit connection to a test database, with a table ``name`` holding row 1 (value 0, token 5)."""

    def __init__(self, kind: str, connection: Any, table: str, quote: str) -> None:
        self.kind = kind
        self.connection = connection
        self.table = table
        self.q = quote + table.replace(quote, quote * 2) + quote  # the quoted table name
        self.refusal: type[Exception] = {
            "postgresql": psycopg.errors.CheckViolation,
            "sqlite": sqlite3.IntegrityError,
            "mariadb": pymysql.err.OperationalError,
        }[kind]

    @contextlib.contextmanager
    def refuses(self) -> Iterator[pytest.ExceptionInfo[Exception]]:
        """The guard's refusal: the driver's error class (by module and name: a full run has been seen to hold a
        second copy of PyMySQL's error module, made by Django's MySQL backend loaded on PyMySQL) and its message."""
        with pytest.raises(Exception, match=REFUSED) as refused:
            yield refused
        raised = type(refused.value)
        assert (raised.__module__, raised.__qualname__) == (self.refusal.__module__, self.refusal.__qualname__)

    def run(self, statement: str) -> None:
        cursor = self.connection.cursor()
        cursor.execute(statement)
        cursor.close()

    def row(self) -> tuple[int, int]:
        cursor = self.connection.cursor()
        cursor.execute(f"SELECT value, fence_token FROM {self.q} WHERE id = 1")
        value, token = cursor.fetchone()
        cursor.close()
        return int(value), int(token)

    def install(self) -> None:
        for statement in distlock.fence_guard_sql(self.kind, self.table).create:
            self.run(statement)

    def uninstall(self) -> None:
        for statement in distlock.fence_guard_sql(self.kind, self.table).drop:
            self.run(statement)


@pytest.fixture(params=["postgresql", "sqlite", "mariadb"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A fenced table in a real database, named with a quote in it (quoting is part of what is tested)."""
    kind: str = request.param
    table = f'fenced "{uuid.uuid4().hex[:8]}'
    if kind == "postgresql":
        connection: Any = psycopg.connect(request.getfixturevalue("postgres_dsn"), autocommit=True)
        db = Database(kind, connection, table, '"')
        column_type = "BIGINT"
    elif kind == "sqlite":
        connection = sqlite3.connect(tmp_path / "guard.sqlite3", isolation_level=None)
        db = Database(kind, connection, table, '"')
        column_type = "BIGINT"
    else:
        server: MariaDBServer = request.getfixturevalue("mariadb_server")
        connection = pymysql.connect(
            host="127.0.0.1", port=server.port, user="distlock", password="distlock", database="distlock"
        )
        connection.autocommit(True)
        table = table.replace('"', "`")
        db = Database(kind, connection, table, "`")
        column_type = "BIGINT"
    db.run(f"CREATE TABLE {db.q} (id INTEGER PRIMARY KEY, value INTEGER NOT NULL, fence_token {column_type} NOT NULL)")
    db.run(f"INSERT INTO {db.q} (id, value, fence_token) VALUES (1, 0, 5)")
    try:
        yield db
    finally:
        db.uninstall()
        db.run(f"DROP TABLE {db.q}")
        connection.close()


def test_a_raw_update_lowering_the_token_is_refused_and_changes_nothing(database: Database) -> None:
    database.install()
    with database.refuses() as refused:
        database.run(f"UPDATE {database.q} SET fence_token = fence_token - 1, value = 99")
    assert database.row() == (0, 5)
    if database.kind == "postgresql":
        assert isinstance(refused.value, psycopg.IntegrityError)
        assert refused.value.sqlstate == "23514"
        assert refused.value.diag.constraint_name == f"distlock_fence_guard_{database.table}"
        assert refused.value.diag.message_detail == "from 5 to 4"
    if database.kind == "mariadb":
        assert refused.value.args[0] == 1644  # ER_SIGNAL_EXCEPTION: SQLSTATE 45000
        assert "(from 5 to 4)" in str(refused.value)


def test_updates_that_keep_raise_or_leave_the_token_pass(database: Database) -> None:
    database.install()
    database.run(f"UPDATE {database.q} SET value = 1, fence_token = 5")
    assert database.row() == (1, 5)
    database.run(f"UPDATE {database.q} SET value = 2, fence_token = fence_token + 3")
    assert database.row() == (2, 8)
    database.run(f"UPDATE {database.q} SET value = 3")
    assert database.row() == (3, 8)
    with database.refuses():
        database.run(f"UPDATE {database.q} SET fence_token = 0")
    assert database.row() == (3, 8)


def test_a_multi_row_update_lowering_one_row_changes_no_row(database: Database) -> None:
    database.run(f"INSERT INTO {database.q} (id, value, fence_token) VALUES (2, 0, 1)")
    database.install()
    with database.refuses():
        database.run(f"UPDATE {database.q} SET value = 7, fence_token = 3")  # raises row 2, lowers row 1
    cursor = database.connection.cursor()
    cursor.execute(f"SELECT id, value, fence_token FROM {database.q} ORDER BY id")
    assert [tuple(map(int, row)) for row in cursor.fetchall()] == [(1, 0, 5), (2, 0, 1)]
    cursor.close()


def test_installing_twice_is_one_guard_and_dropping_removes_it(database: Database) -> None:
    database.install()
    database.install()
    with database.refuses():
        database.run(f"UPDATE {database.q} SET fence_token = 4")
    database.uninstall()
    database.uninstall()  # dropping what is not there is not an error
    database.run(f"UPDATE {database.q} SET fence_token = 4")
    assert database.row() == (0, 4)


def test_statements_quote_names_and_name_long_tables_within_identifier_limits() -> None:
    long = "t" * 100
    for dialect in ("postgresql", "sqlite", "mysql", "mariadb"):
        create, drop = distlock.fence_guard_sql(dialect, long, column="token", schema="s")
        assert all("%" not in statement for statement in create + drop)
        names = {name for statement in create + drop for name in re.findall(r"distlock_fence_guard_\w+", statement)}
        assert len(names) == 1, names
        assert len(names.pop()) <= 63
    assert distlock.fence_guard_sql("MariaDB", "x") == distlock.fence_guard_sql("mysql", "x")
    assert distlock.fence_guard_sql("postgresql", "a", schema="b").drop[1] == (
        'DROP FUNCTION IF EXISTS "b"."distlock_fence_guard_a"()'
    )


@pytest.mark.parametrize(
    ("dialect", "table", "column"),
    [("oracle", "t", "fence_token"), ("sqlite", "", "fence_token"), ("sqlite", "t", "a\0b")],
)
def test_a_database_without_a_guard_or_an_impossible_name_is_a_configuration_error(
    dialect: str, table: str, column: str
) -> None:
    with pytest.raises(distlock.ConfigurationError):
        distlock.fence_guard_sql(dialect, table, column=column)
