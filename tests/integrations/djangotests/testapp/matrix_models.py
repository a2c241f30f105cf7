"""Models of the write-path matrix (``test_django_write_matrix.py``), registered only where that module is imported.

A plain owner with fenced items (reverse foreign key writes, cascades from a plain parent), a multi-table child of a
fenced parent (``fence_token`` lives in the parent's table) and a row whose lock is named from a column (moves).
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models

from distlock_django import FencedManager, FencedModel


class MxQuerySet(models.QuerySet["MxItem"]):
    """A user's queryset on Django's own ``QuerySet`` (its manager is declared ``MxQuerySet.as_manager()``)."""

    def valued(self) -> MxQuerySet:
        return self.filter(value__gt=0)


class MxOwner(models.Model):
    name: models.CharField[str, str] = models.CharField(max_length=20, default="")

    objects: ClassVar[models.Manager[MxOwner]] = models.Manager()

    class Meta:
        app_label = "testapp"


class MxItem(FencedModel):
    value: models.IntegerField[int, int] = models.IntegerField(default=0)
    owner: models.ForeignKey[MxOwner | None, MxOwner | None] = models.ForeignKey(
        MxOwner, null=True, on_delete=models.CASCADE, related_name="items"
    )
    keeper: models.ForeignKey[MxOwner | None, MxOwner | None] = models.ForeignKey(
        MxOwner, null=True, on_delete=models.SET_NULL, related_name="kept_items"
    )

    fence_lock = "mx:{pk}"

    objects: ClassVar[FencedManager] = FencedManager()
    # Managers a user adds on Django's own querysets: distlock puts FencedQuerySet in front of their queryset class.
    plain: ClassVar[models.Manager[Any]] = models.Manager()
    mine: ClassVar[Any] = MxQuerySet.as_manager()

    class Meta:
        app_label = "testapp"


class MxBase(FencedModel):
    value: models.IntegerField[int, int] = models.IntegerField(default=0)
    owner: models.ForeignKey[MxOwner | None, MxOwner | None] = models.ForeignKey(
        MxOwner, null=True, on_delete=models.CASCADE, related_name="bases"
    )
    keeper: models.ForeignKey[MxOwner | None, MxOwner | None] = models.ForeignKey(
        MxOwner, null=True, on_delete=models.SET_NULL, related_name="kept_bases"
    )

    fence_lock = "mxb:{pk}"

    objects: ClassVar[FencedManager] = FencedManager()
    # Managers a user adds on Django's own querysets: distlock puts FencedQuerySet in front of their queryset class.
    plain: ClassVar[models.Manager[Any]] = models.Manager()
    mine: ClassVar[Any] = MxQuerySet.as_manager()

    class Meta:
        app_label = "testapp"


class MxSub(MxBase):
    """Multi-table inheritance: its own table holds ``extra``; ``fence_token`` and ``value`` are MxBase's."""

    extra: models.IntegerField[int, int] = models.IntegerField(default=0)

    class Meta:
        app_label = "testapp"


class MxShelved(FencedModel):
    """Guarded by the lock of its shelf: changing ``shelf`` moves the row from one lock to another."""

    shelf: models.IntegerField[int, int] = models.IntegerField()
    value: models.IntegerField[int, int] = models.IntegerField(default=0)

    fence_lock = "shelf:{shelf}"

    class Meta:
        app_label = "testapp"
