"""The lock services of one server process (`OneServer`): Redis, ZooKeeper and the PostgreSQL lock table.

- `RedisService` (``redis://``), a server without an append-only file. ``redis-restart``: a worker stops between
  read and write, lock held (as in ``holder-pause``); the server is SIGKILLed and started again at once and comes
  back empty, every lock, queue, lease and token counter forgotten (the weaker guarantee docs/GUARANTEES.md
  describes); another worker gets the lock, and the stopped one resumes, usually well inside its TTL, with a stale
  token. Tokens keep increasing only because the backend floors them with the server's clock. ``redis-pause``:
  SIGSTOP the server for the duration (the leases run out on its wall clock meanwhile), then SIGCONT.
- `ZooKeeperService` (``zk://``), one standalone `ZooKeeperServer`. ``zookeeper-restart``: SIGKILL it, start it
  again after the duration with its data directory (sessions, nodes and sequence counters kept: tokens keep
  increasing). ``zookeeper-pause``: SIGSTOP it past the session timeout (a lease's TTL), then SIGCONT.
- `LockTableService` (``sql+postgresql://``), lock tables on a `PostgresServer` of their own, not the workloads'
  database (whose server no lock fault touches). ``locktable-restart``: SIGKILL PostgreSQL, start it again after
  the duration (every acknowledged commit kept). ``locktable-pause``: SIGSTOP it and its backends past the TTL,
  then SIGCONT.

What can go wrong: a server that does not start again is a `ServerStartError` from the fault (the runner's
`Service.undo` tries once more). A Redis restart's note counts the keys before the kill and just after the restart
(workers may already have queued again by then).
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from distlock.testing import (
    PostgresServer,
    RedisServer,
    ZooKeeperServer,
    find_postgres_bin,
    find_redis_server,
    find_zookeeper,
)
from faults._nemesis import HOLDER_PAUSE
from faults._service import OneServer, first_line

if TYPE_CHECKING:
    from faults._nemesis import Nemesis

__all__ = ["LockTableService", "RedisService", "ZooKeeperService"]


class RedisService(OneServer[RedisServer]):
    name = "redis"
    faults = ("redis-restart", "redis-pause", HOLDER_PAUSE)
    # Without persistence a restart is what makes a stale holder write, and its stale holder resumes within its TTL.
    control = "redis-restart"
    within_ttl = frozenset({"redis-restart"})
    caveat = (
        "Redis runs here without persistence, as docs/GUARANTEES.md warns against for locks that must survive a "
        "crash: a restart forgets every lock, lease and token counter, so two workers can hold the lock at once and "
        "only the fence keeps the row right, with tokens still increasing because the backend floors them with the "
        "server's clock."
    )

    @property
    def url(self) -> str:
        return self.process.url

    def start(self) -> None:
        self.server = RedisServer(appendonly=False)
        self.server.start()
        # ``Redis server v=7.0.15 sha=...``
        words = first_line([find_redis_server(), "--version"]).split()
        self.label = "Redis " + next((w.removeprefix("v=") for w in words if w.startswith("v=")), "unknown")
        self.setup = f"`{find_redis_server()}`, one server without an append-only file"

    def _do(self, fault: str, duration: float, nemesis: Nemesis) -> str:
        if fault == "redis-pause":
            return self.pause_for(duration)
        return nemesis.stale_write(hold=0.0, timeout=duration, during=self._restart_empty)

    def _restart_empty(self) -> str:
        """SIGKILL Redis and start it again at once: it comes back empty."""
        server = self.process
        with server.client(timeout=1.0) as client:
            keys = client.dbsize()
        server.kill()
        server.start()
        with server.client(timeout=1.0) as client:
            return f"SIGKILL with {keys} keys, restarted with {client.dbsize()}"


class ZooKeeperService(OneServer[ZooKeeperServer]):
    name = "zookeeper"
    faults = ("zookeeper-restart", "zookeeper-pause", HOLDER_PAUSE)
    outlast_ttl = frozenset({HOLDER_PAUSE, "zookeeper-pause"})

    @property
    def url(self) -> str:
        return self.process.url

    def start(self) -> None:
        self.server = ZooKeeperServer()
        self.server.start()
        self.label = f"ZooKeeper {_zookeeper_version(self.server.port)}"
        self.setup = (
            f"`{find_zookeeper()[1]}`, one standalone server (100 ms tick; a lease is a session, its TTL the session "
            "timeout), its data directory kept across a restart"
        )

    def _do(self, fault: str, duration: float, nemesis: Nemesis) -> str:
        return self.pause_for(duration) if fault == "zookeeper-pause" else self.restart_after(duration)


def _zookeeper_version(port: int) -> str:
    """``3.8.0``, from the four-letter word ``srvr`` (``Zookeeper version: 3.8.0-<commit>, built on ...``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as connection:
        connection.sendall(b"srvr")
        head = connection.recv(4096).decode("utf-8", "replace").splitlines()
    return head[0].rpartition(": ")[2].split("-")[0].split(",")[0] if head else "unknown"


class LockTableService(OneServer[PostgresServer]):
    name = "locktable"
    faults = ("locktable-restart", "locktable-pause", HOLDER_PAUSE)
    outlast_ttl = frozenset({HOLDER_PAUSE, "locktable-pause"})

    @property
    def url(self) -> str:
        return "sql+" + self.process.dsn

    def start(self) -> None:
        self.server = PostgresServer()
        self.server.start()
        # ``postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)``
        version = first_line([str(find_postgres_bin() / "postgres"), "--version"]).split()
        self.label = f"PostgreSQL {version[2] if len(version) > 2 else 'unknown'} lock table"
        self.setup = (
            "`sql+postgresql://` (psycopg): the lock tables on a PostgreSQL server of their own, not the workloads' "
            "database; fsync off, but a SIGKILL keeps every acknowledged commit"
        )

    def _do(self, fault: str, duration: float, nemesis: Nemesis) -> str:
        return self.pause_for(duration) if fault == "locktable-pause" else self.restart_after(duration)
