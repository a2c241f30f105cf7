"""The example bank's data: fenced accounts, an append-only ledger, and the runs of the reconciliation report.

``Account`` rows are guarded by the lock ``account:{pk}``: every write under that lock carries its fencing token, and
the database refuses a write whose token is older than the row's (``StaleFenceToken``). Reads that precede a write
claim the row first (``Account.objects.filter(pk=pk).fenced()``), so a holder that paused after reading cannot write
over what a newer holder did. ``ReportRun`` rows are written by the singleton report task under its lock
``report:daily``.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from distlock_django import FencedModel


class Account(FencedModel):
    """A balance in whole units; ``fence_token`` (from ``FencedModel``) is the token of the last holder to touch it."""

    owner = models.CharField(max_length=100)
    balance = models.BigIntegerField(default=0)

    fence_lock = "account:{pk}"

    class Meta:
        ordering = ("pk",)

    def __str__(self) -> str:
        return f"{self.owner} (#{self.pk})"


class Movement(models.Model):
    """One change of one account's balance, written in the same transaction as the balance, with the lock's token."""

    class Kind(models.TextChoices):
        OPENING = "opening"
        DEPOSIT = "deposit"
        WITHDRAWAL = "withdrawal"
        TRANSFER_IN = "transfer-in"
        TRANSFER_OUT = "transfer-out"
        INTEREST = "interest"

    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="movements")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    amount = models.BigIntegerField(help_text="signed: what the balance changed by")
    balance_after = models.BigIntegerField()
    fence_token = models.BigIntegerField(help_text="the token of the account lock it was written under")
    created = models.DateTimeField(auto_now_add=True)

    objects: ClassVar[models.Manager[Movement]] = models.Manager()

    class Meta:
        ordering = ("pk",)


class ReportRun(FencedModel):
    """One run of the reconciliation report (``bank.tasks.daily_report``): what it found and when it ran."""

    started = models.DateTimeField()
    finished = models.DateTimeField()
    accounts = models.IntegerField()
    total_balance = models.BigIntegerField()
    ledger_total = models.BigIntegerField(help_text="the sum of all movements, opening balances included")
    task_id = models.CharField(max_length=64, blank=True)

    fence_lock = "report:daily"

    class Meta:
        ordering = ("pk",)

    @property
    def balanced(self) -> bool:
        return self.total_balance == self.ledger_total
