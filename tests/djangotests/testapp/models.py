from __future__ import annotations

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
