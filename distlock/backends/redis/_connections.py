"""Where a Redis backend's commands go: a ``RedisServer`` or ``RedisCluster`` target, with a ``Pool`` of
connections per server; the wait for a wake-up (``RedisTarget.pop_wake_up``, a ``BLPOP`` an interrupt can end);
``pack_command``; and which redis-py errors are retryable (``is_retryable``) or a refusal (``is_refused``).

The pools are this package's own, leaner than redis-py's, and fork-aware: a child opens new connections and leaves
the parent's sockets alone. A Cluster's slot map is redis-py's ``RedisCluster``, read on first use and again after a
redirection (``refresh``).

What can go wrong: a closed client's pools raise ``ClientClosed``; a wait answered with an error reply raises
``BackendError``; everything else is redis-py's errors, which the backend retries or translates. Import this module
after ``_backend``, which says which extra to install when redis-py is missing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any

import redis
import redis.cluster
import redis.exceptions

from ..._errors import BackendError, ClientClosed
from ..._protocol import Interrupt

__all__ = [
    "Pool",
    "RedisCluster",
    "RedisServer",
    "RedisTarget",
    "is_refused",
    "is_retryable",
    "pack_command",
]

#: Errors that mean "not now": a restart, a replay, a failover in progress, a slot moving.
_RETRYABLE = (
    redis.exceptions.RedisClusterException,  # no node of a cluster reachable, a slot not served
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.AskError,  # MovedError too
)
_REFUSED = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
    redis.exceptions.NoPermissionError,
)


def is_refused(error: Exception) -> bool:
    return isinstance(error, _REFUSED)


def is_retryable(error: Exception) -> bool:
    # Checked after is_refused: redis-py's AuthenticationError is a ConnectionError too.
    return isinstance(error, _RETRYABLE) and not is_refused(error)


class Pool:
    """Idle connections to one server, reused last in, first out; a new one is made when none is idle.

    Leaner than redis-py's ``ConnectionPool`` (no health-check read, no metrics per checkout), which is a fifth
    of an uncontended lock's cost at two requests per acquisition. A connection comes back disconnected after
    an error and reconnects on its next send; an error also drops the idle ones, likely as dead (a restart).
    After ``fork()`` the parent's connections are left alone: the child only drops its references.
    """

    def __init__(self, connection_class: Any, options: dict[str, Any]) -> None:
        self._connection_class = connection_class
        self._options = options
        self._mutex = threading.Lock()
        self._idle: list[Any] = []
        self._pid = os.getpid()
        self._closed = False

    def get(self) -> Any:
        with self._mutex:
            if self._pid != os.getpid():
                self._pid, self._idle = os.getpid(), []
            if self._closed:
                raise ClientClosed("the distlock client is closed")
            if self._idle:
                return self._idle.pop()
        # No retry=: redis-py's connections then retry nothing; RedisBackend retries within its deadline. RESP2,
        # whatever redis-py's default: the replies parsed here have one shape across redis-py versions.
        return self._connection_class(protocol=2, **self._options)

    def put(self, connection: Any, *, failed: bool = False) -> None:
        with self._mutex:
            keep = not self._closed and self._pid == os.getpid()
            stale, self._idle = (self._idle, []) if failed else ([], self._idle)
            if keep:
                self._idle.append(connection)
        for old in stale if keep else [*stale, connection]:
            old.disconnect()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.disconnect()


class RedisTarget:
    """Where the commands for a key go (a pool per server), and the wait for a wake-up. Subclassed per deployment."""

    description: str
    #: True when a script may only touch keys of one slot (Cluster): then it cannot check a lease key.
    one_slot_per_script = False

    def pool_for(self, key: str) -> Pool:
        """The pool of the server that serves ``key``."""
        raise NotImplementedError

    def pools(self) -> list[Pool]:
        """The pools of every server that holds keys (every master of a Cluster)."""
        raise NotImplementedError

    def refresh(self) -> None:
        """Re-learn the layout after a redirection (Cluster); nothing to do for one server."""

    def close(self) -> None:
        raise NotImplementedError

    def pop_wake_up(self, key: str, limit: float, interrupt: Interrupt, *, patience: float) -> bytes | None:
        """``BLPOP key`` for at most ``limit`` s (plus ``patience`` for a paused server's answer); a fired
        ``interrupt`` shuts the socket down to end it early. Returns what was popped (None when nothing was)."""
        try:
            pool = self.pool_for(key)
            connection = pool.get()
            connection.connect()  # the socket must exist before the interrupt can reach it
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
            # Unreachable: pause briefly so a dead server is not spun on; the caller's next read raises.
            time.sleep(min(0.05, max(limit, 0)))
            return None
        unregister = interrupt.on_fire(lambda: _shut_down(connection))
        failed = True
        popped = None
        try:
            connection.send_packed_command(
                [pack_command(("BLPOP", key, f"{max(limit, 0.001):.3f}"))], check_health=False
            )
            # A paused server cannot hold us past our limit plus one request's worth of patience.
            if connection.can_read(timeout=limit + patience):
                answer = connection.read_response()
                popped = None if answer is None else bytes(answer[1])
                failed = False
            else:
                connection.disconnect()  # the BLPOP is still pending on it
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            connection.disconnect()
            if not interrupt.fired:
                time.sleep(min(0.05, max(limit, 0)))
        except redis.exceptions.ResponseError as e:
            failed = False
            raise BackendError(f"wait on {self.description} failed: {e}") from e
        finally:
            unregister()
            pool.put(connection, failed=failed and not interrupt.fired)
        return popped


def _where(hosts: list[tuple[str, int]]) -> str:
    return ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in hosts)


def _connection_class(tls: bool) -> Any:
    return redis.SSLConnection if tls else redis.Connection


class RedisServer(RedisTarget):
    """One Redis server (``redis://``, ``rediss://``). Connections are made on first use."""

    def __init__(self, address: tuple[str, int], db: int, tls: bool, options: dict[str, Any]) -> None:
        self._pool = Pool(_connection_class(tls), {**options, "host": address[0], "port": address[1], "db": db})
        self.description = f"Redis at {_where([address])}" + (f" (database {db})" if db else "")

    def pool_for(self, key: str) -> Pool:
        return self._pool

    def pools(self) -> list[Pool]:
        return [self._pool]

    def close(self) -> None:
        self._pool.close()


class RedisCluster(RedisTarget):
    """A Redis Cluster (``redis+cluster://``): redis-py's slot map says which master serves a key's slot.

    The slot map is read on first use (not when connecting, so that ``connect()`` errors come from ``check()``)
    and again after a ``MOVED``/``ASK`` redirection or a connection error.
    """

    one_slot_per_script = True

    def __init__(self, hosts: list[tuple[str, int]], tls: bool, options: dict[str, Any]) -> None:
        self._hosts = hosts
        self._tls = tls
        self._options = options
        self._mutex = threading.Lock()
        self._cluster: Any = None
        self._pools: dict[tuple[str, int], Pool] = {}
        self._closed = False
        self.description = f"Redis Cluster at {_where(hosts)}"

    def _slots(self) -> Any:
        with self._mutex:
            if self._closed:
                raise ClientClosed("the distlock client is closed")
            if self._cluster is None:
                nodes = [redis.cluster.ClusterNode(host, port) for host, port in self._hosts]  # type: ignore[no-untyped-call]
                self._cluster = redis.cluster.RedisCluster(startup_nodes=nodes, ssl=self._tls, **self._options)
            return self._cluster

    def pool_for(self, key: str) -> Pool:
        node = self._slots().get_node_from_key(key)
        return self._pool((str(node.host), int(node.port)))

    def pools(self) -> list[Pool]:
        return [self._pool((str(node.host), int(node.port))) for node in self._slots().get_primaries()]

    def _pool(self, address: tuple[str, int]) -> Pool:
        with self._mutex:
            pool = self._pools.get(address)
            if pool is None:
                options = {**self._options, "host": address[0], "port": address[1]}
                pool = self._pools[address] = Pool(_connection_class(self._tls), options)
            return pool

    def refresh(self) -> None:
        self._slots().nodes_manager.initialize()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            cluster, self._cluster = self._cluster, None
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        if cluster is not None:
            cluster.close()


def pack_command(args: tuple[Any, ...]) -> bytes:
    """One command in the Redis protocol, as redis-py's packer would write it for these argument types (bytes, str
    as UTF-8, int), in one piece: a sixth of an uncontended lock's client time went to redis-py's general packer."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode() if isinstance(arg, int) else arg.encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


def _shut_down(connection: Any) -> None:
    """End a blocked read on ``connection`` from another thread: shut its socket down, leave closing to the owner.

    The plain ``socket.shutdown`` (not ``SSLSocket``'s, which tears down TLS state the reading thread is using).
    redis-py has no public way to reach the socket; ``_sock`` is None when not connected.
    """
    sock = getattr(connection, "_sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
