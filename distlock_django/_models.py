"""``FencedModel``: rows the database itself protects from stale lock holders.

A fenced model has a ``fence_token`` column and declares the lock that guards each row::

    class Account(FencedModel):
        balance = models.IntegerField()
        fence_lock = "account:{pk}"          # rendered from the row; DISTLOCK["KEY_PREFIX"] is prepended

Inside that lock (``@distributed_lock("account:{pk}")``, ``with distributed_lock(...)``, or any distlock lock of that
name), writes carry the lock's fencing token and the database refuses them once a newer holder has touched the row:

- ``Account.objects.filter(...).fenced()`` — like ``select_for_update()``: when evaluated it first *claims* the
  rows (``UPDATE ... SET fence_token = :t WHERE pk IN (...) AND fence_token <= :t``) and then reads them.
  Claiming on read is what stops lost updates: a write-only guard lets a paused holder that read before a newer
  holder write after it, and both writes pass. Once the newer holder has claimed, the old one's write is refused.
- ``save()`` updates with ``WHERE fence_token <= :t`` and stores ``:t``; ``delete()`` claims, then deletes;
  ``create()`` stores ``:t``. ``QuerySet.fenced_update(**values)`` updates many rows, each under its own lock's
  token, all or nothing.
- 0 rows where 1 was expected raise ``StaleFenceToken`` (with the token, the row and the newer token found); the
  transaction of a bulk update is rolled back, so no row is skipped silently.

The token is found in the current context: the innermost held lock *whose name is the row's lock name*. A fence
of another lock, passed explicitly (``save(fence=...)``), or the only locks held being others, raises
``LockNotOwned``: a busier lock's token would pass the check and defeat the fence. Outside any lock, writes are
plain (``DISTLOCK["FENCING"] = "on"``) or refused with ``UnfencedWrite`` (``"strict"``).

Transactions: a claim made inside ``transaction.atomic()`` holds the row lock until commit, so a holder stalled
mid-transaction stalls the next holder at the database rather than at the lock service — still safe, not live until
the stalled connection ends. Bound it with PostgreSQL's ``idle_in_transaction_session_timeout`` and statement
timeouts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar, Self, TypeVar

from django.db import models, router, transaction
from django.db.models import signals

import distlock
from distlock import Fence, KeyTemplate, LockNotOwned, StaleFenceToken, UnfencedWrite

from ._conf import conf, lock_name

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


def _stale(model: type[models.Model], pk: Any, token: int, using: str, action: str) -> StaleFenceToken:
    current = model._base_manager.using(using).filter(pk=pk).values_list("fence_token", flat=True).first()
    message = distlock.fence_refused(
        f"{action} of {model.__name__} pk={pk}", token, current, family=_template(model).template
    )
    return StaleFenceToken(message, token=token, row=pk, current=current)


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

    def _fetch_all(self) -> None:
        if self._result_cache is None and self._distlock_claim is not False:
            self._claim()
        super()._fetch_all()

    def iterator(self, chunk_size: int | None = None) -> Iterator[Any]:
        if self._distlock_claim is not False:
            self._claim()
        return super().iterator(chunk_size=chunk_size)

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

    def _claim(self) -> None:
        claim = self._distlock_claim
        explicit = claim if isinstance(claim, Fence | distlock.Lock) else None
        using = self.db
        base = self.model._base_manager.using(using)
        rows = list(base.filter(pk__in=self.values("pk")))
        by_token = self._fences(rows, explicit)
        with transaction.atomic(using=using):
            for token, pks in by_token.items():
                claimed = base.filter(pk__in=pks, fence_token__lte=token).update(fence_token=token)
                if claimed != len(pks):
                    stale = base.filter(pk__in=pks, fence_token__gt=token).values_list("pk", flat=True).first()
                    raise _stale(self.model, stale if stale is not None else pks[0], token, using, "fenced read")

    def fenced_update(self, fence: Fence | distlock.Lock | None = None, **values: Any) -> int:
        """Update every row of this queryset under its lock's token, all or nothing; returns the row count.

        Raises ``StaleFenceToken`` (and writes nothing) if any row carries a newer token.
        """
        _require_fenced(self.model)
        if "fence_token" in values:
            raise distlock.ConfigurationError("fenced_update() sets fence_token itself; do not pass it")
        using = self.db
        base = self.model._base_manager.using(using)
        with transaction.atomic(using=using):
            rows = list(base.filter(pk__in=self.values("pk")))
            by_token = self._fences(rows, fence)
            for token, pks in by_token.items():
                updated = base.filter(pk__in=pks, fence_token__lte=token).update(fence_token=token, **values)
                if updated != len(pks):
                    stale = base.filter(pk__in=pks, fence_token__gt=token).values_list("pk", flat=True).first()
                    raise _stale(self.model, stale if stale is not None else pks[0], token, using, "fenced update")
        return len(rows)

    def update(self, **values: Any) -> int:
        """Plain update: allowed outside locks unless ``FENCING`` is strict; use ``fenced_update()`` in locks."""
        if conf()["FENCING"] == "strict" and self.model is not None and issubclass(self.model, FencedModel):
            raise UnfencedWrite(
                f"QuerySet.update() on fenced model {self.model.__name__} in strict mode; use fenced_update()"
            )
        return super().update(**values)


class FencedManager(models.Manager.from_queryset(FencedQuerySet)):  # type: ignore[misc]
    """The default manager of fenced models: ``Model.objects.filter(...).fenced()`` and ``fenced_update()``."""


class FencedModel(models.Model):
    """Abstract base for rows guarded by a lock; see the module docstring."""

    fence_token: models.BigIntegerField[int, int] = models.BigIntegerField(default=0, editable=False)

    #: The template of the lock that guards a row, rendered from the row: e.g. ``"account:{pk}"``.
    fence_lock: ClassVar[str] = ""

    objects: ClassVar[FencedManager] = FencedManager()

    class Meta:
        abstract = True

    def save(self, *args: Any, fence: Fence | distlock.Lock | None = None, **kwargs: Any) -> None:
        """Save; an update of an existing row is fenced (``StaleFenceToken`` when a newer holder claimed it)."""
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        adding = self._state.adding or self.pk is None
        found = None if adding and self.pk is None else fence_of(self, fence, inserting=adding)
        if adding:
            if found is None and self.pk is None:
                # The lock name may depend on the pk, which an insert creates: check after the insert.
                self.fence_token = 0
                with transaction.atomic(using=using):
                    super().save(*args, **kwargs)
                    found = fence_of(self, fence, inserting=True)
                    if found is not None:
                        type(self)._base_manager.using(using).filter(pk=self.pk).update(fence_token=found.token)
                        self.fence_token = found.token
                return
            self.fence_token = found.token if found is not None else 0
            super().save(*args, **kwargs)
            return
        if found is None:
            super().save(*args, **kwargs)
            return
        self._fenced_update(found.token, using, kwargs.get("update_fields"))

    def _fenced_update(self, token: int, using: str, update_fields: Iterable[str] | None) -> None:
        model = type(self)
        meta = self._meta
        names = None if update_fields is None else set(update_fields)
        signals.pre_save.send(
            sender=model.__mro__[0], instance=self, raw=False, using=using, update_fields=update_fields
        )
        values = {
            field.attname: field.pre_save(self, False)
            for field in meta.concrete_fields
            if not field.primary_key
            and field.attname != "fence_token"
            and (names is None or field.name in names or field.attname in names)
        }
        # As Django's own save_base(): one UPDATE needs no transaction of its own (a stale one matches no row and
        # writes nothing); an inherited model's UPDATE spans its parents' tables, and those run in one transaction.
        # Signals are sent outside it, as Django sends them.
        if meta.parents:
            context: contextlib.AbstractContextManager[object] = transaction.atomic(using=using, savepoint=False)
        else:
            context = transaction.mark_for_rollback_on_error(using=using)
        with context:
            updated = model._base_manager.using(using).filter(pk=self.pk, fence_token__lte=token)
            if updated.update(fence_token=token, **values) != 1:
                raise _stale(model, self.pk, token, using, "fenced save")
        self.fence_token = token
        self._state.adding = False
        self._state.db = using
        signals.post_save.send(
            sender=model.__mro__[0],
            instance=self,
            created=False,
            update_fields=frozenset(update_fields) if update_fields is not None else None,
            raw=False,
            using=using,
        )

    def delete(
        self, using: str | None = None, keep_parents: bool = False, *, fence: Fence | distlock.Lock | None = None
    ) -> tuple[int, dict[str, int]]:
        """Delete; fenced: the row is claimed first (``StaleFenceToken`` if a newer holder has), then deleted."""
        found = fence_of(self, fence)
        if found is None:
            return super().delete(using=using, keep_parents=keep_parents)
        alias = using or router.db_for_write(type(self), instance=self)
        with transaction.atomic(using=alias):
            base = type(self)._base_manager.using(alias)
            if base.filter(pk=self.pk, fence_token__lte=found.token).update(fence_token=found.token) != 1:
                raise _stale(type(self), self.pk, found.token, alias, "fenced delete")
            return super().delete(using=alias, keep_parents=keep_parents)
