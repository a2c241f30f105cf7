"""The one server lifecycle every throwaway server of `distlock.testing` runs on, and the helpers they share.

`_Server` owns a private temporary directory (data, log, sockets, certificates), the server's process tree and
a finalizer, and does what every server does the same way: start (on free loopback ports, below the kernel's
ephemeral range or in ``$DISTLOCK_TEST_PORT_RANGE``; the client port may be given instead), wait until ready, stop,
kill, pause, resume, restart, close, ``with``, the log and its tail. A server module says only what differs: its
command line, when it is ready, how it shuts down, which ports it needs and what to do once.

What can go wrong:

- A given ``port`` outside 1-65535 or in use now: ``ConfigurationError`` when the server is made.
- The process exits or is not ready within ``start_timeout``: `ServerStartError` (`EtcdStartError` for etcd) with
  the tail of its log, the tree killed. A port taken meanwhile makes a first start choose again (up to five times);
  a restart keeps its ports, so it fails.
- ``kill()`` and ``pause()`` freeze the whole tree top-down (SIGSTOP) so that no child escapes by forking; without
  ``/proc`` (not Linux) only the process group is killed and the server process alone paused.
- ``close()``, garbage collection and interpreter exit kill the tree and remove the directory; a Python process
  killed by a signal it does not handle leaves its servers running, under ``$TMPDIR/distlock-*``.
"""

from __future__ import annotations

import abc
import contextlib
import os
import pwd
import random
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
from typing import IO, Any, ClassVar, Self

from distlock._errors import ConfigurationError

__all__ = ["HarnessError", "ServerStartError", "parse_prometheus_text"]

_HOST = "127.0.0.1"
_LOG_TAIL_CHARS = 4000
_PORT_ATTEMPTS = 5


class HarnessError(RuntimeError):
    """The test harness could not do what was asked of a server process (not an error of distlock itself)."""


class ServerStartError(HarnessError):
    """A PostgreSQL or Redis server exited or was not ready in time; the message ends with the tail of its log."""


class _PortInUse(HarnessError):
    """A server could not bind a port it was given (taken since it was chosen): a first start chooses again."""


class _ServerPortInUseError(ServerStartError, _PortInUse):
    pass


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _explicit_binary(env_var: str) -> str | None:
    """The binary ``$env_var`` names, None when it is unset; a ConfigurationError when it is no executable file."""
    explicit = os.environ.get(env_var)
    if not explicit:
        return None
    if not _is_executable(Path(explicit)):
        raise ConfigurationError(f"${env_var} is {explicit!r}, which is not an executable file")
    return explicit


def _clean_env(prefix: str) -> dict[str, str]:
    # etcd reads flags from ETCD_*, etcdctl from ETCDCTL_*, libpq from PG*: a developer's settings must not leak in.
    return {key: value for key, value in os.environ.items() if not key.startswith(prefix)}


_handed_out: set[int] = set()


