"""``FencedModelAdmin``: the admin's writes of fenced rows are made inside the rows' locks, with fencing "on" and
"strict", on SQLite and PostgreSQL.

Every write path of the admin (change form, inline rows, ``list_editable``, delete page, "Delete selected", add) lands
with a token newer than any the row's lock gave before it (so the write held the lock), and leaves the lock free. A row
held elsewhere is not written and the admin says why; a holder's write made while the admin waits is followed, not
overwritten by a read from before it (the admin reads inside the lock). A plain ``ModelAdmin`` fails these: in strict
mode with an error page (``UnfencedWrite``), in mode "on" with a write that carries no token.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from _support import wait_until
from django.contrib import admin
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.core.checks import Error
from django.db import connections
from django.db.models.signals import pre_delete
from django.test import Client
from djangotests.testapp.models import Account, Entry, Plain
from pytest_django.fixtures import Settings

from distlock_django import get_client, lock_name
from distlock_django.admin import FencedModelAdmin

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])

ACCOUNTS = "/admin/testapp/account/"
ENTRIES = "/admin/testapp/entry/"


@pytest.fixture(params=["on", "strict"])
def fencing(request: pytest.FixtureRequest, settings: Settings, db_alias: str) -> str:
    settings.DISTLOCK = {**settings.DISTLOCK, "FENCING": request.param}
    return str(request.param)


@pytest.fixture
def staff(db_alias: str) -> Client:
    client = Client()
    client.force_login(User.objects.create(username="admin", is_staff=True, is_superuser=True))  # no password to hash
    return client


def _token_now(name: str) -> int:
    """A token the lock ``name`` hands out now: larger than every one before it."""
    with get_client().lock(lock_name(name), ttl=10) as lock:
        return lock.token


def _account(pk: int, **values: Any) -> Account:
    with get_client().lock(lock_name(f"account:{pk}"), ttl=10):
        account: Account = Account.objects.create(pk=pk, **values)
    return account


def _entry(pk: int, book: int, account: Account | None = None, **values: Any) -> Entry:
    with get_client().lock(lock_name(f"book:{book}"), ttl=10):
        entry: Entry = Entry.objects.create(pk=pk, book=book, account=account, **values)
    return entry


def _written_in_lock(row: Account | Entry, name: str, before: int) -> None:
    """``row`` (read again) was written with a token of lock ``name`` newer than ``before``, which is free now."""
    row.refresh_from_db()
    assert row.fence_token > before, f"{row!r} kept token {row.fence_token}: written without its lock"
    assert get_client().holder(lock_name(name)) is None


def _messages(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def _inline(*rows: dict[str, Any], initial: int) -> dict[str, Any]:
    data: dict[str, Any] = {
        "entry_set-TOTAL_FORMS": len(rows),
        "entry_set-INITIAL_FORMS": initial,
        "entry_set-MIN_NUM_FORMS": 0,
        "entry_set-MAX_NUM_FORMS": 1000,
    }
    for i, row in enumerate(rows):
        data.update({f"entry_set-{i}-{key}": value for key, value in row.items()})
    return data


def test_a_change_form_writes_the_row_and_its_inline_rows_in_their_locks(fencing: str, staff: Client) -> None:
    account = _account(71, balance=3)
    entry = _entry(5, book=1, account=account, memo="old")
    before = {name: _token_now(name) for name in ("account:71", "book:1", "book:2")}
    rows = (
        {"id": entry.pk, "account": account.pk, "book": 1, "amount": 0, "memo": "changed"},
        {"id": "", "account": account.pk, "book": 2, "amount": 4, "memo": "added"},
    )
    data = {"balance": 9, "note": "by admin", "_save": "Save", **_inline(*rows, initial=1)}
    response = staff.post(f"{ACCOUNTS}71/change/", data)
    assert response.status_code == 302, _messages(response)
    _written_in_lock(account, "account:71", before["account:71"])
    assert (account.balance, account.note) == (9, "by admin")
    _written_in_lock(entry, "book:1", before["book:1"])
    assert entry.memo == "changed"
    _written_in_lock(Entry.objects.get(memo="added"), "book:2", before["book:2"])


def test_a_move_holds_the_lock_of_both_names(fencing: str, staff: Client) -> None:
    entry = _entry(6, book=1)
    before = max(_token_now("book:1"), _token_now("book:2"))
    response = staff.post(f"{ENTRIES}6/change/", {"book": 2, "amount": 0, "memo": "moved", "_save": "Save"})
    assert response.status_code == 302, _messages(response)
    _written_in_lock(entry, "book:2", before)
    assert entry.book == 2


def test_list_editable_writes_each_row_in_its_lock(fencing: str, staff: Client) -> None:
    first, second = _account(72, balance=1), _account(73, balance=2)
    before = max(_token_now("account:72"), _token_now("account:73"))
    data = {
        "form-TOTAL_FORMS": 2,
        "form-INITIAL_FORMS": 2,
        "form-0-id": 72,
        "form-0-balance": 10,
        "form-0-note": "a",
        "form-1-id": 73,
        "form-1-balance": 20,
        "form-1-note": "b",
        "_save": "Save",
    }
    response = staff.post(ACCOUNTS, data)
    assert response.status_code == 302, response.context["cl"].formset.errors
    for row, name, balance in ((first, "account:72", 10), (second, "account:73", 20)):
        _written_in_lock(row, name, before)
        assert row.balance == balance


@pytest.mark.parametrize("how", ["delete page", "delete selected"])
def test_a_delete_holds_the_rows_locks(fencing: str, staff: Client, how: str) -> None:
    _account(74), _account(75)
    held_at_delete: dict[int, bool] = {}

    def seen(sender: type[Account], instance: Account, **kwargs: Any) -> None:
        held_at_delete[instance.pk] = get_client().holder(lock_name(f"account:{instance.pk}")) is not None

    pre_delete.connect(seen, sender=Account)
    try:
        if how == "delete page":
            response = staff.post(f"{ACCOUNTS}74/delete/", {"post": "yes"})
        else:
            response = staff.post(ACCOUNTS, {"action": "delete_selected", "_selected_action": [74, 75], "post": "yes"})
    finally:
        pre_delete.disconnect(seen, sender=Account)
    assert response.status_code == 302, _messages(response)
    gone = {74: True} if how == "delete page" else {74: True, 75: True}
    assert held_at_delete == gone
    assert not Account.objects.filter(pk__in=gone).exists()


def test_an_add_holds_the_new_rows_lock_when_its_name_is_known_before_the_insert(fencing: str, staff: Client) -> None:
    before = _token_now("book:3")
    response = staff.post(f"{ENTRIES}add/", {"book": 3, "amount": 1, "memo": "new", "_save": "Save"})
    assert response.status_code == 302, _messages(response)
    _written_in_lock(Entry.objects.get(memo="new"), "book:3", before)


def test_an_add_named_from_the_automatic_primary_key_is_plain_or_not_offered(fencing: str, staff: Client) -> None:
    response = staff.post(f"{ACCOUNTS}add/", {"balance": 4, "note": "new", "_save": "Save", **_inline(initial=0)})
    add_link = f'href="{ACCOUNTS}add/"'.encode()
    if fencing == "strict":  # it cannot be fenced: the add is not offered
        assert response.status_code == 403
        assert add_link not in staff.get(ACCOUNTS).content
        assert not Account.objects.exists()
    else:
        assert response.status_code == 302, _messages(response)
        assert Account.objects.get(note="new").fence_token == 0  # plain: the row's lock gave no token yet
        assert add_link in staff.get(ACCOUNTS).content


def test_a_row_held_elsewhere_is_not_written_and_the_admin_says_why(
    fencing: str, staff: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = _account(76, balance=1)
    monkeypatch.setattr(admin.site._registry[Account], "lock_timeout", 0.3)
    with get_client().lock(lock_name("account:76"), ttl=10) as held:
        response = staff.post(
            f"{ACCOUNTS}76/change/", {"balance": 9, "note": "x", "_save": "Save", **_inline(initial=0)}, follow=True
        )
        account.refresh_from_db()
        assert (account.balance, account.fence_token) == (1, account.fence_token)
        assert held.owned()
    assert response.redirect_chain == [(f"{ACCOUNTS}76/change/", 302)]
    (message,) = _messages(response)
    assert message == "Nothing was saved: a row it writes is locked elsewhere (not free within 0.3 s). Try again."


def test_the_admin_waits_for_a_holder_and_writes_after_its_write(fencing: str, staff: Client) -> None:
    """The admin takes the row's lock before it reads the row: a lock holder's write made while the admin waits is
    read by the admin (its save is not refused as stale), and the admin's write lands after it, with a newer token."""
    _account(77, balance=1)
    name = lock_name("account:77")
    responses: list[Any] = []

    def post() -> None:
        try:
            data = {"balance": 1, "note": "admin", "_save": "Save", **_inline(initial=0)}
            responses.append(staff.post(f"{ACCOUNTS}77/change/", data))
        finally:
            connections.close_all()  # this thread's

    admin_post = threading.Thread(target=post)
    with get_client().lock(name, ttl=20) as held:
        admin_post.start()
        waiting = lambda: any(len(s.waiters) == 1 for s in get_client().inspect() if s.name == name)  # noqa: E731
        wait_until(waiting, 20, "the admin waiting for the lock")
        worker = Account.objects.filter(pk=77).fenced().get()
        worker.balance += 100
        worker.save()
        holders_token = held.token
    admin_post.join(20)
    assert responses and responses[0].status_code == 302
    row = Account.objects.get(pk=77)
    assert row.note == "admin" and row.fence_token > holders_token
    assert row.balance == 1  # the form's value, set by the operator who saw 1: as in Django's admin, the form wins


def test_fenced_model_admin_is_for_fenced_models() -> None:
    class PlainAdmin(FencedModelAdmin):
        pass

    errors = PlainAdmin(Plain, admin.site).check()
    assert [e.id for e in errors if isinstance(e, Error)] == ["distlock.E017"]
    assert "not a FencedModel" in errors[0].msg
