"""Marks in the SQL lock table (``_protocol.Marking``): ``<prefix>_marks``, one row per mark, keyed by its lock's
``name_key`` and the SHA-256 of the mark's key, with its expiry on the database server's clock (``server_now``: no
client's clock is trusted): each function gives the backend a request to run in its transaction.

:func:`mark_writer`'s request makes the locking reads of a record's write (``_queue.still_holds``), writes
nothing when the ticket no longer holds, else sets the mark (an upsert: a retry writes the same value again) to
expire ``ttl`` seconds after the server's now, and removes at most :data:`SWEEP_BATCH` expired marks of any lock:
each write removes more than it adds, so expired marks do not pile up while marks are written; the last ones stay
until the next write (or for ever, if none comes: a row each). :func:`mark_reader`'s never returns an expired mark,
swept or not.

What can go wrong: nothing is raised here but SQLAlchemy's errors, for the caller's retry loop. Two writes sweeping
at once never wait for each other on PostgreSQL (``SKIP LOCKED``; SQLite: one writer at a time); on MariaDB/MySQL
(``DELETE ... LIMIT``) one may wait for the other, and two that rewrite marks the other sweeps may deadlock: the
database breaks it and the loser is retried.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql as sa_mysql
from sqlalchemy.dialects import postgresql as sa_postgresql
from sqlalchemy.dialects import sqlite as sa_sqlite
from sqlalchemy.engine import Connection

from ..._protocol import Ticket
from ._dialects import server_now
from ._queue import still_holds
from ._schema import Tables, name_key

__all__ = ["SWEEP_BATCH", "mark_reader", "mark_writer"]

#: The most expired marks (of any lock) one write removes.
SWEEP_BATCH = 100


def mark_writer(
    tables: Tables, dialect: str, ticket: Ticket, key: str, value: bytes, ttl: float
) -> Callable[[Connection, object], bool]:
    """The request that sets mark ``key`` of lock ``ticket.name`` to ``value`` for ``ttl`` s if ``ticket`` still
    holds, then sweeps; False, writing nothing, when it does not."""

    def request(connection: Connection, attempt: object) -> bool:
        if not still_holds(connection, tables, ticket):
            return False
        # The sweep after the write: a sweep takes no row another holds (PostgreSQL), so a write waits only for a
        # transaction that will wait for no mark's row (that one wrote its mark before its sweep): no deadlock.
        connection.execute(_upsert(dialect, tables.marks, name_key(ticket.name), name_key(key), value, ttl))
        connection.execute(_sweep(dialect, tables.marks))
        return True

    return request


def mark_reader(tables: Tables, name: str, key: str) -> Callable[[Connection, object], bytes | None]:
    """The request that reads mark ``key`` of lock ``name``: None when there is none or it expired (swept or not)."""
    marks = tables.marks
    query = sa.select(marks.c.value).where(
        marks.c.name_key == name_key(name), marks.c.mark_key == name_key(key), marks.c.expires_at > server_now()
    )

    def request(connection: Connection, attempt: object) -> bytes | None:
        value = connection.execute(query).scalar()
        return None if value is None else bytes(value)

    return request


def _upsert(dialect: str, marks: sa.Table, lock_key: str, mark_key: str, value: bytes, ttl: float) -> Any:
    """INSERT the mark, or set the existing one's value and expiry, in one statement."""
    values = {
        "name_key": lock_key,
        "mark_key": mark_key,
        "value": value,
        "expires_at": server_now() + sa.literal(ttl, sa.Double()),
    }
    changed = ("value", "expires_at")
    if dialect in ("postgresql", "sqlite"):
        insert = (sa_postgresql.insert if dialect == "postgresql" else sa_sqlite.insert)(marks).values(**values)
        return insert.on_conflict_do_update(
            index_elements=["name_key", "mark_key"], set_={name: insert.excluded[name] for name in changed}
        )
    insert_mysql = sa_mysql.insert(marks).values(**values)
    return insert_mysql.on_duplicate_key_update({name: insert_mysql.inserted[name] for name in changed})


def _sweep(dialect: str, marks: sa.Table) -> Any:
    """The DELETE of at most :data:`SWEEP_BATCH` expired marks of any lock."""
    expired = marks.c.expires_at <= server_now()
    if dialect not in ("postgresql", "sqlite"):  # MariaDB/MySQL: no LIMIT in an IN subquery, a DELETE's own instead
        return sa.delete(marks).where(expired).with_dialect_options(mysql_limit=SWEEP_BATCH)
    batch = (
        sa.select(marks.c.name_key, marks.c.mark_key)
        .where(expired)
        .limit(SWEEP_BATCH)
        .with_for_update(skip_locked=True)  # PostgreSQL: rows others hold are theirs to keep or sweep
    )
    return sa.delete(marks).where(sa.tuple_(marks.c.name_key, marks.c.mark_key).in_(batch), expired)
