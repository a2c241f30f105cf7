"""The admin's force-release page counts a semaphore's holders apart from its waiters: the other slots that hold
beside the holder are "Holding it", not "Waiters", and the page does not promise the lock to a waiter."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from _support import wait_until
from django.contrib.auth.models import Permission, User
from django.test import Client

import distlock
from distlock_django import get_client, lock_name

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])

RELEASE = "/admin/distlock/force-release/"


@pytest.fixture
def slots(db_alias: str) -> Iterator[list[distlock.Lock]]:
    """Three slots of a semaphore of limit 3 held, a fourth waiting (a thread blocked in ``acquire``)."""
    client = get_client()
    name = lock_name("counts:1")
    held = [client.semaphore(name, limit=3, ttl=30) for _ in range(3)]
    for slot in held:
        assert slot.acquire(timeout=0)
    waiter = client.semaphore(name, limit=3, ttl=30)
    thread = threading.Thread(target=lambda: waiter.acquire(timeout=60))
    thread.start()

    def queued() -> bool:
        return any(state.name == name and len(state.waiters) == 1 for state in client.inspect())

    wait_until(queued, 10, "the fourth slot to queue")
    try:
        yield held
    finally:
        for slot in held:
            slot.release()
        thread.join(30)
        if waiter.owned():
            waiter.release()


def test_the_release_page_shows_holders_and_waiters_apart(slots: list[distlock.Lock], django_client: Client) -> None:
    user = User.objects.create_user("operator", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="force_release_lock"))
    django_client.force_login(user)
    first = slots[0]
    page = django_client.get(RELEASE, {"name": first.name, "token": str(first.token)})
    html = page.content.decode()
    assert page.status_code == 200
    assert '<td id="distlock-holders">3</td>' in html
    assert '<td id="distlock-waiters">1</td>' in html
    assert "The others holding it with this holder (slots of a semaphore, or readers) keep it." in html
    assert "The next waiter gets the lock at once." not in html
