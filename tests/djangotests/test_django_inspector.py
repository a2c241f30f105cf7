"""The lock inspector: ``manage.py distlock`` and the staff-only admin page, on live locks."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator

import pytest
from _support import wait_until
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from pytest_django.fixtures import Settings

import distlock
from distlock_django import conf, get_client, lock_name

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])


@pytest.fixture
def held_with_waiter(db_alias: str) -> Iterator[tuple[distlock.Lock, distlock.Lock]]:
    client = get_client()
    holder = client.lock(lock_name("inspect:1"), ttl=30)
    assert holder.acquire()
    waiter = client.lock(lock_name("inspect:1"), ttl=30)
    thread = threading.Thread(target=lambda: waiter.acquire(timeout=30))
    thread.start()
    wait_until(lambda: (client.holder(holder.name) or holder).waiters == 1, 10, "the waiter to queue")  # type: ignore[union-attr]
    try:
        yield holder, waiter
    finally:
        holder.release()
        thread.join(10)
        waiter.release()


def test_the_command_lists_holder_and_waiter(held_with_waiter: tuple[distlock.Lock, distlock.Lock]) -> None:
    holder, _ = held_with_waiter
    out = io.StringIO()
    call_command("distlock", stdout=out)
    lines = [line for line in out.getvalue().splitlines() if "inspect:1" in line]
    assert len(lines) == 2
    assert "holder" in lines[0]
    assert str(holder.token) in lines[0]
    assert "waiter 1" in lines[1]


def test_the_command_fails_clearly_when_etcd_is_unreachable(db_alias: str, settings: Settings) -> None:
    settings.DISTLOCK = {**conf(), "URL": "etcd://127.0.0.1:1", "OPTIONS": {"connect_timeout": 1}}
    with pytest.raises(CommandError, match="cannot read locks"):
        call_command("distlock", stdout=io.StringIO())


def test_the_page_is_for_staff_only(held_with_waiter: tuple[distlock.Lock, distlock.Lock], client: Client) -> None:
    holder, _ = held_with_waiter
    assert client.get("/admin/distlock/").status_code == 302  # to the admin login
    user = User.objects.create_user("clerk", password="x", is_staff=False)
    browser = client
    browser.force_login(user)
    assert browser.get("/admin/distlock/").status_code == 302
    user.is_staff = True
    user.save()
    page = browser.get("/admin/distlock/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "dj:inspect:1" in html
    assert str(holder.token) in html
    assert "waiter 1" in html
