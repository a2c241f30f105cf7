"""What makes a table fenced, and which fence a write to one of its rows must carry (``distlock.fence_for_write``).

A fenced table has an integer ``fence_token`` column and exactly one lock-name template (``"account:{id}"``) that
names, from a row's own columns, the lock guarding that row. ``FencedMixin`` models declare it with ``fence_lock``;
plain Core tables with :func:`fenced_table`. Both end up as one :class:`FenceSpec`, kept in ``Table.info``, that every
operation reads.

What can go wrong, and what is raised:

- An operation on a table or model that is not fenced: ``ConfigurationError`` (it has no token to check).
- A template naming something that is not a column: ``InvalidKeyTemplate`` where it is declared (import time).
- A write whose row is guarded by lock ``L`` while the only locks held here are others, or with an explicit fence of
  another lock: ``LockNotOwned``. Tokens are comparable across lock names, so a busier lock's larger token would
  pass ``fence_token <= :t`` and defeat the fence; it is refused instead.
- A fenced operation with no lock at all (or a flush in strict mode): ``UnfencedWrite``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, Table, tuple_
from sqlalchemy.sql.expression import ColumnElement, SQLColumnExpression

from distlock import AsyncLock, ConfigurationError, Fence, InvalidKeyTemplate, KeyTemplate, Lock, fence_for_write

__all__ = ["FenceLike", "FenceSpec", "declare", "fence_for_row", "fenced_table", "required_fence", "spec_of"]

FENCE_COLUMN = "fence_token"
_INFO_KEY = "distlock_sqla.fence"

# What an explicit ``fence=`` may be: a Fence, or a held Lock or AsyncLock.
FenceLike = Fence | Lock | AsyncLock | None


@dataclass(frozen=True, eq=False)
class FenceSpec:
    """How one fenced table is guarded.

    ``pk`` and ``fields`` are expressions to select (ORM attributes for a model, so that inheritance joins are made
    for us; columns for a Core table); ``pk_columns`` and ``fence_column`` are the columns of ``table``, the table
    that holds ``fence_token``, which claims and fenced writes update.
    """

    label: str
    table: Table
    template: KeyTemplate
    fence_column: ColumnElement[int]
    pk_columns: tuple[ColumnElement[Any], ...]
    pk: tuple[SQLColumnExpression[Any], ...]
    pk_keys: tuple[str, ...]
    fields: tuple[tuple[str, SQLColumnExpression[Any]], ...]
    strict: bool
    model: type | None = None

    def lock_name(self, values: Mapping[str, Any]) -> str:
        return self.template.render(values)

    def describe(self, pk: Any) -> str:
        return f"{self.label} {_pk_text(pk)}"

    def pk_matches(self, pks: Sequence[tuple[Any, ...]], *, on_table: bool = False) -> ColumnElement[bool]:
        """``pk IN (...)`` for primary-key tuples, as a plain ``IN`` when the key has one column."""
        columns: Sequence[Any] = self.pk_columns if on_table else self.pk
        if len(columns) == 1:
            return columns[0].in_([pk[0] for pk in pks])  # type: ignore[no-any-return]
        return tuple_(*columns).in_(list(pks))

    def named_by_pk(self) -> bool:
        """True when the lock name is made of primary-key fields only (no read needed to name a row's lock)."""
        return set(self.template.fields) <= set(self.pk_keys)


def _pk_text(pk: Any) -> str:
    if isinstance(pk, tuple):
        return f"pk={pk[0]!r}" if len(pk) == 1 else f"pk={pk!r}"
    return f"pk={pk!r}"


def fenced_table(table: Table, lock: str, *, strict: bool = False) -> Table:
    """Declare a Core ``Table`` fenced: rows guarded by lock template ``lock`` (fields are column keys).

    The table needs an integer ``fence_token`` column (``Column("fence_token", BigInteger, nullable=False,
    default=0, server_default="0")``). ``strict=True`` makes ``fenced_*`` helpers the only way to write it through an
    ORM session. Returns the table. Raises ``InvalidKeyTemplate`` / ``ConfigurationError`` at once when it cannot work.
    """
    template = KeyTemplate(lock)
    fence_column = table.c.get(FENCE_COLUMN)
    if fence_column is None or not isinstance(fence_column.type, Integer):
        raise ConfigurationError(
            f"table {table.name!r} cannot be fenced: it needs an integer column {FENCE_COLUMN!r} "
            '(Column("fence_token", BigInteger, nullable=False, default=0, server_default="0"))'
        )
    if not table.primary_key.columns:
        raise ConfigurationError(f"table {table.name!r} cannot be fenced: it has no primary key to claim rows by")
    declare(
        label=table.name,
        what=f"lock template {lock!r} of table {table.name!r}",
        template=template,
        table=table,
        fence_column=fence_column,
        pk_columns=tuple(table.primary_key.columns),
        pk_keys=tuple(c.key for c in table.primary_key.columns),
        columns=table.c.keys(),
        attribute=lambda key: table.c[key],
        strict=strict,
    )
    return table


def declare(
    *,
    label: str,
    what: str,
    template: KeyTemplate,
    table: Table,
    fence_column: ColumnElement[int],
    pk_columns: tuple[ColumnElement[Any], ...],
    pk_keys: tuple[str, ...],
    columns: Sequence[str],
    attribute: Callable[[str], SQLColumnExpression[Any]],
    strict: bool,
    model: type | None = None,
) -> FenceSpec:
    """Check ``template`` (declared by ``what``) against ``columns``, then make and :func:`register` the spec.

    ``columns`` are the keys ``attribute`` turns into what to select: a Core table's column keys, or a model's
    attribute names. ``InvalidKeyTemplate`` for a field that is not one of them: a row's lock name is made of its own
    columns.
    """
    missing = [field for field in template.fields if field not in columns]
    if missing:
        raise InvalidKeyTemplate(
            f"{what} names {', '.join(map(repr, missing))}, which "
            f"{'is not a column' if len(missing) == 1 else 'are not columns'} of {label} (columns: "
            f"{', '.join(columns)}); a row's lock name must be made of its own columns"
        )
    spec = FenceSpec(
        label=label,
        table=table,
        template=template,
        fence_column=fence_column,
        pk_columns=pk_columns,
        pk=tuple(attribute(key) for key in pk_keys),
        pk_keys=pk_keys,
        fields=tuple((field, attribute(field)) for field in template.fields),
        strict=strict,
        model=model,
    )
    register(spec)
    return spec


def register(spec: FenceSpec) -> None:
    """Record ``spec`` as its table's; a table has one guarding lock template whichever class maps it."""
    existing: FenceSpec | None = spec.table.info.get(_INFO_KEY)
    if existing is not None and existing.template.template != spec.template.template:
        raise ConfigurationError(
            f"table {spec.table.name!r} is already fenced by lock template {existing.template.template!r} "
            f"({existing.label}); {spec.label} declares {spec.template.template!r}. A row is guarded by one lock: "
            "keep one template per table"
        )
    if existing is None or existing.model is None or spec.model is existing.model:
        spec.table.info[_INFO_KEY] = spec


def spec_of(target: Any) -> FenceSpec:
    """The :class:`FenceSpec` of a ``FencedMixin`` model (or instance) or a :func:`fenced_table`.

    ``ConfigurationError`` for anything else: an operation on it would have no fence to check.
    """
    spec = getattr(target, "__fence_spec__", None)
    if isinstance(spec, FenceSpec):
        return spec
    if isinstance(target, Table):
        found = target.info.get(_INFO_KEY)
        if isinstance(found, FenceSpec):
            return found
    name = target.name if isinstance(target, Table) else getattr(target, "__name__", type(target).__name__)
    raise ConfigurationError(
        f"{name!r} is not fenced: it has no fence_token column and no guarding lock to check writes against. "
        "Give the model distlock_sqla.FencedMixin and a fence_lock template (or declare a Core table with "
        "distlock_sqla.fenced_table)"
    )


def table_spec(table: Any) -> FenceSpec | None:
    found = table.info.get(_INFO_KEY) if isinstance(table, Table) else None
    return found if isinstance(found, FenceSpec) else None


def as_fence(fence: FenceLike) -> Fence | Lock | None:
    """Accept a Fence, a held Lock, or an AsyncLock (its sync handle) for ``fence=``."""
    if fence is None or isinstance(fence, Fence | Lock):
        return fence
    if isinstance(fence, AsyncLock):
        return fence.sync
    raise ConfigurationError(f"fence= must be a distlock Fence or a held Lock/AsyncLock, not {type(fence).__name__}")


def fence_for_row(
    name: str, fence: FenceLike, *, what: str | Callable[[], str], required: bool, inserting: bool = False
) -> Fence | None:
    """The fence for a write to ``what``, a row guarded by lock ``name``; None when it is to be written unfenced.

    :func:`distlock.fence_for_write`'s policy (``required`` is its ``strict``), with ``fence`` also an AsyncLock.
    """
    return fence_for_write(name, as_fence(fence), what=what, strict=required, inserting=inserting)


def required_fence(name: str, fence: FenceLike, *, what: str) -> Fence:
    """:func:`fence_for_row` for the fenced helpers, which never write unfenced: a fence, or an error."""
    found = fence_for_row(name, fence, what=what, required=True)
    assert found is not None  # required=True raises instead of returning None
    return found
