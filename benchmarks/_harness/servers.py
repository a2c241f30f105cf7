"""The servers a benchmark runs against: the lock service it measures, with its own request counters, and databases.

:class:`ServerUnderTest` is the lock service a lock benchmark measures, read through its own request counters
(:class:`Counters`); :class:`EtcdUnderTest` and :func:`etcd_server` (an etcd started with fsync on, or
``--etcd-url``) serve every benchmark but the Redis, ZooKeeper and SQL-table ones, which define their own;
:func:`database_servers` (etcd, PostgreSQL and a scratch directory for SQLite) serves the database benchmarks.

What can go wrong: counters must not count their own reads, so etcd's are read over HTTP (its metrics), not gRPC.
Leases and keys one measurement leaves on the server would expire, costing the server work, during the next one:
:meth:`ServerUnderTest.remove_leftovers` counts and removes them. Every request to etcd is bounded by
:data:`REQUEST_TIMEOUT`; servers started here are stopped when the run ends, however it ends.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import dataclasses
import json
import sqlite3
import tempfile
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Protocol

import grpc
from etcd3 import etcdrpc

from benchmarks._harness.machine import package_version
from distlock.testing import EtcdServer, PostgresServer, parse_prometheus_text

__all__ = [
    "REQUEST_TIMEOUT",
    "SQLITE_DESCRIPTION",
    "Counters",
    "DatabaseServers",
    "EtcdMetrics",
    "EtcdUnderTest",
    "ServerUnderTest",
    "database_servers",
    "endpoint_of",
    "etcd_server",
]

#: How long one request to etcd (an RPC, a read of its metrics or of its JSON gateway) may take, in seconds.
REQUEST_TIMEOUT = 10.0


SQLITE_DESCRIPTION = f"{sqlite3.sqlite_version} (pysqlite), a file in a temporary directory, WAL, synchronous=NORMAL"


_MSG_RECEIVED = "grpc_server_msg_received_total{"


class Counters(Protocol):
    """A server's own count of the requests it received. Reading it must not count itself."""

    def requests(self) -> Counter[str]:
        """Requests received so far, by kind (etcd: gRPC method; Redis: command)."""


class ServerUnderTest(abc.ABC):
    """The lock service a benchmark measures: its URL (for ``distlock.connect``), its counters, what it is."""

    product: ClassVar[str]

    def __init__(self, url: str, counters: Counters, description: str) -> None:
        self.url = url
        self.counters = counters
        self.description = description

    @abc.abstractmethod
    def version(self) -> str: ...

    @abc.abstractmethod
    def remove_leftovers(self) -> int:
        """Remove what the locks measured so far left on the server (leases, keys); return how many there were."""


def endpoint_of(url: str) -> str:
    """``host:port`` of an ``etcd://host:port`` (or ``http://``, or bare ``host:port``) URL."""
    parsed = urllib.parse.urlsplit(url if "://" in url else f"etcd://{url}")
    if parsed.hostname is None or parsed.port is None:
        raise SystemExit(f"--etcd-url {url!r}: expected etcd://HOST:PORT")
    return f"{parsed.hostname}:{parsed.port}"


def _loopback_opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no $http_proxy for loopback


@dataclasses.dataclass(frozen=True)
class EtcdMetrics:
    """etcd's Prometheus endpoint. Reading it is plain HTTP, so it does not count as an RPC itself."""

    url: str

    def requests(self) -> Counter[str]:
        """gRPC messages received so far, by method (every message of a stream: watch create, cancel, ...)."""
        with _loopback_opener().open(self.url, timeout=REQUEST_TIMEOUT) as response:
            samples = parse_prometheus_text(response.read().decode())
        counts: Counter[str] = Counter()
        for key, value in samples.items():
            if key.startswith(_MSG_RECEIVED):
                counts[key.partition('grpc_method="')[2].partition('"')[0]] += int(value)
        return counts


