"""``FencedModel``: rows the database itself protects from stale lock holders.

    class Account(FencedModel):
        balance = models.IntegerField()
        fence_lock = "account:{pk}"          # rendered from the row; DISTLOCK["KEY_PREFIX"] is prepended

Inside the row's lock, writes carry the lock's fencing token and the statement itself decides: ``.fenced()`` claims
the rows (``fence_token = :t`` where it is ``<= :t``) before reading them; ``save()`` is Django's own, with
``fence_token = :t WHERE ... AND fence_token = :read`` in its UPDATE (``:read``: the token the instance's data was
read with, kept by ``_reads``); ``delete()`` claims first (a ``pre_delete`` receiver); ``create()`` stores the
token; ``fenced_update()`` writes many rows all or nothing. The token is the innermost held lock *of the row's
name*. Which writes are fenced, claimed or plain, moves, inheritance, the one-statement claim and the long way:
docs/integrations/django.md ("FencedModel"); why claim-on-read: docs/design.md.

What can go wrong: 0 rows where 1 was expected raise ``StaleFenceToken`` (the row is read again only then, to say
why), nothing written; another lock's token, or only other locks held, is ``LockNotOwned``; a write outside the lock
is plain (``FENCING = "on"``) or ``UnfencedWrite`` (``"strict"``, also for the plain bulk APIs). A claim inside a
transaction holds the row lock until commit: a holder stalled there stalls the next one at the database.
"""

from __future__ import annotations

import contextlib
import operator
import sqlite3
import string
from collections.abc import AsyncIterator, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Self, TypeVar, cast

from asgiref.sync import sync_to_async
from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db import IntegrityError, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import signals
from django.db.models.lookups import Exact
from django.db.models.options import Options
from django.db.models.query import ModelIterable, prefetch_related_objects
from django.utils.functional import cached_property

import distlock
from distlock import Fence, KeyTemplate, LockNotOwned, StaleFenceToken, UnfencedWrite

from ._conf import conf, lock_name
from ._reads import UNMATCHED, note_read, note_write, read_filter, read_of

__all__ = ["FencedManager", "FencedModel", "FencedQuerySet", "fence_of"]


class _RowValues(Mapping[str, Any]):
    """A template's view of a model instance: ``{pk}``, ``{id}``, ``{customer_id}``, ``{customer.pk}``..."""

    def __init__(self, instance: models.Model) -> None:
        self._instance = instance

    def __getitem__(self, key: str) -> Any:
        if key == "self":
            return self._instance
        try:
            return getattr(self._instance, key)
        except AttributeError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(f.attname for f in self._instance._meta.concrete_fields)

    def __len__(self) -> int:
        return len(self._instance._meta.concrete_fields)


def _template(model: type[models.Model]) -> KeyTemplate:
    template = getattr(model, "_distlock_template", None)
    declared = getattr(model, "fence_lock", None)
    if template is None or template.template != declared:
        if not declared:
            raise distlock.ConfigurationError(
                f"{model.__name__} is a FencedModel without a fence_lock template; "
                "declare the lock that guards each row, e.g. fence_lock = 'account:{pk}'"
            )
        template = KeyTemplate(declared)
        model._distlock_template = template  # type: ignore[attr-defined]
    return template


def _lock_name_of(instance: models.Model) -> str:
    return lock_name(_template(type(instance)).render(_RowValues(instance)))


def _require_fenced(model: type[models.Model]) -> None:
    if not (isinstance(model, type) and issubclass(model, FencedModel)):
        raise distlock.ConfigurationError(
            f"{getattr(model, '__name__', model)!r} is not a FencedModel: it has no fence_token to check. "
            "Inherit from distlock_django.FencedModel to use fenced reads and writes"
        )


def fence_of(
    instance: models.Model, fence: Fence | distlock.Lock | None = None, *, inserting: bool = False
) -> Fence | None:
    """The fence to write ``instance`` with: explicit (checked) or the current lock of its name; None if unfenced.

    Raises ``LockNotOwned`` for a fence of another lock (or, except for an insert, when only other locks are
    held), ``UnfencedWrite`` in strict mode when no lock of its name is held.
    """
    _require_fenced(type(instance))
    return distlock.fence_for_write(
        _lock_name_of(instance),
        fence,
        what=lambda: f"{type(instance).__name__} pk={instance.pk}",
        strict=conf()["FENCING"] == "strict",
        inserting=inserting,
    )


_INTEGER_TYPES = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "BigIntegerField",
        "IntegerField",
        "PositiveBigIntegerField",
        "PositiveIntegerField",
        "PositiveSmallIntegerField",
        "SmallAutoField",
        "SmallIntegerField",
    }
)
# Values Python orders as every database does; text is left out (the database's collation decides its order).
_SORTABLE_TYPES = _INTEGER_TYPES | {"BooleanField", "DateField", "DateTimeField", "DecimalField", "DurationField"}
_formatter = string.Formatter()


