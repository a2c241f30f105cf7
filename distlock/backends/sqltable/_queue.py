"""A lock's queue in the SQL lock table, read: its entries in id order with their lease's time left by the database
server's clock (:func:`read_entries`), and where an entry stands among the live ones by the grant rule of
``_shape`` (:func:`place_of`), with what a waiter needs to wait well (:class:`WaitingPosition`); and what a removal
of entries does with their names' rows in ``<prefix>_locks``: lock them first (:func:`lock_names`), remove those
left without entries after (:func:`forget_emptied`; a release: :func:`forget_if_emptied`), as when a lease's
entries go (:func:`remove_entries_of`); and whether a ticket still holds, for a holder's write of a record or a
mark (:func:`still_holds`). On tables of the earlier layout (``Tables.removes_name_rows`` false) the rows stay and
nothing is locked for them, as the earlier release did: its joins rely on that (``_schema``).

An entry whose lease expired, or whose lease row is gone, is dead: its lease never comes back, so whoever reads it
dead may remove it (the backend does, in the same transaction). What can go wrong: nothing is raised here; a read
that fails raises SQLAlchemy's error for the caller's retry loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..._protocol import Position, Ticket
from ..._shape import holding, kind_of, waits_on
from ._dialects import server_now
from ._schema import Tables, name_key

__all__ = [
    "Entry",
    "WaitingPosition",
    "forget_emptied",
    "forget_if_emptied",
    "lock_names",
    "place_of",
    "read_entries",
    "remove_entries_of",
    "same_place",
    "seconds",
    "still_holds",
]


@dataclass(frozen=True)
class Entry:
    id: int
    nonce: str
    lease_id: int
    owner: str
    ttl_left: float | None  # by the server's clock; None or <= 0: dead

    @property
    def alive(self) -> bool:
        return self.ttl_left is not None and self.ttl_left > 0


def read_entries(connection: Connection, tables: Tables, name: str, upto: int | None = None) -> list[Entry]:
    """Every entry of ``name`` (up to id ``upto``) in id order, with its lease's time left by the server."""
    w, leases = tables.waiters, tables.leases
    query = (
        sa.select(w.c.id, w.c.nonce, w.c.lease_id, w.c.owner, (leases.c.expires_at - server_now()).label("left"))
        .select_from(w.outerjoin(leases, leases.c.id == w.c.lease_id))
        .where(w.c.name == name)
        .order_by(w.c.id)
    )
    if upto is not None:
        query = query.where(w.c.id <= upto)
    return [
        Entry(int(row.id), str(row.nonce), int(row.lease_id), str(row.owner), seconds(row.left))
        for row in connection.execute(query)
    ]


