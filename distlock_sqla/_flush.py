"""ORM flush integration: objects of ``FencedMixin`` models flushed inside their lock are written fenced.

Mapper events on ``FencedMixin`` (``propagate=True``) run inside every flush, sync or async (``AsyncSession`` flushes
in a greenlet that runs in the awaiting task's context, so the lock held by ``async with`` is visible there):

- **UPDATE** of a modified object: its row's lock name is rendered from the object; the innermost held lock of
  that name gives the token ``t``, which is written into ``fence_token``. The statement is SQLAlchemy's own versioned
  UPDATE: ``SET ..., fence_token = :t WHERE pk = :pk AND fence_token = :read`` where ``:read`` is the token the
  object was loaded with, and the flush refuses an object read with a token newer than ``t`` before writing.
- **DELETE**: the same check, ``WHERE fence_token = :read``.
- **INSERT**: stores ``t`` (or 0 outside the lock).

Why ``= :read`` and not only ``<= :t``: ``<= :t`` alone is the write-only guard that loses updates (DESIGN §3) —
a holder that read before a newer holder claimed, paused, and writes after the newer holder read would pass it.
``= :read`` (with ``:read <= :t``) accepts only writes based on the token still in the row: after a claim
(``:read`` is then ``t``) it is the same as ``<= :t``; for an object read before its claim it refuses the write
if any lock holder claimed or wrote the row in between. Outside any lock the token is left alone, and the write
is refused only if a lock holder touched the row since it was read (unfenced writers do not see each other). Read
with :func:`distlock_sqla.claim` inside the lock and a newer holder's claim makes the old holder's flush fail.

0 rows matched raises :class:`StaleFenceToken` (also a ``StaleDataError``) from the statement itself, before
SQLAlchemy's own rowcount check, and the flush's transaction is rolled back: nothing of the flush is written. The
check is one ``after_execute`` listener on the ``Engine`` class, so it sees sync and async engines alike: for any
statement on a connection that is not in the middle of a fenced flush it costs one dictionary lookup.

Strict mode (``fence_strict = True`` on the model, or ``session.info[STRICT] = True``) raises ``UnfencedWrite`` for
a flush of a fenced object outside its lock, and for ``session.execute(update/delete/insert)`` on a fenced model or
table (use the ``fenced_*`` helpers). Holding only other locks while flushing a fenced object is ``LockNotOwned``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Delete, Table, Update, event, inspect, select
from sqlalchemy.engine import Connection, Engine, Result
from sqlalchemy.orm import Mapper, ORMExecuteState, Session, object_session
from sqlalchemy.orm.base import NO_VALUE

from distlock import Fence, UnfencedWrite

from ._errors import stale
from ._mixin import FencedMixin
from ._spec import FENCE_COLUMN, FenceSpec, fence_for_row, spec_of, table_spec

__all__ = ["FENCED_OPTION", "STRICT"]

STRICT = "distlock_sqla.strict"
"""``session.info`` key: when true, every flush of a fenced object must be made inside its lock."""

FENCED_OPTION = "distlock_sqla_fenced"
"""Execution option marking the fenced helpers' own statements, which strict mode lets through."""

_TOUCHED = "distlock_sqla.pending"


@dataclass
class _Expected:
    """A versioned statement the flush is about to emit for ``target``, and what to say if it matches no row."""

    table: Table
    target: Any
    spec: FenceSpec
    fence: Fence | None
    read: int | None
    delete: bool


# The statements expected per connection, in the order the flush emits them (one statement per versioned object).
_pending: WeakKeyDictionary[Connection, deque[_Expected]] = WeakKeyDictionary()


def _strict(session: Session | None, spec: FenceSpec) -> bool:
    return spec.strict or bool(session is not None and session.info.get(STRICT))


def _describe(action: str, spec: FenceSpec, target: Any) -> str:
    identity = inspect(target).identity
    return f"{action} of {spec.describe(identity if identity is not None else '(new)')}"


def _read_token(target: Any) -> int | None:
    value = inspect(target).attrs[FENCE_COLUMN].loaded_value
    return None if value is NO_VALUE or value is None else int(value)


def _fence(spec: FenceSpec, target: Any, action: str, *, inserting: bool = False) -> Fence | None:
    session = object_session(target)
    values = {field: getattr(target, field) for field, _ in spec.fields}
    unnamed = [field for field, value in values.items() if value is None]
    if unnamed:
        # Only a new row can lack its key (a server-generated id): it cannot be locked before it exists.
        if _strict(session, spec):
            raise UnfencedWrite(
                f"{_describe(action, spec, target)}: its lock {spec.template.template!r} cannot be named before "
                f"{', '.join(unnamed)} is set, and strict mode refuses unfenced writes. Set it before the flush"
            )
        return None
    return fence_for_row(
        spec.lock_name(values),
        None,
        what=lambda: _describe(action, spec, target),
        required=_strict(session, spec),
        inserting=inserting,
    )


