"""The etcd URL grammar: ``etcd://[user:password@]host:port[,host:port...][?prefix=P]``, ``etcds://`` with
``?ca=&cert=&key=`` TLS files; :func:`parse` reads it into an :class:`EtcdConfig` without side effects.

What can go wrong: a URL without a host, with a path, with an unknown option, TLS files on ``etcd://``, a user
without a password (or the reverse) raise ``ConfigurationError``; the TLS files are read by ``open()``, which
raises it for one it cannot read, and for a missing ``etcd`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..._errors import ConfigurationError
from .. import _url

if TYPE_CHECKING:
    from ..._protocol import Backend
    from .. import Scheme

__all__ = ["EtcdConfig", "parse"]


@dataclass(frozen=True)
class EtcdConfig:
    endpoints: tuple[tuple[str, int], ...]
    prefix: str
    tls: _url.TLSFiles | None
    username: str | None
    password: str | None = field(repr=False)
    connect_timeout: float
    request_timeout: float

    def open(self) -> Backend:
        from ._backend import EtcdBackend  # imports grpc: only when an etcd URL is used
        from ._channels import TLSConfig

        tls = self.tls
        return EtcdBackend(
            list(self.endpoints),
            prefix=self.prefix,
            tls=None if tls is None else TLSConfig(tls.ca_cert, tls.client_cert, tls.client_key),
            username=self.username,
            password=self.password,
            connect_timeout=self.connect_timeout,
            request_timeout=self.request_timeout,
        )


def parse(url: str, scheme: Scheme, options: dict[str, Any]) -> EtcdConfig:
    parts = _url.split(url)
    if not parts.netloc:
        raise ConfigurationError(f"distlock URL {parts.shown!r} names no host; e.g. etcd://127.0.0.1:2379")
    if parts.path not in ("", "/"):
        raise ConfigurationError(
            f"distlock URL {parts.shown!r} has a path {parts.path!r}; put a key prefix in ?prefix=... instead"
        )
    found = _url.query(parts, _url.TLS_QUERY)
    _url.check_options(options, _url.OPTIONS)
    username = options.get("username", parts.username)
    password = options.get("password", parts.password)
    if (username is None) != (password is None):
        raise ConfigurationError("etcd authentication needs both a user name and a password")
    connect_timeout, request_timeout = _url.timeouts(options)
    return EtcdConfig(
        endpoints=_url.hosts(parts, scheme.default_port),
        prefix=_url.prefix(options, found),
        tls=_url.tls_files(parts, options, found, tls=scheme.tls, tls_scheme="etcds"),
        username=username,
        password=password,
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
    )
