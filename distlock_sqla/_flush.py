"""ORM flush integration: objects of ``FencedMixin`` models flushed inside their lock are written fenced.

Mapper events on ``FencedMixin`` (``propagate=True``) run inside every flush, sync or async (``AsyncSession``'s
greenlet runs in the awaiting task's context, so the lock of ``async with`` is visible there). An UPDATE or DELETE
is SQLAlchemy's own versioned statement (``fence_token`` is the ``version_id_col``): ``SET ..., fence_token = :t
WHERE pk = :pk AND fence_token = :read``, ``t`` the token of the innermost held lock of the row's name as stored,
``:read`` the token the object's data was read with, kept on ``InstanceState.info`` because expiry discards the
loaded value (and SQLAlchemy would then compare against the row's current token, letting any write pass). A move
(a name field changed) needs both locks and stores the larger token; an INSERT stores ``t`` (0 outside the lock).
Why ``= :read`` and not ``<= :t``: docs/design.md; which writes are fenced: docs/integrations/sqlalchemy.md.

What can go wrong: a refused write raises :class:`StaleFenceToken` (also a ``StaleDataError``), naming the row and
the tokens, and the flush is rolled back; should a SQLAlchemy release write its statements differently (see
``_check_rowcount``), it is still refused, with SQLAlchemy's plain ``StaleDataError``. Holding only other locks is
``LockNotOwned``. In strict mode (``fence_strict`` or ``session.info[STRICT]``) a fenced flush outside its lock,
``session.execute()`` of a write, the bulk methods and Core statements on the session's connection raise
``UnfencedWrite``; outside it they are plain writes.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Delete, Insert, Table, Update, event, inspect, select
from sqlalchemy.engine import Connection, Engine, Result
from sqlalchemy.orm import InstanceState, Mapper, ORMExecuteState, Session, SessionTransaction, object_session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql import visitors
from sqlalchemy.sql.expression import BinaryExpression, BindParameter, ColumnElement

from distlock import Fence, UnfencedWrite

from ._errors import stale
from ._mixin import FencedMixin
from ._spec import FENCE_COLUMN, FenceSpec, fence_for_row, spec_of, table_spec

__all__ = ["FENCED_OPTION", "STRICT", "note_read"]

STRICT = "distlock_sqla.strict"
"""``session.info`` key: when true, every flush of a fenced object must be made inside its lock."""

FENCED_OPTION = "distlock_sqla_fenced"
"""Execution option marking the fenced helpers' own statements, which strict mode lets through."""

_TOUCHED = "distlock_sqla.pending"
_READ = "distlock_sqla.read"  # InstanceState.info: the token the object's loaded data was read with
_FLUSHING = "distlock_sqla.flushing"  # Session.info: a unit-of-work flush is running
_UNDO = "distlock_sqla.undo"  # Session.info: (transaction, state, read before) of each read a flush moved


@dataclass
class _Expected:
    """A versioned statement the flush is about to emit for ``target``, and what to say if it matches no row."""

    table: Table
    target: Any
    spec: FenceSpec
    fence: Fence | None
    read: int | None
    delete: bool


# Per table, the rows a flush on this connection is about to UPDATE or DELETE, by primary key (the object's identity).
_Rows = dict[Table, dict[tuple[Any, ...], _Expected]]

# What the fenced flushes on each connection expect; an entry lives as long as its connection.
_pending: WeakKeyDictionary[Connection, _Rows] = WeakKeyDictionary()

# A statement's primary-key bind parameter names, by statement (the ORM reuses one UPDATE/DELETE per mapper and table).
_pk_binds: WeakKeyDictionary[Update | Delete, tuple[str, ...] | None] = WeakKeyDictionary()

# The session each connection is working for (strict mode needs the session of a statement below the ORM).
_sessions: WeakKeyDictionary[Connection, weakref.ref[Session]] = WeakKeyDictionary()


def _strict(session: Session | None, spec: FenceSpec) -> bool:
    return spec.strict or bool(session is not None and session.info.get(STRICT))


def _describe(action: str, spec: FenceSpec, target: Any) -> str:
    identity = inspect(target).identity
    return f"{action} of {spec.describe(identity if identity is not None else '(new)')}"


# -- the token an object's data was read with -----------------------------------------------------------------------


