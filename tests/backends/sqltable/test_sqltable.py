"""What the SQL lock table promises beyond the backend-neutral contract (which runs on it in PostgreSQL, MariaDB and
SQLite): a frozen holder loses the lock to the next waiter and the database refuses its fenced write; a client whose
clock is an hour off (faketime) sees its lease live exactly as long as the database's clock says; tokens keep
increasing across a crash and a restart of the database, after the largest id was deleted; URLs, errors and the
``sql-tables`` command."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from _support import SQL_TABLES, Worker, wait_until, waiters

import distlock
import distlock.backends
from distlock._cli import main
from distlock.testing import MariaDBServer, PostgresServer

pytestmark = pytest.mark.every_database

TTL = 2


@pytest.fixture
def fenced_row(backend_url: str) -> Iterator[tuple[str, str]]:
    """A table with one fenced row (id 1, value 0, fence_token 0) in the lock table's database: (SQLAlchemy URL,
    table name); dropped after the test."""
    config: Any = distlock.backends.parse_url(backend_url)
    database = config.url.render_as_string(hide_password=False)
    table_name = f"fenced_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(database)
    table = sa.Table(
        table_name,
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("value", sa.Integer, nullable=False),
        sa.Column("fence_token", sa.BigInteger, nullable=False),
    )
    table.create(engine)
    with engine.begin() as connection:
        connection.execute(sa.insert(table).values(id=1, value=0, fence_token=0))
    try:
        yield database, table_name
    finally:
        table.drop(engine)
        engine.dispose()


@pytest.mark.parametrize("backend", SQL_TABLES, indirect=True)
def test_a_frozen_holder_loses_the_lock_to_the_next_waiter_and_its_fenced_write_is_refused(
    backend_url: str, fenced_row: tuple[str, str], lock_name: str
) -> None:
    database, table_name = fenced_row
    write: dict[str, Any] = {"op": "fenced_write", "db": database, "table": table_name, "row": 1}
    worker = Worker(backend_url)
    try:
        first = worker.call(op="acquire", name=lock_name, ttl=TTL)
        assert first["acquired"]
        assert worker.call(**write, value=1) == {"rows": 1}
        worker.stop()  # frozen past its lease: its keeper cannot refresh it
        with distlock.connect(backend_url) as client, client.lock(lock_name, ttl=TTL, timeout=TTL + 5) as lock:
            assert lock.token > first["token"]
            engine = sa.create_engine(database)
            try:
                with engine.begin() as connection:  # the new holder claims the row, then writes
                    claim = sa.text(
                        f"UPDATE {table_name} SET value = 2, fence_token = :t WHERE id = 1 AND fence_token <= :t"
                    )
                    assert connection.execute(claim, {"t": lock.token}).rowcount == 1
                worker.cont()
                assert worker.call(**write, value=99) == {"rows": 0}, "the stale holder's write was accepted"
                with engine.begin() as connection:
                    row = connection.execute(sa.text(f"SELECT value, fence_token FROM {table_name}")).one()
            finally:
                engine.dispose()
            assert tuple(row) == (2, lock.token)
    finally:
        worker.close()


def _libfaketime() -> str:
    """The library Debian's faketime command preloads (package libfaketime, which faketime depends on)."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not found:
        pytest.fail("no libfaketime.so.1 under /usr/lib/*/faketime: install faketime (scripts/servers.sh does)")
    return str(found[0])