def _expect(session: Session | None, connection: Connection, expected: _Expected) -> None:
    pending = _pending.get(connection)
    if pending is None:
        pending = _pending[connection] = deque()
    pending.append(expected)
    if session is not None:
        touched: list[deque[_Expected]] = session.info.setdefault(_TOUCHED, [])
        if not any(p is pending for p in touched):
            touched.append(pending)


def _refuse_newer_read(spec: FenceSpec, target: Any, action: str, fence: Fence, read: int | None) -> None:
    if read is not None and read > fence.token:
        raise stale(_describe(action, spec, target), fence.token, target, read, lock=fence.name)


@event.listens_for(FencedMixin, "before_update", propagate=True)
def _before_update(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    session = object_session(target)
    if session is not None and not session.is_modified(target, include_collections=False):
        return  # no net change: SQLAlchemy emits no UPDATE, and a claim is not our business here
    spec = spec_of(target)
    read = _read_token(target)
    fence = _fence(spec, target, "update")
    if fence is not None:
        _refuse_newer_read(spec, target, "update", fence, read)
        target.fence_token = fence.token
    _expect(session, connection, _Expected(spec.table, target, spec, fence, read, delete=False))


@event.listens_for(FencedMixin, "before_delete", propagate=True)
def _before_delete(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    spec = spec_of(target)
    read = _read_token(target)
    fence = _fence(spec, target, "delete")
    if fence is not None:
        _refuse_newer_read(spec, target, "delete", fence, read)
    _expect(object_session(target), connection, _Expected(spec.table, target, spec, fence, read, delete=True))


@event.listens_for(FencedMixin, "before_insert", propagate=True)
def _before_insert(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    spec = spec_of(target)
    fence = _fence(spec, target, "insert", inserting=True)
    if fence is not None:
        target.fence_token = fence.token


@event.listens_for(Engine, "after_execute")
def _check_rowcount(
    conn: Connection,
    clauseelement: Any,
    multiparams: Any,
    params: Any,
    execution_options: Any,
    result: Result[Any],
) -> None:
    """After each statement on a connection that is flushing fenced objects: did the versioned ones match?"""
    pending = _pending.get(conn)
    if not pending:
        return
    if isinstance(clauseelement, Update):
        delete = False
    elif isinstance(clauseelement, Delete):
        delete = True
    else:
        return
    count = max(1, len(multiparams) if isinstance(multiparams, list | tuple) else 1)
    batch: list[_Expected] = []
    while pending and len(batch) < count and pending[0].table is clauseelement.table and pending[0].delete == delete:
        batch.append(pending.popleft())
    matched = getattr(result, "rowcount", -1)
    if not batch or matched < 0 or matched >= len(batch):
        return
    pending.clear()
    raise _explain(conn, batch)


def _explain(conn: Connection, batch: list[_Expected]) -> Exception:
    """The error for the first object of ``batch`` whose row no longer carries the token it was read with."""
    for expected in batch:
        spec, target = expected.spec, expected.target
        identity = inspect(target).identity or ()
        where = (column == value for column, value in zip(spec.pk_columns, identity, strict=True))
        current = conn.execute(select(spec.fence_column).where(*where)).scalar()
        if current != expected.read or current is None:
            break
    action = "delete" if expected.delete else "update"
    fence = expected.fence
    return stale(
        _describe(action, spec, target),
        None if fence is None else fence.token,
        target,
        current,
        read=expected.read,
        lock=None if fence is None else fence.name,
    )


@event.listens_for(Session, "after_flush_postexec")
def _flushed(session: Session, flush_context: Any) -> None:
    _forget(session)


@event.listens_for(Session, "after_soft_rollback")
def _rolled_back(session: Session, previous_transaction: Any) -> None:
    _forget(session)


def _forget(session: Session) -> None:
    """Drop what a flush expected but did not emit (it failed part-way), so no later statement is judged by it."""
    for pending in session.info.pop(_TOUCHED, ()):
        pending.clear()


@event.listens_for(Session, "do_orm_execute")
def _refuse_unfenced_statements(state: ORMExecuteState) -> None:
    """Strict mode: ``session.execute(update/delete/insert)`` on a fenced model or table must be a fenced helper."""
    if not (state.is_update or state.is_delete or state.is_insert) or state.execution_options.get(FENCED_OPTION):
        return
    mapper = state.bind_mapper
    spec = getattr(mapper.class_, "__fence_spec__", None) if mapper is not None else None
    if spec is None:
        spec = table_spec(getattr(state.statement, "table", None))
    if spec is not None and _strict(state.session, spec):
        kind = "UPDATE" if state.is_update else "DELETE" if state.is_delete else "INSERT"
        raise UnfencedWrite(
            f"{kind} of fenced {spec.label} through session.execute() is not fenced, and strict mode refuses it: "
            "use distlock_sqla.fenced_update / fenced_delete / fenced_insert inside the rows' locks"
        )
