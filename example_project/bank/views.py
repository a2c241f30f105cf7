"""The bank's JSON API: deposits, withdrawals and transfers under per-account locks, with fenced writes.

Three ways to take the lock, one per view, so the example shows each:

- ``deposit``: the ``@distributed_lock("account:{pk}")`` decorator (the key comes from the URL's ``pk``); a busy
  account is waited for up to ``DISTLOCK["TIMEOUT"]``, then answered with 423 and ``Retry-After``;
- ``withdraw``: no decorator — ``DistributedLockMiddleware`` locks it by the rule in ``DISTLOCK["RULES"]``, with
  ``timeout: 0``, so a withdrawal from a busy account is answered with 423 at once;
- ``transfer``: two accounts, two ``with distributed_lock(...)`` blocks taken in the order of their primary keys
  (a fixed order, so two opposite transfers cannot each hold one account and wait for the other forever).

Every view claims the rows it is about to change (``.fenced()``) inside a transaction, then saves them: the save is
refused with ``StaleFenceToken`` if a newer lock holder touched the row meanwhile (this holder paused past its lease),
and the decorator and the middleware answer 409. Each successful answer lists its writes (account, token, amount,
balance after), which the demo uses to check that no update was lost.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

import distlock
from distlock_django import conf, distributed_lock

from .models import Account, Movement, ReportRun
from .tasks import daily_report


class BadRequest(ValueError):
    """The request's body is not what the view needs."""


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError as e:
        raise BadRequest(f"the body is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _positive_int(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadRequest(f"{name!r} must be a positive whole number, not {value!r}")
    return value


def _claim(pk: int) -> Account:
    """Claim account ``pk`` with the held lock's token, then read it (404 if there is no such account)."""
    account: Account | None = Account.objects.filter(pk=pk).fenced().first()
    if account is None:
        raise Http404(f"no account {pk}")
    return account


def _apply(account: Account, kind: Movement.Kind, amount: int) -> dict[str, int]:
    """Change a claimed account's balance by ``amount`` (a fenced save), log the movement; return the write."""
    account.balance += amount
    account.save()  # UPDATE ... SET fence_token = :t WHERE pk = :pk AND fence_token <= :t; 0 rows -> StaleFenceToken
    Movement.objects.create(
        account=account, kind=kind, amount=amount, balance_after=account.balance, fence_token=account.fence_token
    )
    return {"account": account.pk, "token": account.fence_token, "amount": amount, "balance": account.balance}


def _bad_request(error: BadRequest) -> JsonResponse:
    return JsonResponse({"error": str(error)}, status=400)


def _insufficient(account: Account, amount: int) -> JsonResponse:
    return JsonResponse({"error": f"account {account.pk} has {account.balance}, less than {amount}"}, status=409)


@csrf_exempt
@require_POST
@distributed_lock("account:{pk}")
def deposit(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        amount = _positive_int(_body(request), "amount")
    except BadRequest as e:
        return _bad_request(e)
    with transaction.atomic():
        account = _claim(pk)  # claim the row with our token, then read it
        write = _apply(account, Movement.Kind.DEPOSIT, amount)
    return JsonResponse({"writes": [write]})


@csrf_exempt
@require_POST
def withdraw(request: HttpRequest, pk: int) -> HttpResponse:
    # Locked by DistributedLockMiddleware (DISTLOCK["RULES"]): the lock "account:{pk}" is held here.
    try:
        amount = _positive_int(_body(request), "amount")
    except BadRequest as e:
        return _bad_request(e)
    with transaction.atomic():
        account = _claim(pk)
        if account.balance < amount:
            return _insufficient(account, amount)
        write = _apply(account, Movement.Kind.WITHDRAWAL, -amount)
    return JsonResponse({"writes": [write]})


@csrf_exempt
@require_POST
def transfer(request: HttpRequest) -> HttpResponse:
    try:
        body = _body(request)
        source, target, amount = (_positive_int(body, name) for name in ("from", "to", "amount"))
        if source == target:
            raise BadRequest("'from' and 'to' must be different accounts")
    except BadRequest as e:
        return _bad_request(e)
    first, second = sorted((source, target))
    try:
        # Locks in primary-key order, then the transaction: it commits before the locks are released.
        with distributed_lock(f"account:{first}"), distributed_lock(f"account:{second}"), transaction.atomic():
            accounts = {a.pk: a for a in Account.objects.filter(pk__in=(source, target)).fenced()}
            if len(accounts) != 2:
                return JsonResponse({"error": "no such account"}, status=404)
            if accounts[source].balance < amount:
                return _insufficient(accounts[source], amount)
            writes = [
                _apply(accounts[source], Movement.Kind.TRANSFER_OUT, -amount),
                _apply(accounts[target], Movement.Kind.TRANSFER_IN, amount),
            ]
    except distlock.LockNotAcquired:
        response = JsonResponse({"error": "an account of this transfer is busy; retry shortly"}, status=423)
        response["Retry-After"] = str(conf()["RETRY_AFTER"])
        return response
    except (distlock.StaleFenceToken, distlock.LockLost) as e:
        return JsonResponse({"error": f"refused: {e}"}, status=409)
    return JsonResponse({"writes": writes})


@require_GET
def accounts(request: HttpRequest) -> HttpResponse:
    rows = Account.objects.values("id", "owner", "balance", "fence_token")
    return JsonResponse({"accounts": list(rows)})


@csrf_exempt
@require_POST
def run_report(request: HttpRequest) -> HttpResponse:
    """Enqueue the reconciliation report (a singleton task: duplicates that meet a running report are skipped)."""
    result = daily_report.delay()
    return JsonResponse({"task_id": result.id}, status=202)


@require_GET
def task_result(request: HttpRequest, task_id: str) -> HttpResponse:
    result = daily_report.AsyncResult(task_id)
    state = result.state
    value = result.result if state == "SUCCESS" else None
    error = repr(result.result) if state == "FAILURE" else None
    return JsonResponse({"state": state, "result": value, "error": error})


@require_GET
def reports(request: HttpRequest) -> HttpResponse:
    runs = [
        {
            "task_id": run.task_id,
            "token": run.fence_token,
            "started": run.started.timestamp(),
            "finished": run.finished.timestamp(),
            "total_balance": run.total_balance,
            "ledger_total": run.ledger_total,
            "balanced": run.balanced,
        }
        for run in ReportRun.objects.all()
    ]
    return JsonResponse({"runs": runs})


@require_GET
def health(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"run": getattr(settings, "BANK_RUN_ID", "")})