def _port_is_free(port: int, *, as_servers_bind: bool = False) -> bool:
    """Whether ``port`` can be bound (``as_servers_bind``: with ``SO_REUSEADDR``, so TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if as_servers_bind:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((_HOST, port))
        except OSError:
            return False
    return True


def _usable_port(port: int | None) -> int | None:
    """``port`` if a server may be asked to listen on it (None: a free one is chosen), else ``ConfigurationError``."""
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
        raise ConfigurationError(f"a port is an int from 1 to 65535, not {port!r}")
    if port is not None and not _port_is_free(port, as_servers_bind=True):
        raise ConfigurationError(f"port {port} of {_HOST} is in use; give another, or none for a free one")
    return port


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: ``low-high``: the ports this process's servers take (inclusive), for test runs side by side on one machine (each
#: with a range of its own, so that no run takes a port another run's stopped server is about to take again).
PORT_RANGE_ENV = "DISTLOCK_TEST_PORT_RANGE"


def _port_range() -> tuple[int, int] | None:
    """The range of :data:`PORT_RANGE_ENV` as ``range()`` bounds, or below the ephemeral range, or None."""
    given = os.environ.get(PORT_RANGE_ENV)
    if given is None:
        low = _ephemeral_low()
        return (15000, low) if low > 20000 else None
    try:
        first, last = (int(part) for part in given.split("-"))
    except ValueError:
        first = last = 0
    if not 1024 <= first < last <= 65535:
        raise ConfigurationError(f"${PORT_RANGE_ENV} must be LOW-HIGH, two ports from 1024 to 65535, not {given!r}")
    return first, last + 1


def _free_port() -> int:
    """A loopback port nobody listens on, never handed out twice by this process.

    Chosen in ``$DISTLOCK_TEST_PORT_RANGE`` when set, else below the ephemeral range where possible: there the
    kernel never picks it as the source port of an outgoing connection, so a client reconnecting to a stopped
    server cannot take the port (or connect to itself) before the server restarts on it.
    """
    bounds = _port_range()
    if bounds is not None:
        for _ in range(200):
            port = random.randrange(*bounds)
            if port not in _handed_out and _port_is_free(port):
                _handed_out.add(port)
                return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((_HOST, 0))
            port = int(probe.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def parse_prometheus_text(text: str) -> dict[str, float]:
    """Samples of a Prometheus text exposition, keyed by the sample name with its labels exactly as printed.

    ``grpc_server_handled_total{grpc_code="OK",grpc_method="Range",...} 3`` becomes that whole key → 3.0.
    """
    samples: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        # Label values may contain spaces, so split after the closing brace rather than at the first space.
        brace = line.rfind("}")
        if brace >= 0:
            key, rest = line[: brace + 1], line[brace + 1 :]
        else:
            key, _, rest = line.partition(" ")
        fields = rest.split()
        if fields:
            samples[key] = float(fields[0])
    return samples


def _proc_stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first, then the parent's pid)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int(_proc_stat_fields(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def _is_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not; orphans' parent is init)."""
    try:
        return (_proc_stat_fields(pid) or ["Z"])[0] != "Z"
    except OSError:
        return False