class EtcdUnderTest(ServerUnderTest):
    """An etcd: its distlock URL, its client URL (for the HTTP/JSON gateway) and its metrics."""

    product = "etcd"

    def __init__(self, url: str, counters: Counters, description: str) -> None:
        super().__init__(url, counters, description)
        self.endpoint = endpoint_of(url)
        self.client_url = f"http://{self.endpoint}"

    def _gateway(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """GET or POST through etcd's HTTP/JSON gateway (bypassing $http_proxy: this is loopback)."""
        data = None if body is None else json.dumps(body).encode()
        with _loopback_opener().open(f"{self.client_url}{path}", data=data, timeout=REQUEST_TIMEOUT) as response:
            return json.loads(response.read())

    def version(self) -> str:
        return str(self._gateway("/version")["etcdserver"])

    def remove_leftovers(self) -> int:
        """Revoke every lease on the server; return how many there were.

        The list comes from the JSON gateway: python3-etcd3's generated stubs have no ``LeaseLeases``.
        """
        ids = [int(lease["ID"]) for lease in self._gateway("/v3/lease/leases", {}).get("leases", [])]
        with grpc.insecure_channel(self.endpoint) as channel:
            stub = etcdrpc.LeaseStub(channel)

            def revoke(lease_id: int) -> None:
                with contextlib.suppress(grpc.RpcError):  # expired meanwhile
                    stub.LeaseRevoke(etcdrpc.LeaseRevokeRequest(ID=lease_id), timeout=REQUEST_TIMEOUT)

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(revoke, ids))
        return len(ids)


@contextlib.contextmanager
def etcd_server(args: argparse.Namespace) -> Iterator[EtcdUnderTest]:
    """The etcd of ``--etcd-url`` (and ``--metrics-url``), or one started for the run with fsync on."""
    if args.etcd_url:
        endpoint = endpoint_of(args.etcd_url)
        metrics = EtcdMetrics(args.metrics_url or f"http://{endpoint}/metrics")
        yield EtcdUnderTest(f"etcd://{endpoint}", metrics, f"an existing server at {endpoint}")
        return
    # fsync on, as in production: `EtcdServer` turns it off by default to make tests faster.
    with EtcdServer(unsafe_no_fsync=False) as server:
        description = "one member started by `distlock.testing.EtcdServer` on loopback, fsync on"
        yield EtcdUnderTest(server.url, EtcdMetrics(f"{server.metrics_url}/metrics"), description)


@contextlib.contextmanager
def _postgres_server(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """The URL of ``--postgres-url``, or of a PostgreSQL started for the run (fsync as ``--fsync`` says), and how
    it came to be."""
    if args.postgres_url:
        yield args.postgres_url, "an existing server"
        return
    settings = {"fsync": "on", "full_page_writes": "on"} if args.fsync else {}
    with PostgresServer(settings=settings) as server:
        fsync = "fsync on" if args.fsync else "fsync off (synchronous_commit on)"
        yield server.dsn, f"started by `distlock.testing.PostgresServer` on loopback, {fsync}"


@dataclasses.dataclass(frozen=True)
class DatabaseServers:
    """What a database benchmark runs against (see :func:`database_servers`)."""

    scratch: Path  # a temporary directory, for SQLite's file
    etcd: EtcdUnderTest
    postgres_url: str
    postgres_origin: str  # started here, how, or an existing server

    def postgres_description(self, server_version: str) -> str:
        return f"{server_version} via psycopg {package_version('psycopg')}, {self.postgres_origin}"


@contextlib.contextmanager
def database_servers(args: argparse.Namespace, prefix: str) -> Iterator[DatabaseServers]:
    """A temporary directory (named ``prefix...``), the etcd of :func:`etcd_server` and a PostgreSQL (``--fsync``,
    ``--postgres-url``), for the options of :func:`database_arguments`; all removed or stopped afterwards."""
    with (
        tempfile.TemporaryDirectory(prefix=prefix) as temp,
        etcd_server(args) as etcd,
        _postgres_server(args) as (postgres_url, postgres_origin),
    ):
        yield DatabaseServers(Path(temp), etcd, postgres_url, postgres_origin)