def _note_load(state: InstanceState[Any], attrs: Iterable[str] | None) -> None:
    """A load or refresh of ``state`` (of ``attrs``; None: all of it): note the token its data is now read with.

    Kept in ``InstanceState.info``, which expiry does not touch and pickling keeps. A partial refresh that leaves
    other values loaded keeps the earlier read: those values were read with it (the smaller: tokens only grow).
    """
    value = state.dict.get(FENCE_COLUMN)
    if value is None:
        if attrs is None:
            state.info.pop(_READ, None)  # loaded without its token (deferred): the read is not known
        return
    if attrs is not None:
        refreshed = set(attrs)
        if any(prop.key in state.dict and prop.key not in refreshed for prop in state.mapper.column_attrs):
            return
    state.info[_READ] = int(value)


@event.listens_for(FencedMixin, "load", propagate=True)
def _loaded(target: Any, context: Any) -> None:
    _note_load(inspect(target), None)


@event.listens_for(FencedMixin, "refresh", propagate=True)
def _refreshed(target: Any, context: Any, attrs: Iterable[str] | None) -> None:
    _note_load(inspect(target), attrs)


def _note_write(session: Session | None, state: InstanceState[Any], token: int) -> None:
    """``state``'s row was just written with ``token``: that is its read now, unless the transaction rolls back."""
    previous = state.info.get(_READ)
    state.info[_READ] = token
    if session is not None and previous != token:
        session.info.setdefault(_UNDO, []).append((session._transaction, state, previous))


def _undo_writes(session: Session, rolled_back: SessionTransaction) -> None:
    """Give the objects written in ``rolled_back`` (or a transaction inside it) the reads they had before."""
    kept = []
    for transaction, state, previous in reversed(session.info.get(_UNDO, ())):
        inside = transaction
        while inside is not None and inside is not rolled_back:
            inside = inside.parent
        if inside is None:
            kept.append((transaction, state, previous))
        elif previous is None:
            state.info.pop(_READ, None)
        else:
            state.info[_READ] = previous
    session.info[_UNDO] = kept[::-1]


def note_read(session: Session, obj: Any, token: int) -> None:
    """``obj``'s row was written by a fenced helper with ``token`` (its values are expired): its read from now on."""
    _note_write(session, inspect(obj), token)


def _read(spec: FenceSpec, state: InstanceState[Any], connection: Connection) -> int | None:
    """The token ``state``'s data was read with; if never known (its token was deferred), the row's, read now.

    Read now, on the flush's connection, the write is still a compare-and-set: the statement matches only a row
    that still carries it. None: the row is gone.
    """
    read = state.info.get(_READ)
    return int(read) if read is not None else _row_token(connection, spec, state.identity or ())


def _row_token(connection: Connection, spec: FenceSpec, identity: Sequence[Any]) -> int | None:
    """The token the row with primary key ``identity`` carries now, read on ``connection``; None: it is gone."""
    where = spec.pk_matches([tuple(identity)], on_table=True)
    current = connection.execute(select(spec.fence_column).where(where)).scalar()
    return None if current is None else int(current)


# -- which lock guards the row, before and after the write --------------------------------------------------------


def _name(spec: FenceSpec, values: Mapping[str, Any]) -> str | None:
    """The lock name of a row with ``values``; None when a field is unset (a new row's server-generated key)."""
    return None if any(value is None for value in values.values()) else spec.lock_name(values)


