"""``connect(url)`` and the client: URL parsing, backend choice by scheme, the client's life cycle across fork.

URLs::

    etcd://host:port[,host:port...][?prefix=distlock]          plain gRPC to one member or a cluster
    etcd://user:password@host:port                             etcd authentication
    etcds://host:port?ca=/ca.pem[&cert=/c.pem&key=/k.pem]      TLS (system roots without ca=), client certificates
    redis://[user:password@]host[:port][/db][?prefix=distlock]  one Redis server (port 6379, database 0 by default)
    rediss://host:port?ca=/ca.pem[&cert=/c.pem&key=/k.pem]     Redis over TLS
    redis+cluster://host:port[,host:port...]                   Redis Cluster (rediss+cluster:// with TLS)
    zk://host:port[,host:port...][/chroot][?prefix=distlock]    a ZooKeeper ensemble (port 2181 by default)
    sql+postgresql://user:password@host:port/database[?prefix=distlock]   a lock table in PostgreSQL (psycopg 3)
    sql+mysql://user:password@host:port/database               ... in MariaDB or MySQL (PyMySQL; also sql+mariadb://)
    sql+sqlite:///path/to/file.db                              ... in a SQLite file (this machine's processes only)
    memory://[name][?prefix=distlock]                          in this process's memory, for tests (distlock.testing)

Keyword options of :func:`connect` override the URL: ``prefix``, ``username``, ``password``, ``ca_cert``,
``client_cert``, ``client_key``, ``connect_timeout`` (how long ``connect`` may take to reach the service, default
5 s), ``request_timeout`` (how long one operation may retry before ``BackendUnavailable``, default 5 s), and
``check=False`` to skip the connection check (then errors show on first use). After ``sql+`` comes a SQLAlchemy
URL: a driver may be named (``sql+postgresql+psycopg2://``), and query options other than ``prefix`` go to the
driver; the lock table's tables are ``<prefix>_leases``, ``<prefix>_waiters`` and ``<prefix>_locks``.

What can go wrong: a malformed URL, an unknown scheme or option, or a missing extra raise ``ConfigurationError``
before any network traffic; an unreachable service raises ``BackendUnavailable`` within ``connect_timeout``; bad
credentials raise ``AuthenticationFailed``. Every call on a closed client raises ``ClientClosed``, and so does a call
that was under way in another thread when the client closed, whatever the backend raised in that race (a cancelled
gRPC stream, a closed socket). A client used after ``fork()`` opens its own connection and leases in
the child and leaves the parent's alone. ``close()`` (also at interpreter exit) revokes the client's leases, which
releases every lock it still holds.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, Self, Unpack
from urllib.parse import parse_qsl, unquote, urlsplit

from ._election import AsyncElection, Election
from ._errors import ClientClosed, ConfigurationError
from ._lock import AsyncLock, Lock, LockOptions
from ._multi import AsyncMultiLock, MultiLock
from ._protocol import Backend, Holder, Inspectable, LockState
from ._rwlock import AsyncRWLock, RWLock
from ._seconds import seconds
from ._session import Keeper
from ._shape import semaphore_kind
from .backends import SCHEMES, Scheme, scheme_of

__all__ = ["Client", "connect"]

log = logging.getLogger("distlock")

_DEFAULT_PREFIX = "distlock"
_QUERY = {"prefix", "ca", "cert", "key"}
_OPTIONS = {"prefix", "username", "password", "ca_cert", "client_cert", "client_key", "connect_timeout"}
_OPTIONS |= {"request_timeout"}

_clients: weakref.WeakSet[Client] = weakref.WeakSet()


class Client:
    """A connection to a lock service. Thread-safe; one per process is plenty. Make locks with :meth:`lock`."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._keeper = Keeper(backend)
        self._closed = False
        _clients.add(self)

    @property
    def description(self) -> str:
        """Where this client points, e.g. ``"etcd at 127.0.0.1:2379"``."""
        return self._backend.description

    def __repr__(self) -> str:
        return f"<distlock.Client {self.description}{' closed' if self._closed else ''}>"

    def lock(self, name: str, **options: Unpack[LockOptions]) -> Lock:
        """A handle on lock ``name``: ``ttl`` is the lease length, ``timeout`` the default wait (see
        :class:`LockOptions` for every option and its default, :class:`Lock` for the handle)."""
        self._check_open()
        return Lock(self, name, **options)

    def async_lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncLock:
        """The asyncio twin of :meth:`lock`."""
        return AsyncLock(self.lock(name, **options))

    def semaphore(self, name: str, limit: int, **options: Unpack[LockOptions]) -> Lock:
        """A handle on semaphore ``name``: at most ``limit`` handles hold it at once, in FIFO order, each with its
        own fencing token. The handle is a :class:`Lock` (same options, ``with``, ``token``, ``lost``...); a name is
        used with one limit at a time (``LockKindMismatch`` otherwise). Raises ``ConfigurationError`` for a
        ``limit`` that is not an int from 1 to 10,000."""
        lock = self.lock(name, **options)
        lock._kind = semaphore_kind(limit)
        return lock

    def async_semaphore(self, name: str, limit: int, **options: Unpack[LockOptions]) -> AsyncLock:
        """The asyncio twin of :meth:`semaphore`."""
        return AsyncLock(self.semaphore(name, limit, **options))

    def rwlock(self, name: str, **options: Unpack[LockOptions]) -> RWLock:
        """A read/write lock on ``name``: ``.read()`` and ``.write()`` make lock handles with these options (many
        readers or one writer, FIFO between them; see :class:`RWLock`)."""
        self._check_open()
        return RWLock(self, name, **options)

    def async_rwlock(self, name: str, **options: Unpack[LockOptions]) -> AsyncRWLock:
        """The asyncio twin of :meth:`rwlock`."""
        return AsyncRWLock(self.rwlock(name, **options))

    def multi_lock(self, names: Iterable[str], **options: Unpack[LockOptions]) -> MultiLock:
        """Locks on every name in ``names``, taken all or none in one canonical (sorted) order, so that two
        processes asking for the same names in different orders cannot deadlock; a token per name. The options
        apply to each lock; ``timeout`` bounds the whole acquisition (see :class:`MultiLock`)."""
        self._check_open()
        return MultiLock(self, names, **options)

    def async_multi_lock(self, names: Iterable[str], **options: Unpack[LockOptions]) -> AsyncMultiLock:
        """The asyncio twin of :meth:`multi_lock`."""
        return AsyncMultiLock(self.multi_lock(names, **options))

    def election(self, name: str, value: str | None = None, **options: Unpack[LockOptions]) -> Election:
        """A candidate in leader election ``name``, named ``value`` (default ``"host:pid"``): ``campaign()`` to
        lead, ``resign()``, ``leader()``, ``observe()``; the term is the leader's fencing token (see
        :class:`Election`). The options are a lock's, except ``owner``."""
        self._check_open()
        return Election(self, name, value, **options)

    def async_election(self, name: str, value: str | None = None, **options: Unpack[LockOptions]) -> AsyncElection:
        """The asyncio twin of :meth:`election`."""
        return AsyncElection(self.election(name, value, **options))

    def holder(self, name: str) -> Holder | None:
        """Who holds lock ``name`` now (its owner id, the token, the number of waiters), or None."""
        self._check_open()
        from ._names import validate_name

        with self._while_open(f"read lock {name!r}"):
            return self._backend.holder(validate_name(name))

    def force_release(self, name: str, token: int) -> bool:
        """Remove lock ``name``'s holder if its fencing token is still ``token``; True if removed, False if the lock
        has no holder or its holder has another token (a newer holder is never touched).

        For operators clearing a stuck lock (``distlock force-release``, the Django admin): the next waiter gets the
        lock at once, and the holder's handle becomes ``lost`` within about a third of its TTL. ``token`` is the
        holder's token as :meth:`holder` or :meth:`inspect` showed it. Raises ``InvalidLockName`` for a bad name
        and ``ConfigurationError`` for a token that is not a positive int.
        """
        self._check_open()
        from ._names import validate_name

        validate_name(name)
        if isinstance(token, bool) or not isinstance(token, int) or token < 1:
            raise ConfigurationError(
                f"token must be the holder's fencing token, a positive int (as holder() shows it), not {token!r}"
            )
        with self._while_open(f"force-release lock {name!r}"):
            released = self._backend.force_release(name, token)
        if released:
            log.warning("distlock: lock %r force-released at token %d on %s", name, token, self.description)
        return released

    def inspect(self) -> list[LockState]:
        """Every lock with a holder or waiters under this client's prefix, in name order (for inspectors)."""
        self._check_open()
        if not isinstance(self._backend, Inspectable):
            raise ConfigurationError(f"{self.description} cannot list its locks (no inspect() in this backend)")
        with self._while_open("inspect locks"):
            return self._backend.inspect()

    def close(self) -> None:
        """Revoke this client's leases (releasing every lock it holds) and close its connection."""
        if self._closed:
            return
        self._closed = True
        try:
            self._keeper.close()
        finally:
            self._backend.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"this distlock client ({self.description}) is closed")

    @contextlib.contextmanager
    def _while_open(self, what: str) -> Iterator[None]:
        """Run the block; an error it raises once the client is closed is a symptom of the close: ``ClientClosed``.

        ``close()`` sets the flag before it revokes anything or closes a connection, so an error caused by the
        close always finds it set.
        """
        try:
            yield
        except ClientClosed:
            raise
        except Exception as e:
            if not self._closed:
                raise
            raise ClientClosed(f"{what}: this distlock client ({self.description}) was closed meanwhile") from e

    def _after_fork(self) -> None:
        self._backend.after_fork()
        self._keeper.after_fork()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def connect(url: str, **options: Any) -> Client:
    """Connect to the lock service at ``url`` (see the module docstring for URLs and options)."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"a distlock URL is a non-empty string like 'etcd://127.0.0.1:2379', not {url!r}")
    parts = urlsplit(url)
    scheme = scheme_of(parts.scheme)
    if scheme is None:
        raise ConfigurationError(
            f"unsupported distlock URL scheme {parts.scheme!r} in {_redact(url)!r}; use one of: "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    check = bool(options.pop("check", True))
    backend = _BUILDERS[scheme.backend](url, parts, scheme, options)
    client = Client(backend)
    if check:
        try:
            backend.check()
        except BaseException:
            client.close()
            raise
    return client


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _parse_hosts(netloc: str, url: str, default_port: int) -> list[tuple[str, int]]:
    hosts: list[tuple[str, int]] = []
    for raw in netloc.split(","):
        item = raw.strip()
        if not item:
            raise ConfigurationError(f"empty host in distlock URL {_redact(url)!r}")
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_text = item.rpartition(":") if ":" in item else (item, "", "")
        if not host:
            raise ConfigurationError(f"missing host in {item!r} of distlock URL {_redact(url)!r}")
        try:
            port = int(port_text) if port_text else default_port
        except ValueError:
            raise ConfigurationError(f"bad port {port_text!r} in distlock URL {_redact(url)!r}") from None
        if not 0 < port < 65536:
            raise ConfigurationError(f"port {port} out of range in distlock URL {_redact(url)!r}")
        hosts.append((host, port))
    return hosts


def _split_userinfo(netloc: str) -> tuple[str, str | None, str | None]:
    """``user:password@hosts`` -> (hosts, user, password), percent-decoded."""
    if "@" not in netloc:
        return netloc, None, None
    userinfo, netloc = netloc.rsplit("@", 1)
    user_text, sep, password_text = userinfo.partition(":")
    return netloc, unquote(user_text), unquote(password_text) if sep else None


def _query(url: str, parts: Any, known: set[str]) -> dict[str, str]:
    query: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in known:
            raise ConfigurationError(
                f"unknown option {key!r} in distlock URL {_redact(url)!r}; known: {', '.join(sorted(known))}"
            )
        query[key] = value
    return query


def _check_options(options: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(options) - allowed
    if unknown:
        raise ConfigurationError(
            f"unknown connect() option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(allowed))}"
        )


def _prefix(options: dict[str, Any], query: dict[str, str], forbidden: str = "") -> str:
    prefix = str(options.get("prefix", query.get("prefix", _DEFAULT_PREFIX)))
    if not prefix or prefix.endswith("/") or any(ord(c) < 32 or c in forbidden for c in prefix):
        extra = f" and contain none of {forbidden!r}" if forbidden else ""
        raise ConfigurationError(f"key prefix {prefix!r} must be non-empty, printable{extra} and not end with '/'")
    return prefix


def _timeouts(options: dict[str, Any]) -> dict[str, float]:
    return {name: seconds(options.get(name, 5.0), name) for name in ("connect_timeout", "request_timeout")}


def _etcd_backend(url: str, parts: Any, scheme: Scheme, options: dict[str, Any]) -> Backend:
    from .backends.etcd._backend import EtcdBackend, TLSConfig  # imports grpc: only when an etcd URL is used

    netloc, username, password = _split_userinfo(parts.netloc)
    if not netloc:
        raise ConfigurationError(f"distlock URL {_redact(url)!r} names no host; e.g. etcd://127.0.0.1:2379")
    if parts.path not in ("", "/"):
        raise ConfigurationError(
            f"distlock URL {_redact(url)!r} has a path {parts.path!r}; put a key prefix in ?prefix=... instead"
        )
    query = _query(url, parts, _QUERY)
    _check_options(options, _OPTIONS)
    prefix = _prefix(options, query)
    username = options.get("username", username)
    password = options.get("password", password)
    ca = options.get("ca_cert", query.get("ca"))
    cert = options.get("client_cert", query.get("cert"))
    key = options.get("client_key", query.get("key"))
    if (ca or cert or key) and not scheme.tls:
        raise ConfigurationError(f"TLS files given for {_redact(url)!r}: use the etcds:// scheme for TLS")
    timeouts = _timeouts(options)
    return EtcdBackend(
        _parse_hosts(netloc, url, scheme.default_port),
        prefix=prefix,
        tls=TLSConfig(ca_cert=ca, client_cert=cert, client_key=key) if scheme.tls else None,
        username=username,
        password=password,
        connect_timeout=timeouts["connect_timeout"],
        request_timeout=timeouts["request_timeout"],
    )


def _redis_backend(url: str, parts: Any, scheme: Scheme, options: dict[str, Any]) -> Backend:
    # Imports redis-py: only when a Redis URL is used.
    from .backends.redis._backend import RedisBackend, RedisCluster, RedisServer

    cluster, tls = scheme.cluster, scheme.tls
    netloc, username, password = _split_userinfo(parts.netloc)
    if not netloc:
        raise ConfigurationError(f"distlock URL {_redact(url)!r} names no host; e.g. redis://127.0.0.1:6379/0")
    query = _query(url, parts, _QUERY)
    _check_options(options, _OPTIONS)
    # Braces would end the {hash tag} that keeps a lock's keys in one Cluster slot.
    prefix = _prefix(options, query, forbidden="{}")
    username = options.get("username", username) or None  # redis://:password@host has an empty user name
    password = options.get("password", password)
    ca = options.get("ca_cert", query.get("ca"))
    cert = options.get("client_cert", query.get("cert"))
    key = options.get("client_key", query.get("key"))
    if (ca or cert or key) and not tls:
        raise ConfigurationError(f"TLS files given for {_redact(url)!r}: use the rediss:// scheme for TLS")
    if (cert is None) != (key is None):
        raise ConfigurationError("a TLS client certificate needs both cert and key (or neither)")
    path = parts.path.strip("/")
    if cluster and path not in ("", "0"):
        raise ConfigurationError(f"distlock URL {_redact(url)!r}: Redis Cluster has only database 0")
    if not path.isdigit() and path != "":
        raise ConfigurationError(
            f"distlock URL {_redact(url)!r} has a path {parts.path!r}; it can only name a database number (/0)"
        )
    hosts = _parse_hosts(netloc, url, scheme.default_port)
    if len(hosts) > 1 and not cluster:
        raise ConfigurationError(
            f"distlock URL {_redact(url)!r} names {len(hosts)} hosts; use redis+cluster:// for a Redis Cluster"
        )
    timeouts = _timeouts(options)
    connection: dict[str, Any] = {
        "username": username,
        "password": password,
        # Also bounds the connection handshake (AUTH, ...): a paused server fails connect() in connect_timeout.
        "socket_timeout": min(timeouts["connect_timeout"], timeouts["request_timeout"]),
        "socket_connect_timeout": min(timeouts["connect_timeout"], timeouts["request_timeout"]),
    }
    if tls:
        connection.update(ssl_ca_certs=ca, ssl_certfile=cert, ssl_keyfile=key)
        for path_option, label in ((ca, "CA certificate"), (cert, "client certificate"), (key, "client key")):
            if path_option is not None and not os.access(path_option, os.R_OK):
                raise ConfigurationError(f"cannot read the Redis {label} file {path_option!r}")
    target = RedisCluster(hosts, tls, connection) if cluster else RedisServer(hosts[0], int(path or 0), tls, connection)
    return RedisBackend(
        target,
        prefix=prefix,
        connect_timeout=timeouts["connect_timeout"],
        request_timeout=timeouts["request_timeout"],
    )


def _zookeeper_backend(url: str, parts: Any, scheme: Scheme, options: dict[str, Any]) -> Backend:
    from .backends.zookeeper._backend import ZooKeeperBackend  # imports kazoo: only when a zk URL is used

    netloc, username, _ = _split_userinfo(parts.netloc)
    if not netloc:
        raise ConfigurationError(f"distlock URL {_redact(url)!r} names no host; e.g. zk://127.0.0.1:2181")
    if username is not None or "username" in options or "password" in options:
        raise ConfigurationError(f"distlock URL {_redact(url)!r}: ZooKeeper authentication is not supported")
    query = _query(url, parts, {"prefix"})
    _check_options(options, {"prefix", "connect_timeout", "request_timeout"})
    timeouts = _timeouts(options)
    return ZooKeeperBackend(
        _parse_hosts(netloc, url, scheme.default_port),
        prefix=_prefix(options, query),
        chroot=unquote(parts.path),
        connect_timeout=timeouts["connect_timeout"],
        request_timeout=timeouts["request_timeout"],
    )


def sql_url(url: str, prefix_option: object = None) -> tuple[Any, str]:
    """The SQLAlchemy URL after ``sql+`` in a distlock URL (``postgresql`` made ``postgresql+psycopg``, ``mysql``
    and ``mariadb`` made ``...+pymysql`` when no driver is named) and the table prefix (``?prefix=``, or
    ``prefix_option`` when given); ``ConfigurationError`` for a URL SQLAlchemy cannot parse or a prefix that is not
    a plain SQL name."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url.partition("+")[2])
    except (ArgumentError, ValueError) as e:
        raise ConfigurationError(f"distlock URL {_redact(url)!r} is not a SQLAlchemy URL after 'sql+': {e}") from e
    backend, _, driver = parsed.drivername.partition("+")
    default = {"postgresql": "psycopg", "mysql": "pymysql", "mariadb": "pymysql"}.get(backend)
    if default is not None and not driver:
        parsed = parsed.set(drivername=f"{backend}+{default}")
    query = dict(parsed.query)
    given = query.pop("prefix", _DEFAULT_PREFIX)
    prefix = str(prefix_option if prefix_option is not None else given)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,40}", prefix):
        raise ConfigurationError(
            f"table prefix {prefix!r} must be a plain SQL name: a letter or _, then up to 40 letters, digits or _"
        )
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ConfigurationError(
            f"distlock URL {_redact(url)!r} names no SQLite file (an in-memory database is one process's only); "
            "e.g. sql+sqlite:///var/lib/app/locks.db"
        )
    return parsed.set(query=query), prefix


