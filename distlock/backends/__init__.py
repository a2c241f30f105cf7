"""Lock services behind one seam: a module per service, each only translating the protocol and its errors.

A backend implements the handful of primitives of ``distlock._protocol.Backend`` (grant, refresh and revoke a
lease; join a lock's queue, read a ticket's place, wait for the waiter ahead, leave the queue) for one lock
service, and turns that service's client errors into :mod:`distlock` errors. Queueing, timeouts, renewal and
fencing are written once above it, in ``distlock._lock`` and ``distlock._session``; a backend holds no lock logic
of its own.

- ``_etcd``: etcd's v3 gRPC API (``etcd://``, ``etcds://``), needs the ``etcd`` extra (grpcio, protobuf,
  python3-etcd3).
- ``_redis``: Lua scripts on a Redis server or Cluster (``redis://``, ``rediss://``, ``redis+cluster://``,
  ``rediss+cluster://``), needs the ``redis`` extra (redis-py).
- ``_zookeeper``: ephemeral sequential nodes on a ZooKeeper ensemble (``zk://``), needs the ``zookeeper`` extra
  (kazoo).
- ``_sqltable``: a lock table in the application's own SQL database through SQLAlchemy Core (``sql+postgresql://``,
  ``sql+mysql://`` for MariaDB and MySQL, ``sql+sqlite:///``; a driver may be named, ``sql+postgresql+psycopg2://``),
  needs the ``sqltable`` extra (SQLAlchemy), and a driver: ``sqltable-postgresql`` (psycopg 3) or
  ``sqltable-mysql`` (PyMySQL); SQLite needs none.
- ``memory://``: the in-memory reference backend, ``distlock.testing._memory`` (no extra; one process only).

``distlock.connect(url)`` chooses the backend by the URL's scheme, from the one table :data:`SCHEMES` (scheme ->
backend, extra to install, default port, TLS, cluster), and imports the backend's module only then: importing
:mod:`distlock` never imports grpc or redis-py, and a missing extra is a ``ConfigurationError`` naming the extra
to install. This package therefore imports neither client library itself; the Django system checks read the same
table to tell a bad URL from a missing extra without connecting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["SCHEMES", "Scheme", "scheme_of"]


@dataclass(frozen=True)
class Scheme:
    """One URL scheme :func:`distlock.connect` accepts, and what it takes to use it.

    ``backend`` names the module (``distlock.backends._<backend>``), ``extra`` the distlock extra that installs its
    client library, ``requires`` the top-level modules that extra provides (look them up with
    ``importlib.util.find_spec`` to know whether the scheme can work, without importing them), ``default_port`` the
    port of a host given without one; ``tls`` and ``cluster`` say what the scheme asks for.
    """

    name: str
    backend: str
    extra: str
    requires: tuple[str, ...]
    default_port: int
    tls: bool = False
    cluster: bool = False


def _etcd(name: str, *, tls: bool = False) -> Scheme:
    return Scheme(name, backend="etcd", extra="etcd", requires=("grpc", "etcd3"), default_port=2379, tls=tls)


def _sql(database: str, extra: str, driver: tuple[str, ...], default_port: int) -> Scheme:
    return Scheme(
        f"sql+{database}", backend="sqltable", extra=extra, requires=("sqlalchemy", *driver), default_port=default_port
    )


def _redis(name: str, *, tls: bool = False, cluster: bool = False) -> Scheme:
    return Scheme(
        name, backend="redis", extra="redis", requires=("redis",), default_port=6379, tls=tls, cluster=cluster
    )


#: Every URL scheme ``connect()`` accepts, by name (lower case). The one table: ``connect()`` and the Django
#: system checks both read it. A SQL scheme may also name a driver (``sql+postgresql+psycopg2``): :func:`scheme_of`
#: finds its entry.
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
            Scheme("zk", backend="zookeeper", extra="zookeeper", requires=("kazoo",), default_port=2181),
            _sql("postgresql", "sqltable-postgresql", ("psycopg",), 5432),
            _sql("mysql", "sqltable-mysql", ("pymysql",), 3306),
            _sql("mariadb", "sqltable-mysql", ("pymysql",), 3306),
            _sql("sqlite", "sqltable", (), 0),
            # In this process only, for tests: distlock.testing._memory (no extra, no server).
            Scheme("memory", backend="memory", extra="", requires=(), default_port=0),
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