def _lock_values(
    spec: FenceSpec, state: InstanceState[Any], connection: Connection
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The template fields of ``state``'s row as stored (what names its lock now) and as this flush writes them.

    From the attributes' history and the identity, without loading what is expired: a field is read from the row
    only when it is set while not loaded (what it replaces is only in the row), or when it is not loaded and not in
    the identity (the lock cannot be named without it; SQLAlchemy would load it too).
    """
    identity = dict(zip(spec.pk_keys, state.identity or (), strict=True))
    stored: dict[str, Any] = {}
    current: dict[str, Any] = {}
    unknown = []
    for field, _ in spec.fields:
        history = state.attrs[field].history
        if history.added:
            current[field] = history.added[0]
            if history.deleted:
                stored[field] = history.deleted[0]
            elif field in identity:
                stored[field] = identity[field]
            else:
                unknown.append(field)
        elif field in identity:
            stored[field] = current[field] = identity[field]
        elif history.unchanged:
            stored[field] = current[field] = history.unchanged[0]
        else:
            stored[field] = current[field] = getattr(state.obj(), field)  # not loaded: loads it
    if unknown:
        exprs = [expr for field, expr in spec.fields if field in unknown]
        found = connection.execute(select(*exprs).where(spec.pk_matches([tuple(state.identity or ())]))).one_or_none()
        stored.update(zip(unknown, found or (None,) * len(unknown), strict=True))
    return stored, current


def _fence_named(
    spec: FenceSpec, name: str | None, session: Session | None, what: Callable[[], str], *, inserting: bool = False
) -> Fence | None:
    if name is None:
        # Only a new row can lack its key (a server-generated id): it cannot be locked before it exists.
        if _strict(session, spec):
            raise UnfencedWrite(
                f"{what()}: its lock {spec.template.template!r} cannot be named before the fields it is made of are "
                "set, and strict mode refuses unfenced writes. Set them before the flush"
            )
        return None
    return fence_for_row(name, None, what=what, required=_strict(session, spec), inserting=inserting)


def _guard(
    connection: Connection,
    session: Session | None,
    spec: FenceSpec,
    state: InstanceState[Any],
    action: str,
    written: InstanceState[Any] | None = None,
) -> None:
    """Fence the flush's UPDATE (of ``written``'s values) or DELETE (``written`` None) of ``state``'s row.

    The row's lock is named from the row as stored; an update that changes a field of the name moves the row to
    another lock and needs both (the fence of the lock held here of each name, ``LockNotOwned`` if one is
    missing). The statement SQLAlchemy emits compares ``fence_token`` with the token the object was read with
    (:func:`_read`), made its committed value here; a read newer than the source lock's token is refused before
    anything is written. The row is written with the larger token of its locks, or, outside any lock, keeps its
    token.
    """
    target = state.obj()

    def what() -> str:
        return _describe(action, spec, target)

    stored_values, written_values = _lock_values(spec, state, connection)
    stored = _name(spec, stored_values)
    fences = [_fence_named(spec, stored, session, what)]
    if written is not None:
        if written is not state:  # a row switch: the new object's values are written over the old row
            written_values = {field: getattr(written.obj(), field) for field, _ in spec.fields}
        destination = _name(spec, written_values)
        if destination != stored:
            fences.append(_fence_named(spec, destination, session, what))
    read = _read(spec, state, connection)
    source = fences[0]
    if source is not None and read is not None and read > source.token:
        raise stale(what(), source.token, target, read, family=spec.template.template, lock=source.name)
    # Written with the larger token of the locks involved: the row's token never goes down, whichever is newer.
    fence = max((held for held in fences if held is not None), key=lambda held: held.token, default=None)
    if read is not None:
        set_committed_value(target, FENCE_COLUMN, read)
        if written is not None:
            setattr(written.obj(), FENCE_COLUMN, read if fence is None else fence.token)
    delete = written is None
    _expect(session, connection, _Expected(spec.table, target, spec, fence, read, delete=delete))


def _expect(session: Session | None, connection: Connection, expected: _Expected) -> None:
    """Note that this flush is about to write ``expected.target``'s row on ``connection``."""
    identity = inspect(expected.target).identity
    if identity is None:
        return  # not persistent: the ORM emits no UPDATE or DELETE for it
    pending = _pending.get(connection)
    if pending is None:
        pending = _pending[connection] = {}
    pending.setdefault(expected.table, {})[tuple(identity)] = expected
    if session is not None:
        touched: list[_Rows] = session.info.setdefault(_TOUCHED, [])
        if not any(p is pending for p in touched):
            touched.append(pending)


