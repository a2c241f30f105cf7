"""Views the tests drive over HTTP (test client, ASGI client and a real server)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from django.db import router, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views import View

import distlock
from distlock_django import distributed_lock, get_client

from .models import Account

#: Events a test uses to hold a view inside its lock (keyed by a name in the URL).
GATES: dict[str, threading.Event] = {}
ENTERED: dict[str, threading.Event] = {}


@distributed_lock("account:{pk}")
def increment(request: HttpRequest, pk: int) -> HttpResponse:
    account = Account.objects.filter(pk=pk).fenced().get()
    account.balance += 1
    account.save()
    return JsonResponse({"balance": account.balance, "token": distlock.current_token()})


#: What on-commit probes saw: was the view's lock still held when its transaction committed?
PROBES: list[bool] = []


@distributed_lock("account:{pk}")
def probed_increment(request: HttpRequest, pk: int) -> HttpResponse:
    account = Account.objects.filter(pk=pk).fenced().get()
    account.balance += 1
    account.save()
    name = distlock.current_lock()
    assert name is not None
    transaction.on_commit(
        lambda: PROBES.append(get_client().holder(name.name) is not None), using=router.db_for_write(Account)
    )
    return HttpResponse("ok")


@distributed_lock("gate:{name}", timeout=0)
def gated(request: HttpRequest, name: str) -> HttpResponse:
    ENTERED.setdefault(name, threading.Event()).set()
    GATES.setdefault(name, threading.Event()).wait(30)
    return HttpResponse("done")


@distributed_lock("async:{pk}")
async def async_view(request: HttpRequest, pk: int) -> HttpResponse:
    lock = distlock.current_lock()
    assert lock is not None
    return JsonResponse({"lock": lock.name, "held": lock.owned()})


@distributed_lock("cbv:{pk}")
class AccountView(View):
    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        lock = distlock.current_lock()
        assert lock is not None
        return JsonResponse({"lock": lock.name, "family": lock.family})


def stream(request: HttpRequest, name: str) -> StreamingHttpResponse:
    def chunks() -> Iterator[bytes]:
        for i in range(3):
            yield f"chunk {i}\n".encode()

    return StreamingHttpResponse(chunks())


def middleware_plain(request: HttpRequest, name: str) -> HttpResponse:
    lock = distlock.current_lock()
    return JsonResponse({"lock": None if lock is None else lock.name})


@distributed_lock("account:{pk}")
def stale_write(request: HttpRequest, pk: int) -> HttpResponse:
    account = Account.objects.get(pk=pk)
    account.save(fence=distlock.Fence(f"dj:account:{pk}", 1))  # an old token of the right lock
    return HttpResponse("written")


def middleware_stale_write(request: HttpRequest, name: str) -> HttpResponse:
    """Under the middleware's lock (rule ``^/mw/``): a write with an old token of the row's lock is refused."""
    account = Account.objects.get(pk=int(name))
    account.save(fence=distlock.Fence(f"dj:account:{name}", 1))
    return HttpResponse("written")


def atomic_increment(pk: int) -> int:
    """Increment under the lock inside a transaction the caller opened (release must wait for its commit)."""

    @distributed_lock("account:{pk}")
    def inner(pk: int) -> int:
        account = Account.objects.filter(pk=pk).fenced().get()
        account.balance += 1
        account.save()
        return int(account.balance)

    with transaction.atomic(using=router.db_for_write(Account)):
        return inner(pk)
