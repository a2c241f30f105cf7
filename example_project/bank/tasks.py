"""The reconciliation report: a Celery singleton task (``distlock.celery.SingletonTask``) on the lock ``report:daily``.

It is the kind of job a scheduler (celery beat, cron) and impatient staff both trigger: many enqueues, and two runs
at once would double the work and write two reports. With ``lock_on="run"`` (the default) a worker takes the lock
before the body runs; a copy that finds it held is a duplicate and is skipped (returns None). The lease is kept alive
while the report runs; a worker killed mid-run frees the lock within ``lock_ttl``. The report row is written with the
lock's fencing token (``ReportRun`` is fenced by ``report:daily``): a run that lost its lock (its worker paused past
the lease) cannot write after a newer run.
"""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from distlock.celery import SingletonTask

from .models import Account, Movement, ReportRun

#: How long the report's "heavy" part takes: long enough for enqueues made at once to meet a running report.
REPORT_SECONDS = 1.0


@shared_task(base=SingletonTask, bind=True, unique_on="report:daily", lock_ttl=10)
def daily_report(self: SingletonTask) -> dict[str, Any]:
    """Check that the balances add up to the ledger; returns what it found (None when skipped as a duplicate)."""
    started = timezone.now()
    with transaction.atomic():  # one snapshot of balances and ledger
        accounts = Account.objects.count()
        total = Account.objects.aggregate(total=Sum("balance"))["total"] or 0
        ledger = Movement.objects.aggregate(total=Sum("amount"))["total"] or 0
    time.sleep(REPORT_SECONDS)  # stands in for the expensive part of a real report
    self.lock.ensure_held()  # cheap local check; the fenced create() below is what makes the write safe
    run = ReportRun.objects.create(
        started=started,
        finished=timezone.now(),
        accounts=accounts,
        total_balance=total,
        ledger_total=ledger,
        task_id=self.request.id or "",
    )
    return {"token": run.fence_token, "balanced": run.balanced, "total_balance": total}
