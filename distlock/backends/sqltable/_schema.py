"""The SQL lock table's schema: its four tables, named after a prefix (:func:`lock_tables`), their DDL for a DBA
(:func:`table_ddl`, the one place it is written; ``distlock sql-tables`` prints it), creating the missing ones and
reading the layout (:func:`create_missing_tables`), and the key of a lock's row (:func:`name_key`).

::

    <prefix>_leases   (id, ttl, expires_at)                  one row per client session lease
    <prefix>_waiters  (id, name, lease_id, nonce, owner)     one row per queue entry; id is the fencing token
    <prefix>_locks    (name_key, record)                     one row per lock name with an entry (or an election's
                                                             record): serialises joins, keeps the record
    <prefix>_marks    (name_key, mark_key, value, expires_at)  one row per mark of a lock (``_marks``), until it expires
    <prefix>_layout   (version)                              the layout marker: one row, this release's LAYOUT

The layout: tables without the marker are the earlier release's, whose joins rely on a name's row staying for ever
(they look for it, make it without locking, then lock it); so there the rows stay, and the earlier release's
clients can run beside this one's. Only a fresh install (none of the tables) or the upgrade step
(``distlock sql-tables --upgrade``, once no client of the earlier release runs) makes the marker, and with it a
name's row goes with the last entry of its queue. (docs/operations/sql-table.md, "Upgrading".) The marks table
came later than the other three: on tables made without it, it is made as any missing table is, whatever the layout.

What can go wrong: nothing here talks to a database but :func:`create_missing_tables`, whose errors (no privilege
to create, a concurrent creator) its caller retries or translates. Why the ids never repeat on each database:
docs/operations/sql-table.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as sa_postgresql
from sqlalchemy.dialects import sqlite as sa_sqlite
from sqlalchemy.engine import URL, Connection, Dialect
from sqlalchemy.schema import CreateIndex, CreateTable

from ..._install import docs_url

__all__ = [
    "LAYOUT",
    "UNSUPPORTED",
    "Tables",
    "create_missing_tables",
    "earlier_layout",
    "layout_ddl",
    "lock_tables",
    "name_key",
    "table_ddl",
]

#: The layout this release makes, the version in ``<prefix>_layout``: a name's row in ``<prefix>_locks`` goes with
#: the last entry of its queue. Tables without the marker are of the earlier layout, 1: a row per name for ever.
LAYOUT = 2

#: What these tables cannot keep (``Backend.unsupported``): nothing, every capability is kept.
UNSUPPORTED: Mapping[str, str] = MappingProxyType({})

#: The longest lock name (``_names.MAX_NAME_BYTES``: 1,024 bytes of UTF-8, so at most 1,024 characters).
_NAME_LENGTH = 1024
#: MariaDB indexes at most 3,072 bytes of a key: index the first 255 characters of a name (utf8mb4: 1,020 bytes).
_MYSQL_NAME_PREFIX = 255


@dataclass(frozen=True)
class Tables:
    metadata: sa.MetaData
    leases: sa.Table
    waiters: sa.Table
    locks: sa.Table
    marks: sa.Table
    #: In a MetaData of its own: made only by a fresh install or the upgrade step, never as "missing".
    layout_marker: sa.Table
    #: The database's layout, once :func:`create_missing_tables` read it; None before.
    layout: int | None = None

    @property
    def removes_name_rows(self) -> bool:
        """A name's row goes with its last entry on this release's layout only; keeping it is always safe."""
        return self.layout == LAYOUT


def lock_tables(prefix: str) -> Tables:
    """The tables of the lock table named ``<prefix>_leases``, ``<prefix>_waiters``, ``<prefix>_locks``,
    ``<prefix>_marks``, and its layout marker ``<prefix>_layout``."""
    metadata = sa.MetaData()
    token = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite's AUTOINCREMENT needs INTEGER
    # MariaDB/MySQL: UTF-8 and a binary collation, so names compare as they do elsewhere ('A' is not 'a').
    text_options: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
    leases = sa.Table(
        f"{prefix}_leases",
        metadata,
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("ttl", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Index(f"{prefix}_leases_expires_at", "expires_at"),
        **text_options,
    )
    waiters = sa.Table(
        f"{prefix}_waiters",
        metadata,
        # PostgreSQL: GENERATED ALWAYS, so that not even an INSERT naming an id can reuse one.
        sa.Column("id", token, sa.Identity(always=True), primary_key=True),
        sa.Column("name", sa.String(_NAME_LENGTH), nullable=False),
        sa.Column("lease_id", sa.BigInteger(), nullable=False),
        sa.Column("nonce", sa.String(64), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Index(f"{prefix}_waiters_name_id", "name", "id", mysql_length={"name": _MYSQL_NAME_PREFIX}),
        sa.Index(f"{prefix}_waiters_lease_id", "lease_id"),
        sqlite_autoincrement=True,
        **text_options,
    )
    locks = sa.Table(
        f"{prefix}_locks",
        metadata,
        sa.Column("name_key", sa.String(64), primary_key=True),  # sha256 of the name, hex: any name, one key length
        # The lock's record (``write_record``); a length past 64 KiB makes it a MEDIUMBLOB on MariaDB/MySQL.
        sa.Column("record", sa.LargeBinary(length=2**24 - 1), nullable=True),
        **text_options,
    )
    marks = sa.Table(
        f"{prefix}_marks",
        metadata,
        sa.Column("name_key", sa.String(64), primary_key=True),  # the lock's name_key, as in <prefix>_locks
        sa.Column("mark_key", sa.String(64), primary_key=True),  # sha256 of the mark's key, hex: as a name's
        # A MEDIUMBLOB on MariaDB/MySQL, as the record: a BLOB keeps 65,535 bytes, one short of a mark's largest.
        sa.Column("value", sa.LargeBinary(length=2**24 - 1), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),  # by the database server's clock (server_now)
        sa.Index(f"{prefix}_marks_expires_at", "expires_at"),
        **text_options,
    )
    layout_marker = sa.Table(
        f"{prefix}_layout", sa.MetaData(), sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False)
    )
    return Tables(metadata, leases, waiters, locks, marks, layout_marker)


def table_ddl(url: URL, prefix: str) -> list[str]:
    """The DDL that creates the lock table's tables and indexes on ``url``'s database, one statement per item.

    Compiled for the URL's dialect without connecting (the driver need not be installed)."""
    dialect = url.get_dialect()()
    tables = lock_tables(prefix)
    statements = []
    for table in tables.metadata.sorted_tables:
        statements.append(str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)).strip())
        statements.extend(
            str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect)).strip()
            for index in sorted(table.indexes, key=lambda index: str(index.name))
        )
    return statements


