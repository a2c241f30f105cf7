"""The Redis URL grammar: ``redis://[user:password@]host[:port][/db][?prefix=P]``, ``rediss://`` with
``?ca=&cert=&key=`` TLS files, ``redis+cluster://host:port[,host:port...]`` (``rediss+cluster://``);
:func:`parse` reads it into a :class:`RedisConfig` without side effects.

What can go wrong: a URL without a host, with a path other than a database number, a database other than 0 on a
Cluster, several hosts without ``+cluster``, braces in the prefix (they would end the ``{hash tag}`` that keeps a
lock's keys in one Cluster slot), an unknown option, TLS files on a plain scheme raise ``ConfigurationError``;
``open()`` raises it for a TLS file it cannot read and for a missing ``redis`` extra.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..._errors import ConfigurationError
from .. import _url
from . import socket_timeout

if TYPE_CHECKING:
    from ..._protocol import Backend
    from .. import Scheme

__all__ = ["RedisConfig", "parse"]


@dataclass(frozen=True)
class RedisConfig:
    hosts: tuple[tuple[str, int], ...]
    db: int
    cluster: bool
    prefix: str
    tls: _url.TLSFiles | None
    username: str | None
    password: str | None = field(repr=False)
    connect_timeout: float
    request_timeout: float

    def open(self) -> Backend:
        # Imports redis-py: only when a Redis URL is used (``_backend`` first: it says which extra is missing).
        from ._backend import RedisBackend
        from ._connections import RedisCluster, RedisServer

        timeout = socket_timeout(self.connect_timeout, self.request_timeout)
        connection: dict[str, Any] = {
            "username": self.username,
            "password": self.password,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
        }
        tls = self.tls
        if tls is not None:
            connection.update(ssl_ca_certs=tls.ca_cert, ssl_certfile=tls.client_cert, ssl_keyfile=tls.client_key)
            for path, label in (
                (tls.ca_cert, "CA certificate"),
                (tls.client_cert, "client certificate"),
                (tls.client_key, "client key"),
            ):
                if path is not None and not os.access(path, os.R_OK):
                    raise ConfigurationError(f"cannot read the Redis {label} file {path!r}")
        target = (
            RedisCluster(list(self.hosts), tls is not None, connection)
            if self.cluster
            else RedisServer(self.hosts[0], self.db, tls is not None, connection)
        )
        return RedisBackend(
            target, prefix=self.prefix, connect_timeout=self.connect_timeout, request_timeout=self.request_timeout
        )


def parse(url: str, scheme: Scheme, options: dict[str, Any]) -> RedisConfig:
    parts = _url.split(url)
    if not parts.netloc:
        raise ConfigurationError(f"distlock URL {parts.shown!r} names no host; e.g. redis://127.0.0.1:6379/0")
    found = _url.query(parts, _url.TLS_QUERY)
    _url.check_options(options, _url.OPTIONS)
    prefix = _url.prefix(options, found, forbidden="{}")
    tls = _url.tls_files(parts, options, found, tls=scheme.tls, tls_scheme="rediss")
    path = parts.path.strip("/")
    if scheme.cluster and path not in ("", "0"):
        raise ConfigurationError(f"distlock URL {parts.shown!r}: Redis Cluster has only database 0")
    if not path.isdigit() and path != "":
        raise ConfigurationError(
            f"distlock URL {parts.shown!r} has a path {parts.path!r}; it can only name a database number (/0)"
        )
    hosts = _url.hosts(parts, scheme.default_port)
    if len(hosts) > 1 and not scheme.cluster:
        raise ConfigurationError(
            f"distlock URL {parts.shown!r} names {len(hosts)} hosts; use redis+cluster:// for a Redis Cluster"
        )
    connect_timeout, request_timeout = _url.timeouts(options)
    return RedisConfig(
        hosts=hosts,
        db=int(path or 0),
        cluster=scheme.cluster,
        prefix=prefix,
        tls=tls,
        username=options.get("username", parts.username) or None,  # redis://:password@host has an empty user name
        password=options.get("password", parts.password),
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
    )