def _returning_claims(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` can claim and read rows in one ``UPDATE ... RETURNING``."""
    if connection.vendor == "postgresql":
        return True
    # Django's SQLite backend runs on the standard library's sqlite3, so its library version is the database's.
    return connection.vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 35)


def _column(model: type[models.Model], name: str) -> models.Field[Any, Any] | None:
    """The concrete field a template field or an ordering names by ``pk`` or its attname (not a relation's name)."""
    meta = model._meta
    if name == "pk":
        return meta.pk
    return next((f for f in meta.concrete_fields if f.attname == name), None)


def _field_type(field: models.Field[Any, Any]) -> str:
    target = field.target_field if isinstance(field, models.ForeignKey) else field
    return target.get_internal_type()


def _rows_of_lock(
    model: type[models.Model], name: str, connection: BaseDatabaseWrapper
) -> tuple[str, list[Any]] | None:
    """SQL (``"id" = %s AND ``, and its parameters) true exactly for the rows guarded by lock ``name``; None when
    SQL cannot say it, or no row can be.

    Said for a constant template and for one integer field (``"account:{pk}"``): the name is parsed back into the
    field's value, which renders to exactly that name (``str(int)`` is canonical); any other template: None.
    """
    template = _template(model).template
    pieces = list(_formatter.parse(template))
    roots = [field for _, field, _, _ in pieces if field is not None]
    if not roots:
        return ("", []) if name == lock_name(template) else None
    field = _column(model, roots[0]) if len(roots) == 1 else None
    if field is None or _field_type(field) not in _INTEGER_TYPES:
        return None
    before = lock_name(pieces[0][0])
    after = "".join(literal for literal, _, _, _ in pieces[1:])
    if len(name) <= len(before) + len(after) or not (name.startswith(before) and name.endswith(after)):
        return None
    text = name[len(before) : len(name) - len(after)]
    try:
        value = int(text)
    except ValueError:
        return None
    if str(value) != text:
        return None
    return f"{connection.ops.quote_name(cast(str, field.column))} = %s AND ", [value]


def _one_row_kept(query: Any) -> bool:
    """Whether a sliced query keeps its one possible row: its filter pins the primary key (``pk=``, as in
    ``get(pk=...)``), so at most one row matches, and the slice starts at it. Such a slice needs no subquery."""
    where = query.where
    if query.low_mark or query.high_mark == 0 or where.connector != "AND" or where.negated:
        return False
    pk = query.get_meta().pk
    return any(
        isinstance(child, Exact)
        and getattr(child.lhs, "target", None) is pk
        and getattr(child.rhs, "resolve_expression", None) is None
        for child in where.children
    )


def _stale(
    model: type[models.Model], pk: Any, token: int | None, using: str, action: str, read: int | None = None
) -> StaleFenceToken:
    current = model._base_manager.using(using).filter(pk=pk).values_list("fence_token", flat=True).first()
    message = distlock.fence_refused(
        f"{action} of {model.__name__} pk={pk}",
        token,
        current,
        read=None if read == UNMATCHED else read,
        family=_template(model).template,
    )
    return StaleFenceToken(message, token=token, row=pk, current=current)


def _owner(model: type[models.Model]) -> type[models.Model]:
    """The model whose table holds ``fence_token``: the model itself, or (multi-table inheritance) the fenced
    parent. Every guard is an UPDATE of that table alone, with the token in its WHERE."""
    return model._meta.get_field("fence_token").model


def _guard(model: type[models.Model], using: str) -> models.QuerySet[Any]:
    """A queryset of the table that holds ``fence_token`` (the child's pk is its parent's, parent link as pk)."""
    return _owner(model)._base_manager.using(using)


def _raw_update(queryset: models.QuerySet[Any], **values: Any) -> int:
    """``QuerySet.update()`` as Django runs it, for the guarded statements built here (not a plain write)."""
    return models.QuerySet.update(queryset, **values)


def _still_read(guard: models.QuerySet[Any], pk: Any, read: int) -> bool:
    """Whether row ``pk`` still carries ``read``, asked in a statement that locks it (an UPDATE that changes
    nothing) until the caller's transaction ends: no claim lands between this check and the write that follows."""
    return _raw_update(guard.filter(pk=pk, fence_token=read), fence_token=models.F("fence_token")) == 1


def _name_fields(model: type[models.Model]) -> list[models.Field[Any, Any]] | None:
    """The concrete non-pk fields of the fence-holding table that the lock template reads, e.g. ``book`` for
    ``"book:{book}"``; an UPDATE carrying ``field = <value the name was rendered from>`` lands only on a row
    that is still of that lock, so a move (a row changing lock) is seen in the write's own statement. None: the
    template reads something else (``{self}``, a property, a field of a child table), which SQL cannot compare."""
    cached = getattr(model, "_distlock_name_fields", None)
    template = _template(model).template
    if cached is not None and cached[0] == template:
        return cast("list[models.Field[Any, Any]] | None", cached[1])
    meta = model._meta
    owner = _owner(model)
    fields: list[models.Field[Any, Any]] | None = []
    for _, root, _, _ in _formatter.parse(template):
        if root is None:
            continue
        name = root.split(".", 1)[0].split("[", 1)[0]
        if name in ("pk", meta.pk.attname, meta.pk.name):
            continue
        field = next((f for f in meta.concrete_fields if name in (f.name, f.attname)), None)
        if field is None or field.model is not owner or field.primary_key:
            fields = None
            break
        if fields is not None and field not in fields:
            fields.append(field)
    model._distlock_name_fields = (template, fields)  # type: ignore[attr-defined]
    return fields


_M = TypeVar("_M", bound=models.Model)


class FencedQuerySet(models.QuerySet[_M]):
    """QuerySet with claim-on-read (``fenced()``) and all-or-nothing fenced bulk updates (``fenced_update()``)."""

    _distlock_claim: Fence | distlock.Lock | bool | None = False

    def fenced(self, fence: Fence | distlock.Lock | None = None) -> Self:
        """Claim the rows this queryset returns (with each row's lock token) when it is evaluated, then read them."""
        _require_fenced(self.model)
        clone = self.all()
        clone._distlock_claim = fence if fence is not None else True
        return clone

    def _clone(self) -> Self:
        clone = super()._clone()  # type: ignore[misc]
        clone._distlock_claim = self._distlock_claim
        return clone  # type: ignore[no-any-return]

    def __reduce_ex__(self, protocol: Any) -> Any:
        plain = type(self).__dict__.get("_distlock_plain")  # a manager's own queryset class, made fenced
        if plain is None:
            return super().__reduce_ex__(protocol)
        return (_unpickle_fenced, (plain,), self.__getstate__())

    def only(self, *fields: Any) -> Self:
        """Django's ``only()``; ``fence_token`` is always loaded too (a row's token is what its data was read with)."""
        if fields and fields != (None,) and "fence_token" not in fields:
            fields = (*fields, "fence_token")
        return super().only(*fields)

    def defer(self, *fields: Any) -> Self:
        """Django's ``defer()``; ``fence_token`` is never deferred (see :meth:`only`)."""
        if fields == (None,):
            return super().defer(None)
        return super().defer(*(field for field in fields if field != "fence_token"))

    def _fetch_all(self) -> None:
        if self._result_cache is None and self._distlock_claim is not False:
            rows = self._claim_and_read()
            if rows is not None:
                self._result_cache = rows
            super()._fetch_all()
            self._result_cache = [self._claimed(row) for row in self._result_cache or ()]
            return
        super()._fetch_all()

    def iterator(self, chunk_size: int | None = None) -> Iterator[Any]:
        if self._distlock_claim is not False:
            rows = self._claim_and_read()
            if rows is not None:
                lookups = self._prefetch_related_lookups  # type: ignore[attr-defined]
                if lookups:
                    prefetch_related_objects(rows, *lookups)
                return iter([self._claimed(row) for row in rows])
            return (self._claimed(row) for row in super().iterator(chunk_size=chunk_size))
        return super().iterator(chunk_size=chunk_size)

    def _claimed(self, row: Any) -> Any:
        """A row this queryset claimed and read: its token is this instance's own claim (rolled back with its
        transaction, the row carries again a token this instance never read: ``distlock_django._reads``)."""
        if isinstance(row, FencedModel):
            token = read_of(row, self.db)
            if token is not None:
                note_write(row, token, self.db, claim=True)
        return row

    def _fences(self, rows: Iterable[models.Model], fence: Fence | distlock.Lock | None) -> dict[int, list[Any]]:
        by_token: dict[int, list[Any]] = {}
        for row in rows:
            found = fence_of(row, fence)
            if found is None:
                raise LockNotOwned(
                    f"fenced read of {self.model.__name__} pk={row.pk} needs its lock "
                    f"{_lock_name_of(row)!r}, which is not held here",
                    name=_lock_name_of(row),
                )
            by_token.setdefault(found.token, []).append(row.pk)
        return by_token

    def _claim_and_read(self) -> list[_M] | None:
        """Claim the rows; return them if the claim read them too (one statement), else None: read them after.

        The one place that picks how a claim runs (docs/integrations/django.md says when it is one statement).
        """
        claim = self._distlock_claim
        explicit = claim if isinstance(claim, Fence | distlock.Lock) else None
        fence = explicit.fence if isinstance(explicit, distlock.Lock) else explicit or distlock.current_fence()
        statement = None if fence is None else self._claim_statement(fence)
        if statement is not None:
            rows = self._claim_returning(*statement)
            if rows is not None:
                return rows
        self._claim(explicit)
        return None

    def _claim_statement(
        self, fence: Fence
    ) -> tuple[str, Sequence[Any], list[models.Field[Any, Any]], list[tuple[str, bool]]] | None:
        """``UPDATE ... RETURNING`` that claims and reads these rows under ``fence``, the columns it returns and the
        order to sort them in; None when this database or this queryset's shape needs the long way."""
        query = self.query
        meta = self.model._meta
        connection = connections[self.db]
        compiler = query.get_compiler(self.db)
        if (
            not _returning_claims(connection)
            or self._iterable_class is not ModelIterable
            or self._known_related_objects  # type: ignore[attr-defined]
            or query.select_related
            or query.annotations
            or query.extra
            or query.distinct
            or query.combinator
            or query.is_empty()
            or meta.parents
            or meta.is_composite_pk
        ):
            return None
        rows_of_lock = _rows_of_lock(self.model, fence.name, connection)
        ordering = self._python_ordering()
        mask: Mapping[Any, Any] = query.get_select_mask()  # keyed by field
        fields = [f for f in meta.concrete_fields if not mask or f in mask]
        loaded = {f.attname for f in fields}
        if rows_of_lock is None or ordering is None or any(attname not in loaded for attname, _ in ordering):
            return None
        qn = connection.ops.quote_name
        fence_column = cast("models.Field[Any, Any]", _column(self.model, "fence_token")).column
        table, token = qn(meta.db_table), qn(cast(str, fence_column))
        pk = qn(cast(str, meta.pk.column))
        try:
            if query.count_active_tables() > 1:
                # An UPDATE has no joins: the rows are picked in a subquery (its own FROM names the table again).
                rows_sql, rows_params = self.values("pk").query.get_compiler(self.db).as_sql()
                where, where_params = f"{pk} IN ({rows_sql})", list(rows_params)
            else:
                where, where_params = compiler.compile(query.where)
        except EmptyResultSet:
            return None  # nothing to claim (``none()``, ``pk__in=[]``): the long way reads nothing too
        except FullResultSet:
            where, where_params = "", []
        if query.is_sliced and query.count_active_tables() <= 1 and not _one_row_kept(query):
            # Nor a LIMIT: a slice (``get()`` takes one) picks its rows in a subquery, ordered as the queryset.
            order = ", ".join(
                f"{qn(cast(str, cast('models.Field[Any, Any]', _column(self.model, attname)).column))}"
                f"{' DESC' if descending else ''}"
                for attname, descending in ordering
            )
            limit = connection.ops.limit_offset_sql(query.low_mark, query.high_mark)
            where = (
                f"{pk} IN (SELECT {pk} FROM {table}{f' WHERE {where}' if where else ''}"
                f"{f' ORDER BY {order}' if order else ''} {limit})"
            )
        key, key_params = rows_of_lock
        returning = ", ".join(qn(cast(str, f.column)) for f in fields)
        statement = (
            f"UPDATE {table} SET {token} = CASE WHEN {key}{token} <= %s THEN %s END"
            f"{f' WHERE {where}' if where else ''} RETURNING {returning}"
        )
        return statement, [*key_params, fence.token, fence.token, *where_params], fields, ordering

    def _python_ordering(self) -> list[tuple[str, bool]] | None:
        """The queryset's ordering as ``(attname, descending)`` keys, or None where Python could sort otherwise than
        the database (expressions, relations, text, nullable or float fields, ``?``, ``extra()``)."""
        query = self.query
        if query.extra_order_by:
            return None
        ordering = query.order_by or (self.model._meta.ordering if query.default_ordering else None) or ()
        keys = []
        for item in ordering:
            if not isinstance(item, str):
                return None
            field = _column(self.model, item.removeprefix("-"))
            if field is None or field.null or field.is_relation or _field_type(field) not in _SORTABLE_TYPES:
                return None
            keys.append((field.attname, item.startswith("-")))
        return keys

    def _claim_returning(
        self,
        statement: str,
        params: Sequence[Any],
        fields: list[models.Field[Any, Any]],
        ordering: list[tuple[str, bool]],
    ) -> list[_M] | None:
        """Run :meth:`_claim_statement`'s statement: the rows claimed and read, or None if it was refused whole."""
        using = self.db
        connection = connections[using]
        # One statement is atomic on its own. In a transaction it runs in a savepoint: a refused statement aborts a
        # PostgreSQL transaction, and the caller's must stay usable, as the long way's claim leaves it.
        context = contextlib.nullcontext() if connection.get_autocommit() else transaction.atomic(using=using)
        try:
            with context, connection.cursor() as cursor:
                cursor.execute(statement, params)
                values: Iterable[Sequence[Any]] = cursor.fetchall()
        except IntegrityError:
            return None  # a row of another lock or claimed by a newer holder: the long way tells which
        compiler = self.query.get_compiler(using)
        converters = compiler.get_converters([f.get_col(self.model._meta.db_table) for f in fields])
        if converters:
            values = compiler.apply_converters(values, converters)
        names = [f.attname for f in fields]
        rows = [self.model.from_db(using, names, row) for row in values]
        for attname, descending in reversed(ordering):  # RETURNING has no order: sort by the last key first
            rows.sort(key=operator.attrgetter(attname), reverse=descending)
        return rows

    def _claim(self, explicit: Fence | distlock.Lock | None) -> None:
        """The long way: read the rows to name their locks, claim them per token in a transaction."""
        using = self.db
        base = self.model._base_manager.using(using)
        rows = list(base.filter(pk__in=self._pks()))
        by_token = self._fences(rows, explicit)
        with transaction.atomic(using=using):
            for token, pks in by_token.items():
                self._claim_rows(pks, token, token, using, "fenced read")

    def _pks(self) -> Any:
        """This queryset's pks as a subquery, or read first where the database refuses a sliced one (MariaDB and
        MySQL: no ``LIMIT`` in an ``IN`` subquery; ``get()`` slices)."""
        pks = self.values("pk")
        if self.query.is_sliced and not connections[self.db].features.allow_sliced_subqueries_with_in:
            listed: Any = pks.values_list("pk", flat=True)
            listed._distlock_claim = False  # a plain read of the pks, not a claim
            return list(listed)
        return pks

    def _claim_rows(self, pks: list[Any], guard: int, token: int, using: str, action: str) -> None:
        """Set ``fence_token = token`` on rows ``pks`` where it is ``<= guard``: one UPDATE of the table holding
        ``fence_token`` (a parent's, for multi-table inheritance), all of them or ``StaleFenceToken``."""
        guard_rows = _guard(self.model, using)
        if _raw_update(guard_rows.filter(pk__in=pks, fence_token__lte=guard), fence_token=token) != len(pks):
            stale = guard_rows.filter(pk__in=pks, fence_token__gt=guard).values_list("pk", flat=True).first()
            raise _stale(self.model, stale if stale is not None else pks[0], guard, using, action)

    def fenced_update(self, fence: Fence | distlock.Lock | None = None, **values: Any) -> int:
        """Update every row of this queryset under its lock's token, all or nothing; returns the row count.

        Raises ``StaleFenceToken`` (and writes nothing) if any row carries a newer token. Values that change a
        row's lock name (a field the template reads) move it: the lock of its new name is needed too.
        """
        _require_fenced(self.model)
        if "fence_token" in values:
            raise distlock.ConfigurationError("fenced_update() sets fence_token itself; do not pass it")
        using = self.db
        base = self.model._base_manager.using(using)
        multi_table = bool(self.model._meta.parents)
        with transaction.atomic(using=using):
            # Locking reads where the database has them: the rows' lock names are read as stored, and kept so.
            rows = list(base.select_for_update().filter(pk__in=self._pks()))
            by_token = self._fences(rows, fence)
            moves = self._moves(rows, values)
            for token, pks in by_token.items():
                for stored, group in self._by_destination(pks, moves, token).items():
                    if multi_table:
                        # The parent's fence_token first, guarded by the token, before any child row is touched.
                        self._claim_rows(group, token, stored, using, "fenced update")
                        _raw_update(base.filter(pk__in=group), **values)
                        continue
                    updated = _raw_update(
                        base.filter(pk__in=group, fence_token__lte=token), fence_token=stored, **values
                    )
                    if updated != len(group):
                        stale = base.filter(pk__in=group, fence_token__gt=token).values_list("pk", flat=True).first()
                        raise _stale(
                            self.model, stale if stale is not None else group[0], token, using, "fenced update"
                        )
        return len(rows)

    def _moves(self, rows: list[Any], values: Mapping[str, Any]) -> dict[Any, int]:
        """For rows whose lock name ``values`` change: pk -> the token of the destination's lock (held here, else
        ``LockNotOwned``/``UnfencedWrite``). A move needs both locks."""
        names = _name_fields(self.model)
        template_reads = {root for _, root, _, _ in _formatter.parse(_template(self.model).template) if root}
        touched = [key for key in values if names is None or any(key in (f.name, f.attname) for f in names)]
        if names is None:
            touched = [key for key in values if key in template_reads]
        if not touched:
            return {}
        if any(hasattr(values[key], "resolve_expression") for key in touched):
            raise distlock.ConfigurationError(
                f"fenced_update() of {self.model.__name__} sets {touched} (read by its fence_lock) to an expression: "
                "the row's new lock cannot be named before the write; set plain values"
            )
        moves: dict[Any, int] = {}
        for row in rows:
            before = _lock_name_of(row)
            for key in touched:
                setattr(row, key, values[key])
            if _lock_name_of(row) != before:
                destination = fence_of(row)
                if destination is None:
                    raise LockNotOwned(
                        f"fenced update moves {self.model.__name__} pk={row.pk} to lock {_lock_name_of(row)!r}, "
                        "which is not held here: a move needs the locks of both names",
                        name=_lock_name_of(row),
                    )
                moves[row.pk] = destination.token
        return moves

    @staticmethod
    def _by_destination(pks: list[Any], moves: Mapping[Any, int], token: int) -> dict[int, list[Any]]:
        """Rows guarded by ``token`` grouped by the token they are stored with: the larger of the two locks' for a
        move (a row's token never goes down), else ``token``."""
        groups: dict[int, list[Any]] = {}
        for pk in pks:
            groups.setdefault(max(token, moves.get(pk, token)), []).append(pk)
        return groups

    def update(self, **values: Any) -> int:
        """Plain update: allowed outside locks unless ``FENCING`` is strict; use ``fenced_update()`` in locks.

        It leaves ``fence_token`` alone unless told to set it (``update(fence_token=...)`` is the one raw write of
        the token this library lets through; the opt-in database guard refuses lowering it).
        """
        if conf()["FENCING"] == "strict" and issubclass(self.model, FencedModel) and self.exists():
            # Only an UPDATE that matches rows is a write: Django's deletion collector updates SET_NULL relations
            # through a queryset that often matches none, and deleting a parent must not be refused for it.
            self._plain_write("QuerySet.update()", "use fenced_update()")
        return super().update(**values)

    def _plain_write(self, what: str, instead: str) -> None:
        """Strict mode refuses a plain write to a fenced model before anything is written."""
        if conf()["FENCING"] == "strict" and self.model is not None and issubclass(self.model, FencedModel):
            raise UnfencedWrite(f"{what} on fenced model {self.model.__name__} in strict mode; {instead}")

    def bulk_create(self, objs: Iterable[_M], *args: Any, **kwargs: Any) -> list[_M]:
        """Plain inserts (an upsert's update is plain too); refused in strict mode, and never sets ``fence_token``
        on a conflict (``ConfigurationError``). ``save()`` or ``create()`` in the row's lock are fenced."""
        self._plain_write("bulk_create()", "create() or save() each row inside its lock")
        update_fields = kwargs.get("update_fields") or (args[3] if len(args) > 3 else None)
        if update_fields and any(name == "fence_token" for name in update_fields):
            raise distlock.ConfigurationError(
                f"bulk_create(update_conflicts=True) of {self.model.__name__} updates fence_token: a plain write "
                "never changes it (a row's token never goes down)"
            )
        created = super().bulk_create(objs, *args, **kwargs)
        conflicts = kwargs.get("ignore_conflicts") or kwargs.get("update_conflicts") or any(args[1:3])
        if not conflicts:  # each row is as inserted: its token is the object's read
            for obj in created:
                if isinstance(obj, FencedModel):
                    note_write(obj, obj.fence_token, self.db, insert=True)
        return created

    def bulk_update(self, objs: Iterable[_M], fields: Iterable[str], batch_size: int | None = None) -> int:
        """Plain updates; refused in strict mode, and never of ``fence_token`` (``ConfigurationError``)."""
        self._plain_write("bulk_update()", "use fenced_update() or save() each row inside its lock")
        fields = list(fields)
        if "fence_token" in fields:
            raise distlock.ConfigurationError(
                f"bulk_update() of {self.model.__name__} writes fence_token: a plain write never changes it"
            )
        return super().bulk_update(objs, fields, batch_size=batch_size)

    async def aiterator(self, chunk_size: int = 2000) -> AsyncIterator[Any]:
        """As ``iterator()``: a ``fenced()`` queryset claims its rows first (in a thread, as Django's async ORM
        runs its queries), then yields them."""
        if self._distlock_claim is False:
            async for row in super().aiterator(chunk_size=chunk_size):
                yield row
            return
        rows = await sync_to_async(lambda: list(self.iterator(chunk_size=chunk_size)))()
        for row in rows:
            yield row


class FencedManager(models.Manager.from_queryset(FencedQuerySet)):  # type: ignore[misc]
    """The default manager of fenced models: ``Model.objects.filter(...).fenced()`` and ``fenced_update()``."""


class FencedModel(models.Model):
    """Abstract base for rows guarded by a lock; see docs/integrations/django.md ("FencedModel")."""

    fence_token: models.BigIntegerField[int, int] = models.BigIntegerField(default=0, editable=False)

    #: The template of the lock that guards a row, rendered from the row: e.g. ``"account:{pk}"``.
    fence_lock: ClassVar[str] = ""

    objects: ClassVar[FencedManager] = FencedManager()
    # The base manager (Django's own writes go through it: a reverse foreign key's ``add()``, ``on_delete=SET_NULL``,
    # the deletion collector's reads): a fenced queryset, so strict mode refuses its plain writes. Children inherit it
    # (Django takes the first parent's base manager name) unless their Meta names another.
    _distlock_base: ClassVar[FencedManager] = FencedManager()

    class Meta:
        abstract = True
        base_manager_name = "_distlock_base"

    @classmethod
    def from_db(cls, db: str | None, field_names: Collection[str], values: Collection[Any], **kwargs: Any) -> Self:
        """Django's ``from_db()``; notes the token the row was read with (``distlock_django._reads``)."""
        instance = super().from_db(db, field_names, values, **kwargs)
        note_read(instance, instance.fence_token if "fence_token" in field_names else None)
        return instance

    def refresh_from_db(self, using: str | None = None, fields: Any = None, *args: Any, **kwargs: Any) -> None:
        """Django's ``refresh_from_db()``. Reloading all the fields the instance has loaded makes the row's token
        its read; reloading some (``fields``, or a ``from_queryset`` with ``only()``/``defer()``, of which Django
        copies the loaded fields only) keeps the earlier read: the other fields were read with it."""
        loaded = {f.attname for f in self._meta.concrete_fields} - self.get_deferred_fields()
        from_queryset = kwargs.get("from_queryset", args[0] if args else None)
        super().refresh_from_db(using, fields, *args, **kwargs)
        partial = from_queryset is not None and bool(from_queryset.query.deferred_loading[0])
        if (fields is None and not partial) or (fields is not None and loaded <= set(fields)):
            token = None if "fence_token" in self.get_deferred_fields() else self.fence_token
            note_read(self, token)

    def save(self, *args: Any, fence: Fence | distlock.Lock | None = None, **kwargs: Any) -> None:
        """Django's ``save()``, with an update of an existing row fenced in its own UPDATE statement
        (``StaleFenceToken`` when a newer holder claimed it); see :meth:`_do_update`."""
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        if self.pk is None:
            # An insert. The lock name may depend on the pk, which the insert creates: check after the insert.
            self.fence_token = 0
            with transaction.atomic(using=using):
                self._save_with(None, args, kwargs)
                found = fence_of(self, fence, inserting=True)
                if found is not None:
                    _raw_update(_guard(type(self), using).filter(pk=self.pk), fence_token=found.token)
                    self.fence_token = found.token
                note_write(self, self.fence_token, using, insert=True)
            return
        # A pk is set: the row may exist (an instance built from a pk updates it), so only a forced insert is an
        # insert here.
        inserting = bool(kwargs.get("force_insert") or (len(args) > 0 and args[0]))
        found = fence_of(self, fence, inserting=inserting)
        if found is not None and inserting:
            self.fence_token = found.token
        self._save_with(found, args, kwargs)

    def _save_with(self, found: Fence | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._distlock_write = found
        try:
            super().save(*args, **kwargs)
        finally:
            del self._distlock_write

    def _do_update(  # type: ignore[override]  # 5.2 and 6.x signatures
        self,
        base_qs: models.QuerySet[Any],
        using: str,
        pk_val: Any,
        values: list[tuple[Any, Any, Any]],
        update_fields: Iterable[str] | None,
        forced_update: bool,
        *returning: Any,
    ) -> Any:
        """Django's UPDATE of one table of a ``save()``, fenced on the table that holds ``fence_token``.

        Django 5.2 returns whether a row was updated; 6.x passes ``returning_fields`` and returns the rows the UPDATE
        returned (none: not updated). Both are passed through and answered in kind.

        With a lock (``found``): ``UPDATE ... SET ..., fence_token = :t WHERE pk = :pk AND fence_token <= :t AND
        <the template's fields = the values the lock name was rendered from>`` — also with ``update_fields`` that
        name no field of this table, and before a multi-table child's own table (Django saves parents first, in
        one transaction). 0 rows: :meth:`_refused` says why. Without one (``FENCING = "on"``): Django's UPDATE
        without ``fence_token`` — a plain write never changes the row's token.
        """
        write = self.__dict__.get("_distlock_write", _PLAIN)
        owner = _owner(type(self))
        if write is _PLAIN or base_qs.model is not owner:  # not from save() (raw fixtures), or a child's table
            return _django_do_update(self, base_qs, using, pk_val, values, update_fields, forced_update, *returning)
        values = [value for value in values if value[0].attname != "fence_token"]
        read = read_of(self, using, write.token if isinstance(write, Fence) else None)
        if not isinstance(write, Fence):
            # Plain: Django's UPDATE, on the row only while it carries the token this instance's data was read with.
            # Nothing of this table to write (a multi-table child's own fields, ``update_fields`` of another table):
            # the row is still checked, and locked until the save's transaction ends (the child's table is written
            # in it), so no claim lands between the check and that write.
            if read is not None and not values and not _still_read(base_qs, pk_val, read):
                return self._refused_plain(base_qs, using, pk_val, read, returning)
            current = base_qs.filter(**read_filter(read))
            updated = _django_do_update(self, current, using, pk_val, values, update_fields, forced_update, *returning)
            if updated and self._state.db != using:
                note_read(self, None)  # a copy to another database: its row's token there is not known
            return updated or self._refused_plain(base_qs, using, pk_val, read, returning)
        names = _name_fields(type(self)) or []
        conditions = {field.attname: getattr(self, field.attname) for field in names}
        fence_field = owner._meta.get_field("fence_token")
        filtered = base_qs.filter(pk=pk_val, **read_filter(read, write.token), **conditions)
        updated = filtered._update([*values, (fence_field, None, write.token)], *returning)  # type: ignore[attr-defined]
        if updated:
            self.fence_token = write.token
            note_write(self, write.token, using)
            return updated if returning else True
        return self._refused(base_qs, using, pk_val, values, write, read, returning)

    def _refused_plain(
        self, base_qs: models.QuerySet[Any], using: str, pk_val: Any, read: int | None, returning: Any
    ) -> Any:
        """A plain UPDATE matched no row. Of a loaded instance (``read`` known): written, claimed or deleted since it
        was read (``StaleFenceToken``; saved again, a deleted row would come back with the data read before its
        deletion). Otherwise the row is not there: Django inserts it, or raises its own error."""
        if read is not None:
            raise _stale(type(self), pk_val, None, using, "save", read)
        return [] if returning else False

    def _refused(
        self,
        base_qs: models.QuerySet[Any],
        using: str,
        pk_val: Any,
        values: list[tuple[Any, Any, Any]],
        write: Fence,
        read: int | None,
        returning: tuple[Any, ...],
    ) -> Any:
        """A fenced UPDATE matched no row (the accepted path never comes here): the row is gone, was claimed by
        a newer holder, or is stored under another lock name — a move, which needs that lock too."""
        model = type(self)
        with transaction.atomic(using=using):
            stored = model._base_manager.using(using).select_for_update().filter(pk=pk_val).first()
            if stored is None:
                if self._state.adding:
                    self.fence_token = write.token  # built from a pk, no such row: Django inserts it
                    return [] if returning else False
                raise _stale(model, pk_val, write.token, using, "fenced save", read)
            source = _lock_name_of(stored)
            if source == write.name:
                raise _stale(model, pk_val, write.token, using, "fenced save", read)
            # The row is stored under lock ``source``: its holder's token guards it; a moved row keeps the larger.
            held = distlock.fence_for_write(
                source,
                None,
                what=lambda: f"{model.__name__} pk={pk_val} (stored under {source!r}, saved as {write.name!r})",
                strict=conf()["FENCING"] == "strict",
            )
            if held is None:
                raise LockNotOwned(
                    f"saving {model.__name__} pk={pk_val} moves it from lock {source!r} to {write.name!r}: "
                    f"a move needs both locks, and {source!r} is not held here",
                    name=source,
                )
            names = _name_fields(model) or []
            was = {field.attname: getattr(stored, field.attname) for field in names}
            token = max(held.token, write.token)
            fence_field = _owner(model)._meta.get_field("fence_token")
            filtered = base_qs.filter(pk=pk_val, **read_filter(read, held.token), **was)
            updated = filtered._update([*values, (fence_field, None, token)], *returning)  # type: ignore[attr-defined]
            if not updated:
                raise _stale(model, pk_val, held.token, using, "fenced save", read)
        self.fence_token = token
        note_write(self, token, using)
        return updated if returning else True

    def delete(
        self, using: str | None = None, keep_parents: bool = False, *, fence: Fence | distlock.Lock | None = None
    ) -> tuple[int, dict[str, int]]:
        """Delete; fenced: the row is claimed first (``StaleFenceToken`` if a newer holder has), then deleted.

        The claim is made by the ``pre_delete`` receiver every fenced model has (:func:`_claim_before_delete`),
        in Django's deletion transaction, as for rows a ``QuerySet.delete()`` or a cascade deletes.
        """
        found = fence_of(self, fence)
        self._distlock_delete = found
        try:
            return super().delete(using=using, keep_parents=keep_parents)
        finally:
            self.__dict__.pop("_distlock_delete", None)


# Django's own (5.2's signature, or 6.x's with ``returning_fields``; the stubs describe 6.x's).
_django_do_update: Any = cast(Any, models.Model)._do_update
_PLAIN = object()  # no fence decided by save()/delete() for this write


def _claim_before_delete(sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any) -> None:
    """Every deletion of a fenced row (``delete()``, ``QuerySet.delete()``, a cascade) claims it first, in Django's
    deletion transaction, before anything is deleted: with its lock's token (``StaleFenceToken`` if a newer holder
    claimed it), else refused in strict mode (``UnfencedWrite``); plain with no lock in mode "on"."""
    found = instance.__dict__.pop("_distlock_delete", _PLAIN)
    direct = found is not _PLAIN
    if found is _PLAIN:
        found = fence_of(instance)
    guard = _guard(sender, using)
    pk = getattr(instance, _owner(sender)._meta.pk.attname)
    # The token read is checked for the instance delete() was called on. The others were read by Django's collector
    # in the deletion's transaction, a moment ago; one of them may be the same row as another (a multi-table child and
    # its parent share the row holding ``fence_token``), which the first claim has just moved on to ``:t``.
    read = read_of(instance, using, found.token if isinstance(found, Fence) else None) if direct else None
    if isinstance(found, Fence):
        rows = guard.filter(pk=pk, **read_filter(read, found.token))
        if _raw_update(rows, fence_token=found.token) != 1:
            raise _stale(sender, instance.pk, found.token, using, "fenced delete", read)
    # Plain: the row is deleted only while it carries the token the instance was read with (checked and locked in
    # the deletion's transaction, so no claim lands between the check and the DELETE).
    elif direct and read is not None and not _still_read(guard, pk, read) and guard.filter(pk=pk).exists():
        raise _stale(sender, instance.pk, None, using, "delete", read)


_FENCED_QUERYSETS: dict[type[models.QuerySet[Any]], type[FencedQuerySet[Any]]] = {}


def _fenced_queryset_class(queryset_class: type[models.QuerySet[Any]]) -> type[FencedQuerySet[Any]]:
    """``queryset_class`` with ``FencedQuerySet`` in front of it: its own methods, behind the fence's (``update()``,
    ``bulk_*`` refused in strict mode, ``fenced()``). Made once per class. It bears the original's name and module, so
    a manager made with ``as_manager()`` deconstructs into migrations as the original; its querysets pickle as the
    original's class, made fenced again when unpickled (:meth:`FencedQuerySet.__reduce_ex__`)."""
    fenced = _FENCED_QUERYSETS.get(queryset_class)
    if fenced is None:
        namespace = {
            "__module__": queryset_class.__module__,
            "__qualname__": queryset_class.__qualname__,
            "_distlock_plain": queryset_class,
        }
        fenced = type(queryset_class.__name__, (FencedQuerySet, queryset_class), namespace)
        _FENCED_QUERYSETS[queryset_class] = fenced
    return fenced


def _unpickle_fenced(plain: type[models.QuerySet[Any]]) -> FencedQuerySet[Any]:
    fenced = _fenced_queryset_class(plain)
    return fenced.__new__(fenced)


class _FencedOptions(Options):  # type: ignore[type-arg]
    """The ``_meta`` of a concrete fenced model: Django's, with a fenced queryset class on every manager."""

    @cached_property
    def managers(self) -> Any:
        managers = Options.managers.func(self)  # type: ignore[attr-defined]
        for manager in managers:
            if not issubclass(manager._queryset_class, FencedQuerySet):
                manager._queryset_class = _fenced_queryset_class(manager._queryset_class)
        return managers


def _prepare_fenced(sender: type[models.Model], **kwargs: Any) -> None:
    """For each concrete fenced model: the delete claim, and a fenced queryset for every manager (a manager declared
    on Django's ``QuerySet``, ``models.Manager()`` or ``MyQuerySet.as_manager()``, would otherwise write past strict
    mode: its queryset class gets ``FencedQuerySet`` in front)."""
    if not issubclass(sender, FencedModel) or sender._meta.abstract:
        return
    # Every manager gets a fenced queryset: Django's ``_meta.managers`` (copies of the managers declared on the
    # model and its parents, bound to it) are made by this model's own Options class from now on, which puts
    # FencedQuerySet in front of each copy's queryset class; made again whenever the app registry clears its caches.
    meta = cast(Any, sender._meta)
    if not isinstance(meta, _FencedOptions):
        meta.__class__ = _FencedOptions
        meta._expire_cache(reverse=False)  # the copies Django made before this signal
    signals.pre_delete.connect(
        _claim_before_delete, sender=sender, weak=False, dispatch_uid=f"distlock:{sender._meta.label}"
    )


signals.class_prepared.connect(_prepare_fenced, weak=False, dispatch_uid="distlock:fenced-models")
