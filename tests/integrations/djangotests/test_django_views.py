"""@distributed_lock and the middleware on real requests: test client, ASGI client, and a real HTTP server."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from _support import wait_until
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, RequestFactory
from djangotests.httpclient import post_many
from djangotests.testapp import views
from djangotests.testapp.models import Account
from pytest_django.fixtures import Settings
from pytest_django.live_server_helper import LiveServer

import distlock
from distlock_django import conf, distributed_lock, get_client, lock_name

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])


def _held(name: str) -> bool:
    return get_client().holder(lock_name(name)) is not None


def test_two_simultaneous_requests_one_200_one_423(db_alias: str, django_client: Client, settings: Settings) -> None:
    gate = views.GATES.setdefault("g1", threading.Event())
    entered = views.ENTERED.setdefault("g1", threading.Event())
    gate.clear()
    entered.clear()
    first: list[Any] = []
    thread = threading.Thread(target=lambda: first.append(Client().get("/gate/g1/")))
    thread.start()
    try:
        assert entered.wait(10), "the first request never got the lock"
        second = django_client.get("/gate/g1/")
        assert second.status_code == 423
        assert second["Retry-After"] == str(conf()["RETRY_AFTER"])
        body = second.content.decode()
        assert "dj:gate" not in body
        assert "token" not in body.lower()
    finally:
        gate.set()
        thread.join(10)
    assert first[0].status_code == 200
    settings.DISTLOCK = {**conf(), "CONTENTION_STATUS": 409}
    gate.clear()
    entered.clear()
    thread = threading.Thread(target=lambda: Client().get("/gate/g1/"))
    thread.start()
    try:
        assert entered.wait(10)
        assert django_client.get("/gate/g1/").status_code == 409
    finally:
        gate.set()
        thread.join(10)


def test_a_stale_write_in_a_view_answers_409(db_alias: str, django_client: Client) -> None:
    account = Account.objects.create(balance=1)
    Account.objects.filter(pk=account.pk).update(fence_token=2**62)  # a newer holder has claimed the row
    response = django_client.post(f"/stale/{account.pk}/")
    assert response.status_code == 409
    assert Account.objects.get().balance == 1
    assert not _held(f"account:{account.pk}")


def test_a_stale_write_under_the_middleware_answers_409_as_under_the_decorator(
    db_alias: str, django_client: Client
) -> None:
    account = Account.objects.create(balance=1)
    Account.objects.filter(pk=account.pk).update(fence_token=2**62)  # a newer holder has claimed the row
    response = django_client.post(f"/mw/stale/{account.pk}/")
    assert response.status_code == 409
    assert response.content == django_client.post(f"/stale/{account.pk}/").content  # the decorator's answer
    assert Account.objects.get().balance == 1
    assert not _held(f"mw:{account.pk}")


def test_async_view_under_asgi_and_class_based_view(
    db_alias: str, django_client: Client, async_client: AsyncClient
) -> None:
    async def call() -> Any:
        return await async_client.get("/async/7/")

    response = asyncio.run(call())
    assert response.status_code == 200
    assert response.json() == {"lock": "dj:async:7", "held": True}
    assert not _held("async:7")
    response = django_client.post("/cbv/8/")
    assert response.status_code == 200
    assert response.json() == {"lock": "dj:cbv:8", "family": "cbv:{pk}"}  # the metrics' label: the template
    assert not _held("cbv:8")


def test_middleware_holds_the_lock_until_the_last_chunk_is_sent(db_alias: str, django_client: Client) -> None:
    response: Any = django_client.get("/stream/s1/")
    assert response.status_code == 200
    chunks = iter(response.streaming_content)
    assert next(chunks) == b"chunk 0\n"
    assert _held("stream:s1"), "the lock was released before the response was sent"
    assert list(chunks) == [b"chunk 1\n", b"chunk 2\n"]
    response.close()
    assert not _held("stream:s1")


def test_middleware_rules_choose_views_and_methods(db_alias: str, django_client: Client) -> None:
    assert django_client.post("/mw/x/").json() == {"lock": "dj:mw:x"}
    assert django_client.get("/mw/x/").json() == {"lock": None}  # default methods: unsafe ones only
    assert not _held("mw:x")


def test_release_waits_for_commit(db_alias: str) -> None:
    """A second holder never reads what the first had not committed when it left the decorated function."""
    account = Account.objects.create(balance=0)
    inner_done = threading.Event()
    commit = threading.Event()
    second: list[int] = []

    @distributed_lock("account:{pk}")
    def write(pk: int) -> None:
        row = Account.objects.filter(pk=pk).fenced().get()
        row.balance = 1
        row.save()

    def first_holder() -> None:
        with transaction.atomic(using=db_alias):
            write(account.pk)
            inner_done.set()
            commit.wait(10)
        connections.close_all()

    @distributed_lock("account:{pk}")
    def read(pk: int) -> None:
        second.append(Account.objects.get(pk=pk).balance)

    def second_holder() -> None:
        read(account.pk)
        connections.close_all()

    a = threading.Thread(target=first_holder)
    a.start()
    assert inner_done.wait(10)
    b = threading.Thread(target=second_holder)
    b.start()
    wait_until(lambda: get_client().holder(lock_name(f"account:{account.pk}")).waiters == 1, 10, "b to queue")  # type: ignore[union-attr]
    assert second == [], "the lock was released before the transaction committed"
    commit.set()
    a.join(10)
    b.join(10)
    assert second == [1]


def test_release_after_rollback(db_alias: str) -> None:
    @distributed_lock("rollback:{n}")
    def work(n: int) -> None:
        pass

    held_inside: list[bool] = []

    def transaction_that_fails() -> None:
        with transaction.atomic(using=db_alias):
            work(1)
            held_inside.append(_held("rollback:1"))
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        transaction_that_fails()
    assert held_inside == [True], "the lock was released before the transaction ended"
    assert not _held("rollback:1"), "a rolled-back transaction kept the lock"


def test_decorator_bad_input() -> None:
    with pytest.raises(distlock.InvalidKeyTemplate, match="has no parameter"):

        @distributed_lock("order:{order_id}")
        def wrong(request: HttpRequest, pk: int) -> None:
            pass

    with pytest.raises(distlock.InvalidKeyTemplate, match="malformed"):
        distributed_lock("order:{")

    @distributed_lock("order:{order_id}")
    def flexible(**kwargs: Any) -> None:
        pass

    with pytest.raises(distlock.InvalidKeyTemplate, match="needs 'order_id'"):
        flexible(pk=1)
    with pytest.raises(distlock.InvalidKeyTemplate, match="has fields"), distributed_lock("order:{x}"):
        pass


def test_decorator_on_plain_functions_and_as_context_manager(django_servers: dict[str, str]) -> None:
    @distributed_lock("job:{name}", timeout=0)
    def job(name: str) -> int:
        return distlock.current_token() or 0

    assert job("a") > 0
    with distributed_lock("job:a") as lock:
        assert lock.name == "dj:job:a"
        with pytest.raises(distlock.LockNotAcquired):
            job("a")
    assert not _held("job:a")


def test_decorator_with_a_limit_lets_that_many_calls_hold_at_once(django_servers: dict[str, str]) -> None:
    with pytest.raises(distlock.ConfigurationError, match="limit"):
        distributed_lock("report:{name}", limit=0)
    barrier = threading.Barrier(2, timeout=10)
    tokens: list[int] = []

    @distributed_lock("report:{name}", limit=2, timeout=0)
    def report(name: str) -> None:
        barrier.wait()  # meets the other holder: both hold at once, or this times out
        barrier.wait()  # ... until it has tried a third call
        tokens.append(distlock.current_token() or 0)

    @distributed_lock("report:{name}", limit=2, timeout=0)
    def third(name: str) -> None:
        pass

    first = threading.Thread(target=report, args=("daily",))
    first.start()
    with distributed_lock("report:daily", limit=2, timeout=0) as lock:
        barrier.wait()
        with pytest.raises(distlock.LockNotAcquired):
            third("daily")
        barrier.wait()
        first.join(20)
        assert len(tokens) == 1 and tokens[0] > 0 and tokens[0] != lock.token
    assert not _held("report:daily")


# -- a real server --------------------------------------------------------------------------------------------


def test_eight_processes_increment_a_balance_through_a_real_server_exactly(
    db_alias: str, live_server: LiveServer
) -> None:
    """pytest-django's live server (threaded, in this process) on the test's database, eight client processes."""
    address = urlsplit(live_server.url).netloc
    account = Account.objects.create(balance=0)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(8)
    results = context.Queue()
    clients = [
        context.Process(target=post_many, args=(address, f"/increment/{account.pk}/", 50, barrier, results))
        for _ in range(8)
    ]
    started = time.monotonic()
    for process in clients:
        process.start()
    codes = [code for _ in clients for code in results.get(timeout=120)]
    for process in clients:
        process.join(30)
    assert codes == [200] * 400
    assert Account.objects.get(pk=account.pk).balance == 400
    print(f"400 locked increments over HTTP in {time.monotonic() - started:.1f} s")


def test_atomic_requests_release_after_the_request_commits(db_alias: str, django_client: Client) -> None:
    account = Account.objects.create(balance=0)
    settings_dict = connections[db_alias].settings_dict
    settings_dict["ATOMIC_REQUESTS"] = True
    views.PROBES.clear()
    try:
        response = django_client.post(f"/probed/{account.pk}/")
    finally:
        settings_dict["ATOMIC_REQUESTS"] = False
    assert response.status_code == 200
    assert views.PROBES == [True], "the lock was released before ATOMIC_REQUESTS committed"
    assert Account.objects.get(pk=account.pk).balance == 1
    assert not _held(f"account:{account.pk}")


def test_an_async_view_with_stop_on_lost_is_stopped_with_409_and_a_sync_one_is_refused(
    django_servers: dict[str, str],
) -> None:
    @distributed_lock("stop:{pk}", ttl=1, stop_on_lost=True)
    async def view(request: HttpRequest, pk: int) -> HttpResponse:
        get_client().force_release(lock_name(f"stop:{pk}"), distlock.current_token() or 0)
        await asyncio.sleep(30)
        return HttpResponse("finished")

    started = time.monotonic()
    response = asyncio.run(view(RequestFactory().post("/stop/1"), pk=1))
    assert response.status_code == conf()["CONFLICT_STATUS"] and time.monotonic() - started < 10
    with pytest.raises(distlock.ConfigurationError, match="only an async view or function can be stopped"):

        @distributed_lock("stop:{pk}", stop_on_lost=True)
        def sync_view(request: HttpRequest, pk: int) -> None:
            pass

    with pytest.raises(distlock.ConfigurationError, match=r"A sync function in the main thread .* lock\.scope\(\)"):

        @distributed_lock("stop:{pk}", stop_on_lost=True)
        def sync_job(pk: int) -> None:
            pass

    with pytest.raises(distlock.ConfigurationError, match=r"enter the lock's scope yourself"):
        with distributed_lock("stop:cm", stop_on_lost=True):
            pass
