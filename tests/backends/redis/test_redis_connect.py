"""connect() to Redis: URLs, databases, passwords and ACL users, TLS, and bad input or a bad server that must fail
fast with a clear error (real redis-servers from `distlock.testing.RedisServer`)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

import distlock
from distlock.testing import RedisServer


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://", "names no host"),
        ("redis://127.0.0.1:notaport", "bad port"),
        ("redis://127.0.0.1:6379/zero", "can only name a database number"),
        ("redis://127.0.0.1:6379,127.0.0.1:6380", "use redis\\+cluster://"),
        ("redis+cluster://127.0.0.1:6379/2", "only database 0"),
        ("redis://127.0.0.1:6379?prefix=a{b}", "none of"),
        ("redis://127.0.0.1:6379?prefx=a", "unknown option 'prefx'"),
        ("redis://127.0.0.1:6379?ca=/tmp/ca.pem", "rediss://"),
        ("rediss://127.0.0.1:6379?ca=/nonexistent/ca.pem", "cannot read the Redis CA certificate"),
        ("rediss://127.0.0.1:6379?cert=/tmp/c.pem", "both cert and key"),
        ("redis+sentinel://127.0.0.1:26379/mymaster", "unsupported distlock URL scheme"),
    ],
)
def test_bad_redis_urls_raise_configuration_error_before_any_traffic(url: str, message: str) -> None:
    with pytest.raises(distlock.ConfigurationError, match=message):
        distlock.connect(url)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_redis_down_raises_backend_unavailable_within_the_connect_timeout() -> None:
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(distlock.BackendUnavailable, match=f"127.0.0.1:{port}") as info:
        distlock.connect(f"redis://127.0.0.1:{port}/0", connect_timeout=1)
    assert time.monotonic() - started < 5, "connect() took far longer than its connect_timeout"
    assert "is Redis running there?" in str(info.value)


def test_a_paused_redis_raises_backend_unavailable_not_a_hang(redis_server: RedisServer) -> None:
    redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(distlock.BackendUnavailable):
            distlock.connect(redis_server.url, connect_timeout=1)
        assert time.monotonic() - started < 5
    finally:
        redis_server.resume()


def test_redis_going_away_makes_acquire_raise_backend_unavailable(redis_server: RedisServer, lock_name: str) -> None:
    with distlock.connect(redis_server.url, request_timeout=1) as client:
        lock = client.lock(lock_name, ttl=5)
        redis_server.kill()
        started = time.monotonic()
        with pytest.raises(distlock.BackendUnavailable, match=r"Redis at 127\.0\.0\.1"):
            lock.acquire(timeout=10)
        assert time.monotonic() - started < 5, "acquire() kept retrying past the request timeout"


@pytest.fixture(scope="module")
def redis_with_password() -> Iterator[RedisServer]:
    with RedisServer(password="s3cret-pw") as server:
        yield server


@pytest.mark.parametrize("userinfo", [":wrong-pw@", "", "nobody:s3cret-pw@"])
def test_wrong_or_missing_credentials_raise_authentication_failed(
    redis_with_password: RedisServer, userinfo: str
) -> None:
    url = f"redis://{userinfo}127.0.0.1:{redis_with_password.port}/0"
    with pytest.raises(distlock.AuthenticationFailed, match="refused the credentials") as info:
        distlock.connect(url, connect_timeout=2)
    assert "s3cret-pw" not in str(info.value) and "wrong-pw" not in str(info.value)


def test_the_right_password_works(redis_with_password: RedisServer, lock_name: str) -> None:
    with distlock.connect(redis_with_password.url) as client, client.lock(lock_name, ttl=5) as lock:
        assert lock.token > 0


def test_an_acl_user_needs_only_its_own_keys_and_a_user_without_scripts_is_refused(
    redis_server: RedisServer, lock_name: str
) -> None:
    with redis_server.client() as admin:
        admin.acl_setuser(
            "locker", enabled=True, passwords=["+locker-pw"], keys=["app:*"], commands=["+@all", "-@dangerous"]
        )
        admin.acl_setuser(
            "noscripts", enabled=True, passwords=["+n-pw"], keys=["app:*"], commands=["+@all", "-@scripting"]
        )
    base = f"127.0.0.1:{redis_server.port}/0"
    with distlock.connect(f"redis://locker:locker-pw@{base}?prefix=app") as client:
        with client.lock(lock_name, ttl=5) as lock:
            assert client.holder(lock_name) is not None and lock.token > 0
    with distlock.connect(f"redis://noscripts:n-pw@{base}?prefix=app") as client:
        with pytest.raises(distlock.AuthenticationFailed, match="refused"):
            client.lock(lock_name, ttl=5).acquire(timeout=1)


def test_the_database_number_in_the_url_is_used(redis_server: RedisServer, lock_name: str) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/3"
    with distlock.connect(url) as client, client.lock(lock_name, ttl=5):
        with redis_server.client() as admin:
            assert admin.execute_command("SELECT", 3)
            in_db3 = admin.keys("distlock:*")
        assert any(b":lease:" in key for key in in_db3), in_db3
    with distlock.connect(url) as client:
        assert "database 3" in client.description


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, int, Path]]:
    """A Redis that also serves TLS (on a second port), with a certificate from a throwaway CA."""
    directory = tmp_path_factory.mktemp("redis-tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca.cert_pem.write_to_path(str(ca_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    tls_port = _closed_port()
    args = ["--tls-port", str(tls_port), "--tls-cert-file", str(cert_path), "--tls-key-file", str(key_path)]
    args += ["--tls-ca-cert-file", str(ca_path), "--tls-auth-clients", "no"]
    with RedisServer(extra_args=args) as server:
        yield server, tls_port, ca_path


def test_rediss_with_the_servers_ca_works(tls_redis: tuple[RedisServer, int, Path], lock_name: str) -> None:
    _, tls_port, ca_path = tls_redis
    with distlock.connect(f"rediss://127.0.0.1:{tls_port}/0?ca={ca_path}") as client:
        with client.lock(lock_name, ttl=5) as lock:
            assert client.holder(lock_name) is not None and lock.token > 0


def test_rediss_without_trusting_the_server_is_refused(tls_redis: tuple[RedisServer, int, Path]) -> None:
    _, tls_port, _ = tls_redis
    with pytest.raises(distlock.BackendUnavailable, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        distlock.connect(f"rediss://127.0.0.1:{tls_port}/0", connect_timeout=2)
