"""The fence guard for SQLAlchemy and Alembic: the database refuses any UPDATE that lowers a row's ``fence_token``.

Fenced flushes and the ``fenced_*`` helpers never lower a token; raw SQL, another service or an unfenced bulk write
can. :func:`fence_guard` gives the trigger that refuses those writes too (:func:`distlock.fence_guard_sql` writes it,
for PostgreSQL, SQLite and MySQL/MariaDB)::

    guard = fence_guard(Account)          # a FencedMixin model, a fenced_table(), a Table or a table name
    guard.listen()                        # created with the table by metadata.create_all(), dropped before it
    guard.create(connection)              # or now, on an existing table (idempotent); guard.drop(connection)

    # an Alembic migration (online or --sql):
    def upgrade():
        for ddl in fence_guard("accounts").create_ddl(op.get_context().dialect):
            op.execute(ddl)

What can go wrong: a database without a guard (not PostgreSQL, SQLite or MySQL/MariaDB) raises
``ConfigurationError`` when the statements are made; ``listen()`` needs a ``Table`` (or a model), not a name. A
refused UPDATE is the database's error, raised by the driver and wrapped by SQLAlchemy: ``IntegrityError`` on
PostgreSQL (SQLSTATE 23514) and SQLite, ``OperationalError`` on MySQL/MariaDB (SQLSTATE 45000, error 1644); its
message starts with ``distlock fence guard:``. Nothing of the statement is written.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DDL, Connection, Table, event
from sqlalchemy.engine import Dialect

from distlock import ConfigurationError, fence_guard_sql

from ._spec import FENCE_COLUMN, table_spec

__all__ = ["FenceGuard", "fence_guard"]


class FenceGuard:
    """The fence guard of one table: its DDL per database, and ways to run it."""

    def __init__(self, table: str, *, column: str = FENCE_COLUMN, schema: str | None = None, of: Table | None = None):
        self.table = table
        self.column = column
        self.schema = schema
        self._of = of

    def __repr__(self) -> str:
        where = f"{self.schema}.{self.table}" if self.schema else self.table
        return f"FenceGuard({where}.{self.column})"

    def create_ddl(self, dialect: Dialect | str) -> list[DDL]:
        """The statements that install the guard on ``dialect`` (a ``Dialect`` or its name), in order."""
        create, _ = self._sql(dialect)
        return [_ddl(statement) for statement in create]

    def drop_ddl(self, dialect: Dialect | str) -> list[DDL]:
        """The statements that remove the guard, in order (nothing happens where it is not installed)."""
        _, drop = self._sql(dialect)
        return [_ddl(statement) for statement in drop]

    def create(self, connection: Connection) -> None:
        """Install the guard through ``connection`` (replacing one already there); commit to keep it."""
        for ddl in self.create_ddl(connection.dialect):
            connection.execute(ddl)

    def drop(self, connection: Connection) -> None:
        """Remove the guard through ``connection``."""
        for ddl in self.drop_ddl(connection.dialect):
            connection.execute(ddl)

    def listen(self) -> FenceGuard:
        """Create the guard whenever the table is created (``metadata.create_all()``) and drop it before the table."""
        if self._of is None:
            raise ConfigurationError(f"{self!r} was made from a table name: listen() needs the Table or the model")
        event.listen(self._of, "after_create", self._after_create)
        event.listen(self._of, "before_drop", self._before_drop)
        return self

    def _after_create(self, target: Table, connection: Connection, **kw: Any) -> None:
        self.create(connection)

    def _before_drop(self, target: Table, connection: Connection, **kw: Any) -> None:
        self.drop(connection)

    def _sql(self, dialect: Dialect | str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        name = dialect if isinstance(dialect, str) else dialect.name
        return fence_guard_sql(name, self.table, column=self.column, schema=self.schema)


def _ddl(statement: str) -> DDL:
    # DDL formats its text with %: a % in a quoted name must reach the driver as one.
    return DDL(statement.replace("%", "%%"))  # type: ignore[no-untyped-call]


def fence_guard(target: Any, *, column: str = FENCE_COLUMN) -> FenceGuard:
    """The :class:`FenceGuard` of a fenced model or table, a ``Table``, or a table name (for migrations).

    For a model of joined-table inheritance it guards the table that holds ``fence_token``. ``column`` names the
    token column of a plain ``Table`` or a table name; a fenced model or table uses its own.
    """
    if isinstance(target, str):
        return FenceGuard(target, column=column)
    table = target if isinstance(target, Table) else getattr(target, "__table__", None)
    spec = getattr(target, "__fence_spec__", None) or (table_spec(table) if table is not None else None)
    if spec is not None:
        table, column = spec.table, FENCE_COLUMN
    if not isinstance(table, Table):
        raise ConfigurationError(
            f"fence_guard() takes a fenced model, a Table or a table name, not {type(target).__name__}"
        )
    found = table.c.get(column)
    if found is None:
        raise ConfigurationError(f"table {table.name!r} has no column {column!r} to guard")
    return FenceGuard(table.name, column=found.name, schema=table.schema, of=table)