@pytest.mark.parametrize(
    ("backend", "offset"), [("postgres-table", "+1h"), ("mariadb-table", "-1h")], indirect=["backend"]
)
def test_a_client_an_hour_off_keeps_its_lease_exactly_as_long_as_the_database_clock_says(
    backend_url: str, lock_name: str, offset: str
) -> None:
    """An hour ahead, a lease computed on the client's clock would outlive its holder by an hour; an hour behind,
    it would be dead at once. Computed and compared on the database's clock, it lives while its holder refreshes
    it and ends within its TTL after the holder dies. (SQLite has no server: its clock is each process's own.)"""
    ttl = 1.0  # the shortest lease: keeps the test short
    # What `faketime -f OFFSET` does, without its forking parent (a SIGKILL must reach the holder itself). Only the
    # wall clock is off, as on a machine set to a wrong time: libfaketime 0.9.10 faking the monotonic clocks too
    # makes Python's timed waits hang (and time.sleep fail), whatever the code under test does.
    worker = Worker(
        backend_url,
        wrapper=["env", f"LD_PRELOAD={_libfaketime()}", f"FAKETIME={offset}", "FAKETIME_DONT_FAKE_MONOTONIC=1"],
    )
    try:
        skew = worker.call(op="clock")["time"] - time.time()
        assert abs(abs(skew) - 3600) < 60, f"faketime did not move the worker's clock ({skew:+.0f} s)"
        first = worker.call(op="acquire", name=lock_name, ttl=ttl)
        assert first["acquired"]
        with distlock.connect(backend_url) as client:
            (state,) = [state for state in client.inspect() if state.name == lock_name]
            assert state.holder.ttl_left is not None and 0 < state.holder.ttl_left <= ttl + 0.05
            waiter = client.lock(lock_name, ttl=ttl)
            assert not waiter.acquire(timeout=ttl * 1.5), "the lease expired while its holder refreshed it"
            killed = time.monotonic()
            worker.kill()
            assert waiter.acquire(timeout=ttl + 5), "the killed holder's lease did not expire"
            assert time.monotonic() - killed <= ttl + 1
            assert waiter.token > first["token"]
            waiter.release()
    finally:
        worker.close()


@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
def test_tokens_strictly_increase_across_a_database_crash_and_restart(database: str, lock_name: str) -> None:
    """Each release deletes the largest id in the table (it is empty then): a counter that restarted from the
    table's contents would hand that id out again."""
    server: PostgresServer | MariaDBServer = PostgresServer() if database == "postgresql" else MariaDBServer()
    with server:
        url = f"sql+{server.dsn}" if isinstance(server, PostgresServer) else server.url
        tokens = []
        for fault in ("nothing", "kill", "restart"):
            if fault == "kill":
                server.kill()
                server.start()
            elif fault == "restart":
                server.restart()
            with distlock.connect(url) as client, client.lock(lock_name, ttl=10) as lock:
                tokens.append(lock.token)
    assert tokens == sorted(set(tokens)), tokens


@pytest.mark.parametrize("backend", SQL_TABLES, indirect=True)
def test_a_dead_waiter_ahead_is_removed_by_the_waiter_behind_it(
    backend_url: str, client: distlock.Client, lock_name: str
) -> None:
    """Nobody deletes a crashed client's rows for it: the waiter behind finds the lease expired (by the database's
    clock) and removes the entry, within the TTL."""
    holder = client.lock(lock_name, ttl=10)
    assert holder.acquire()
    worker = Worker(backend_url)
    try:
        worker.send(op="acquire", name=lock_name, ttl=1, timeout=60)
        wait_until(lambda: waiters(client, lock_name) == 1, 10, "the worker to queue")
        behind = client.lock(lock_name, ttl=10)
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(behind.acquire(timeout=10)))
        thread.start()
        wait_until(lambda: waiters(client, lock_name) == 2, 10, "a second waiter to queue behind the worker")
        worker.kill()
        holder.release()
        thread.join(10)
        assert got == [True]
        assert [state.waiters for state in client.inspect() if state.name == lock_name] == [()]
        behind.release()
    finally:
        worker.close()


