"""What every backend's URL grammar shares: splitting a URL, its hosts, user info, query and TLS options, the
``connect()`` option check, the key prefix and the two timeouts, each written once.

A backend's ``<name>/_url.py`` parses its URL with these and returns its config (``distlock.backends.parse_url``
chooses the module by scheme). Nothing here opens a file or a socket or imports a client library: parsing is free
of side effects, so Django's checks and the CLI can ask whether a URL is good without connecting.

What can go wrong: every bad part raises ``ConfigurationError`` naming the URL with its password redacted
(:func:`redact`), the bad part, and what is allowed; :func:`missing_extra` is the error for a client library a
grammar itself needs (SQLAlchemy's URL parser) that is not installed.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .._errors import ConfigurationError
from .._seconds import seconds

if TYPE_CHECKING:
    from . import Scheme

__all__ = [
    "DEFAULT_PREFIX",
    "OPTIONS",
    "PLAIN_OPTIONS",
    "TLS_QUERY",
    "Parts",
    "TLSFiles",
    "check_options",
    "hosts",
    "missing_extra",
    "prefix",
    "query",
    "redact",
    "split",
    "timeouts",
    "tls_files",
]

DEFAULT_PREFIX = "distlock"
#: The ``connect()`` options of a backend without credentials or TLS (ZooKeeper, SQL lock tables).
PLAIN_OPTIONS = frozenset({"prefix", "connect_timeout", "request_timeout"})
#: The ``connect()`` options of a backend with credentials and TLS (etcd, Redis).
OPTIONS = PLAIN_OPTIONS | {"username", "password", "ca_cert", "client_cert", "client_key"}
#: The query options of a URL with TLS files (etcd, Redis).
TLS_QUERY = frozenset({"prefix", "ca", "cert", "key"})


@dataclass(frozen=True)
class Parts:
    """A URL split: ``netloc`` without its user info, which is percent-decoded into ``username`` and ``password``."""

    url: str
    scheme: str
    netloc: str
    path: str
    query: str
    username: str | None
    password: str | None = field(repr=False)

    @property
    def shown(self) -> str:
        """The URL with its password redacted, for messages."""
        return redact(self.url)


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def split(url: str) -> Parts:
    parts = urlsplit(url)
    netloc, username, password = parts.netloc, None, None
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user_text, sep, password_text = userinfo.partition(":")
        username, password = unquote(user_text), unquote(password_text) if sep else None
    return Parts(url, parts.scheme, netloc, parts.path, parts.query, username, password)


def hosts(parts: Parts, default_port: int) -> tuple[tuple[str, int], ...]:
    """The ``host[:port]`` list of the URL (IPv6 in brackets); ``default_port`` for a host given without one."""
    found: list[tuple[str, int]] = []
    for raw in parts.netloc.split(","):
        item = raw.strip()
        if not item:
            raise ConfigurationError(f"empty host in distlock URL {parts.shown!r}")
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_text = item.rpartition(":") if ":" in item else (item, "", "")
        if not host:
            raise ConfigurationError(f"missing host in {item!r} of distlock URL {parts.shown!r}")
        try:
            port = int(port_text) if port_text else default_port
        except ValueError:
            raise ConfigurationError(f"bad port {port_text!r} in distlock URL {parts.shown!r}") from None
        if not 0 < port < 65536:
            raise ConfigurationError(f"port {port} out of range in distlock URL {parts.shown!r}")
        found.append((host, port))
    return tuple(found)


def query(parts: Parts, known: Collection[str]) -> dict[str, str]:
    """The URL's query options, each one of ``known``."""
    found: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in known:
            raise ConfigurationError(
                f"unknown option {key!r} in distlock URL {parts.shown!r}; known: {', '.join(sorted(known))}"
            )
        found[key] = value
    return found


def check_options(options: dict[str, Any], allowed: Collection[str]) -> None:
    unknown = set(options) - set(allowed)
    if unknown:
        raise ConfigurationError(
            f"unknown connect() option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(allowed))}"
        )


def prefix(options: dict[str, Any], found: dict[str, str], forbidden: str = "") -> str:
    """The key prefix: the ``prefix`` option, else ``?prefix=``, else ``distlock``."""
    chosen = str(options.get("prefix", found.get("prefix", DEFAULT_PREFIX)))
    if not chosen or chosen.endswith("/") or any(ord(c) < 32 or c in forbidden for c in chosen):
        extra = f" and contain none of {forbidden!r}" if forbidden else ""
        raise ConfigurationError(f"key prefix {chosen!r} must be non-empty, printable{extra} and not end with '/'")
    return chosen


def timeouts(options: dict[str, Any]) -> tuple[float, float]:
    """``(connect_timeout, request_timeout)``, 5 s each unless given."""
    return seconds(options.get("connect_timeout", 5.0), "connect_timeout"), seconds(
        options.get("request_timeout", 5.0), "request_timeout"
    )


@dataclass(frozen=True)
class TLSFiles:
    """The paths of a CA bundle (None: the system roots) and of a client certificate and its key; not read here."""

    ca_cert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None


def tls_files(
    parts: Parts, options: dict[str, Any], found: dict[str, str], *, tls: bool, tls_scheme: str
) -> TLSFiles | None:
    """The TLS files of a TLS scheme (options over ``?ca=&cert=&key=``); None for a plain scheme, which may name
    none (``tls_scheme`` is the scheme to tell the user of instead)."""
    files = TLSFiles(
        options.get("ca_cert", found.get("ca")),
        options.get("client_cert", found.get("cert")),
        options.get("client_key", found.get("key")),
    )
    if not tls:
        if files.ca_cert or files.client_cert or files.client_key:
            raise ConfigurationError(f"TLS files given for {parts.shown!r}: use the {tls_scheme}:// scheme for TLS")
        return None
    if (files.client_cert is None) != (files.client_key is None):
        raise ConfigurationError("a TLS client certificate needs both cert and key (or neither)")
    return files


def missing_extra(scheme: Scheme, error: ImportError) -> ConfigurationError:
    """The error for a client library ``scheme``'s grammar needs that is not installed."""
    return ConfigurationError(
        f"{scheme.name}:// URLs need the '{scheme.extra}' extra: pip install 'distlock-fenced[{scheme.extra}]' "
        f"({error})"
    )