def _all_threads_stopped(pid: int) -> bool:
    """True when every thread of ``pid`` is in the stopped state (Linux /proc); True where /proc is missing."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return True
    try:
        for task in tasks.iterdir():
            stat = (task / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                return False
    except OSError:
        return True
    return True


def _freeze_tree(root: int) -> list[int]:
    """SIGSTOP ``root`` and all its descendants, top-down (a stopped parent forks no new child); return their pids.

    Top-down matters for PostgreSQL: its backends put themselves in sessions of their own (so signalling the
    process group misses them), and a backend busy in a query does not notice its postmaster's death.
    """
    if not Path("/proc").is_dir():  # no way to find the descendants: stop what we can
        with contextlib.suppress(ProcessLookupError):
            os.kill(root, signal.SIGSTOP)
        return [root]
    frozen: list[int] = []
    level = [root]
    while level:
        for pid in level:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
        children = _children_by_parent()
        level = [child for pid in level for child in children.get(pid, []) if child not in frozen]
    return frozen


class _ProcessTree:
    """A server process and its descendants: the mutable state the finalizer needs (it must not refer to the server)."""

    def __init__(self) -> None:
        self.popen: subprocess.Popen[bytes] | None = None
        self._frozen: list[int] = []

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole tree, as a crash of the machine's service would, and reap the server process."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            if Path("/proc").is_dir():
                frozen = _freeze_tree(self.popen.pid)
                for pid in frozen:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                # SIGKILL takes effect when a process is next scheduled: wait, so that a restart finds them gone.
                deadline = time.monotonic() + 5
                while any(_is_alive(pid) for pid in frozen[1:]) and time.monotonic() < deadline:
                    time.sleep(0.005)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        self._frozen = []

    def pause(self) -> None:
        """Freeze the tree with SIGSTOP and wait (up to 5 s) until the kernel reports every thread stopped."""
        assert self.popen is not None
        self._frozen = _freeze_tree(self.popen.pid)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not all(_all_threads_stopped(pid) for pid in self._frozen):
            time.sleep(0.005)

    def resume(self) -> None:
        """SIGCONT what ``pause()`` froze (the server process alone if nothing was frozen)."""
        assert self.popen is not None
        for pid in self._frozen or [self.popen.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._frozen = []


def _finalize(process: _ProcessTree, owned_dir: Path) -> None:
    process.kill()
    shutil.rmtree(owned_dir, ignore_errors=True)


class _Managed(abc.ABC):
    """``with it:`` starts it (unless it runs already) and closes it on the way out, also when starting fails."""

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def _is_running(self) -> bool:
        return False

    def __enter__(self) -> Self:
        if not self._is_running():
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


class _Server(_Managed):
    """One server process (and its children) on loopback, everything it writes in its own temporary directory."""

    _log_name: ClassVar[str] = "server.log"
    _start_error: ClassVar[type[HarnessError]] = ServerStartError
    _port_in_use_error: ClassVar[type[HarnessError]] = _ServerPortInUseError
    _stop_signal: ClassVar[signal.Signals] = signal.SIGTERM
    _stop_timeout: ClassVar[float] = 10.0

    def __init__(self, prefix: str, start_timeout: float, port: int | None = None) -> None:
        self._given_port = _usable_port(port)
        self._start_timeout = start_timeout
        self._dir = Path(tempfile.mkdtemp(prefix=prefix))
        self._process = _ProcessTree()
        self._finalizer = weakref.finalize(self, _finalize, self._process, self._dir)
        self._prepared = False
        self._ports_fixed = False  # after the first successful start (or when a cluster chose them)
        self._started_once = False
        self._paused = False
        self._log_offset = 0

    # -- what a server defines

    @property
    @abc.abstractmethod
    def _label(self) -> str:
        """What error messages call the server ("Redis", "etcd distlock-m0")."""

    @abc.abstractmethod
    def _where(self) -> str:
        """Where it listens, for ``repr()``; something like "no port yet" before its first start."""

    @abc.abstractmethod
    def _choose_ports(self) -> None:
        """Choose ports for a first start (again after a port was taken); the client's: `_client_port_choice`."""

    def _client_port_choice(self) -> int:
        """The port clients connect to: the one given to the constructor, else a free one."""
        return self._given_port if self._given_port is not None else _free_port()

    @abc.abstractmethod
    def _command(self) -> list[str]: ...

    @abc.abstractmethod
    def _ready(self) -> bool:
        """Whether the running process serves requests yet (polled until it does)."""

    def _popen_kwargs(self) -> dict[str, Any]:
        return {}

    def _run_as(self) -> pwd.struct_passwd | None:
        """The unprivileged user the server runs as (we are root, and it refuses root), else None: as we are."""
        return None

    def _as_user(self, command: list[str]) -> list[str]:
        """``command`` run as `_run_as`'s user, through ``setpriv``, which execs it: the server stays our direct
        child (so ``kill()`` crashes it for real, which ``runuser``'s watching parent would prevent). Not through
        subprocess's ``user=``: that makes Python fork instead of vfork, and a fork runs gRPC's fork handlers in the
        child, whose poller can crash it before the exec when an etcd client is open in this process (grpc/grpc
        #43055: the server "exited with code -7 while starting")."""
        user = self._run_as()
        if user is None:
            return command
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise ConfigurationError("setpriv (Debian's util-linux) is needed to run a server as another user")
        return [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--", *command]

    def _prepare(self) -> None:
        """Before the first start: create the data directory, if the server does not."""

    def _discard_failed_start(self) -> None:
        """After a first start failed on a taken port, before the next try with new ports."""

    def _after_first_start(self) -> None:
        """Once, after the first successful start."""

    # -- lifecycle

    def start(self) -> None:
        """Start the server (with the data it has) and wait until it answers.

        The first start chooses free ports; later starts (after ``stop()`` or ``kill()``) reuse them.
        """
        if self.running:
            raise HarnessError(f"{self!r} is already running")
        if not self._prepared:
            self._prepare()
            self._prepared = True
        for attempt in range(_PORT_ATTEMPTS):
            if not self._ports_fixed:
                self._choose_ports()
            self._launch()
            try:
                self._wait_ready(time.monotonic() + self._start_timeout)
            except _PortInUse:
                if self._ports_fixed or attempt == _PORT_ATTEMPTS - 1:
                    raise
                self._discard_failed_start()
            else:
                break
        self._ports_fixed = True
        if not self._started_once:
            self._started_once = True
            self._after_first_start()

    def stop(self, timeout: float | None = None) -> None:
        """Shut the server down gracefully; SIGKILL after ``timeout`` s (default per server). Nothing if not running."""
        popen = self._process.popen
        if popen is None or popen.poll() is not None:
            return
        popen.send_signal(self._stop_signal)
        self._process.resume()  # a paused process handles the signal only once continued
        self._paused = False
        try:
            popen.wait(self._stop_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the server and its child processes, as in a crash; the data stays for ``start()``."""
        self._process.kill()
        self._paused = False

    def pause(self) -> None:
        """Freeze the server with SIGSTOP: connections stay open, but nothing is answered until ``resume()``."""
        self._require_running()
        self._process.pause()
        self._paused = True

    def resume(self) -> None:
        """Continue a paused server (SIGCONT)."""
        self._require_running()
        self._process.resume()
        self._paused = False

    def restart(self) -> None:
        """Stop the server (if running) and start it again on the same ports with the same data."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and remove its temporary directory. Safe to call twice."""
        self.stop()
        self._finalizer()

    def _is_running(self) -> bool:
        return self.running

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "not running"
        return f"<{type(self).__name__} {self._where()} {state}>"

    # -- properties

    @property
    def pid(self) -> int:
        """The process id of the current (or last) server process."""
        if self._process.popen is None:
            raise HarnessError(f"{self._label} was never started")
        return self._process.popen.pid

    @property
    def running(self) -> bool:
        """Whether the server process is alive (a paused one is)."""
        return self._process.alive()

    @property
    def paused(self) -> bool:
        return self._paused and self.running

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

    def _require_running(self) -> None:
        if not self.running:
            raise HarnessError(f"{self!r} is not running")

    def _run_step(self, command: list[str], what: str) -> None:
        """Run a set-up step (``initdb``, ``mariadb-install-db``) to its end, its output in the log; raise
        ``ServerStartError`` with the log's tail when it fails."""
        command = self._as_user(command)
        with self._open_log(command) as log:
            result = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=False,
                **self._popen_kwargs(),
            )  # fmt: skip
        if result.returncode != 0:
            raise ServerStartError(
                f"{what} failed with code {result.returncode}. Log ({self.log_path}):\n{self.log_tail()}"
            )

    def _open_log(self, command: Sequence[str]) -> IO[bytes]:
        log = self.log_path.open("ab")
        self._log_offset = log.tell()
        log.write(f"---- distlock.testing: {' '.join(command)}\n".encode())
        log.flush()
        return log

    def _launch(self) -> None:
        """Start the process without waiting for it (cluster members must start together to form a quorum)."""
        command = self._as_user(self._command())
        with self._open_log(command) as log:
            self._process.popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the terminal reaches only Python, which then closes the server
                **self._popen_kwargs(),
            )
        self._paused = False

    def _poll_ready(self) -> bool:
        """True once ready; raises the start error if the process has exited."""
        popen = self._process.popen
        if popen is None:
            raise HarnessError(f"{self._label} was never started")
        code = popen.poll()
        if code is not None:
            tail = self.log_tail()
            error = self._port_in_use_error if "already in use" in tail else self._start_error
            raise error(f"{self._label} exited with code {code} while starting. Log ({self.log_path}):\n{tail}")
        return self._ready()

    def _wait_ready(self, deadline: float) -> None:
        try:
            while not self._poll_ready():
                if time.monotonic() > deadline:
                    raise self._start_error(
                        f"{self._label} was not ready within {self._start_timeout:g} s. "
                        f"Log ({self.log_path}):\n{self.log_tail()}"
                    )
                time.sleep(0.02)
        except BaseException:
            self.kill()
            raise


class _OnePortServer(_Server):
    """A server that listens on one port of 127.0.0.1 (PostgreSQL, Redis)."""

    _port: int | None = None  # until the first start chooses it

    host = _HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise HarnessError(f"{self._label} has no port until it is started")
        return self._port

    def _where(self) -> str:
        return f"{_HOST}:{self._port}" if self._port is not None else "no port yet"

    def _choose_ports(self) -> None:
        self._port = self._client_port_choice()
