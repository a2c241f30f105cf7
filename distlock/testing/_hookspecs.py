"""The hooks of distlock's pytest plugin: how another plugin (distlock_django's) gives it URLs only it understands.

``pytest_distlock_url`` turns a URL of a scheme distlock does not know (``django://<alias>``) into the distlock URL
it means now (the ``sql+`` URL of the test database's lock table); ``pytest_distlock_default`` names the project's
own lock service when the session names none (``--distlock-url``, ``--distlock-backend``), so that ``distlock_url``
runs on a throwaway service of that backend instead of etcd. Both are ``firstresult``: the first plugin that answers
(not None) wins; a plugin implements them with ``@pytest.hookimpl(optionalhook=True)``, so it loads even with
distlock's plugin turned off. What can go wrong: nothing here; what ``_plugin.py`` does with the answers, it says.
"""

from __future__ import annotations

import pytest

__all__ = ["pytest_distlock_default", "pytest_distlock_url"]


@pytest.hookspec(firstresult=True)
def pytest_distlock_url(url: str, request: pytest.FixtureRequest) -> str | None:
    """The distlock URL that ``url`` (of a scheme distlock does not know) means now, or None: not a URL of yours.

    Called from a session-scoped fixture, whose ``request`` may get other session fixtures (the test database)."""


@pytest.hookspec(firstresult=True)
def pytest_distlock_default(request: pytest.FixtureRequest) -> str | None:
    """The URL of the project's own lock service (its configuration, not a URL to connect to), or None: no opinion.

    ``distlock_url`` then runs on a throwaway service of that URL's backend; a URL of a scheme distlock does not know
    goes through ``pytest_distlock_url`` and is used as it answers."""
