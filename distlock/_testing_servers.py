"""Throwaway real PostgreSQL and Redis servers for tests: `PostgresServer` and `RedisServer`.

Import them from `distlock.testing` (this private module imports that one). Like `EtcdServer`, each server runs
on a free loopback port with everything (data, log, unix socket) in a private temporary directory, can be killed
(SIGKILL, as in a crash) and started again with its data, and is removed by ``close()``::

    from distlock.testing import PostgresServer, RedisServer

    with PostgresServer() as pg, RedisServer(appendonly=True) as redis_server:
        dsn = pg.create_database("app")  # postgresql://distlock@127.0.0.1:<port>/app
        url = redis_server.url  # redis://127.0.0.1:<port>/0
        redis_server.kill()
        redis_server.start()  # same port, same data: with appendonly=True every acknowledged write is back

PostgreSQL runs with settings for tests (trust authentication for the superuser ``distlock``, 127.0.0.1 only,
``fsync=off``). It refuses to run as root, so as root (CI containers) initdb and postgres run as Debian's
``postgres`` user, or as a system user ``distlock-pg`` created once with useradd when there is none; as
anybody else they run as that user. postgres is our direct child (subprocess's ``user=``, not runuser, whose
watching parent would leave postgres running when SIGKILLed), so ``kill()`` crashes it for real. Binaries:
the directory ``$DISTLOCK_PG_BIN``, else the newest ``/usr/lib/postgresql/*/bin``, else where ``pg_ctl`` is on
``$PATH``. Redis: ``$DISTLOCK_REDIS_BIN``, else ``redis-server`` on ``$PATH``; no RDB snapshots, and with
``appendonly=True`` an append-only file fsynced on every write (``appendfsync always``). ``info()`` and
``command_stats()`` use redis-py (``pip install 'distlock[redis]'``). ``scripts/servers.sh`` installs both
servers on Debian.

What can go wrong:

- No binary: `ConfigurationError`, naming the Debian package (``postgresql``, ``redis-server``).
- As root with no ``postgres`` user and no useradd: `ConfigurationError`. The temporary directory must be
  reachable by that user: a ``$TMPDIR`` under ``/root`` is not, and initdb then fails with its own message.
- The server exits or is not ready within ``start_timeout``: `ServerStartError` with the tail of its log. A port
  taken between choosing it and binding it is retried with a new port on a first start; a restart keeps its port.
- ``kill()`` SIGKILLs the server's whole process tree (PostgreSQL's backends too, so a restart does not find
  them holding the old shared memory). ``close()``, garbage collection and interpreter exit kill the server and
  remove the directory; only a Python process killed by SIGKILL leaves servers behind: look for processes
  with data under ``$TMPDIR/distlock-pg-*`` or ``$TMPDIR/distlock-redis-*``.
- ``command_stats()`` counts the server's own lifetime: it restarts from zero with the process, and each call
  (an ``INFO``) counts itself from the next call on. A paused Redis answers nothing, so asking it times out.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Self
from urllib.parse import quote

from distlock._errors import ConfigurationError
from distlock.testing import (
    _HOST,
    _LOG_TAIL_CHARS,
    _PORT_ATTEMPTS,
    HarnessError,
    _all_threads_stopped,
    _clean_env,
    _free_port,
    _is_executable,
    _Process,
)

if TYPE_CHECKING:
    import redis

__all__ = ["PostgresServer", "RedisServer", "ServerStartError", "find_postgres_bin", "find_redis_server"]

_PG_USER = "distlock"  # the superuser initdb creates, and the database created for it
_PG_SYSTEM_USER = "distlock-pg"  # the OS user created as root when there is no Debian `postgres` user
_PG_HINT = "install the Debian/Ubuntu package postgresql (apt-get install postgresql), or run scripts/servers.sh"
_REDIS_HINT = "install the Debian/Ubuntu package redis-server (apt-get install redis-server), or run scripts/servers.sh"
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class ServerStartError(HarnessError):
    """A PostgreSQL or Redis server exited or was not ready in time; the message ends with the tail of its log."""


class _PortInUseError(ServerStartError):
    """The chosen port was taken before the server bound it: choose another."""


def find_postgres_bin() -> Path:
    """The directory of PostgreSQL's server binaries (``postgres``, ``initdb``, ``createdb``).

    ``$DISTLOCK_PG_BIN``, else the newest ``/usr/lib/postgresql/<version>/bin`` (Debian), else the directory of
    ``pg_ctl`` on ``$PATH``.
    """
    explicit = os.environ.get("DISTLOCK_PG_BIN")
    if explicit:
        if not _is_executable(Path(explicit) / "postgres"):
            raise ConfigurationError(f"$DISTLOCK_PG_BIN is {explicit!r}, which has no executable postgres in it")
        return Path(explicit)
    versions = [path for path in Path("/usr/lib/postgresql").glob("*/bin") if _is_executable(path / "postgres")]
    if versions:
        return max(versions, key=lambda path: [int(part) for part in re.findall(r"\d+", path.parent.name)] or [0])
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is not None:
        directory = Path(pg_ctl).resolve().parent
        if _is_executable(directory / "postgres"):
            return directory
    raise ConfigurationError(
        "no PostgreSQL server found (looked at $DISTLOCK_PG_BIN, /usr/lib/postgresql/*/bin and pg_ctl on $PATH): "
        f"{_PG_HINT}; or set $DISTLOCK_PG_BIN to a directory with postgres and initdb"
    )


def find_redis_server() -> str:
    """Path of redis-server: ``$DISTLOCK_REDIS_BIN``, else ``redis-server`` on ``$PATH``."""
    explicit = os.environ.get("DISTLOCK_REDIS_BIN")
    if explicit:
        if not _is_executable(Path(explicit)):
            raise ConfigurationError(f"$DISTLOCK_REDIS_BIN is {explicit!r}, which is not an executable file")
        return explicit
    on_path = shutil.which("redis-server")
    if on_path is None:
        raise ConfigurationError(
            f"no redis-server binary found (looked at $DISTLOCK_REDIS_BIN and $PATH): {_REDIS_HINT}; "
            "or set $DISTLOCK_REDIS_BIN to a redis-server binary"
        )
    return on_path


def _postgres_os_user() -> pwd.struct_passwd | None:
    """The unprivileged user to run PostgreSQL as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", _PG_SYSTEM_USER):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
    useradd = shutil.which("useradd")
    if useradd is None:
        raise ConfigurationError(
            "PostgreSQL refuses to run as root and there is no postgres user to run it as, nor useradd to create "
            f"one: create an unprivileged user named {_PG_SYSTEM_USER} or postgres"
        )
    result = subprocess.run(
        [
            useradd,
            "--system",
            "--no-create-home",
            "--home-dir=/nonexistent",
            "--shell=/usr/sbin/nologin",
            _PG_SYSTEM_USER,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        return pwd.getpwnam(_PG_SYSTEM_USER)  # a parallel test process may have created it first: that is fine
    except KeyError:
        raise ConfigurationError(f"could not create the user {_PG_SYSTEM_USER}: {result.stderr.strip()}") from None


class _TreeProcess(_Process):
    """A server whose ``kill()`` SIGKILLs its whole process tree, as a crash of the machine's service would.

    PostgreSQL's backends put themselves in sessions of their own (so killing the process group misses them),
    and one busy in a query does not notice its postmaster's death: it would keep the old shared memory
    attached and make a restart refuse to start. So the tree is frozen top-down with SIGSTOP (a stopped parent
    forks no new child while we look for its children), then every process in it is SIGKILLed.
    """

    def kill(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            _kill_tree(self.popen.pid)
        self.popen.wait()


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def _is_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not; orphans' parent is init)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() or ["Z"])[0] != "Z"
    except OSError:
        return False


def _kill_tree(root: int) -> None:
    if not Path("/proc").is_dir():  # no way to find the descendants: kill what we can
        with contextlib.suppress(ProcessLookupError):
            os.killpg(root, signal.SIGKILL)
        return
    frozen: list[int] = []
    level = [root]
    while level:
        for pid in level:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
        children = _children_by_parent()
        level = [child for pid in level for child in children.get(pid, []) if child not in frozen]
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # SIGKILL takes effect when a process is next scheduled: wait, so that a restart finds them gone.
    deadline = time.monotonic() + 5
    while any(_is_alive(pid) for pid in frozen[1:]) and time.monotonic() < deadline:
        time.sleep(0.005)


def _finalize(process: _Process, owned_dir: Path) -> None:
    process.kill()
    shutil.rmtree(owned_dir, ignore_errors=True)


class _LocalServer:
    """What PostgresServer and RedisServer share: a temp dir, a log, one process tree, a port, start/kill/close."""

    _kind = "server"
    _log_name = "server.log"

    def __init__(self, prefix: str, start_timeout: float) -> None:
        self._start_timeout = start_timeout
        self._dir = Path(tempfile.mkdtemp(prefix=prefix))
        self._process = _TreeProcess()
        self._finalizer = weakref.finalize(self, _finalize, self._process, self._dir)
        self._port: int | None = None
        self._started = False  # the port is fixed after the first successful start
        self._log_offset = 0

    # -- what subclasses define

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _popen_kwargs(self) -> dict[str, Any]:
        return {}

    def _prepare(self) -> None:
        """Before the first start: create the data directory."""

    def _after_first_start(self) -> None:
        """Once, after the first successful start."""

    # -- lifecycle

    def start(self) -> None:
        """Start the server (with the data it has, on its port) and wait until it answers."""
        if self._process.alive():
            raise HarnessError(f"{self!r} is already running")
        if not self._started:
            self._prepare()
        for attempt in range(_PORT_ATTEMPTS):
            if not self._started:
                self._port = _free_port()
            self._launch()
            try:
                self._wait_ready(time.monotonic() + self._start_timeout)
            except _PortInUseError:
                if self._started or attempt == _PORT_ATTEMPTS - 1:
                    raise
            else:
                break
        if not self._started:
            self._started = True
            self._after_first_start()

    def kill(self) -> None:
        """SIGKILL the server and its child processes, as in a crash; the data stays for ``start()``."""
        self._process.kill()

    def _stop(self, signum: int, timeout: float) -> None:
        popen = self._process.popen
        if popen is None or popen.poll() is not None:
            return
        popen.send_signal(signum)
        popen.send_signal(signal.SIGCONT)  # a paused process handles the signal only once continued
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def close(self) -> None:
        """Stop the server and remove its temporary directory. Safe to call twice."""
        self.stop()
        self._finalizer()

    def stop(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        if not self.running:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "not running"
        where = f"{_HOST}:{self._port}" if self._port is not None else "no port yet"
        return f"<{type(self).__name__} {where} {state}>"

    # -- properties

    @property
    def host(self) -> str:
        return _HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise HarnessError(f"{self._kind} has no port until it is started")
        return self._port

    @property
    def pid(self) -> int:
        """The process id of the current (or last) server process."""
        if self._process.popen is None:
            raise HarnessError(f"{self._kind} was never started")
        return self._process.popen.pid

    @property
    def running(self) -> bool:
        """Whether the server process is alive (a paused one is)."""
        return self._process.alive()

    @property
    def base_dir(self) -> Path:
        """The temporary directory that holds everything of this server."""
        return self._dir

    @property
    def data_dir(self) -> Path:
        return self._dir / "data"

    @property
    def log_path(self) -> Path:
        """The server's log: its stdout and stderr of every start, appended."""
        return self._dir / self._log_name

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of the log of the current (or last) start."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(self._log_offset, log.seek(0, os.SEEK_END) - chars))
                return log.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(no log: {exc})"

    # -- internals

    def _open_log(self, command: Sequence[str]) -> IO[bytes]:
        log = self.log_path.open("ab")
        self._log_offset = log.tell()
        log.write(f"---- distlock.testing: {' '.join(command)}\n".encode())
        log.flush()
        return log

    def _launch(self) -> None:
        command = self._command()
        with self._open_log(command) as log:
            self._process.popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group (see _TreeProcess), and Ctrl-C reaches only us
                **self._popen_kwargs(),
            )

    def _wait_ready(self, deadline: float) -> None:
        popen = self._process.popen
        assert popen is not None
        try:
            while True:
                code = popen.poll()
                if code is not None:
                    tail = self.log_tail()
                    error = _PortInUseError if "already in use" in tail else ServerStartError
                    raise error(f"{self._kind} exited with code {code} while starting. Log ({self.log_path}):\n{tail}")
                if self._ready():
                    return
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"{self._kind} was not ready within {self._start_timeout:g} s. "
                        f"Log ({self.log_path}):\n{self.log_tail()}"
                    )
                time.sleep(0.02)
        except BaseException:
            self.kill()
            raise


class PostgresServer(_LocalServer):
    """One PostgreSQL server on 127.0.0.1, its cluster in its own temporary directory.

    The superuser ``distlock`` (trust authentication, no password) owns the database ``distlock`` that ``dsn``
    names; ``create_database()`` makes more. Stopping and killing keep the data and the port for ``start()``.
    """

    _kind = "PostgreSQL"
    _log_name = "postgres.log"

    def __init__(self, *, start_timeout: float = 60.0, settings: dict[str, str] | None = None) -> None:
        bin_dir = find_postgres_bin()
        self._postgres = str(bin_dir / "postgres")
        self._initdb = str(bin_dir / "initdb")
        self._createdb = str(bin_dir / "createdb")
        self._user = _postgres_os_user()
        self._settings = {
            "listen_addresses": _HOST,
            # fsync off, but commits still write their WAL before answering (synchronous_commit stays on): a
            # killed server keeps every commit it acknowledged; only a crash of the machine could lose them.
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            "max_connections": "200",
            **(settings or {}),
        }
        super().__init__("distlock-pg-", start_timeout)
        try:
            if self._user is not None:
                os.chown(self._dir, self._user.pw_uid, self._user.pw_gid)
        except BaseException:
            self._finalizer()
            raise

    @property
    def socket_dir(self) -> Path:
        return self._dir / "socket"

    @property
    def dsn(self) -> str:
        """``postgresql://distlock@127.0.0.1:<port>/distlock``: a libpq URL for psycopg, SQLAlchemy, Django."""
        return self.dsn_for(_PG_USER)

    def dsn_for(self, database: str) -> str:
        """The libpq URL of another database on this server."""
        return f"postgresql://{_PG_USER}@{_HOST}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database (lower-case letters, digits, ``_``) and return its libpq URL."""
        if not isinstance(name, str) or not _DB_NAME.fullmatch(name):
            raise ConfigurationError(
                f"database name {name!r} must be 1-63 lower-case letters, digits or _, not starting with a digit"
            )
        self._createdb_run(name)
        return self.dsn_for(name)

    def stop(self, timeout: float = 10.0) -> None:
        """Fast shutdown (SIGINT: ends sessions, writes a checkpoint), SIGKILL after ``timeout`` s."""
        self._stop(signal.SIGINT, timeout)

    def restart(self) -> None:
        """Stop PostgreSQL (if running) and start it again on the same port with the same data."""
        self.stop()
        self.start()

    def _popen_kwargs(self) -> dict[str, Any]:
        env = _clean_env("PG")
        if self._user is None:
            return {"env": env}
        env.update(HOME=self._user.pw_dir, USER=self._user.pw_name, LOGNAME=self._user.pw_name)
        return {"env": env, "user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def _prepare(self) -> None:
        self.socket_dir.mkdir(mode=0o700)
        if self._user is not None:
            os.chown(self.socket_dir, self._user.pw_uid, self._user.pw_gid)
        command = [
            self._initdb,
            f"--pgdata={self.data_dir}",
            f"--username={_PG_USER}",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]
        with self._open_log(command) as log:
            result = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=False,
                **self._popen_kwargs(),
            )  # fmt: skip
        if result.returncode != 0:
            raise ServerStartError(
                f"initdb failed with code {result.returncode}. Log ({self.log_path}):\n{self.log_tail()}"
            )

    def _command(self) -> list[str]:
        command = [self._postgres, "-D", str(self.data_dir), "-p", str(self.port), "-k", str(self.socket_dir)]
        for key, value in self._settings.items():
            command += ["-c", f"{key}={value}"]
        return command

    def _ready(self) -> bool:
        # postgres writes its pid into line 1 of postmaster.pid and its state into line 8: "ready" means it
        # accepts connections (pg_ctl waits for the same). The pid tells a crashed server's stale file (which says
        # "ready" too) from ours. No client library needed, and no connection attempt that logs an error.
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[0].strip() == str(self.pid) and lines[7].strip() == "ready"

    def _after_first_start(self) -> None:
        self._createdb_run(_PG_USER)

    def _createdb_run(self, name: str) -> None:
        result = subprocess.run(
            [self._createdb, f"--host={_HOST}", f"--port={self.port}", f"--username={_PG_USER}", "--no-password", name],
            capture_output=True,
            text=True,
            timeout=60,
            env=_clean_env("PG"),
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise HarnessError(f"createdb {name} failed with code {result.returncode}: {result.stderr.strip()}")


class RedisServer(_LocalServer):
    """One redis-server on 127.0.0.1 in its own temporary directory.

    ``appendonly=True`` keeps every acknowledged write across ``kill()`` (an append-only file fsynced on each
    write); without it a restarted server is empty. ``password`` turns on ``requirepass``.
    """

    _kind = "Redis"
    _log_name = "redis.log"

    def __init__(
        self,
        *,
        appendonly: bool = False,
        password: str | None = None,
        start_timeout: float = 20.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self._redis_bin = find_redis_server()
        self._appendonly = appendonly
        self._password = password
        self._extra_args = list(extra_args)
        self._paused = False
        super().__init__("distlock-redis-", start_timeout)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, with ``:password@`` when the server has a password."""
        auth = f":{quote(self._password, safe='')}@" if self._password is not None else ""
        return f"redis://{auth}{_HOST}:{self.port}/0"

    @property
    def appendonly(self) -> bool:
        return self._appendonly

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    def stop(self, timeout: float = 10.0) -> None:
        """Shut Redis down (SIGTERM: it flushes the append-only file), SIGKILL after ``timeout`` s."""
        self._stop(signal.SIGTERM, timeout)
        self._paused = False

    def kill(self) -> None:
        super().kill()
        self._paused = False

    def pause(self) -> None:
        """Freeze Redis with SIGSTOP: connections stay open but nothing is answered until ``resume()``."""
        self._signal(signal.SIGSTOP)
        self._paused = True
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not _all_threads_stopped(self.pid):
            time.sleep(0.005)

    def resume(self) -> None:
        """Continue a paused Redis (SIGCONT)."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def restart(self) -> None:
        """Stop Redis (if running) and start it again on the same port with the same data directory."""
        self.stop()
        self.start()

    def client(self, timeout: float = 5.0) -> redis.Redis:
        """A new redis-py client for this server (close it when done)."""
        try:
            import redis
        except ImportError as exc:
            raise ConfigurationError("RedisServer.client() needs redis-py: pip install 'distlock[redis]'") from exc
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

    def _signal(self, signum: int) -> None:
        if not self.running:
            raise HarnessError(f"{self!r} is not running")
        os.kill(self.pid, signum)

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