def seconds(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class WaitingPosition(Position):
    """Where a waiter stands, with what it needs to wait well: the entries whose removal it waits for (their
    notification channels) and the seconds until the first lease ahead of it would expire (then it reads again)."""

    awaited: tuple[int, ...] = ()
    semaphore: bool = False
    recheck_in: float = math.inf


def place_of(entries: Sequence[Entry], mine: Entry) -> Position:
    """The place of ``mine`` behind the live ``entries`` ahead of it (in id order), by the grant rule of ``_shape``."""
    kinds = [kind_of(entry.nonce) for entry in entries] + [kind_of(mine.nonce)]
    index = len(entries)
    if holding(kinds)[-1]:
        return Position(held=True, waiters_ahead=index)
    recheck = min((entry.ttl_left or 0.0 for entry in entries), default=math.inf)
    at = waits_on(kinds)
    if at is None:  # a semaphore slot: any of the entries ahead leaving may let it in
        awaited, semaphore = tuple(entry.id for entry in entries), True
        ahead = entries[-1]
    else:
        ahead, awaited, semaphore = entries[at], (entries[at].id,), False
    return WaitingPosition(
        held=False,
        ahead=str(ahead.id).encode(),
        waiters_ahead=index,
        awaited=awaited,
        semaphore=semaphore,
        recheck_in=max(recheck, 0.0),
    )


def same_place(a: Position, b: Position) -> bool:
    return (a.held, a.gone, a.ahead, a.waiters_ahead) == (b.held, b.gone, b.ahead, b.waiters_ahead)


def lock_names(connection: Connection, tables: Tables, names: Collection[str]) -> None:
    """Lock the ``<prefix>_locks`` rows of ``names`` until commit, in key order (two removals never deadlock), as a
    join does before it takes an id: whoever removes entries locks first, so that a join of the same name waits for
    the removal (then finds its row gone and makes it anew) or the removal waits for the join (then sees its entry).
    A name without a row (deleted by hand) is not locked: nothing will remove it."""
    if not names or not tables.removes_name_rows:
        return
    locks = tables.locks
    keys = sorted({name_key(name) for name in names})
    connection.execute(
        sa.select(locks.c.name_key).where(locks.c.name_key.in_(keys)).order_by(locks.c.name_key).with_for_update()
    ).all()


def forget_emptied(connection: Connection, tables: Tables, names: Collection[str]) -> None:
    """Remove the ``<prefix>_locks`` row of each of ``names`` whose queue is empty and that keeps no record (an
    election's record stays). The caller locked the rows (:func:`lock_names`, a join's ``insert_or_lock``): a join of
    these names waits for this transaction, and one that committed before is seen here (READ COMMITTED reads what
    committed before each statement; SQLite has one writer)."""
    if not names or not tables.removes_name_rows:
        return
    w, locks = tables.waiters, tables.locks
    busy = set(connection.execute(sa.select(w.c.name).where(w.c.name.in_(set(names))).distinct()).scalars())
    empty = [name_key(name) for name in set(names) - busy]
    if empty:
        connection.execute(sa.delete(locks).where(locks.c.name_key.in_(empty), locks.c.record.is_(None)))


def remove_entries_of(
    connection: Connection, tables: Tables, lease_ids: Sequence[int], removed: Callable[[str, list[int]], None]
) -> None:
    """Remove every entry of the leases ``lease_ids`` (gone or going), their names' rows locked first, and the row of
    each name whose queue this empties; ``removed(name, ids)`` for each name. A join of one of these leases that
    commits between the look and the removal is found by the next look; one after the lease row is gone fails."""
    w = tables.waiters
    locked: set[str] = set()
    while rows := connection.execute(sa.select(w.c.id, w.c.name).where(w.c.lease_id.in_(lease_ids))).all():
        by_name: dict[str, list[int]] = {}
        for row in rows:
            by_name.setdefault(str(row.name), []).append(int(row.id))
        lock_names(connection, tables, by_name.keys() - locked)
        locked |= by_name.keys()
        connection.execute(sa.delete(w).where(w.c.id.in_([int(row.id) for row in rows])))
        for name, ids in by_name.items():
            removed(name, ids)
    forget_emptied(connection, tables, locked)


def forget_if_emptied(connection: Connection, tables: Tables, name: str) -> None:
    """After a release removed its entry: when ``name``'s queue looks empty, lock its row, look again (a join may have
    committed before the lock) and remove it. A hand-over (the queue is not empty) costs one read, no lock.

    Unlike the other removals, this one locks the row after removing an entry (a release must stay cheap): a join
    that holds the row and removes that same entry as dead (its lease ran out as it was released) waits for this
    transaction while this one waits for the row, a deadlock the database breaks, and the loser is retried."""
    w = tables.waiters
    if (
        tables.removes_name_rows
        and connection.execute(sa.select(w.c.id).where(w.c.name == name).limit(1)).first() is None
    ):
        lock_names(connection, tables, [name])
        forget_emptied(connection, tables, [name])


def still_holds(connection: Connection, tables: Tables, ticket: Ticket) -> bool:
    """Whether ``ticket``'s entry is still there with its lease alive, for a holder's write in the same transaction
    (a record, a mark): an entry that held holds until it is removed.

    Locking reads of the lock's row (in the order a join takes it) and of the ticket's row: a waiter that removes the
    ticket as dead (its lease ran out) must wait for this transaction, or this one sees the row gone. Without the row
    lock a write could pass its check, the successor remove the row and read what was written, and the write land
    after that read."""
    w, leases, locks = tables.waiters, tables.leases, tables.locks
    key = name_key(ticket.name)
    connection.execute(sa.select(locks.c.name_key).where(locks.c.name_key == key).with_for_update())
    row = connection.execute(
        sa.select(w.c.id).where(w.c.id == ticket.token, w.c.name == ticket.name).with_for_update()
    ).first()
    alive = connection.execute(
        sa.select(leases.c.id).where(leases.c.id == ticket.lease_id, leases.c.expires_at > server_now())
    ).first()
    return row is not None and alive is not None
