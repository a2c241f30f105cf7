"""The ZooKeeper URL grammar: ``zk://host:port[,host:port...][/chroot][?prefix=P]``; :func:`parse` reads it into a
:class:`ZooKeeperConfig` without side effects.

What can go wrong: a URL without a host, with user info or credential options (ZooKeeper authentication is not
supported), an unknown option, or a chroot and prefix that make a path with an empty, ``.`` or ``..`` component
raise ``ConfigurationError``; ``open()`` raises it for a missing ``zookeeper`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ..._errors import ConfigurationError
from .. import _url

if TYPE_CHECKING:
    from ..._protocol import Backend
    from .. import Scheme

__all__ = ["ZooKeeperConfig", "parse"]


@dataclass(frozen=True)
class ZooKeeperConfig:
    hosts: tuple[tuple[str, int], ...]
    prefix: str
    chroot: str
    connect_timeout: float
    request_timeout: float

    def open(self) -> Backend:
        from ._backend import ZooKeeperBackend  # imports kazoo: only when a zk URL is used

        return ZooKeeperBackend(
            list(self.hosts),
            prefix=self.prefix,
            chroot=self.chroot,
            connect_timeout=self.connect_timeout,
            request_timeout=self.request_timeout,
        )


def parse(url: str, scheme: Scheme, options: dict[str, Any]) -> ZooKeeperConfig:
    parts = _url.split(url)
    if not parts.netloc:
        raise ConfigurationError(f"distlock URL {parts.shown!r} names no host; e.g. zk://127.0.0.1:2181")
    if parts.username is not None or "username" in options or "password" in options:
        raise ConfigurationError(f"distlock URL {parts.shown!r}: ZooKeeper authentication is not supported")
    found = _url.query(parts, {"prefix"})
    _url.check_options(options, _url.PLAIN_OPTIONS)
    connect_timeout, request_timeout = _url.timeouts(options)
    prefix, chroot = _url.prefix(options, found), unquote(parts.path)
    base = "/".join(part for part in (chroot.strip("/"), prefix) if part)
    if any(part in ("", ".", "..") for part in base.split("/")):
        raise ConfigurationError(f"ZooKeeper path /{base} has an empty, '.' or '..' component")
    return ZooKeeperConfig(
        hosts=_url.hosts(parts, scheme.default_port),
        prefix=prefix,
        chroot=chroot,
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
    )