def _sqltable_backend(url: str, parts: Any, scheme: Scheme, options: dict[str, Any]) -> Backend:
    from .backends.sqltable._backend import SqlTableBackend  # imports SQLAlchemy: only when a SQL URL is used

    _check_options(options, {"prefix", "connect_timeout", "request_timeout"})
    parsed, prefix = sql_url(url, options.get("prefix"))
    timeouts = _timeouts(options)
    return SqlTableBackend(
        parsed,
        prefix=prefix,
        connect_timeout=timeouts["connect_timeout"],
        request_timeout=timeouts["request_timeout"],
    )


def _memory_backend(url: str, parts: Any, scheme: Scheme, options: dict[str, Any]) -> Backend:
    from .testing._memory import parse

    return parse(url, scheme, options).open()


_BUILDERS: dict[str, Callable[[str, Any, Scheme, dict[str, Any]], Backend]] = {
    "etcd": _etcd_backend,
    "redis": _redis_backend,
    "zookeeper": _zookeeper_backend,
    "sqltable": _sqltable_backend,
    "memory": _memory_backend,
}


def _after_fork_in_child() -> None:
    for client in list(_clients):
        client._after_fork()


def _close_all() -> None:
    for client in list(_clients):
        with contextlib.suppress(Exception):
            client.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all)
