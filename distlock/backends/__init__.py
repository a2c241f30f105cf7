"""Lock services behind one seam: a package per service, each translating the protocol and its errors, and owning its
URL grammar.

A backend implements the primitives of ``distlock._protocol.Backend`` for one lock service and turns that service's
client errors into :mod:`distlock` errors; queueing, timeouts, renewal and fencing are written once above it.
Each package has ``_url.py`` (its grammar: ``parse(url, scheme, options)`` returns a frozen config, free of side
effects, whose ``open()`` builds the backend) and ``_backend.py`` (imports the client library); ``_url.py`` here
holds what the grammars share. The URLs themselves are listed in docs/getting-started.md ("URLs and options").

:data:`SCHEMES` is the one table of driver facts: per scheme, the module with its grammar, the extra to install,
the modules that extra provides, the default port, TLS, cluster and (SQL) the default driver. Adding a backend adds
its package and entries here, nothing else. :func:`parse_url` chooses the grammar by scheme; ``distlock.connect()``
is ``parse_url(url, **options).open()`` and a check. What can go wrong: a malformed URL, an unknown scheme or
option raise ``ConfigurationError`` from :func:`parse_url` (no file read, no socket, no client library imported,
except SQLAlchemy's URL parser for ``sql+``); unreadable TLS files and a missing extra raise it from ``open()``,
still before any network traffic.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import ConfigurationError
from ._url import redact, split

if TYPE_CHECKING:
    from .._protocol import Backend

__all__ = ["SCHEMES", "BackendConfig", "Scheme", "parse_url", "scheme_of"]


@dataclass(frozen=True)
class Scheme:
    """One URL scheme :func:`distlock.connect` accepts, and what it takes to use it.

    ``backend`` names the backend (its package, its metrics label), ``url_module`` the module whose
    ``parse(url, scheme, options)`` reads the URL (any importable module), ``extra`` the distlock extra that
    installs its client library, ``requires`` the top-level modules that extra provides (look them up with
    ``importlib.util.find_spec`` to know whether the scheme can work, without importing them), ``default_port`` the
    port of a host given without one; ``tls`` and ``cluster`` say what the scheme asks for; ``driver`` is the
    SQLAlchemy driver of a ``sql+`` URL that names none.
    """

    name: str
    backend: str
    url_module: str
    extra: str
    requires: tuple[str, ...]
    default_port: int
    tls: bool = False
    cluster: bool = False
    driver: str | None = None


class BackendConfig(Protocol):
    """What :func:`parse_url` returns: a backend's parsed URL and options (frozen, no password in its repr)."""

    def open(self) -> Backend:
        """Build the backend (imports its client library; reads TLS files; no network traffic)."""
        ...


def _etcd(name: str, *, tls: bool = False) -> Scheme:
    return Scheme(
        name,
        backend="etcd",
        url_module="distlock.backends.etcd._url",
        extra="etcd",
        requires=("grpc", "etcd3"),
        default_port=2379,
        tls=tls,
    )


def _sql(database: str, extra: str, driver: str | None, default_port: int) -> Scheme:
    """A ``sql+`` scheme; ``driver`` is both the default SQLAlchemy driver and the module it needs."""
    return Scheme(
        f"sql+{database}",
        backend="sqltable",
        url_module="distlock.backends.sqltable._url",
        extra=extra,
        requires=("sqlalchemy", *([driver] if driver else [])),
        default_port=default_port,
        driver=driver,
    )


def _redis(name: str, *, tls: bool = False, cluster: bool = False) -> Scheme:
    return Scheme(
        name,
        backend="redis",
        url_module="distlock.backends.redis._url",
        extra="redis",
        requires=("redis",),
        default_port=6379,
        tls=tls,
        cluster=cluster,
    )


#: Every URL scheme ``connect()`` accepts, by name (lower case). The one table: :func:`parse_url`, the Django
#: system checks and the CLI read it. A SQL scheme may also name a driver (``sql+postgresql+psycopg2``):
#: :func:`scheme_of` finds its entry.
SCHEMES: Mapping[str, Scheme] = MappingProxyType(
    {
        scheme.name: scheme
        for scheme in (
            _etcd("etcd"),
            _etcd("etcds", tls=True),
            _redis("redis"),
            _redis("rediss", tls=True),
            _redis("redis+cluster", cluster=True),
            _redis("rediss+cluster", tls=True, cluster=True),
            Scheme(
                "zk",
                backend="zookeeper",
                url_module="distlock.backends.zookeeper._url",
                extra="zookeeper",
                requires=("kazoo",),
                default_port=2181,
            ),
            _sql("postgresql", "sqltable-postgresql", "psycopg", 5432),
            _sql("mysql", "sqltable-mysql", "pymysql", 3306),
            _sql("mariadb", "sqltable-mysql", "pymysql", 3306),
            _sql("sqlite", "sqltable", None, 0),
            # In this process only, for tests (no extra, no server).
            Scheme(
                "memory",
                backend="memory",
                url_module="distlock.testing._memory",
                extra="",
                requires=(),
                default_port=0,
            ),
        )
    }
)


def scheme_of(name: str) -> Scheme | None:
    """The entry of :data:`SCHEMES` for URL scheme ``name`` (any case), or None; ``sql+<database>+<driver>`` is
    ``sql+<database>``'s (the driver is SQLAlchemy's business)."""
    name = name.lower()
    found = SCHEMES.get(name)
    if found is None and name.startswith("sql+") and name.count("+") == 2:
        found = SCHEMES.get(name.rpartition("+")[0])
    return found


def parse_url(url: str, **options: Any) -> BackendConfig:
    """The backend config of ``url`` with ``connect()``'s keyword options (all but ``check``), parsed by the grammar
    of its scheme, without side effects; ``config.open()`` builds the backend. Raises ``ConfigurationError`` for a
    malformed URL, an unknown scheme or a bad option."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"a distlock URL is a non-empty string like 'etcd://127.0.0.1:2379', not {url!r}")
    name = split(url).scheme
    scheme = scheme_of(name)
    if scheme is None:
        raise ConfigurationError(
            f"unsupported distlock URL scheme {name!r} in {redact(url)!r}; use one of: "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    config: BackendConfig = importlib.import_module(scheme.url_module).parse(url, scheme, dict(options))
    return config
