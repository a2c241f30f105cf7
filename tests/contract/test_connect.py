"""connect(): URLs, options, TLS, authentication, and bad input that must fail fast with a clear error."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

import distlock
from distlock.testing import EtcdServer


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "non-empty string"),
        ("http://127.0.0.1:2379", "unsupported distlock URL scheme"),
        ("etcd://", "names no host"),
        ("etcd://127.0.0.1:notaport", "bad port"),
        ("etcd://127.0.0.1:70000", "out of range"),
        ("etcd://127.0.0.1:2379,", "empty host"),
        ("etcd://127.0.0.1:2379/some/path", "prefix"),
        ("etcd://127.0.0.1:2379?prefx=a", "unknown option 'prefx'"),
        ("etcd://127.0.0.1:2379?prefix=a/", "must be non-empty"),
        ("etcd://127.0.0.1:2379?ca=/tmp/ca.pem", "etcds://"),
        ("etcds://127.0.0.1:2379?ca=/nonexistent/ca.pem", "cannot read the etcd CA certificate"),
        ("etcd://user@127.0.0.1:2379", "both a user name and a password"),
    ],
)
def test_bad_urls_raise_configuration_error(url: str, message: str) -> None:
    with pytest.raises(distlock.ConfigurationError, match=message):
        distlock.connect(url)


def test_bad_options_raise_configuration_error(etcd_url: str) -> None:
    with pytest.raises(distlock.ConfigurationError, match="unknown connect"):
        distlock.connect(etcd_url, ttl=3)
    with pytest.raises(distlock.ConfigurationError, match="connect_timeout"):
        distlock.connect(etcd_url, connect_timeout=0)


def test_passwords_are_redacted_from_errors() -> None:
    with pytest.raises(distlock.ConfigurationError) as info:
        distlock.connect("etcd://root:s3cret@127.0.0.1:2379/x")
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("name", ["", "x" * 1025, "a\nb", "a\x00b", "tab\there", "\ud800"])
def test_bad_lock_names_raise_invalid_lock_name(client: distlock.Client, name: str) -> None:
    with pytest.raises(distlock.InvalidLockName):
        client.lock(name)


def test_a_lock_name_must_be_text(client: distlock.Client) -> None:
    with pytest.raises(distlock.InvalidLockName, match="must be a str"):
        client.lock(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), "30", None])
def test_bad_ttl_raises_configuration_error(client: distlock.Client, lock_name: str, ttl: object) -> None:
    with pytest.raises(distlock.ConfigurationError, match="ttl"):
        client.lock(lock_name, ttl=ttl)  # type: ignore[arg-type]


def test_bad_timeouts_raise_configuration_error(client: distlock.Client, lock_name: str) -> None:
    with pytest.raises(distlock.ConfigurationError, match="timeout"):
        client.lock(lock_name, timeout=-1)
    with pytest.raises(distlock.ConfigurationError, match="timeout"):
        client.lock(lock_name).acquire(timeout=float("nan"))
    with pytest.raises(distlock.ConfigurationError, match="max_hold"):
        client.lock(lock_name, max_hold=0)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_endpoint_fails_within_the_connect_timeout() -> None:
    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(distlock.BackendUnavailable, match=f"127.0.0.1:{port}.*connect_timeout") as info:
        distlock.connect(f"etcd://127.0.0.1:{port}", connect_timeout=1)
    assert time.monotonic() - start < 5, "connect hung past its timeout"
    assert isinstance(info.value, ConnectionError)


def test_a_server_that_goes_away_raises_backend_unavailable(etcd_server: EtcdServer, lock_name: str) -> None:
    with distlock.connect(etcd_server.url, request_timeout=1) as client:
        lock = client.lock(lock_name, ttl=5)
        etcd_server.stop()
        start = time.monotonic()
        with pytest.raises(distlock.BackendUnavailable, match=r"unavailable|did not answer"):
            lock.acquire(timeout=10)
        assert time.monotonic() - start < 8, "acquire hung past request_timeout"


@pytest.fixture
def auth_server() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        server.enable_auth("rootpw")
        yield server


def test_authentication(auth_server: EtcdServer, lock_name: str) -> None:
    with distlock.connect(auth_server.url_with_credentials("root", "rootpw")) as client:
        with client.lock(lock_name, ttl=5) as lock:
            assert lock.token > 0
    with pytest.raises(distlock.AuthenticationFailed, match="root"):
        distlock.connect(auth_server.url_with_credentials("root", "wrong"), connect_timeout=2)
    with pytest.raises(distlock.AuthenticationFailed, match="authentication enabled"):
        distlock.connect(auth_server.url, connect_timeout=2)


def test_tls_with_client_certificates(lock_name: str) -> None:
    with EtcdServer(tls=True) as server:
        assert server.url.startswith("etcds://")
        with distlock.connect(server.url) as client, client.lock(lock_name, ttl=5) as lock:
            assert lock.token > 0
        options = {"ca_cert": str(server.ca_path), "client_cert": str(server.client_cert_path)}
        options["client_key"] = str(server.client_key_path)
        with distlock.connect(f"etcds://{server.endpoint}", **options) as client:
            assert client.holder(lock_name) is None
        with pytest.raises(distlock.BackendUnavailable):
            distlock.connect(f"etcd://{server.endpoint}", connect_timeout=1)  # plaintext to a TLS port


def test_prefixes_separate_lock_namespaces(etcd_url: str, lock_name: str) -> None:
    with distlock.connect(etcd_url, prefix="app-one") as one, distlock.connect(etcd_url, prefix="app-two") as two:
        with one.lock(lock_name, ttl=5), two.lock(lock_name, ttl=5, timeout=0):
            pass