def layout_ddl(url: URL, prefix: str) -> list[str]:
    """The DDL of the layout marker (a fresh install's, or the upgrade step's), like :func:`table_ddl`."""
    dialect = url.get_dialect()()
    marker = lock_tables(prefix).layout_marker
    return [
        str(CreateTable(marker, if_not_exists=True).compile(dialect=dialect)).strip(),
        str(_mark(dialect, marker).compile(dialect=dialect, compile_kwargs={"literal_binds": True})).strip(),
    ]


def _mark(dialect: Dialect, marker: sa.Table) -> Any:
    """The INSERT of this release's layout into the marker, which does nothing when the row is there."""
    if dialect.name == "postgresql":
        return sa_postgresql.insert(marker).values(version=LAYOUT).on_conflict_do_nothing()
    if dialect.name == "sqlite":
        return sa_sqlite.insert(marker).values(version=LAYOUT).on_conflict_do_nothing()
    return sa.insert(marker).values(version=LAYOUT).prefix_with("IGNORE")


def create_missing_tables(connection: Connection, tables: Tables, *, upgrade: bool = False) -> Tables:
    """Create the tables and indexes of ``tables`` that ``connection``'s database lacks, and read its layout:
    ``tables`` with it. The marker is made with the tables when none of them was there, or when ``upgrade``
    (the upgrade step); tables of the earlier release are left without it, so their layout is 1."""
    # Look first: creating needs privileges that a table a DBA made beforehand does not.
    present = set(sa.inspect(connection).get_table_names())
    marker = tables.layout_marker
    if upgrade or not present & {table.name for table in tables.metadata.sorted_tables}:
        # The marker before the tables: MariaDB commits at each CREATE, and whoever sees a table must see it.
        connection.execute(CreateTable(marker, if_not_exists=True))
        connection.execute(_mark(connection.dialect, marker))
        present.add(marker.name)
    for table in tables.metadata.sorted_tables:
        if table.name in present:
            continue
        connection.execute(CreateTable(table, if_not_exists=True))
        for index in table.indexes:
            connection.execute(CreateIndex(index, if_not_exists=True))
    layout = connection.execute(sa.select(sa.func.max(marker.c.version))).scalar() if marker.name in present else 1
    return replace(tables, layout=int(layout or 1))


#: The page that tells how to move off the earlier layout.
_UPGRADING = "operations/sql-table.md#upgrading-from-the-release-that-kept-one-row-per-name"


def earlier_layout(description: str, prefix: str) -> str:
    """What a client on tables of the earlier layout says once, at its first request."""
    return (
        f"distlock: {description} has the earlier layout (no table {prefix}_layout): a name's row in {prefix}_locks "
        "stays after its last holder, as the earlier release kept it, so that its clients can run beside this one; "
        "once none of them runs, `distlock sql-tables --upgrade` makes the layout marker, and clients started after "
        f"it remove those rows (see {docs_url(_UPGRADING)})"
    )


def name_key(name: str) -> str:
    """The key of lock ``name``'s row in ``<prefix>_locks``: the SHA-256 of the name, hex (any name, one length)."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()