@event.listens_for(FencedMixin, "before_update", propagate=True)
def _before_update(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    session = object_session(target)
    if session is not None and not session.is_modified(target, include_collections=False):
        return  # no net change: SQLAlchemy emits no UPDATE, and a claim is not our business here
    state = inspect(target)
    _guard(connection, session, spec_of(target), state, "update", written=state)


@event.listens_for(FencedMixin, "before_delete", propagate=True)
def _before_delete(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    _guard(connection, object_session(target), spec_of(target), inspect(target), "delete")


@event.listens_for(FencedMixin, "before_insert", propagate=True)
def _before_insert(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    spec = spec_of(target)
    session = object_session(target)
    replaced = _replaced(session, mapper, target)
    if replaced is not None:
        # delete(old) + add(new) with old's key in one flush: SQLAlchemy writes it as an UPDATE of old's row.
        _guard(connection, session, spec, replaced, "update", written=inspect(target))
        return
    values = {field: getattr(target, field) for field, _ in spec.fields}
    fence = _fence_named(spec, _name(spec, values), session, lambda: _describe("insert", spec, target), inserting=True)
    if fence is not None:
        target.fence_token = fence.token


def _replaced(session: Session | None, mapper: Mapper[Any], target: Any) -> InstanceState[Any] | None:
    """The state of an object deleted in this flush that ``target``, a new object with its key, replaces."""
    if session is None:
        return None
    existing = session.identity_map.get(mapper.identity_key_from_instance(target))
    if existing is None or existing is target or existing not in session.deleted:
        return None
    replaced: InstanceState[Any] = inspect(existing)
    return replaced


@event.listens_for(FencedMixin, "after_update", propagate=True)
def _after_update(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    state = inspect(target)
    token = state.dict.get(FENCE_COLUMN)
    if token is not None:
        _note_write(object_session(target), state, int(token))


@event.listens_for(FencedMixin, "after_insert", propagate=True)
def _after_insert(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    _after_update(mapper, connection, target)


def _pk_bind_names(statement: Update | Delete, columns: Sequence[ColumnElement[Any]]) -> tuple[str, ...] | None:
    """The names of the bind parameters ``statement``'s WHERE clause compares ``columns`` to (``col = :name``).

    None unless each column has one: the statement is then not one whose rows can be told from its parameters.
    """
    if statement in _pk_binds:
        return _pk_binds[statement]
    names: dict[int, str] = {}
    where = statement.whereclause
    for element in () if where is None else visitors.iterate(where):
        if not (
            isinstance(element, BinaryExpression)
            and element.operator is operator.eq
            and isinstance(element.right, BindParameter)
        ):
            continue
        for index, column in enumerate(columns):
            if element.left is column:
                names[index] = element.right.key
    found = tuple(names[i] for i in range(len(columns))) if len(names) == len(columns) else None
    _pk_binds[statement] = found
    return found


# The ORM's own WHERE and row count refuse a stale flush; this listener only names the row and the tokens, raising
# StaleFenceToken right after the statement, before SQLAlchemy's check. It matches an UPDATE/DELETE to the noted rows
# by the primary-key bind parameters of its WHERE clause (never by the order statements come in), relying on two
# things tests/integrations/sqla/test_sqla_flush_hook.py checks: the ORM passes each row's primary key under those
# bind names, and ``rowcount`` is the rows matched. Were either to change, nothing would be recognised and the write
# would still be refused, by SQLAlchemy's own StaleDataError. A statement of the application's own on the same table
# is taken for the flush's only if it passes a noted row's key, and is then judged by that row's token read back.
# One listener on the Engine class, added at import: listener lists must not change while an event runs, so adding
# one per flushing Connection could race a statement being dispatched, and ``event.listen`` costs about 20 us per
# transaction; this way every engine dispatches events (a few microseconds a statement) and the listener is one
# dictionary lookup outside a fenced flush.
@event.listens_for(Engine, "after_execute")
def _check_rowcount(
    conn: Connection,
    clauseelement: Any,
    multiparams: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    execution_options: Any,
    result: Result[Any],
) -> None:
    """After each statement on a connection a fenced flush used: did the UPDATE/DELETE of noted rows match them?"""
    pending = _pending.get(conn)
    if not pending or not isinstance(clauseelement, Update | Delete):
        return
    rows = pending.get(clauseelement.table)  # type: ignore[call-overload]
    if not rows:
        return
    names = _pk_bind_names(clauseelement, next(iter(rows.values())).spec.pk_columns)
    if names is None:
        return
    parameter_sets: Sequence[Mapping[str, Any]] = multiparams or [params]
    delete = isinstance(clauseelement, Delete)
    batch = list(_noted(rows, parameter_sets, names, delete=delete))
    matched = getattr(result, "rowcount", -1)
    if not batch or matched < 0 or matched >= len(parameter_sets):
        return
    if len(parameter_sets) > 1 and not conn.dialect.supports_sane_multi_rowcount:
        return  # the count of an executemany is not the rows matched: SQLAlchemy does not check it either
    error = _explain(conn, batch, gone_is_stale=not delete or len(parameter_sets) == 1)
    if error is not None:
        pending.clear()
        raise error


def _noted(
    rows: dict[tuple[Any, ...], _Expected],
    parameter_sets: Iterable[Mapping[str, Any]],
    names: tuple[str, ...],
    *,
    delete: bool,
) -> Iterable[_Expected]:
    """The noted rows (taken out of ``rows``) that these parameter sets of an UPDATE (or DELETE) write."""
    for parameters in parameter_sets:
        key = tuple(parameters.get(name) for name in names)
        expected = rows.get(key)
        if expected is not None and expected.delete == delete:
            del rows[key]
            yield expected


def _explain(conn: Connection, batch: list[_Expected], *, gone_is_stale: bool) -> Exception | None:
    """The error for the first object of ``batch`` whose row no longer carries the token it was read with, if any.

    Rows are read back on the flush's own connection, after the statement: a row an executemany DELETE did delete is
    gone too, so a missing row is taken as stale only when ``gone_is_stale`` (the statement could not have removed it).
    """
    found = []
    for expected in batch:
        current = _row_token(conn, expected.spec, inspect(expected.target).identity or ())
        if current is not None and current != expected.read:
            return _stale(expected, current)
        found.append((expected, current))
    gone = [expected for expected, current in found if current is None]
    return _stale(gone[0], None) if gone and gone_is_stale else None


def _stale(expected: _Expected, current: int | None) -> Exception:
    fence = expected.fence
    return stale(
        _describe("delete" if expected.delete else "update", expected.spec, expected.target),
        None if fence is None else fence.token,
        expected.target,
        current,
        family=expected.spec.template.template,
        read=expected.read,
        lock=None if fence is None else fence.name,
    )


@event.listens_for(Session, "before_flush")
def _flushing(session: Session, flush_context: Any, instances: Any) -> None:
    session.info[_FLUSHING] = True  # a unit-of-work flush (the bulk methods flag themselves "flushing" too)


@event.listens_for(Session, "after_flush_postexec")
def _flushed(session: Session, flush_context: Any) -> None:
    _forget(session)


@event.listens_for(Session, "after_soft_rollback")
def _rolled_back(session: Session, previous_transaction: SessionTransaction) -> None:
    _forget(session)
    if session.info.get(_UNDO):
        _undo_writes(session, previous_transaction)


@event.listens_for(Session, "after_transaction_end")
def _ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:
        session.info.pop(_UNDO, None)  # committed for good, or rolled back (and undone above)


@event.listens_for(Session, "after_begin")
def _began(session: Session, transaction: SessionTransaction, connection: Connection) -> None:
    _sessions[connection] = weakref.ref(session)


def _forget(session: Session) -> None:
    """Drop what a flush expected but did not emit (it failed part-way), so no later statement is judged by it."""
    session.info.pop(_FLUSHING, None)
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


@event.listens_for(Engine, "before_execute")
def _refuse_plain_writes(
    conn: Connection,
    clauseelement: Any,
    multiparams: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    execution_options: Mapping[str, Any],
) -> None:
    """Strict mode, below the ORM: a write to a fenced table that is neither a fenced flush nor a fenced helper.

    What reaches here without passing ``do_orm_execute``: the session's bulk methods (``bulk_save_objects``,
    ``bulk_insert_mappings``, ``bulk_update_mappings``), Core statements on the session's connection, and Core
    statements on any connection to a table declared strict.
    """
    if not isinstance(clauseelement, Insert | Update | Delete) or execution_options.get(FENCED_OPTION):
        return
    spec = table_spec(clauseelement.table)
    if spec is None:
        return
    ref = _sessions.get(conn)
    session = None if ref is None else ref()
    if session is not None and session.info.get(_FLUSHING):
        return  # the flush's own statements, fenced object by object above
    if _strict(session, spec):
        kind = type(clauseelement).__name__.upper()
        raise UnfencedWrite(
            f"{kind} of fenced {spec.label} outside a flush and outside the fenced helpers (a bulk method or a Core "
            "statement) is not fenced, and strict mode refuses it: flush objects, or use "
            "distlock_sqla.fenced_update / fenced_delete / fenced_insert inside the rows' locks"
        )
