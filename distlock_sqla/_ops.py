"""Fenced reads and writes for Core and ORM: claim-on-read, fenced update, delete and insert.

Each helper takes a ``Session`` or a ``Connection`` (or their asyncio twins, and is then awaited), finds the rows'
lock names from their columns, and takes each row's token from the lock of that name held in the current context
(or from ``fence=``, checked to be of that lock). :func:`claim` (and :func:`claim_one`) selects the rows' keys,
claims them (``UPDATE … SET fence_token = :t WHERE pk IN (…) AND fence_token <= :t``) and only then reads them;
:func:`fenced_update` / :func:`fenced_delete` write with that check, :func:`fenced_insert` stores the token. Several
rows are written in a SAVEPOINT (``begin_nested()``), all or nothing. Why claim before reading: docs/design.md; the
transaction advice: docs/integrations/sqlalchemy.md.

What can go wrong: a row whose lock is not held raises ``UnfencedWrite`` (``LockNotOwned`` when other locks are held,
or ``fence=`` is of another lock), a row that cannot be claimed or written ``StaleFenceToken``: nothing written, and
a claim reads nothing. On pysqlite, SAVEPOINT needs SQLAlchemy's documented transaction set-up, and an
``AUTOCOMMIT`` connection has nothing to roll back: use single-row operations there. A claim inside a transaction
holds the row lock until commit, so a holder stalled there stalls the next one at the database (safe, not live).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple, overload

from sqlalchemy import Select, delete, insert, select, update
from sqlalchemy.engine import Connection, Result
from sqlalchemy.exc import NoResultFound
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ClauseElement, ColumnElement, Executable

from distlock import ConfigurationError, Fence

from ._errors import StaleFenceToken, stale
from ._flush import FENCED_OPTION, note_read
from ._spec import FenceLike, FenceSpec, required_fence, spec_of, table_spec

if TYPE_CHECKING:
    # sqlalchemy.ext.asyncio needs greenlet, which SQLAlchemy 2.1 no longer installs: sync users must not need it.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    AsyncExecutor = AsyncSession | AsyncConnection

__all__ = ["claim", "claim_one", "fenced_delete", "fenced_insert", "fenced_update"]

_Ts = TypeVarTuple("_Ts")
_M = TypeVar("_M")
_T = TypeVar("_T")

Executor = Session | Connection
_OPTIONS = {FENCED_OPTION: True}
# Primary keys per statement: far below SQLite's 32766 bound parameters, and short enough to log.
_CHUNK = 500

PK = tuple[Any, ...]


def _is_async(executor: Any) -> bool:
    """Whether ``executor`` is an ``AsyncSession``/``AsyncConnection``, without importing SQLAlchemy's asyncio.

    An object of those classes exists only once ``sqlalchemy.ext.asyncio`` is imported (and greenlet is installed),
    so a module that is not loaded yet means a sync executor; importing it here would fail without greenlet.
    """
    asyncio_ext = sys.modules.get("sqlalchemy.ext.asyncio")
    return asyncio_ext is not None and isinstance(executor, asyncio_ext.AsyncSession | asyncio_ext.AsyncConnection)


def _run(executor: Any, fn: Callable[..., _T], *args: Any) -> _T | Awaitable[_T]:
    """Call ``fn(sync_executor, *args)``: directly, or in the greenlet of an ``AsyncSession``/``AsyncConnection``."""
    if _is_async(executor):
        return executor.run_sync(fn, *args)  # type: ignore[no-any-return]
    if not isinstance(executor, Session | Connection):
        raise ConfigurationError(
            f"fenced operations need a Session or a Connection (or AsyncSession/AsyncConnection), not "
            f"{type(executor).__name__}; for an Engine use `with engine.begin() as conn:`"
        )
    return fn(executor, *args)


# -- claim-on-read ----------------------------------------------------------------------------------------------


@overload
def claim(executor: Executor, statement: Select[*_Ts], *, fence: FenceLike = None) -> Result[*_Ts]: ...
@overload
def claim(executor: AsyncExecutor, statement: Select[*_Ts], *, fence: FenceLike = None) -> Awaitable[Result[*_Ts]]: ...
def claim(executor: Any, statement: Select[*_Ts], *, fence: FenceLike = None) -> Any:
    """Claim the rows ``statement`` selects with their locks' tokens, then read them: the select's ``Result``.

    ``statement`` selects from one fenced model or table (``select(Account).where(...)``); its WHERE, joins, order
    and limit choose the rows. Objects already in the session are refreshed from the claimed rows. Raises
    ``StaleFenceToken`` (nothing read, no claim kept) when a newer holder has claimed any of them.
    """
    if _is_async(executor):
        return _claim_async(executor, statement, fence)
    return _run(executor, _claim, statement, fence)


async def _claim_async(executor: AsyncExecutor, statement: Select[*_Ts], fence: FenceLike) -> Any:
    # The Result is buffered in the greenlet: rows of an async driver cannot be fetched outside it.
    frozen = await _run(executor, lambda sync: _claim(sync, statement, fence).freeze())  # type: ignore[misc]
    return frozen()


def _claim(executor: Executor, statement: Select[*_Ts], fence: FenceLike) -> Result[*_Ts]:
    spec = _spec_of_select(statement)
    keys = statement.with_only_columns(*spec.pk, *(expr for _, expr in spec.fields), maintain_column_froms=True)
    names = _names(executor, spec, keys)
    if names:
        _claim_rows(executor, spec, names, fence)
    # The rows are chosen (limit, offset and all) by the read of their keys: the final read takes exactly those.
    final = statement.limit(None).offset(None).where(spec.pk_matches(list(names)))
    return executor.execute(final, execution_options={"populate_existing": True})


@overload
def claim_one(session: Session, model: type[_M], ident: Any, *, fence: FenceLike = None) -> _M: ...
@overload
def claim_one(session: AsyncSession, model: type[_M], ident: Any, *, fence: FenceLike = None) -> Awaitable[_M]: ...
def claim_one(session: Any, model: type[_M], ident: Any, *, fence: FenceLike = None) -> Any:
    """Claim the row of ``model`` with primary key ``ident`` (as ``session.get`` takes it), then load it.

    One ``UPDATE ... RETURNING`` when the lock name is made of primary-key fields and the dialect returns rows
    (PostgreSQL, SQLite >= 3.35); a read of the row's key columns first otherwise, a separate read after.
    ``NoResultFound`` when there is no such row, ``StaleFenceToken`` when a newer holder has claimed it.
    """
    return _run(session, _claim_one, model, ident, fence)


def _claim_one(session: Session, model: type[_M], ident: Any, fence: FenceLike) -> _M:
    spec = spec_of(model)
    pk: PK = tuple(ident) if isinstance(ident, tuple | list) else (ident,)
    if len(pk) != len(spec.pk_columns):
        raise ConfigurationError(f"{spec.label} has a {len(spec.pk_columns)}-column primary key; got {ident!r}")
    if spec.named_by_pk():
        names = {pk: spec.lock_name(dict(zip(spec.pk_keys, pk, strict=True)))}
    else:
        names = _names(session, spec, select(*spec.pk, *(expr for _, expr in spec.fields)).where(spec.pk_matches([pk])))
        if not names:
            raise NoResultFound(f"no {spec.label} with primary key {ident!r}")
    if _can_return(session, spec):
        # One statement: the claiming UPDATE returns the claimed row, which loads (or refreshes) the object.
        [(pk, name)] = names.items()
        token = required_fence(name, fence, what=f"claim of {spec.describe(pk)}").token
        statement = (
            update(model)
            .where(spec.pk_matches([pk]), spec.fence_column <= token)
            .values({spec.fence_column: token})
            .returning(model)
        )
        options = {**_OPTIONS, "populate_existing": True, "synchronize_session": False}
        returned = session.execute(statement, execution_options=options).scalars().one_or_none()
        if returned is None:
            _raise_if_stale(session, spec, [pk], token, "claim", name)
        found = returned
    else:
        _claim_rows(session, spec, names, fence, missing_is_error=False)
        found = session.get(model, ident, populate_existing=True)
    if found is None:
        raise NoResultFound(f"no {spec.label} with primary key {ident!r}")
    return found


def _can_return(session: Session, spec: FenceSpec) -> bool:
    """Can the claim of one object be one ``UPDATE ... RETURNING``? (One mapped table, a dialect that returns.)"""
    mapper = getattr(spec.model, "__mapper__", None)
    if mapper is None or len(mapper.tables) != 1:
        return False
    return bool(session.get_bind(mapper=mapper).dialect.update_returning)


def _claim_rows(
    executor: Executor, spec: FenceSpec, names: dict[PK, str], fence: FenceLike, *, missing_is_error: bool = True
) -> None:
    def claim_statement(pks: Sequence[PK], bound: int, token: int) -> Executable:
        matches = spec.pk_matches(pks, on_table=True)
        return update(spec.table).where(matches, spec.fence_column <= bound).values({spec.fence_column: token})

    _write(executor, spec, names, fence, "claim", claim_statement, missing_is_error=missing_is_error)


# -- fenced writes ----------------------------------------------------------------------------------------------


@overload
def fenced_update(
    executor: Executor, target: Any, values: Mapping[Any, Any], *where: Any, fence: FenceLike = None
) -> int: ...
@overload
def fenced_update(
    executor: AsyncExecutor, target: Any, values: Mapping[Any, Any], *where: Any, fence: FenceLike = None
) -> Awaitable[int]: ...
def fenced_update(executor: Any, target: Any, values: Mapping[Any, Any], *where: Any, fence: FenceLike = None) -> Any:
    """Set ``values`` on the rows of ``target`` (a fenced model or table) matching ``where``; the number updated.

    Each row is written with its own lock's token (``SET ..., fence_token = :t WHERE ... AND fence_token <= :t``),
    all or nothing: if any row carries a newer token (or is gone) nothing is written and ``StaleFenceToken`` is
    raised. ``values`` are keyed by attribute or column name (or column); SQL expressions are allowed.
    """
    return _run(executor, _fenced_update, target, values, where, fence)


def _fenced_update(
    executor: Executor, target: Any, values: Mapping[Any, Any], where: Sequence[Any], fence: FenceLike
) -> int:
    spec = spec_of(target)
    assignments = _columns(spec, values)
    moved = _moved_fields(spec, assignments)
    rows = _rows(executor, spec, select(*spec.pk, *(expr for _, expr in spec.fields)).where(*where))
    names = {pk: spec.lock_name(fields) for pk, fields in rows.items()}
    # A row whose lock name changes moves to another lock: the write needs the lock it leaves and the one it joins.
    destinations = {pk: spec.lock_name({**fields, **moved}) for pk, fields in rows.items()} if moved else None

    def update_statement(pks: Sequence[PK], bound: int, token: int) -> Executable:
        matches = spec.pk_matches(pks, on_table=True)
        return (
            update(spec.table)
            .where(matches, spec.fence_column <= bound)
            .values({**assignments, spec.fence_column: token})
        )

    tokens = _write(executor, spec, names, fence, "update", update_statement, destinations=destinations)
    _expire(executor, spec, tokens)
    return len(tokens)


def _moved_fields(spec: FenceSpec, assignments: Mapping[Any, Any]) -> dict[str, Any]:
    """The fields of the lock template that ``assignments`` (by column) set, with their new values."""
    by_key = {column.key: value for column, value in assignments.items()}
    moved = {field: by_key[field] for field, _ in spec.fields if field in by_key}
    expressions = [field for field, value in moved.items() if isinstance(value, ClauseElement)]
    if expressions:
        raise ConfigurationError(
            f"fenced_update of {spec.label} sets {', '.join(expressions)}, which the rows' lock "
            f"{spec.template.template!r} is named from, to an SQL expression: the lock the rows move to must be known "
            "before the write. Pass a value"
        )
    return moved


@overload
def fenced_delete(executor: Executor, target: Any, *where: Any, fence: FenceLike = None) -> int: ...
@overload
def fenced_delete(executor: AsyncExecutor, target: Any, *where: Any, fence: FenceLike = None) -> Awaitable[int]: ...
def fenced_delete(executor: Any, target: Any, *where: Any, fence: FenceLike = None) -> Any:
    """Delete the rows of ``target`` matching ``where``, each only if its token is not newer than its lock's token.

    All or nothing, like :func:`fenced_update`; returns the number deleted.
    """
    return _run(executor, _fenced_delete, target, where, fence)


def _fenced_delete(executor: Executor, target: Any, where: Sequence[Any], fence: FenceLike) -> int:
    spec = spec_of(target)
    names = _names(executor, spec, select(*spec.pk, *(expr for _, expr in spec.fields)).where(*where))

    def delete_statement(pks: Sequence[PK], bound: int, token: int) -> Executable:
        return delete(spec.table).where(spec.pk_matches(pks, on_table=True), spec.fence_column <= bound)

    tokens = _write(executor, spec, names, fence, "delete", delete_statement)
    _expire(executor, spec, tokens, deleted=True)
    return len(tokens)


@overload
def fenced_insert(
    executor: Executor, target: Any, rows: Mapping[str, Any] | Sequence[Mapping[str, Any]], *, fence: FenceLike = None
) -> int: ...
@overload
def fenced_insert(
    executor: AsyncExecutor,
    target: Any,
    rows: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    fence: FenceLike = None,
) -> Awaitable[int]: ...
def fenced_insert(
    executor: Any, target: Any, rows: Mapping[str, Any] | Sequence[Mapping[str, Any]], *, fence: FenceLike = None
) -> Any:
    """Insert ``rows`` (dicts keyed by attribute or column name) storing each row's lock token; the number inserted.

    Each row must carry the values its lock name is made of. All or nothing when more than one row.
    """
    return _run(executor, _fenced_insert, target, rows, fence)


def _fenced_insert(
    executor: Executor, target: Any, rows: Mapping[str, Any] | Sequence[Mapping[str, Any]], fence: FenceLike
) -> int:
    spec = spec_of(target)
    batch = [rows] if isinstance(rows, Mapping) else list(rows)
    fences: dict[str, Fence] = {}
    grouped: dict[str, list[dict[Any, Any]]] = {}
    for row in batch:
        values = {field: row.get(field) for field, _ in spec.fields}
        unnamed = [field for field, value in values.items() if value is None]
        if unnamed:
            raise ConfigurationError(
                f"fenced insert into {spec.label}: the row's lock {spec.template.template!r} needs "
                f"{', '.join(unnamed)}, which the row does not set: {dict(row)!r}"
            )
        name = spec.lock_name(values)
        if name not in fences:
            fences[name] = required_fence(name, fence, what=f"insert into {spec.label} ({name})")
        grouped.setdefault(name, []).append(_columns(spec, row))
    with _all_or_nothing(executor, len(batch) > 1):
        for name, group in grouped.items():
            token = fences[name].token
            params = [{column.key: value for column, value in values.items()} for values in group]
            _execute(executor, insert(spec.table), [{**row, spec.fence_column.key: token} for row in params])
    return len(batch)


# -- shared steps -----------------------------------------------------------------------------------------------


def _execute(executor: Executor, statement: Executable, params: Any = None) -> Result[Any]:
    return executor.execute(statement, params, execution_options=_OPTIONS)


def _spec_of_select(statement: Select[*tuple[Any, ...]]) -> FenceSpec:
    found: list[FenceSpec] = []
    for description in statement.column_descriptions:
        entity = description.get("entity")
        spec = getattr(entity, "__fence_spec__", None)
        if spec is not None and spec not in found:
            found.append(spec)
    if not found:
        for from_ in statement.get_final_froms():
            spec = table_spec(from_)
            if spec is not None and spec not in found:
                found.append(spec)
    if len(found) != 1:
        what = "no fenced model or table" if not found else ", ".join(s.label for s in found)
        raise ConfigurationError(
            f"claim() needs a select of exactly one fenced model or table (FencedMixin / fenced_table); this "
            f"statement selects {what}. Claim other fenced rows with statements of their own"
        )
    return found[0]


def _rows(executor: Executor, spec: FenceSpec, keys: Select[*tuple[Any, ...]]) -> dict[PK, dict[str, Any]]:
    """Primary key -> template fields of each row ``keys`` (pk columns, then template fields) returns, in order."""
    width = len(spec.pk)
    rows: dict[PK, dict[str, Any]] = {}
    for row in executor.execute(keys):
        pk = tuple(row[:width])
        if pk not in rows:
            rows[pk] = {field: row[width + i] for i, (field, _) in enumerate(spec.fields)}
    return rows


def _names(executor: Executor, spec: FenceSpec, keys: Select[*tuple[Any, ...]]) -> dict[PK, str]:
    """Primary key -> lock name of each row ``keys`` (pk columns, then template fields) returns, in order."""
    return {pk: spec.lock_name(fields) for pk, fields in _rows(executor, spec, keys).items()}


def _write(
    executor: Executor,
    spec: FenceSpec,
    names: dict[PK, str],
    fence: FenceLike,
    action: str,
    statement: Callable[[Sequence[PK], int, int], Executable],
    *,
    missing_is_error: bool = True,
    destinations: Mapping[PK, str] | None = None,
) -> dict[PK, int]:
    """Run ``statement(pks, bound, token)`` per lock name and chunk, all or nothing: each row written, with the token
    it was written with. ``StaleFenceToken`` on a short count.

    A row written with ``token`` must carry no token above ``bound``, its lock's token; a row moving to the lock
    ``destinations`` names needs that lock too and is written with the larger of the two tokens (a row's token never
    goes down, whichever lock is newer).
    """
    groups: dict[tuple[str, str], list[PK]] = {}
    fences: dict[str, Fence] = {}
    for pk, name in names.items():
        route = (name, name if destinations is None else destinations[pk])
        for each in route:
            if each not in fences:
                fences[each] = required_fence(each, fence, what=f"{action} of {spec.describe(pk)}")
        groups.setdefault(route, []).append(pk)
    tokens: dict[PK, int] = {}
    with _all_or_nothing(executor, len(names) > 1):
        for (name, destination), pks in groups.items():
            bound = fences[name].token
            token = max(bound, fences[destination].token)
            for start in range(0, len(pks), _CHUNK):
                chunk = pks[start : start + _CHUNK]
                matched = _execute(executor, statement(chunk, bound, token)).rowcount  # type: ignore[attr-defined]
                if matched != len(chunk):
                    if not missing_is_error and len(names) == 1:
                        _raise_if_stale(executor, spec, chunk, bound, action, name)
                        return {}
                    raise _stale_rows(executor, spec, chunk, bound, action, name)
                tokens.update(dict.fromkeys(chunk, token))
    return tokens


def _current_tokens(executor: Executor, spec: FenceSpec, pks: Sequence[PK]) -> dict[PK, int]:
    rows = executor.execute(select(*spec.pk_columns, spec.fence_column).where(spec.pk_matches(pks, on_table=True)))
    return {tuple(row[:-1]): int(row[-1]) for row in rows}


def _stale_rows(
    executor: Executor, spec: FenceSpec, pks: Sequence[PK], token: int, action: str, name: str
) -> StaleFenceToken:
    current = _current_tokens(executor, spec, pks)
    culprit = next((pk for pk in pks if current.get(pk, token + 1) > token), pks[0])
    pk = culprit[0] if len(culprit) == 1 else culprit
    error = stale(
        f"{action} of {spec.describe(pk)}", token, pk, current.get(culprit), family=spec.template.template, lock=name
    )
    if len(pks) > 1:
        error.args = (f"{error.args[0]} (nothing of this {action} of {len(pks)} rows was written)",)
    return error


def _raise_if_stale(executor: Executor, spec: FenceSpec, pks: Sequence[PK], token: int, action: str, name: str) -> None:
    if _current_tokens(executor, spec, pks):
        raise _stale_rows(executor, spec, pks, token, action, name)


@contextlib.contextmanager
def _all_or_nothing(executor: Executor, needed: bool) -> Iterator[None]:
    """A SAVEPOINT around a multi-row write, rolled back when it raises; nothing around a single-row one."""
    if not needed:
        yield
        return
    with executor.begin_nested():
        yield


def _columns(spec: FenceSpec, values: Mapping[Any, Any]) -> dict[Any, Any]:
    """``values`` keyed by columns of the fenced table, from attribute names, column keys or columns."""
    columns: dict[Any, Any] = {}
    mapper = None if spec.model is None else getattr(spec.model, "__mapper__", None)
    for key, value in values.items():
        column: Any = key
        if isinstance(key, str):
            if mapper is not None and key in mapper.columns:
                column = mapper.columns[key]
            elif key in spec.table.c:
                column = spec.table.c[key]
            else:
                raise ConfigurationError(f"{spec.label} has no column {key!r}")
        else:
            column = getattr(key, "expression", key)
        if not isinstance(column, ColumnElement) or getattr(column, "table", None) is not spec.table:
            raise ConfigurationError(
                f"fenced writes of {spec.label} set columns of table {spec.table.name!r} only; {key!r} is not one"
            )
        if column is spec.fence_column:
            raise ConfigurationError("fence_token is set by the fence itself; do not pass it in values")
        columns[column] = value
    return columns


def _expire(executor: Executor, spec: FenceSpec, tokens: dict[PK, int], *, deleted: bool = False) -> None:
    """Make objects of the written rows that the session holds reflect the database: expired (read, from now on,
    with the token written), or gone if deleted."""
    if not isinstance(executor, Session) or spec.model is None:
        return
    for pk, token in tokens.items():
        key = executor.identity_key(spec.model, pk)
        obj = executor.identity_map.get(key)
        if obj is None:
            continue
        if deleted:
            executor.expunge(obj)
        else:
            executor.expire(obj)
            note_read(executor, obj, token)
