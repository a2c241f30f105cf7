"""Locks inside Django's ``TestCase`` and pytest-django's ``db`` fixture, whose transactions never commit.

Those wrap each test in atomic blocks that are rolled back at its end. A lock must not wait for that commit: it is
released at its own end, or at the end of the test's own ``atomic()`` block (committed or rolled back) around it.
The same tests run as ``TestCase`` methods (two wrapping blocks: the class's and the test's) and as pytest functions
on ``db`` (one block), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest
from django.db import connections, transaction
from django.test import Client, TestCase
from djangotests.testapp import router, views
from djangotests.testapp.models import Account

from distlock_django import distributed_lock, get_client, lock_name


def _held(name: str) -> bool:
    return get_client().holder(lock_name(name)) is not None


def two_requests_both_answer_200(client: Client) -> None:
    account = Account.objects.create(balance=0)
    first = client.post(f"/increment/{account.pk}/")
    second = client.post(f"/increment/{account.pk}/")  # waited TIMEOUT and answered 423 when release awaited commit
    assert (first.status_code, second.status_code) == (200, 200)
    assert second.json()["balance"] == 2
    assert second.json()["token"] > first.json()["token"]
    assert not _held(f"account:{account.pk}")


def a_request_racing_a_held_lock_answers_423(client: Client, name: str) -> None:
    gate = views.GATES.setdefault(name, threading.Event())
    entered = views.ENTERED.setdefault(name, threading.Event())
    gate.clear()
    entered.clear()
    first: list[Any] = []
    thread = threading.Thread(target=lambda: first.append(Client().get(f"/gate/{name}/")))
    thread.start()
    try:
        assert entered.wait(10), "the first request never got the lock"
        assert client.get(f"/gate/{name}/").status_code == 423
    finally:
        gate.set()
        thread.join(10)
    assert first[0].status_code == 200
    with get_client().lock(lock_name(f"gate:{name}"), ttl=10):  # held by a lock outside any request
        assert client.get(f"/gate/{name}/").status_code == 423
    assert client.get(f"/gate/{name}/").status_code == 200


def own_atomic_blocks_release_when_they_end(alias: str) -> None:
    with distributed_lock("tc:bare"):
        pass
    assert not _held("tc:bare"), "only the test case's blocks were open: released at once"

    with transaction.atomic(using=alias):
        with transaction.atomic(using=alias):
            with distributed_lock("tc:nested"):
                Account.objects.create(balance=1)
        assert _held("tc:nested"), "released before the test's own outermost block ended"
    assert not _held("tc:nested"), "kept after the test's own block committed"

    held_inside: list[bool] = []

    def rolled_back() -> None:
        with transaction.atomic(using=alias):
            with transaction.atomic(using=alias), distributed_lock("tc:rollback"):
                pass
            held_inside.append(_held("tc:rollback"))
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        rolled_back()
    assert held_inside == [True]
    assert not _held("tc:rollback"), "kept after the test's own block rolled back"

    with transaction.atomic(using=alias):
        with pytest.raises(RuntimeError), transaction.atomic(using=alias), distributed_lock("tc:savepoint"):
            raise RuntimeError("roll back to the savepoint")
        # What the lock guarded was rolled back: released at once, as in a real transaction.
        assert not _held("tc:savepoint"), "kept after its savepoint rolled back"


def atomic_requests_release_when_the_request_ends(client: Client, alias: str) -> None:
    account = Account.objects.create(balance=0)
    settings_dict = connections[alias].settings_dict
    settings_dict["ATOMIC_REQUESTS"] = True
    try:
        codes = [client.post(f"/probed/{account.pk}/").status_code for _ in range(2)]
    finally:
        settings_dict["ATOMIC_REQUESTS"] = False
    assert codes == [200, 200]
    assert Account.objects.get(pk=account.pk).balance == 2
    assert not _held(f"account:{account.pk}")


# -- Django's TestCase ------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("django_servers")
class SQLiteTestCase(TestCase):
    databases: ClassVar[set[str]] = {"default", "pg"}  # type: ignore[misc]
    alias = "default"

    def setUp(self) -> None:
        router.CURRENT[0] = self.alias
        self.addCleanup(router.CURRENT.__setitem__, 0, "default")

    def test_two_requests_both_answer_200(self) -> None:
        two_requests_both_answer_200(self.client)

    def test_a_request_racing_a_held_lock_answers_423(self) -> None:
        a_request_racing_a_held_lock_answers_423(self.client, f"tc-{self.alias}")

    def test_own_atomic_blocks_release_when_they_end(self) -> None:
        own_atomic_blocks_release_when_they_end(self.alias)

    def test_atomic_requests_release_when_the_request_ends(self) -> None:
        atomic_requests_release_when_the_request_ends(self.client, self.alias)


class PostgresTestCase(SQLiteTestCase):
    alias = "pg"


# -- pytest-django's db fixture -----------------------------------------------------------------------------------


@pytest.mark.django_db(databases=["default", "pg"])
def test_db_two_requests_both_answer_200(db_alias: str, django_client: Client) -> None:
    two_requests_both_answer_200(django_client)


@pytest.mark.django_db(databases=["default", "pg"])
def test_db_a_request_racing_a_held_lock_answers_423(db_alias: str, django_client: Client) -> None:
    a_request_racing_a_held_lock_answers_423(django_client, f"db-{db_alias}")


@pytest.mark.django_db(databases=["default", "pg"])
def test_db_own_atomic_blocks_release_when_they_end(db_alias: str) -> None:
    own_atomic_blocks_release_when_they_end(db_alias)


@pytest.mark.django_db(databases=["default", "pg"])
def test_db_atomic_requests_release_when_the_request_ends(db_alias: str, django_client: Client) -> None:
    atomic_requests_release_when_the_request_ends(django_client, db_alias)


@pytest.mark.django_db(databases=["default", "pg"])
def test_db_nothing_is_lost_at_teardown(db_alias: str, django_client: Client, caplog: pytest.LogCaptureFixture) -> None:
    """The lock of a view called in the test is gone before the test's transaction rolls back: no "lock lost"."""
    account = Account.objects.create(balance=0)
    assert django_client.post(f"/increment/{account.pk}/").status_code == 200
    with distributed_lock("tc:late"):
        pass
    assert not _held(f"account:{account.pk}")
    assert not _held("tc:late")
    assert not [r for r in caplog.records if r.name.startswith("distlock")]
