"""The storage-level fence guard: a trigger that refuses any UPDATE lowering a fenced table's ``fence_token``.

Fenced writes (``UPDATE … WHERE fence_token <= :t``) keep a row's token from going backwards only for writers that
go through them; raw SQL, another service or a bulk path can still store an older token. The guard is a ``BEFORE
UPDATE`` trigger the database runs for every writer. :func:`fence_guard_sql` writes its create and drop statements
for one table, for PostgreSQL (11+), SQLite and MySQL/MariaDB, once for every integration (``distlock_django``'s
``InstallFenceGuard``, ``distlock_sqla``'s ``fence_guard()``). A refusal's message starts with ``distlock fence
guard:`` and the statement writes nothing; the trigger is named ``distlock_fence_guard_<table>`` (hashed past 63
characters); creating replaces an existing guard, dropping a missing one is no error. How each database raises it
and what it does not refuse (a write that keeps the token, NULL, DELETE then INSERT): docs/GUARANTEES.md,
"Storage-level guard (recommended)".

What can go wrong here: a database other than these, a name with a NUL character, or an empty name raise
``ConfigurationError``. On MySQL with binary logging on, creating a trigger needs the ``TRIGGER`` privilege and
``log_bin_trust_function_creators`` (or SUPER); the database refuses otherwise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import NamedTuple

from ._errors import ConfigurationError

__all__ = ["FENCE_GUARD_MESSAGE", "FenceGuardSQL", "fence_guard_sql"]

#: How every refusal's message starts, on every database.
FENCE_GUARD_MESSAGE = "distlock fence guard:"

_PREFIX = "distlock_fence_guard_"
_MAX_NAME = 63  # PostgreSQL's identifier limit (MySQL's is 64)
# Database names as SQLAlchemy's dialects and Django's vendors spell them -> the SQL written for them.
_DIALECTS = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "sqlite": "sqlite",
    "mysql": "mysql",
    "mariadb": "mysql",
}
_BODY_TAG = "$distlock_fence_guard$"


class FenceGuardSQL(NamedTuple):
    """The statements that install (``create``) and remove (``drop``) one table's guard, to run in order."""

    create: tuple[str, ...]
    drop: tuple[str, ...]


def fence_guard_sql(
    dialect: str, table: str, *, column: str = "fence_token", schema: str | None = None
) -> FenceGuardSQL:
    """The SQL of the fence guard of ``table`` on ``dialect``: "postgresql", "sqlite", "mysql" or "mariadb".

    ``column`` is the token column, ``schema`` the table's schema (PostgreSQL schema or MySQL database) when it is
    not the connection's default. Names are quoted for the database; the statements take no parameters and add no
    ``%`` of their own, so any driver can run them as they are (passing no parameters). ``ConfigurationError`` for
    another database.
    """
    kind = _DIALECTS.get(dialect.lower())
    if kind is None:
        raise ConfigurationError(
            f"no fence guard for database {dialect!r}: distlock writes it for PostgreSQL, SQLite and MySQL/MariaDB"
        )
    for what, name in (("table", table), ("column", column), ("schema", schema)):
        if name is not None and (not name or "\0" in name or _BODY_TAG in name):
            raise ConfigurationError(f"fence guard: {what} name {name!r} cannot be used as an SQL identifier")
    guard = _guard_name(table)
    message = f"{FENCE_GUARD_MESSAGE} refused an UPDATE lowering {table}.{column}"
    if kind == "postgresql":
        return _postgresql(table, column, schema, guard, message)
    if kind == "sqlite":
        return _sqlite(table, column, schema, guard, message)
    return _mysql(table, column, schema, guard, message)


def _guard_name(table: str) -> str:
    name = _PREFIX + table
    if len(name.encode()) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(table.encode()).hexdigest()[:8]
    head = name.encode()[: _MAX_NAME - len(digest) - 1].decode(errors="ignore")
    return f"{head}_{digest}"


def _double_quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _backquoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _qualified(quote: Callable[[str], str], name: str, schema: str | None) -> str:
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)


def _postgresql(table: str, column: str, schema: str | None, guard: str, message: str) -> FenceGuardSQL:
    target = _qualified(_double_quoted, table, schema)
    function = _qualified(_double_quoted, guard, schema)
    trigger, col = _double_quoted(guard), _double_quoted(column)
    body = (
        "BEGIN\n"
        "  RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME,\n"
        f"    COLUMN = {_literal(column)}, MESSAGE = {_literal(message)},\n"
        f"    DETAIL = 'from ' || OLD.{col} || ' to ' || NEW.{col};\n"
        "END;\n"
    )
    create = (
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS {_BODY_TAG}\n{body}{_BODY_TAG}",
        f"DROP TRIGGER IF EXISTS {trigger} ON {target}",
        f"CREATE TRIGGER {trigger} BEFORE UPDATE ON {target} FOR EACH ROW "
        f"WHEN (NEW.{col} < OLD.{col}) EXECUTE FUNCTION {function}()",
    )
    drop = (f"DROP TRIGGER IF EXISTS {trigger} ON {target}", f"DROP FUNCTION IF EXISTS {function}()")
    return FenceGuardSQL(create, drop)


def _sqlite(table: str, column: str, schema: str | None, guard: str, message: str) -> FenceGuardSQL:
    # SQLite puts a trigger in its table's schema: the trigger's name is qualified, the table's must not be.
    trigger = _qualified(_double_quoted, guard, schema)
    col = _double_quoted(column)
    create = (
        f"DROP TRIGGER IF EXISTS {trigger}",
        f"CREATE TRIGGER {trigger} BEFORE UPDATE ON {_double_quoted(table)} FOR EACH ROW "
        f"WHEN NEW.{col} < OLD.{col} BEGIN SELECT RAISE(ABORT, {_literal(message)}); END",
    )
    return FenceGuardSQL(create, (f"DROP TRIGGER IF EXISTS {trigger}",))


def _mysql(table: str, column: str, schema: str | None, guard: str, message: str) -> FenceGuardSQL:
    trigger = _qualified(_backquoted, guard, schema)
    col = _backquoted(column)
    # SIGNAL takes a literal or a variable as its message (at most 128 characters): the values are put together in one.
    create = (
        f"DROP TRIGGER IF EXISTS {trigger}",
        f"CREATE TRIGGER {trigger} BEFORE UPDATE ON {_qualified(_backquoted, table, schema)} FOR EACH ROW\n"
        "BEGIN\n"
        "  DECLARE refusal VARCHAR(128);\n"
        f"  IF NEW.{col} < OLD.{col} THEN\n"
        f"    SET refusal = LEFT(CONCAT({_literal(message + ' (from ')}, OLD.{col}, ' to ', NEW.{col}, ')'), 128);\n"
        "    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = refusal;\n"
        "  END IF;\n"
        "END",
    )
    return FenceGuardSQL(create, (f"DROP TRIGGER IF EXISTS {trigger}",))
