"""The lock inspector on live locks: ``manage.py distlock`` and the admin's lock page with its force release.

The page is an admin page (``admin/distlock/``): staff only, linked from the admin index, searched by lock-name
prefix, 100 locks a page. A force release needs the ``distlock_django.force_release_lock`` permission, goes through a
confirmation page and a CSRF-checked POST, removes the holder only at the token the operator saw, and leaves a
``LogEntry``.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from _support import wait_until
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client
from pytest_django.fixtures import Settings

import distlock
from distlock_django import conf, get_client, lock_name
from distlock_django.models import FORCE_RELEASE_PERMISSION

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])

PAGE = "/admin/distlock/"
RELEASE = "/admin/distlock/force-release/"


@dataclass
class Queue:
    """A held lock and one waiter queued behind it (a thread blocked in ``acquire``)."""

    holder: distlock.Lock
    waiter: distlock.Lock
    thread: threading.Thread

    @property
    def name(self) -> str:
        return self.holder.name

    def owner(self, lock: distlock.Lock) -> str:
        """The owner id the service shows for ``lock`` while it holds the lock."""
        holder = get_client().holder(self.name)
        assert holder is not None and holder.token == lock.token
        return holder.owner

    def waiter_got_it(self, timeout: float = 20) -> bool:
        self.thread.join(timeout)
        return self.waiter.owned()


@pytest.fixture
def queue(db_alias: str) -> Iterator[Queue]:
    client = get_client()
    # A short lease: the holder's keeper checks its keys after each refresh (a third of the TTL), so a force
    # release shows as ``lost`` within about a second.
    holder = client.lock(lock_name("inspect:1"), ttl=3)
    assert holder.acquire()
    waiter = client.lock(lock_name("inspect:1"), ttl=30)
    thread = threading.Thread(target=lambda: waiter.acquire(timeout=60))
    thread.start()
    wait_until(lambda: getattr(client.holder(holder.name), "waiters", 0) == 1, 10, "the waiter to queue")
    try:
        yield Queue(holder, waiter, thread)
    finally:
        if holder.owned():
            with contextlib.suppress(distlock.LockLost):  # force-released by the test
                holder.release()
        thread.join(30)
        if waiter.owned():
            waiter.release()


def _user(name: str, *, staff: bool = True, can_release: bool = False) -> User:
    user = User.objects.create_user(name, password="x", is_staff=staff)
    if can_release:
        user.user_permissions.add(Permission.objects.get(codename="force_release_lock"))
    return user


@pytest.fixture
def operator(django_client: Client) -> Client:
    """A staff user with the force-release permission, logged in."""
    django_client.force_login(_user("operator", can_release=True))
    return django_client


def test_the_command_lists_holder_and_waiter(queue: Queue) -> None:
    out = io.StringIO()
    call_command("distlock", stdout=out)
    lines = [line for line in out.getvalue().splitlines() if "inspect:1" in line]
    assert len(lines) == 2
    assert "holder" in lines[0]
    assert str(queue.holder.token) in lines[0]
    assert "waiter 1" in lines[1]


def test_the_command_fails_clearly_when_etcd_is_unreachable(db_alias: str, settings: Settings) -> None:
    settings.DISTLOCK = {**conf(), "URL": "etcd://127.0.0.1:1", "OPTIONS": {"connect_timeout": 1}}
    with pytest.raises(CommandError, match="cannot read locks"):
        call_command("distlock", stdout=io.StringIO())


def test_the_command_force_releases_only_at_the_token_given(queue: Queue) -> None:
    with pytest.raises(CommandError, match="not released: its holder's token is"):
        call_command("distlock", force_release=queue.name, token=queue.holder.token - 1, stdout=io.StringIO())
    assert get_client().holder(queue.name).token == queue.holder.token  # type: ignore[union-attr]
    out = io.StringIO()
    # As the admin's search, the command takes the name without KEY_PREFIX too ("inspect:1" for "dj:inspect:1").
    assert queue.name == "dj:inspect:1"
    call_command("distlock", force_release="inspect:1", token=queue.holder.token, stdout=out)
    assert out.getvalue().strip() == f"released lock {queue.name!r} at token {queue.holder.token}"
    assert queue.waiter_got_it()
    with pytest.raises(CommandError, match="needs --token"):
        call_command("distlock", force_release=queue.name, stdout=io.StringIO())


def test_the_page_is_for_staff_only(queue: Queue, django_client: Client) -> None:
    assert django_client.get(PAGE)["Location"].startswith("/admin/login/")
    user = _user("clerk", staff=False)
    django_client.force_login(user)
    assert django_client.get(PAGE)["Location"].startswith("/admin/login/")
    user.is_staff = True
    user.save()
    page = django_client.get(PAGE)
    assert page.status_code == 200
    html = page.content.decode()
    assert '<div class="breadcrumbs">' in html and "Distributed locks" in html  # the admin's own template
    row = _row(html, "dj:inspect:1")
    assert f"<td>{queue.holder.token}</td>" in row
    assert "<td>1</td>" in row  # one waiter
    assert "Force release" not in html  # staff without the permission see no release button


def _row(html: str, name: str) -> str:
    start = html.index(f'<th scope="row">{name}</th>')
    return html[start : html.index("</tr>", start)]


def test_the_admin_index_links_to_the_page(queue: Queue, django_client: Client) -> None:
    django_client.force_login(_user("clerk"))
    index = django_client.get("/admin/").content.decode()
    assert 'href="/admin/distlock_django/distributedlock/"' in index
    assert ">Distributed locks</a>" in index
    assert django_client.get("/admin/distlock_django/distributedlock/")["Location"] == PAGE
    # "Recent actions" links a release to the lock: the page, searched for it.
    lock_url = django_client.get(f"/admin/distlock_django/distributedlock/{queue.name}/change/")["Location"]
    assert lock_url == f"{PAGE}?q=dj%3Ainspect%3A1"


def test_search_by_name_prefix(db_alias: str, operator: Client) -> None:
    client = get_client()
    locks = [client.lock(lock_name(name), ttl=30) for name in ("alpha:1", "alpha:2", "beta:1")]
    for lock in locks:
        assert lock.acquire()
    try:

        def shown(query: str) -> list[str]:
            html = operator.get(PAGE, {"q": query}).content.decode()
            return [name for name in ("dj:alpha:1", "dj:alpha:2", "dj:beta:1") if f">{name}</th>" in html]

        assert shown("") == ["dj:alpha:1", "dj:alpha:2", "dj:beta:1"]
        assert shown("alpha:") == ["dj:alpha:1", "dj:alpha:2"]  # without the key prefix
        assert shown("dj:beta") == ["dj:beta:1"]  # or with it
        assert shown("alpha:2") == ["dj:alpha:2"]
        assert "No lock matches “gamma”." in operator.get(PAGE, {"q": "gamma"}).content.decode()
    finally:
        for lock in locks:
            lock.release()


def test_many_locks_are_paged(db_alias: str, operator: Client) -> None:
    client = get_client()
    locks = [client.lock(lock_name(f"many:{i:03}"), ttl=30) for i in range(230)]
    for lock in locks:
        assert lock.acquire()
    try:

        def names(**query: str) -> list[str]:
            html = operator.get(PAGE, {"q": "many:", **query}).content.decode()
            return [lock.name for lock in locks if f">{lock.name}</th>" in html]

        assert names() == [f"dj:many:{i:03}" for i in range(100)]
        assert names(p="2") == [f"dj:many:{i:03}" for i in range(100, 200)]
        assert names(p="3") == [f"dj:many:{i:03}" for i in range(200, 230)]
        assert names(p="99") == names(p="3")  # past the end: the last page
        html = operator.get(PAGE, {"q": "many:"}).content.decode()
        assert "230 locks" in html
        assert 'href="/admin/distlock/?q=many%3A&amp;p=3"' in html  # page links keep the search
    finally:
        for lock in locks:
            lock.release()


def test_force_release_needs_the_permission(queue: Queue, django_client: Client) -> None:
    django_client.force_login(_user("clerk"))
    query = {"name": queue.name, "token": str(queue.holder.token)}
    assert django_client.get(RELEASE, query).status_code == 403
    assert django_client.post(RELEASE, query).status_code == 403
    assert get_client().holder(queue.name).token == queue.holder.token  # type: ignore[union-attr]
    assert not LogEntry.objects.exists()


def test_the_permission_can_be_granted(db_alias: str) -> None:
    assert _user("operator", can_release=True).has_perm(FORCE_RELEASE_PERMISSION)
    assert not _user("clerk").has_perm(FORCE_RELEASE_PERMISSION)
    assert User.objects.create_superuser("root", password="x").has_perm(FORCE_RELEASE_PERMISSION)


def test_force_release_after_confirmation_hands_the_lock_over_and_is_logged(queue: Queue, operator: Client) -> None:
    token, owner = queue.holder.token, queue.owner(queue.holder)
    page = operator.get(PAGE).content.decode()
    button = f'href="{RELEASE}?name=dj%3Ainspect%3A1&amp;token={token}"'
    assert button in _row(page, "dj:inspect:1")

    confirm = operator.get(RELEASE, {"name": queue.name, "token": str(token)})
    html = confirm.content.decode()
    assert confirm.status_code == 200
    assert f'<td id="distlock-token">{token}</td>' in html
    assert f"<code>{owner}</code>, token {token}" in html  # the holder as it is now
    assert "The next waiter gets the lock at once." in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert get_client().holder(queue.name).token == token  # type: ignore[union-attr]  # a GET changes nothing

    done = operator.post(RELEASE, {"name": queue.name, "token": str(token)}, follow=True)
    assert done.redirect_chain == [(f"{PAGE}?q=dj%3Ainspect%3A1", 302)]
    assert f"Released lock “dj:inspect:1” at token {token} (owner {owner})" in done.content.decode()
    assert queue.waiter_got_it()
    assert queue.waiter.token > token
    wait_until(lambda: queue.holder.lost, 15, "the released holder to see its lock lost")

    entry = LogEntry.objects.get()
    assert (entry.user.username, entry.object_id, entry.action_flag) == ("operator", queue.name, CHANGE)
    assert entry.get_change_message() == f"Force-released at fencing token {token} (owner {owner})."


def test_a_stale_token_changes_nothing(queue: Queue, operator: Client) -> None:
    stale = queue.holder.token
    query = {"name": queue.name, "token": str(stale)}
    queue.holder.release()  # meanwhile the holder finished: the waiter holds the lock with a newer token
    assert queue.waiter_got_it()

    confirm = operator.get(RELEASE, query).content.decode()
    assert 'id="distlock-changed"' in confirm
    assert "distlock-confirm" not in confirm  # no button to release what the operator did not see

    done = operator.post(RELEASE, query, follow=True).content.decode()
    assert (
        f"Lock “dj:inspect:1” was not released: its holder has changed (now token {queue.waiter.token}, owner "
        f"{queue.owner(queue.waiter)}; you saw token {stale}). Nothing was changed."
    ) in done
    assert get_client().holder(queue.name).token == queue.waiter.token  # type: ignore[union-attr]
    assert not queue.waiter.lost
    assert not LogEntry.objects.exists()


def test_the_release_needs_a_post_with_a_csrf_token(queue: Queue, db_alias: str) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(_user("operator", can_release=True))
    answer = browser.post(RELEASE, {"name": queue.name, "token": str(queue.holder.token)})
    assert answer.status_code == 403
    assert get_client().holder(queue.name).token == queue.holder.token  # type: ignore[union-attr]


def test_bad_release_requests_are_refused(db_alias: str, operator: Client) -> None:
    for query in ({"name": "dj:x"}, {"name": "dj:x", "token": "-3"}, {"name": "dj:x", "token": "²"}, {"token": "5"}):
        assert operator.post(RELEASE, query).status_code == 400


def test_the_page_says_when_the_lock_service_is_unreachable(operator: Client, settings: Settings) -> None:
    settings.DISTLOCK = {**conf(), "URL": "etcd://127.0.0.1:1", "OPTIONS": {"connect_timeout": 1}}
    page = operator.get(PAGE)
    assert page.status_code == 503
    assert "Cannot read locks: BackendUnavailable" in page.content.decode()
