"""Headless Chromium for the admin tests: Debian's chromium, driven by Selenium through Debian's chromedriver.

Import the ``browser`` fixture into a test module (``from _browser import browser  # noqa: F401``). The browser is
a missing server like any other: without it the test fails (``bash scripts/servers.sh`` installs it), it never
skips. ``DISTLOCK_SCREENSHOTS`` names a directory (e.g. ``docs``) where :func:`save` also writes its PNG files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

CHROMIUM = os.environ.get("DISTLOCK_CHROMIUM_BIN", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DISTLOCK_CHROMEDRIVER_BIN", "/usr/bin/chromedriver")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(
            f"no headless browser: {', '.join(missing)} missing. Run `bash scripts/servers.sh` (as root it installs "
            "Debian's chromium and chromium-driver), or set DISTLOCK_CHROMIUM_BIN and DISTLOCK_CHROMEDRIVER_BIN"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # we run as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--no-default-browser-check",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1280,820",
    ):
        options.add_argument(argument)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def rows(browser: WebDriver, table_id: str) -> list[list[str]]:
    """The text of each body row's cells (``th`` and ``td``) of table ``table_id``."""
    found = browser.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")
    return [[cell.text for cell in row.find_elements(By.CSS_SELECTOR, "th, td")] for row in found]


def save(browser: WebDriver, tmp_path: Path, name: str) -> None:
    """A screenshot in the test's temp dir, and in ``$DISTLOCK_SCREENSHOTS`` when set."""
    browser.save_screenshot(str(tmp_path / name))
    directory = os.environ.get("DISTLOCK_SCREENSHOTS")
    if directory:
        browser.save_screenshot(str(Path(directory) / name))


def log_in(browser: WebDriver, login_url: str, username: str, password: str) -> None:
    """Fill in and submit the admin's login form at ``login_url``."""
    browser.get(login_url)
    browser.find_element(By.NAME, "username").send_keys(username)
    browser.find_element(By.NAME, "password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
