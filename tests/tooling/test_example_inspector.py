"""The lock inspector in a real headless browser (``_browser.py``: Debian's chromium, Selenium, chromedriver).

The example bank's site runs as in the demo (``manage.py runserver`` on the session's etcd, SQLite in a temp dir);
this test process holds the lock of an account and a second client of it waits for the same lock. A staff user
logs in through the admin's login form; the account list must show each row's ``fence_token`` beside its lock's
holder and waiter, and the admin's lock page (``admin/distlock/``) the same lock with its holder, one waiter and the
force-release button (the staff user is a superuser).

Set ``DISTLOCK_SCREENSHOTS`` to a directory (e.g. ``docs``) to save the two pages there as PNG files.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _browser import browser, rows, save  # noqa: F401
from _support import wait_until
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

import distlock
from scripts import demo

PASSWORD = "inspector-test-password"


@pytest.fixture
def site(etcd_url: str, tmp_path: Path) -> Iterator[demo.Site]:
    """The example bank (3 accounts, staff user ``admin``) on the session's etcd, under a key prefix of its own."""
    run_id = uuid.uuid4().hex[:8]
    env = demo.example_env(tmp_path / "data", demo.with_prefix(etcd_url, f"inspector-test-{run_id}"), run_id)
    demo.setup_bank(env, accounts=3, password=PASSWORD)
    processes = demo.Processes(tmp_path)
    try:
        yield demo.start_site(processes, env, demo.free_port())
    finally:
        processes.stop_all()


def test_the_inspector_shows_a_held_lock_and_its_waiter_beside_the_fenced_rows(
    site: demo.Site,
    browser: WebDriver,  # noqa: F811
    tmp_path: Path,
) -> None:
    deposit = demo.request(site.port, "POST", "/api/accounts/1/deposit", {"amount": 25})
    assert deposit.status == 200, deposit.body
    written_token = deposit.body["writes"][0]["token"]

    url = site.env["DISTLOCK_URL"]
    with distlock.connect(url) as client, distlock.connect(url) as other_client:
        holder = client.lock("account:2", ttl=30)
        assert holder.acquire(timeout=10)
        waiter = other_client.lock("account:2", ttl=30)
        waiting = threading.Thread(target=waiter.acquire, kwargs={"timeout": 60})
        waiting.start()
        try:
            wait_until(lambda: getattr(client.holder("account:2"), "waiters", 0) == 1, 10, "the waiter to queue")

            browser.get(site.url("/admin/distlock/"))
            assert "/admin/login/" in browser.current_url  # staff only
            browser.get(site.url("/admin/login/?next=/admin/bank/account/"))
            browser.find_element(By.NAME, "username").send_keys("admin")
            browser.find_element(By.NAME, "password").send_keys(PASSWORD)
            browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
            WebDriverWait(browser, 20).until(expected_conditions.presence_of_element_located((By.ID, "account-locks")))

            accounts = {row[0]: row for row in rows(browser, "result_list")}
            assert set(accounts) == {"1", "2", "3"}
            header = [th.text.lower() for th in browser.find_elements(By.CSS_SELECTOR, "#result_list thead th")]
            fence_column = header.index("fence token")
            lock_column = header.index("lock now")
            assert accounts["1"][fence_column] == str(written_token)
            assert accounts["1"][lock_column] == "free"
            assert accounts["2"][fence_column] == "0"
            assert accounts["2"][lock_column] == f"held by token {holder.token}, 1 waiting"

            locks = rows(browser, "account-locks")
            assert [row[:3] for row in locks][:1] == [["account:2", "holder", str(holder.token)]]
            assert [row[:2] for row in locks[1:]] == [["account:2", "waiter 1"]]
            assert int(locks[1][2]) > holder.token  # a waiter's key is newer: its token will be larger
            assert all(row[4] and PASSWORD not in row[4] for row in locks)  # an opaque owner id, nothing secret
            save(browser, tmp_path, "example-accounts-and-locks.png")

            browser.get(site.url("/admin/distlock/"))
            inspector = rows(browser, "distlock-locks")
            assert [row[:4] for row in inspector] == [["account:2", locks[0][4], "1", str(holder.token)]]
            assert inspector[0][5] == "Force release…"
            save(browser, tmp_path, "lock-inspector.png")
        finally:
            holder.release()
            waiting.join(30)
            if waiter.owned():
                waiter.release()
