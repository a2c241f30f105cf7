"""Throwaway real Redis for tests: `RedisServer`, one redis-server on 127.0.0.1.

Import it from `distlock.testing`. It runs on a free loopback port with its data and log in a private temporary
directory, on the shared lifecycle of ``_base`` (stop, kill, pause, resume, restart, close). No RDB snapshots;
with ``appendonly=True`` an append-only file fsynced on every write (``appendfsync always``), so a killed and
restarted server has every write it acknowledged; without it a restarted server is empty. ``password`` turns
on ``requirepass``. ``info()``, ``command_stats()`` and ``client()`` use redis-py
(``pip install 'distlock-fenced[redis]'``); starting and stopping the server do not. The binary is
``$DISTLOCK_REDIS_BIN``, else ``redis-server`` on ``$PATH``.

What can go wrong:

- No binary: `ConfigurationError`, naming the Debian package ``redis-server``.
- redis-server exits or does not answer PING within ``start_timeout``: `ServerStartError` with the tail of its
  log (a port taken meanwhile is retried on a first start).
- ``command_stats()`` counts the server's own lifetime: it restarts from zero with the process, and each call
  (an ``INFO``) counts itself from the next call on. A paused Redis answers nothing, so asking it times out.
- A server left running by a Python process killed with SIGKILL has its data under ``$TMPDIR/distlock-redis-*``.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from distlock._errors import ConfigurationError
from distlock.testing._base import _HOST, _explicit_binary, _OnePortServer

if TYPE_CHECKING:
    import redis

__all__ = ["RedisServer", "find_redis_server"]

_REDIS_HINT = "install the Debian/Ubuntu package redis-server (apt-get install redis-server), or run scripts/servers.sh"


def find_redis_server() -> str:
    """Path of redis-server: ``$DISTLOCK_REDIS_BIN``, else ``redis-server`` on ``$PATH``."""
    explicit = _explicit_binary("DISTLOCK_REDIS_BIN")
    if explicit is not None:
        return explicit
    on_path = shutil.which("redis-server")
    if on_path is None:
        raise ConfigurationError(
            f"no redis-server binary found (looked at $DISTLOCK_REDIS_BIN and $PATH): {_REDIS_HINT}; "
            "or set $DISTLOCK_REDIS_BIN to a redis-server binary"
        )
    return on_path


class RedisServer(_OnePortServer):
    """One redis-server on 127.0.0.1 in its own temporary directory.

    ``appendonly=True`` keeps every acknowledged write across ``kill()`` (an append-only file fsynced on each
    write); without it a restarted server is empty. ``password`` turns on ``requirepass``.
    """

    _label = "Redis"
    _log_name = "redis.log"

    def __init__(
        self,
        *,
        appendonly: bool = False,
        password: str | None = None,
        start_timeout: float = 20.0,
        extra_args: Sequence[str] = (),
        port: int | None = None,
    ) -> None:
        self._redis_bin = find_redis_server()
        self._appendonly = appendonly
        self._password = password
        self._extra_args = list(extra_args)
        super().__init__("distlock-redis-", start_timeout, port)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, with ``:password@`` when the server has a password."""
        auth = f":{quote(self._password, safe='')}@" if self._password is not None else ""
        return f"redis://{auth}{_HOST}:{self.port}/0"

    @property
    def appendonly(self) -> bool:
        return self._appendonly

    def client(self, timeout: float = 5.0) -> redis.Redis:
        """A new redis-py client for this server (close it when done)."""
        try:
            import redis
        except ImportError as exc:
            raise ConfigurationError(
                "RedisServer.client() needs redis-py: pip install 'distlock-fenced[redis]'"
            ) from exc
        return redis.Redis.from_url(self.url, socket_timeout=timeout, socket_connect_timeout=timeout)

    def info(self, section: str = "default") -> dict[str, Any]:
        """``INFO <section>`` as redis-py parses it."""
        with self.client() as client:
            return dict(client.info(section))

    def command_stats(self) -> dict[str, int]:
        """Calls per command since this process started, from ``INFO commandstats``: ``{"get": 3, ...}``.

        Subcommands are keyed as Redis prints them (``client|setname``). This call's own INFO counts from the
        next call on.
        """
        stats = self.info("commandstats")
        return {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}

    def _prepare(self) -> None:
        self.data_dir.mkdir()

    def _command(self) -> list[str]:
        command = [
            self._redis_bin,
            "--port", str(self.port),
            "--bind", _HOST,
            "--dir", str(self.data_dir),
            "--daemonize", "no",
            "--logfile", "",
            "--save", "",
            "--appendonly", "yes" if self._appendonly else "no",
            "--appendfsync", "always",
        ]  # fmt: skip
        if self._password is not None:
            command += ["--requirepass", self._password]
        return command + self._extra_args

    def _ready(self) -> bool:
        # A raw PING (no redis-py needed to start a server): "+PONG" once it serves; "-LOADING" while it replays
        # its append-only file; "-NOAUTH" cannot happen since AUTH goes first when there is a password.
        request = b"*1\r\n$4\r\nPING\r\n"
        if self._password is not None:
            password = self._password.encode()
            request = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(password), password) + request
        try:
            with socket.create_connection((_HOST, self.port), timeout=1.0) as connection:
                connection.sendall(request)
                reply = b""
                while reply.count(b"\r\n") < (2 if self._password is not None else 1):
                    chunk = connection.recv(256)
                    if not chunk:
                        return False
                    reply += chunk
        except OSError:
            return False
        return reply.rstrip().endswith(b"+PONG")
