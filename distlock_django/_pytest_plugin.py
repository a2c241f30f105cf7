"""distlock_django's pytest plugin: the ``distlock_django`` fixture, on top of distlock's plugin and pytest-django.

pytest loads it by itself where distlock-fenced is installed (the ``pytest11`` entry point named ``distlock_django``;
``-p no:distlock_django`` turns it off). It answers distlock's plugin hooks: ``django://<alias>`` means the lock
table in that alias's test database (made first: pytest-django's ``django_db_setup``), and with no
``--distlock-url``/``--distlock-backend`` ``distlock_url`` follows the project's own ``DISTLOCK["URL"]`` (itself for
``django://``, else a throwaway service of its backend), so a project never needs a backend it does not use. The
fixture ``distlock_django`` points ``settings.DISTLOCK`` (through pytest-django's ``settings`` fixture) for one test at
``distlock_url`` under ``distlock_prefix`` with ``TIMEOUT`` 0 (``@pytest.mark.distlock_django(timeout=…)``: another),
the rest of your ``DISTLOCK`` kept; those keys stay beneath later assignments (``_conf.fixture_defaults``).

What can go wrong: without pytest-django the fixture, and a ``django://`` URL, fail their test's set-up saying what to
install; a marker with another argument than ``timeout`` fails it naming the marker. Django is imported only when a
fixture or a hook needs it, so the plugin is harmless where Django is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

import distlock

__all__ = ["distlock_django", "pytest_configure", "pytest_distlock_default", "pytest_distlock_url"]

_MARKER = "distlock_django"
_NEEDS_PYTEST_DJANGO = "needs pytest-django: pip install pytest-django"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{_MARKER}(timeout=0): the DISTLOCK TIMEOUT the distlock_django fixture sets for this test"
    )


@pytest.hookimpl(optionalhook=True)
def pytest_distlock_url(url: str, request: pytest.FixtureRequest) -> str | None:
    """``django://<alias>``: the ``sql+`` URL of the lock table in that alias's test database."""
    from distlock_django._database import alias_of, database_url

    if alias_of(url) is None:
        return None
    try:
        request.getfixturevalue("django_db_setup")  # the test databases exist: the alias means its test database
    except pytest.FixtureLookupError:
        pytest.fail(f"distlock: {url!r} {_NEEDS_PYTEST_DJANGO}", pytrace=False)
    return database_url(url)


@pytest.hookimpl(optionalhook=True)
def pytest_distlock_default(request: pytest.FixtureRequest) -> str | None:
    """The project's ``DISTLOCK["URL"]``, when pytest-django has configured Django settings that have one."""
    if not request.config.pluginmanager.hasplugin("django"):
        return None
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        configured = getattr(settings, "DISTLOCK", None)
    except ImproperlyConfigured:  # no DJANGO_SETTINGS_MODULE: not a Django project's run
        return None
    url = configured.get("URL") if isinstance(configured, Mapping) else None
    return url if isinstance(url, str) and url else None


@pytest.fixture
def distlock_django(
    request: pytest.FixtureRequest, distlock_url: str, distlock_prefix: str
) -> Iterator[distlock.Client]:
    """distlock_django pointed at the test's lock service for one test, through pytest-django's ``settings`` fixture,
    with ``TIMEOUT`` 0 unless ``@pytest.mark.distlock_django(timeout=…)`` says otherwise; returns distlock_django's
    shared client."""
    try:
        settings = request.getfixturevalue("settings")
    except pytest.FixtureLookupError:
        pytest.fail(f"distlock_django {_NEEDS_PYTEST_DJANGO}", pytrace=False)
    from distlock_django._client import get_client, reset_client
    from distlock_django._conf import fixture_defaults

    marker = request.node.get_closest_marker(_MARKER)
    marked: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and (marker.args or set(marked) - {"timeout"}):
        pytest.fail(f"@pytest.mark.{_MARKER} takes only timeout=, not {marker.args or marked}", pytrace=False)
    ours = {"URL": distlock_url, "OPTIONS": {"prefix": distlock_prefix}, "TIMEOUT": marked.get("timeout", 0)}
    configured = getattr(settings, "DISTLOCK", None)
    reset_client()
    settings.DISTLOCK = {**(configured if isinstance(configured, Mapping) else {}), **ours}
    with fixture_defaults(ours):
        try:
            yield get_client()
        finally:
            reset_client()
