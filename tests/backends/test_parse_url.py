"""``distlock.backends.parse_url``: every scheme's grammar, free of side effects (no socket, no file, no client
library); what needs a file or a library waits for ``open()``, which ``connect()`` calls before any traffic."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import pytest
from _support import child_env

import distlock
import distlock.backends
from distlock.backends import SCHEMES, Scheme, parse_url

PASSWORD = "s3cret"


def sample_url(scheme: Scheme) -> str:
    """A URL of ``scheme`` with a password where it takes one and TLS files that do not exist where it takes them."""
    if scheme.name == "sql+sqlite":
        return "sql+sqlite:////nonexistent/dir/locks.db"
    if scheme.backend == "sqltable":
        return f"{scheme.name}://user:{PASSWORD}@127.0.0.1:1/db"
    hosts = "127.0.0.1:1,127.0.0.1:2" if scheme.cluster or scheme.backend == "etcd" else "127.0.0.1:1"
    user = "" if scheme.backend == "zookeeper" else f"user:{PASSWORD}@"
    tls = "?ca=/nonexistent/ca.pem&cert=/nonexistent/c.pem&key=/nonexistent/k.pem" if scheme.tls else ""
    return f"{scheme.name}://{user}{hosts}{tls}"


@contextlib.contextmanager
def no_side_effects() -> Iterator[None]:
    """Any socket connection, file opened or file checked in the block fails the test (so does an import of a module
    not yet imported: imports read files)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a side effect: {args!r}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(builtins, "open", refuse)
        patch.setattr(os, "access", refuse)
        patch.setattr(os, "stat", refuse)
        yield


@pytest.mark.parametrize("scheme", list(SCHEMES.values()), ids=list(SCHEMES))
def test_every_scheme_parses_a_sample_url_without_side_effects(scheme: Scheme) -> None:
    parse_url(sample_url(scheme))  # imports the grammar's modules (imports read files)
    with no_side_effects():
        config: Any = parse_url(sample_url(scheme), connect_timeout=2)
    assert dataclasses.is_dataclass(type(config)) and callable(config.open)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.connect_timeout = 1
    assert (config.connect_timeout, config.request_timeout) == (2.0, 5.0)
    assert PASSWORD not in repr(config)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("etcds://127.0.0.1:1?ca=/nonexistent/ca.pem", "cannot read the etcd CA certificate"),
        ("rediss://127.0.0.1:1?ca=/nonexistent/ca.pem", "cannot read the Redis CA certificate"),
    ],
)
def test_unreadable_tls_files_parse_and_connect_refuses_them_before_any_traffic(
    url: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parse_url(url)  # imports the grammar's modules (imports read files)
    with no_side_effects():
        parse_url(url)

    def refuse(*args: Any) -> None:
        raise AssertionError("connect() sent traffic")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    with pytest.raises(distlock.ConfigurationError, match=message):
        distlock.connect(url)


def test_parsing_imports_no_client_library() -> None:
    probe = (
        "import sys, distlock.backends\n"
        "for url in sys.argv[1:]:\n"
        "    distlock.backends.parse_url(url)\n"
        "print(sorted(m for m in ('grpc', 'etcd3', 'redis', 'kazoo', 'psycopg', 'pymysql') if m in sys.modules))\n"
    )
    urls = [sample_url(scheme) for scheme in SCHEMES.values()]
    result = subprocess.run(
        [sys.executable, "-c", probe, *urls], capture_output=True, text=True, env=child_env(), timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "non-empty string"),
        ("http://127.0.0.1", "unsupported distlock URL scheme 'http'"),
        ("etcd://user@127.0.0.1", "both a user name and a password"),
        ("etcd://127.0.0.1?cert=/c.pem", "use the etcds:// scheme"),
        ("rediss://127.0.0.1?cert=/c.pem", "needs both cert and key"),
        ("zk://127.0.0.1/a//b", "empty, '.' or '..' component"),
        ("sql+sqlite://", "names no SQLite file"),
        *(
            (url, r"names no SQLite file.*sql\+sqlite:///locks\.db \(three slashes.*sql\+sqlite:////var")
            for url in (
                "sql+sqlite://:memory:",  # SQLAlchemy alone: "invalid literal for int()"
                "sql+sqlite+pysqlite://:memory:",
                "sql+sqlite:///:memory:",
                "sql+sqlite://locks.db",  # two slashes: a host
                "sql+sqlite://host/locks.db",
                "sql+sqlite:///file:locks?mode=memory&uri=true",
            )
        ),
    ],
)
def test_what_connect_refuses_parse_url_refuses(url: str, message: str) -> None:
    with pytest.raises(distlock.ConfigurationError, match=message):
        parse_url(url)


def test_a_sqlite_url_takes_a_relative_path_after_three_slashes_and_an_absolute_one_after_four() -> None:
    relative, absolute = parse_url("sql+sqlite:///locks.db"), parse_url("sql+sqlite:////var/lib/app/locks.db")
    assert (relative.url.database, absolute.url.database) == ("locks.db", "/var/lib/app/locks.db")  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class _EchoConfig:
    url: str

    def open(self) -> Any:
        raise NotImplementedError


def parse(url: str, scheme: Scheme, options: dict[str, Any]) -> _EchoConfig:
    """The grammar of the ``echo://`` scheme below: a module outside ``distlock.backends``."""
    return _EchoConfig(url)


def test_a_scheme_may_name_a_grammar_outside_distlock_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    echo = Scheme("echo", backend="echo", url_module=__name__, extra="echo", requires=(), default_port=0)
    monkeypatch.setattr(distlock.backends, "SCHEMES", MappingProxyType({**SCHEMES, "echo": echo}))
    assert parse_url("echo://anything") == _EchoConfig("echo://anything")
