from __future__ import annotations

import datetime
from typing import ClassVar

from django.db import models

from distlock_django import FencedManager, FencedModel


class Account(FencedModel):
    balance: models.IntegerField[int, int] = models.IntegerField(default=0)
    note: models.CharField[str, str] = models.CharField(max_length=50, default="")

    fence_lock = "account:{pk}"

    class Meta:
        app_label = "testapp"


class Plain(models.Model):
    """Not fenced, but given the fenced manager by mistake."""

    value: models.IntegerField[int, int] = models.IntegerField(default=0)

    objects = FencedManager()

    class Meta:
        app_label = "testapp"


class Entry(FencedModel):
    """Entries of one book share its lock, so one token claims many rows; ordered by posting date by default."""

    book: models.IntegerField[int, int] = models.IntegerField()
    amount: models.IntegerField[int, int] = models.IntegerField(default=0)
    posted: models.DateField[datetime.date, datetime.date] = models.DateField(default=datetime.date(2026, 1, 1))
    memo: models.CharField[str, str] = models.CharField(max_length=50, default="")
    account: models.ForeignKey[Account | None, Account | None] = models.ForeignKey(
        Account, null=True, on_delete=models.CASCADE
    )

    fence_lock = "book:{book}"

    objects: ClassVar[FencedManager] = FencedManager()
    plain: ClassVar[models.Manager[Entry]] = models.Manager()  # Django's own QuerySet, on a model loaded at start

    class Meta:
        app_label = "testapp"
        ordering = ("-posted", "pk")
