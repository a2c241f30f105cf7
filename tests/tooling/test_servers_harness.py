"""The PostgreSQL and Redis test harness (`distlock.testing.PostgresServer` / `RedisServer`) runs real servers.

Each test checks what the other test files rely on: the server answers on its URL, keeps its data across a crash
where it promises to, gives fresh databases, and leaves no process or directory behind once closed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from distlock._errors import ConfigurationError
from distlock.testing import HarnessError, PostgresServer, RedisServer
from distlock.testing.__main__ import main as harness_command_line
from distlock.testing._base import _free_port


def _processes_using(directory: Path) -> list[int]:
    """Live processes (zombies have no command line) whose command line names ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(directory).encode() in cmdline:
            found.append(int(entry.name))
    return found


def _select_one(dsn: str) -> object:
    with psycopg.connect(dsn, connect_timeout=10) as connection:
        row = connection.execute("select 1").fetchone()
    assert row is not None
    return row[0]


def test_postgres_answers_on_its_dsn_as_superuser_distlock(postgres_server: PostgresServer) -> None:
    assert postgres_server.dsn == f"postgresql://distlock@127.0.0.1:{postgres_server.port}/distlock"
    assert postgres_server.host == "127.0.0.1"
    assert _select_one(postgres_server.dsn) == 1
    with psycopg.connect(postgres_server.dsn) as connection:
        row = connection.execute("select current_user, current_setting('fsync')").fetchone()
    assert row == ("distlock", "off")


def test_postgres_dsn_fixture_answers(postgres_dsn: str) -> None:
    assert _select_one(postgres_dsn) == 1


def test_postgres_create_database_gives_an_empty_separate_database(postgres_server: PostgresServer) -> None:
    with psycopg.connect(postgres_server.dsn, autocommit=True) as connection:
        connection.execute("create table if not exists in_main (id int)")
    dsn = postgres_server.create_database("harness_fresh")
    assert dsn.endswith("/harness_fresh")
    with psycopg.connect(dsn) as connection:
        row = connection.execute("select current_database(), to_regclass('in_main') is null").fetchone()
    assert row == ("harness_fresh", True)


def test_postgres_create_database_rejects_a_name_it_would_have_to_quote(postgres_server: PostgresServer) -> None:
    with pytest.raises(ConfigurationError, match="database name"):
        postgres_server.create_database('x"; drop database distlock; --')


def test_postgres_keeps_committed_rows_across_kill_and_restart_and_then_closes_clean() -> None:
    server = PostgresServer()
    with server:
        port = server.port
        with psycopg.connect(server.dsn, autocommit=True) as connection:
            connection.execute("create table kept (n int)")
            connection.execute("insert into kept values (42)")
        first_pid = server.pid
        server.kill()
        assert not server.running
        server.start()
        assert server.pid != first_pid and server.port == port
        with psycopg.connect(server.dsn) as connection:
            assert connection.execute("select n from kept").fetchall() == [(42,)]
        server.restart()
        assert _select_one(server.dsn) == 1
        base_dir = server.base_dir
        assert _processes_using(base_dir)
    assert not server.running
    assert not base_dir.exists()
    assert _processes_using(base_dir) == []
    if os.geteuid() == 0:  # PostgreSQL refuses root: the harness must have run it as another user
        with pytest.raises(ProcessLookupError):
            os.kill(server.pid, 0)


def test_postgres_pause_freezes_the_server_and_its_backends_until_resume(postgres_server: PostgresServer) -> None:
    with psycopg.connect(postgres_server.dsn, autocommit=True) as session:
        postgres_server.pause()
        assert postgres_server.paused
        backend_state = Path(f"/proc/{session.info.backend_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert backend_state == "T"  # stopped, not only the postmaster
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(postgres_server.dsn, connect_timeout=1).close()
        postgres_server.resume()
        assert not postgres_server.paused
        assert session.execute("select 1").fetchone() == (1,)
    assert _select_one(postgres_server.dsn) == 1


def _fake_useradd(monkeypatch: pytest.MonkeyPatch, directory: Path) -> Path:
    """Put a useradd on $PATH that records its arguments and fails (this machine's users stay as they are)."""
    record = directory / "useradd-args"
    useradd = directory / "useradd"
    useradd.write_text(f'#!/bin/sh\necho "$@" > {record}\necho "useradd: not here" >&2\nexit 9\n')
    useradd.chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # as root, PostgreSQL needs an unprivileged user to run as
    return record


def test_postgres_as_root_without_a_user_to_run_as_says_what_to_do_and_creates_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = _fake_useradd(monkeypatch, tmp_path)
    monkeypatch.setenv("DISTLOCK_PG_USER", "distlock-no-such-user")
    with pytest.raises(ConfigurationError, match=r"no user distlock-no-such-user .*create_user=True") as error:
        PostgresServer()
    assert "useradd --system" in str(error.value)
    assert not record.exists()


def test_postgres_create_user_runs_useradd_for_the_user_asked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = _fake_useradd(monkeypatch, tmp_path)
    with pytest.raises(ConfigurationError, match="could not create the user distlock-no-such-user: useradd: not here"):
        PostgresServer(user="distlock-no-such-user", create_user=True)
    assert record.read_text().split() == [
        "--system", "--no-create-home", "--home-dir=/nonexistent", "--shell=/usr/sbin/nologin", "distlock-no-such-user",
    ]  # fmt: skip


def test_postgres_refuses_a_named_user_that_is_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(ConfigurationError, match="the user root is root"):
        PostgresServer(user="root")


def test_command_line_prints_usage_without_a_server() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "distlock.testing"], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.startswith("usage: python -m distlock.testing")