def test_a_lock_under_the_longest_prefix_is_released_on_postgresql(postgres_dsn: str, lock_name: str) -> None:
    """A 41-character prefix (the most ``?prefix=`` takes) makes a lock's NOTIFY channel longer than PostgreSQL's
    63-character names: it is cut to fit, or the release fails ("channel name too long") and the lock stays held."""
    url = f"sql+{postgres_dsn}"
    prefix = f"p{uuid.uuid4().hex}"[:41]
    with distlock.connect(url, prefix=prefix) as client, distlock.connect(url, prefix=prefix) as other:
        with client.lock(lock_name, ttl=30):
            assert not other.lock(lock_name).acquire(timeout=0)
        assert other.lock(lock_name).acquire(timeout=0)


def test_bad_urls_are_configuration_errors(tmp_path: Path) -> None:
    for url in (
        "sql+postgresql://host:notaport/db",
        "sql+sqlite://",
        "sql+sqlite:///:memory:",
        f"sql+sqlite:///{tmp_path}/locks.db?prefix=bad-prefix",
        "sql+postgresql+nosuchdriver://host/db",
    ):
        with pytest.raises(distlock.ConfigurationError):
            distlock.connect(url, check=False)
    with pytest.raises(distlock.ConfigurationError):  # a SQLite file that cannot be made: found on connect
        distlock.connect(f"sql+sqlite:///{tmp_path}/no/such/dir/locks.db")


def _driver_error(error: BaseException) -> str:
    """The module of the driver's exception under a distlock error: its cause is SQLAlchemy's wrapper of it."""
    cause = error.__cause__
    assert isinstance(cause, sa.exc.DBAPIError), repr(cause)
    return type(cause.orig).__module__


def test_postgres_errors_carry_the_driver_error(postgres_server: PostgresServer) -> None:
    port = postgres_server.port
    with pytest.raises(distlock.AuthenticationFailed) as refused:
        distlock.connect(f"sql+postgresql://nobody@127.0.0.1:{port}/distlock")
    assert _driver_error(refused.value).startswith("psycopg")
    with pytest.raises(distlock.ConfigurationError) as missing:
        distlock.connect(f"sql+postgresql://distlock@127.0.0.1:{port}/nosuchdb")
    assert _driver_error(missing.value).startswith("psycopg")


def test_mariadb_errors_carry_the_driver_error(mariadb_server: MariaDBServer) -> None:
    port = mariadb_server.port
    with pytest.raises(distlock.AuthenticationFailed) as refused:
        distlock.connect(f"sql+mysql://distlock:wrong@127.0.0.1:{port}/distlock")
    assert _driver_error(refused.value).startswith("pymysql")
    # MariaDB tells a user without privileges on a database "access denied", whether it exists or not.
    with pytest.raises(distlock.AuthenticationFailed) as hidden:
        distlock.connect(f"sql+mysql://distlock:distlock@127.0.0.1:{port}/nosuchdb")
    assert _driver_error(hidden.value).startswith("pymysql")


def test_a_database_that_is_down_is_unavailable_within_the_connect_timeout() -> None:
    with PostgresServer() as server:
        url = f"sql+{server.dsn}"
    started = time.monotonic()
    with pytest.raises(distlock.BackendUnavailable) as down:
        distlock.connect(url, connect_timeout=1)
    assert time.monotonic() - started < 5
    assert down.value.__cause__ is not None


def test_sql_tables_prints_the_ddl_and_creates_the_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sql+sqlite:///{tmp_path}/locks.db?prefix=app_locks"
    assert main(["--url", url, "sql-tables", "--print-only"]) == 0
    assert not (tmp_path / "locks.db").exists()
    printed = capsys.readouterr().out
    for table in ("app_locks_leases", "app_locks_waiters", "app_locks_locks"):
        assert f"CREATE TABLE IF NOT EXISTS {table}" in printed
    assert "AUTOINCREMENT" in printed  # SQLite reuses the largest id without it
    assert main(["--url", url, "sql-tables"]) == 0
    engine = sa.create_engine(f"sqlite:///{tmp_path}/locks.db")
    try:
        assert {"app_locks_leases", "app_locks_waiters", "app_locks_locks"} <= set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert main(["--url", "redis://127.0.0.1:6379", "sql-tables", "--print-only"]) == 2
