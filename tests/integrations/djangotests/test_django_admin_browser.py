"""Force release from the admin in headless Chromium: a live holder frozen with SIGSTOP, released by an operator.

Two ``fenceworker.py`` processes on PostgreSQL: the first takes an account's lock (a long lease), claims and reads the
row, and is frozen; the second queues for the same lock. A staff user who was given the force-release permission
logs in through the admin's form, follows "Distributed locks" from the admin index, searches for the lock, presses
"Force release…" on its row and confirms. Then: the second worker holds the lock and writes; the first, resumed,
sees its lock ``lost`` and its fenced write is refused; the admin's log has the release.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _browser import browser, log_in, rows, save  # noqa: F401
from _support import wait_until
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from djangotests.test_django_fencing import DjangoWorker
from djangotests.testapp.models import Account
from pytest_django.live_server_helper import LiveServer
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from distlock_django import get_client, lock_name

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])

PASSWORD = "operator-test-password"


@pytest.fixture
def workers(django_child_env: dict[str, str]) -> Iterator[tuple[DjangoWorker, DjangoWorker]]:
    first, second = DjangoWorker(django_child_env), DjangoWorker(django_child_env)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("db_alias", ["pg"], indirect=True)  # one database is enough for a browser test
def test_a_frozen_holder_is_force_released_from_the_admin(
    db_alias: str,
    workers: tuple[DjangoWorker, DjangoWorker],
    live_server: LiveServer,
    browser: WebDriver,  # noqa: F811
    tmp_path: Path,
) -> None:
    holder, waiter = workers
    account = Account.objects.create(balance=100)
    name = lock_name(f"account:{account.pk}")
    operator = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="force_release_lock"))

    # A lease long enough that it cannot run out while frozen: only the release can free the lock.
    held = holder.call(op="lock_and_read", pk=account.pk, ttl=60, claim=True)
    holder.stop()
    try:
        waiter.send(op="lock_and_read", pk=account.pk, ttl=30, claim=True, timeout=120)
        wait_until(lambda: getattr(get_client().holder(name), "waiters", 0) == 1, 20, "the second worker to queue")
        owner = get_client().holder(name).owner  # type: ignore[union-attr]

        log_in(browser, f"{live_server.url}/admin/login/?next=/admin/", "operator", PASSWORD)
        wait = WebDriverWait(browser, 30)
        wait.until(expected_conditions.element_to_be_clickable((By.LINK_TEXT, "Distributed locks"))).click()
        search = wait.until(expected_conditions.presence_of_element_located((By.ID, "searchbar")))
        assert browser.current_url == f"{live_server.url}/admin/distlock/"
        search.send_keys("account:")
        search.submit()
        wait.until(expected_conditions.url_contains("q=account"))
        shown = rows(browser, "distlock-locks")
        assert [row[:4] for row in shown] == [[name, owner, "1", str(held["token"])]]  # holder, waiters, token
        assert 0 < int(shown[0][4].removesuffix(" s")) <= 60  # the frozen holder's lease, running out
        save(browser, tmp_path, "force-release-list.png")
        row = browser.find_element(By.XPATH, f"//table[@id='distlock-locks']//tr[th='{name}']")
        row.find_element(By.LINK_TEXT, "Force release…").click()

        wait.until(expected_conditions.presence_of_element_located((By.ID, "distlock-confirm")))
        assert browser.find_element(By.ID, "distlock-token").text == str(held["token"])
        assert browser.find_element(By.ID, "distlock-holder").text.endswith(f"token {held['token']}")
        save(browser, tmp_path, "force-release-confirm.png")
        browser.find_element(By.ID, "distlock-confirm").click()

        message = wait.until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".messagelist .success"))
        )
        assert message.text.startswith(f"Released lock “{name}” at token {held['token']}")

        got = waiter.read(timeout=30)  # the next waiter has the lock, and has claimed the row with its token
        assert got["token"] > held["token"]
        assert waiter.call(op="write") == {"ok": True}
    finally:
        holder.cont()
    wait_until(lambda: holder.call(op="lost")["lost"], 60, "the resumed holder to see its lock lost")
    refused = holder.call(op="write")
    assert refused["error"] == "StaleFenceToken", refused
    account.refresh_from_db()
    assert (account.balance, account.fence_token) == (101, got["token"])  # the new holder's write stands

    entry = LogEntry.objects.get()
    assert (entry.user, entry.object_id) == (operator, name)
    assert f"fencing token {held['token']}" in entry.get_change_message()
