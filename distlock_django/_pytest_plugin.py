"""distlock_django's pytest plugin: the ``distlock_django`` fixture, on top of distlock's plugin and pytest-django.

pytest loads it by itself where distlock-fenced is installed (the ``pytest11`` entry point named ``distlock_django``;
``-p no:distlock_django`` turns it off). ``distlock_django`` points ``settings.DISTLOCK`` (through pytest-django's
``settings`` fixture) for one test at distlock's ``distlock_url`` under ``distlock_prefix`` (the rest of your
``DISTLOCK`` kept), resets distlock_django's shared client before and after, and returns that client.

What can go wrong: without pytest-django the fixture fails its test's set-up saying what to install. Django is
imported only when the fixture runs, so the plugin is harmless where Django is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import distlock

__all__ = ["distlock_django"]


@pytest.fixture
def distlock_django(
    request: pytest.FixtureRequest, distlock_url: str, distlock_prefix: str
) -> Iterator[distlock.Client]:
    """distlock_django pointed at the test server for one test, through pytest-django's ``settings`` fixture;
    returns distlock_django's shared client."""
    try:
        settings = request.getfixturevalue("settings")
    except pytest.FixtureLookupError:
        pytest.fail("distlock_django needs pytest-django: pip install pytest-django", pytrace=False)
    from distlock_django._client import get_client, reset_client

    configured = dict(getattr(settings, "DISTLOCK", None) or {})
    options = {**configured.get("OPTIONS", {}), "prefix": distlock_prefix}
    reset_client()
    settings.DISTLOCK = {**configured, "URL": distlock_url, "OPTIONS": options}
    try:
        yield get_client()
    finally:
        reset_client()