def test_command_line_serves_until_sigterm_then_removes_the_server() -> None:
    port = _free_port()
    command = [sys.executable, "-m", "distlock.testing", "redis", "--port", str(port)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as cli:
        assert cli.stdout is not None and cli.stderr is not None
        url = cli.stdout.readline().strip()
        log = Path(cli.stderr.readline().removeprefix("log: ").strip())
        with redis.Redis.from_url(url) as client:
            assert client.ping() is True
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=30) == 0
    assert url == f"redis://127.0.0.1:{port}/0"
    assert log.name == "redis.log" and not log.parent.exists()
    assert _processes_using(log.parent) == []


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["redis", "--port", "0"], 1, "a port is an int from 1 to 65535, not 0"),
        (["zookeeper", "--port", "65536"], 1, "a port is an int from 1 to 65535, not 65536"),
        (["etcd", "--port", "2389", "--members", "3"], 2, "--port names one server's port"),
    ],
)
def test_command_line_refuses_a_bad_port(
    argv: list[str], status: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code: object
    try:
        code = harness_command_line(argv)
    except SystemExit as usage_error:
        code = usage_error.code
    assert code == status and message in capsys.readouterr().err


def test_a_server_refuses_a_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        with pytest.raises(ConfigurationError, match=f"port {taken.getsockname()[1]} of 127.0.0.1 is in use"):
            RedisServer(port=taken.getsockname()[1])


def test_redis_answers_ping_on_its_url(redis_server: RedisServer) -> None:
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    with redis.Redis.from_url(redis_server.url) as client:
        assert client.ping() is True


def test_redis_url_fixture_answers(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        assert client.ping() is True


def test_redis_with_appendonly_keeps_an_incr_counter_across_kill_and_restart(redis_server: RedisServer) -> None:
    with redis.Redis.from_url(redis_server.url) as client:
        assert [client.incr("counter") for _ in range(3)] == [1, 2, 3]
        port, first_pid = redis_server.port, redis_server.pid
        redis_server.kill()
        redis_server.start()
        assert redis_server.pid != first_pid and redis_server.port == port
        assert client.incr("counter") == 4  # redis-py reconnects to the same URL
        redis_server.restart()
        assert client.incr("counter") == 5


def test_redis_without_appendonly_forgets_everything_when_killed() -> None:
    with RedisServer() as server, redis.Redis.from_url(server.url) as client:
        client.set("k", "v")
        server.kill()
        server.start()
        assert client.get("k") is None


def test_redis_pause_stops_answers_until_resume(redis_server: RedisServer) -> None:
    with redis.Redis.from_url(redis_server.url, socket_timeout=0.3) as client:
        client.ping()
        redis_server.pause()
        assert redis_server.paused
        with pytest.raises(redis.TimeoutError):
            client.ping()
        redis_server.resume()
        assert client.ping() is True


def test_redis_password_is_required_and_in_the_url() -> None:
    with RedisServer(password="s3cret/:@") as server:
        assert server.url == f"redis://:s3cret%2F%3A%40@127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(server.url) as client:
            assert client.ping() is True
        with (
            redis.Redis(host=server.host, port=server.port, retry=Retry(NoBackoff(), 0)) as anonymous,
            pytest.raises(redis.AuthenticationError),
        ):
            anonymous.ping()


def test_redis_command_stats_count_calls_per_command(redis_server: RedisServer) -> None:
    with redis.Redis.from_url(redis_server.url) as client:
        for _ in range(3):
            client.set("a", "1")
        client.get("a")
    stats = redis_server.command_stats()
    assert stats["set"] == 3
    assert stats["get"] == 1
    assert redis_server.info("server")["tcp_port"] == redis_server.port


def test_redis_close_leaves_no_process_or_directory() -> None:
    server = RedisServer()
    with server:
        pid, base_dir = server.pid, server.base_dir
        server.pause()  # a paused server must be closed too
    assert not base_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(HarnessError):
        server.resume()


def test_missing_redis_binary_is_a_configuration_error_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DISTLOCK_REDIS_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigurationError, match="redis-server"):
        RedisServer()


def test_postgres_bin_that_is_no_postgres_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DISTLOCK_PG_BIN", str(tmp_path))
    with pytest.raises(ConfigurationError, match="DISTLOCK_PG_BIN"):
        PostgresServer()


def test_a_killed_postgres_takes_its_busy_backends_down_and_restarts_at_once() -> None:
    # A backend busy in a long query does not notice its postmaster's death. Had it outlived the SIGKILL, it would
    # hold the old shared memory, and the restart would fail ("pre-existing shared memory block is still in use").
    with PostgresServer() as server:
        busy = psycopg.connect(server.dsn, autocommit=True)
        backend = busy.info.backend_pid
        busy.pgconn.send_query(b"select count(*) from generate_series(1, 10000000000)")
        with psycopg.connect(server.dsn, autocommit=True) as observer:
            query = "select state from pg_stat_activity where pid = %s"
            while observer.execute(query, (backend,)).fetchone() != ("active",):
                time.sleep(0.01)
        server.kill()
        assert not _is_alive(backend)
        busy.close()
        server.start()
        assert _select_one(server.dsn) == 1


def _is_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a dead process its parent, here init, has not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_servers_take_ports_of_the_range_they_are_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from distlock.testing._base import PORT_RANGE_ENV, _free_port

    monkeypatch.setenv(PORT_RANGE_ENV, "21000-21099")
    assert all(21000 <= _free_port() <= 21099 for _ in range(20))
    for bad in ("21000", "9-80", "30000-20000", "a-b"):
        monkeypatch.setenv(PORT_RANGE_ENV, bad)
        with pytest.raises(ConfigurationError, match="DISTLOCK_TEST_PORT_RANGE must be LOW-HIGH"):
            _free_port()
