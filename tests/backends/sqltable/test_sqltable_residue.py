"""Nothing is left per lock name in the SQL lock table once its holders and waiters are gone (released, given up, or
their lease expired): no entry, no lease, no row in ``<prefix>_locks`` (but an election's record, by design); a join
racing the removal of its name's row keeps its serialisation, in either order; tokens keep increasing after every
row is deleted and the database restarts; a queue read touches only its name's live entries, however often the name
was taken. Each test has tables of its own (a fresh ``?prefix=``), so "nothing left" is "the tables are empty".

Marks (``<prefix>_marks``) are not left by a lock's holders but written on purpose, to outlive the hold until their
TTL: an unexpired mark stays after its client closed, by design. Once expired, a read ignores it and the next write
of any mark removes it, at most ``SWEEP_BATCH`` of them per write, so that the table does not keep them; tables made
before marks get the table at the first connect, and keep their layout.

A rolling upgrade from the earlier release, whose tables have no layout marker (``<prefix>_layout``) and keep a
name's row in ``<prefix>_locks`` for ever: this release's clients on those tables keep the rows too (and say so
once), so that an earlier client's join, which looks for its name's row with a lock, makes it without one when
missing and then locks it, always finds it; the upgrade step (``distlock sql-tables --upgrade``, or its printed DDL)
makes the marker, idempotently, and the clients started after it remove the rows. The race between an earlier join
and a removal of its name's row is driven step by step: harmless on the earlier layout, real on this one
(PostgreSQL), which is why the upgrade step waits until no earlier client runs."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from threading import Event
from typing import Any

import pytest
import sqlalchemy as sa
from _support import SQL_TABLES, LockServer, Worker, wait_until
from sqlalchemy.dialects import mysql as sa_mysql
from sqlalchemy.dialects import postgresql as sa_postgresql
from sqlalchemy.dialects import sqlite as sa_sqlite

import distlock
import distlock.backends
from distlock._cli import main
from distlock.backends.sqltable import _queue as sqltable_queue
from distlock.backends.sqltable._dialects import server_now
from distlock.backends.sqltable._marks import SWEEP_BATCH
from distlock.backends.sqltable._schema import LAYOUT, lock_tables, name_key
from distlock.testing import MariaDBServer

pytestmark = [pytest.mark.every_database, pytest.mark.parametrize("backend", SQL_TABLES, indirect=True)]

TABLES = ("leases", "waiters", "locks", "marks")


def _with_prefix(url: str, prefix: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}prefix={prefix}"


class Tables:
    """A lock table of the test's own (``url``), read and dropped through an engine of the test's."""

    def __init__(self, url: str, mariadb: MariaDBServer | None = None) -> None:
        self.mariadb = mariadb  # its root sees other sessions' lock waits (the lock table's user may not)
        self.prefix = f"res_{uuid.uuid4().hex[:10]}"
        self.url = _with_prefix(url, self.prefix)
        config: Any = distlock.backends.parse_url(self.url)
        self.engine = sa.create_engine(config.url)
        self.dialect = self.engine.dialect.name

    def rows(self) -> dict[str, int]:
        with self.engine.connect() as connection:
            return {
                table: int(connection.execute(sa.text(f"SELECT COUNT(*) FROM {self.prefix}_{table}")).scalar_one())
                for table in TABLES
            }

    def scalar(self, statement: sa.Executable) -> Any:
        with self.engine.connect() as connection:
            return connection.execute(statement).scalar()

    def lock_waits(self) -> int:
        """Statements on this test's tables waiting for a row lock (PostgreSQL, MariaDB). By the statement's text:
        the server is the worker's, and a transaction of another test may be waiting too (ci41 timed out on a count
        of all of them)."""
        if self.mariadb is not None:
            return int(
                self.mariadb.sql(
                    "SELECT COUNT(*) FROM information_schema.INNODB_TRX "
                    f"WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE '%{self.prefix}%'"
                )
            )
        query = "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :tables"
        return int(self.scalar(sa.text(query).bindparams(tables=f"%{self.prefix}%")))

    def drop(self) -> None:
        with self.engine.begin() as connection:
            for table in (*TABLES, "layout"):
                connection.execute(sa.text(f"DROP TABLE IF EXISTS {self.prefix}_{table}"))
        self.engine.dispose()


@pytest.fixture
def tables(backend: str, backend_url: str, request: pytest.FixtureRequest) -> Iterator[Tables]:
    own = Tables(backend_url, request.getfixturevalue("mariadb_server") if backend == "mariadb-table" else None)
    try:
        yield own
    finally:
        own.drop()


EMPTY = dict.fromkeys(TABLES, 0)
#: A lease no keeper refreshes within a test (every LONG / 3 seconds): the race tests count transactions.
LONG = 300


def test_nothing_is_left_after_every_holder_and_waiter_is_gone(tables: Tables) -> None:
    with distlock.connect(tables.url) as client:
        for number in range(300):
            with client.lock(f"order:{number}", ttl=10):
                pass
        with client.lock("taken", ttl=10):  # a waiter that gives up
            assert not client.lock("taken", ttl=10).acquire(timeout=0)
        semaphore = [client.semaphore("pool", 2, ttl=10) for _ in range(3)]
        assert semaphore[0].acquire() and semaphore[1].acquire() and not semaphore[2].acquire(timeout=0)
        for slot in semaphore[:2]:
            slot.release()
        rw = client.rwlock("document", ttl=10)
        readers = [rw.read() for _ in range(2)]
        for reader in readers:
            assert reader.acquire()
        assert not rw.write().acquire(timeout=0)
        for reader in readers:
            reader.release()
        with rw.write():
            pass
        assert tables.rows() == {"leases": 1, "waiters": 0, "locks": 0, "marks": 0}  # the open client's lease
        with client.election("unrecorded", ttl=10):
            pass
        with client.election("leader", ttl=10) as election:
            election.record("the ledger")
    # An election's record lives on, by design: the one row left.
    assert tables.rows() == {"leases": 0, "waiters": 0, "locks": 1, "marks": 0}
    with distlock.connect(tables.url) as client:
        assert client.election("leader").recorded() == b"the ledger"


def test_a_closed_clients_entries_go_with_its_lease(tables: Tables) -> None:
    with distlock.connect(tables.url) as holder:
        with distlock.connect(tables.url) as other:
            held = [other.lock(f"held:{number}", ttl=10) for number in range(20)]
            for lock in held:
                assert lock.acquire()
            waiting = holder.lock("held:0", ttl=10)
            assert not waiting.acquire(timeout=0)
        assert tables.rows() == {"leases": 1, "waiters": 0, "locks": 0, "marks": 0}
    assert tables.rows() == EMPTY


def test_each_write_of_a_mark_removes_a_batch_of_expired_marks_of_any_lock(tables: Tables) -> None:
    with distlock.connect(tables.url) as client:
        with client.lock("invoice", ttl=10) as lock:
            lock.write_mark("sent", b"v", ttl=LONG)
        marks = lock_tables(tables.prefix).marks
        expired = [
            {"name_key": name_key(f"old:{number}"), "mark_key": name_key("k"), "value": b"x", "expires_at": 0.0}
            for number in range(SWEEP_BATCH + 50)
        ]
        with tables.engine.begin() as connection:
            connection.execute(sa.insert(marks), expired)
        assert client.read_mark("old:0", "k") is None  # expired by the database's clock: never read, swept or not
        assert tables.rows()["marks"] == SWEEP_BATCH + 51
        with client.lock("invoice", ttl=10) as lock:
            lock.write_mark("paid", b"v", ttl=LONG)
        assert tables.rows()["marks"] == 52  # a batch went: 50 expired ones are left, and "sent" and "paid"
        with client.lock("other", ttl=10) as lock:
            lock.write_mark("k", b"v", ttl=LONG)
        assert tables.rows()["marks"] == 3
    # Unexpired marks outlive their client, by design, until their TTL; nothing else is left.
    assert tables.rows() == {"leases": 0, "waiters": 0, "locks": 0, "marks": 3}


def test_tables_made_before_marks_get_the_marks_table_at_the_first_connect_and_keep_their_layout(
    tables: Tables,
) -> None:
    _earlier_layout(tables, marker=True)
    assert not sa.inspect(tables.engine).has_table(f"{tables.prefix}_marks")
    with distlock.connect(tables.url) as client:
        with client.lock("a", ttl=LONG) as lock:
            lock.write_mark("k", b"v", ttl=LONG)
        assert client.read_mark("a", "k") == b"v"
        assert tables.rows() == {"leases": 1, "waiters": 0, "locks": 0, "marks": 1}  # this layout: the row went
    assert _layout(tables) == [LAYOUT]


def _expired_leases(tables: Tables) -> int:
    leases = sa.table(f"{tables.prefix}_leases", sa.column("expires_at"))
    return int(tables.scalar(sa.select(sa.func.count()).select_from(leases).where(leases.c.expires_at <= server_now())))


def test_an_expired_holders_rows_go_with_the_next_read_of_its_queue_and_the_next_lease_granted(tables: Tables) -> None:
    """Nobody removes a crashed client's rows for it: the next join or read of its lock's queue removes its entry
    there (and the name's row when that empties the queue), and the next lease granted to any client removes every
    expired lease with its entries."""
    holder, semaphore_holder = Worker(tables.url), Worker(tables.url)
    try:
        with distlock.connect(tables.url) as client:
            with client.lock("warm-up", ttl=10):  # this client's lease is granted before the others expire
                pass
            assert holder.call(op="acquire", name="crashed", ttl=1)["acquired"]
            assert semaphore_holder.call(op="acquire", name="pool", limit=2, ttl=1)["acquired"]
            holder.kill()
            semaphore_holder.kill()
            wait_until(lambda: _expired_leases(tables) == 2, 10, "both leases to expire by the database's clock")
            assert tables.rows() == {"leases": 3, "waiters": 2, "locks": 2, "marks": 0}
            with client.lock("crashed", ttl=10, timeout=0):  # the join finds the dead holder and removes it
                assert tables.rows() == {"leases": 3, "waiters": 2, "locks": 2, "marks": 0}
            assert tables.rows() == {"leases": 3, "waiters": 1, "locks": 1, "marks": 0}
            with distlock.connect(tables.url) as newcomer, newcomer.lock("other", ttl=10):
                assert tables.rows() == {"leases": 2, "waiters": 1, "locks": 1, "marks": 0}  # the two live clients' own
    finally:
        holder.close()
        semaphore_holder.close()
    assert tables.rows() == EMPTY


def _pause_once(monkeypatch: pytest.MonkeyPatch, target: Any, name: str, after: bool) -> tuple[Event, Event]:
    """Make the next call of ``target.name`` (a function of the backend's module, or a method of one backend), from
    any thread, stop (before or ``after`` its work, inside its transaction) until ``go`` is set; ``paused`` is set
    when it stops."""
    paused, go = threading.Event(), threading.Event()
    original: Callable[..., Any] = getattr(target, name)

    def stopping(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(target, name, original)
        if not after:
            paused.set()
            assert go.wait(30)
        result = original(*args, **kwargs)
        if after:
            paused.set()
            assert go.wait(30)
        return result

    monkeypatch.setattr(target, name, stopping)
    return paused, go


def _until_blocked(
    tables: Tables, client: distlock.Client, unless: Callable[[], bool] = lambda: False
) -> Callable[[], object]:
    """What waits for ``client``'s next transaction to be blocked by another's: a lock wait on PostgreSQL and
    MariaDB; on SQLite (one writer at a time), that it is about to begin, which it cannot while another writes.
    Or, on PostgreSQL and MariaDB, for ``unless()`` (the transaction's caller ended without waiting: the test says
    why). (The client's leases are long: no refresh of its keeper begins meanwhile.)"""
    if tables.dialect != "sqlite":
        blocked = lambda: unless() or tables.lock_waits() == 1  # noqa: E731
        return lambda: wait_until(blocked, 30, "the second transaction to wait for a lock")
    backend: Any = client._backend
    transaction, began = backend._transaction, threading.Event()

    def beginning(*args: Any, **kwargs: Any) -> Any:
        began.set()
        return transaction(*args, **kwargs)

    backend._transaction = beginning
    return lambda: wait_until(began.is_set, 10, "the second transaction to begin")


def test_a_join_that_waits_for_the_removal_of_its_names_row_makes_it_anew(
    tables: Tables, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last holder's release locks the name's row, removes its entry and the row, and stops before committing;
    a join of that name then waits for it, and makes the row again once it commits: the join holds, on a row."""
    with distlock.connect(tables.url) as first, distlock.connect(tables.url) as second:
        lock = first.lock("contended", ttl=LONG)
        assert lock.acquire()
        token = lock.token
        with second.lock("warm-up", ttl=LONG):  # its lease: the join below is one transaction
            pass
        paused, go = _pause_once(monkeypatch, sqltable_queue, "forget_emptied", after=True)  # first's release
        releasing = threading.Thread(target=lock.release)
        releasing.start()
        assert paused.wait(10)
        joiner = second.lock("contended", ttl=LONG)
        got: list[bool] = []
        joining = threading.Thread(target=lambda: got.append(joiner.acquire(timeout=10)))
        wait_blocked = _until_blocked(tables, second)
        joining.start()
        wait_blocked()
        go.set()
        releasing.join(10)
        joining.join(10)
        assert got == [True]
        assert tables.rows() == {"leases": 2, "waiters": 1, "locks": 1, "marks": 0}
        assert joiner.token > token
        joiner.release()
        assert tables.rows() == {"leases": 2, "waiters": 0, "locks": 0, "marks": 0}


def test_a_removal_that_waits_for_a_join_keeps_the_names_row(tables: Tables, monkeypatch: pytest.MonkeyPatch) -> None:
    """A join locks the name's row and adds its entry, and stops before committing; the holder's release waits for
    it, then sees the entry and leaves the row, which the joiner holds next."""
    with distlock.connect(tables.url) as first, distlock.connect(tables.url) as second:
        lock = first.lock("contended", ttl=LONG)
        assert lock.acquire()
        with second.lock("warm-up", ttl=LONG):
            pass
        paused, go = _pause_once(monkeypatch, second._backend, "_read_place", after=False)
        joiner = second.lock("contended", ttl=LONG)
        got: list[bool] = []
        joining = threading.Thread(target=lambda: got.append(joiner.acquire(timeout=10)))
        joining.start()
        assert paused.wait(10)
        releasing = threading.Thread(target=lock.release)
        wait_blocked = _until_blocked(tables, first)
        releasing.start()
        wait_blocked()
        go.set()
        releasing.join(10)
        joining.join(10)
        assert got == [True]
        assert tables.rows() == {"leases": 2, "waiters": 1, "locks": 1, "marks": 0}
        joiner.release()
        assert tables.rows() == {"leases": 2, "waiters": 0, "locks": 0, "marks": 0}


@pytest.fixture
def private_tables(lock_server: LockServer) -> Iterator[Tables]:
    own = Tables(lock_server.url, lock_server.server if isinstance(lock_server.server, MariaDBServer) else None)
    try:
        yield own
    finally:
        own.drop()


def test_tokens_keep_increasing_after_every_row_is_deleted_and_the_database_restarts(
    lock_server: LockServer, private_tables: Tables
) -> None:
    """PostgreSQL's sequence, MariaDB's InnoDB counter (kept across restarts since 10.2.4) and SQLite's
    AUTOINCREMENT (``sqlite_sequence``) never go back, though the tables are empty: a counter taken from the largest
    id left (a plain SQLite INTEGER PRIMARY KEY, MariaDB before 10.2.4 at startup) would repeat the last token."""
    tokens = []
    for restart in (False, True):
        if restart:
            private_tables.engine.dispose()
            lock_server.restart()  # SQLite: a file, opened anew by the next client
        for name in ("same", "same", "another"):
            with distlock.connect(private_tables.url) as client, client.lock(name, ttl=10) as lock:
                tokens.append(lock.token)
            assert private_tables.rows() == EMPTY
    assert tokens == sorted(set(tokens)), tokens


def test_a_queue_read_touches_only_the_live_entries_of_its_name(tables: Tables) -> None:
    """However often a name was taken, its rows are its live entries (and its row in ``<prefix>_locks``): the
    queue read, an index range scan on (name, id), returns the same rows after one acquisition as after two
    hundred. On PostgreSQL, EXPLAIN ANALYZE of that read says how many rows its scan returned."""
    waiters = sa.table(f"{tables.prefix}_waiters", sa.column("id"), sa.column("name"))

    def rows_read() -> int:
        if tables.dialect != "postgresql":
            return int(tables.scalar(sa.select(sa.func.count()).select_from(waiters).where(waiters.c.name == "hot")))
        query = sa.text(f"EXPLAIN (ANALYZE, FORMAT JSON) SELECT id FROM {tables.prefix}_waiters WHERE name = 'hot'")
        plan = tables.scalar(query)[0]["Plan"]
        return int(plan["Actual Rows"]) + int(plan.get("Rows Removed by Filter", 0))

    with distlock.connect(tables.url) as client:
        seen = []
        for taken in range(200):
            with client.lock("hot", ttl=10):
                if taken in (0, 199):
                    seen.append(rows_read())
        assert seen == [1, 1]
        assert rows_read() == 0
        assert tables.rows() == {"leases": 1, "waiters": 0, "locks": 0, "marks": 0}


def _earlier_layout(tables: Tables, *, marker: bool = False) -> None:
    """The tables as the earlier release made them: leases, waiters and locks, no marks table, and no marker (or,
    ``marker``, as this release made them before it kept marks)."""
    made = lock_tables(tables.prefix)
    made.metadata.create_all(tables.engine, tables=[made.leases, made.waiters, made.locks])
    if marker:
        made.layout_marker.create(tables.engine)
        with tables.engine.begin() as connection:
            connection.execute(sa.insert(made.layout_marker).values(version=LAYOUT))


def _layout(tables: Tables) -> list[int]:
    if not sa.inspect(tables.engine).has_table(f"{tables.prefix}_layout"):
        return []
    with tables.engine.connect() as connection:
        return list(connection.execute(sa.text(f"SELECT version FROM {tables.prefix}_layout")).scalars())


def _insert_ignore(dialect: str, table: sa.Table, **values: Any) -> Any:
    """The earlier release's ``_dialects.insert_ignore`` (git show 69ef0eb:distlock/backends/sqltable/_dialects.py)."""
    if dialect == "postgresql":
        return sa_postgresql.insert(table).values(**values).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sa_sqlite.insert(table).values(**values).on_conflict_do_nothing()
    return sa_mysql.insert(table).values(**values).prefix_with("IGNORE")


class EarlierJoin:
    """The earlier release's join of ``name`` up to its row lock, a statement at a time, in a transaction at READ
    COMMITTED (git show 69ef0eb:distlock/backends/sqltable/_backend.py, ``enqueue``): look for the name's row with a
    lock (:meth:`lock_row`); when missing, make it without one (:meth:`make_row`), and lock it again."""

    def __init__(self, tables: Tables, name: str) -> None:
        self.dialect = tables.dialect
        self.locks = lock_tables(tables.prefix).locks
        self.key = name_key(name)
        self.connection = tables.engine.connect().execution_options(isolation_level="READ COMMITTED")
        self.transaction = self.connection.begin()

    def lock_row(self) -> bool:
        found = sa.select(self.locks.c.name_key).where(self.locks.c.name_key == self.key).with_for_update()
        return self.connection.execute(found).first() is not None

    def make_row(self) -> None:
        self.connection.execute(_insert_ignore(self.dialect, self.locks, name_key=self.key))

    def __enter__(self) -> EarlierJoin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.connection.close()  # its transaction ends (rolled back): whoever waits for its row lock goes on


def test_clients_on_the_earlier_layout_keep_the_names_rows_and_say_so_once(
    tables: Tables, caplog: pytest.LogCaptureFixture
) -> None:
    _earlier_layout(tables)
    with caplog.at_level(logging.WARNING, logger="distlock"), distlock.connect(tables.url) as client:
        with client.lock("a", ttl=LONG):
            pass
        with client.lock("b", ttl=LONG), client.semaphore("c", limit=2, ttl=LONG):
            pass
        assert tables.rows() == {"leases": 1, "waiters": 0, "locks": 3, "marks": 0}
    assert tables.rows() == {"leases": 0, "waiters": 0, "locks": 3, "marks": 0}
    said = [record.getMessage() for record in caplog.records if "earlier layout" in record.getMessage()]
    assert len(said) == 1 and "distlock sql-tables --upgrade" in said[0], said
    assert _layout(tables) == []


def test_an_earlier_join_finds_its_names_row_after_a_release_of_this_release_on_the_earlier_layout(
    tables: Tables,
) -> None:
    """An earlier join finds no row; this release's client makes it (its join) and holds; the earlier join's
    ``INSERT`` meets it (no lock on PostgreSQL); the holder releases, and the row stays: the earlier join's second
    look locks it, and a join of this release waits for that transaction. (SQLite: one writer at a time, and the
    earlier join was one ``BEGIN IMMEDIATE`` transaction, so nothing comes between its statements.)"""
    if tables.dialect == "sqlite":
        pytest.skip("SQLite runs one write transaction at a time: nothing comes between an earlier join's statements")
    _earlier_layout(tables)
    with distlock.connect(tables.url) as holder, distlock.connect(tables.url) as joiner:
        with _earlier_join_across_a_release(tables, holder) as earlier:
            assert earlier.lock_row()
            got: list[bool | Exception] = []
            wait_blocked = _until_blocked(tables, joiner, unless=lambda: bool(got))
            lock = joiner.lock("contended", ttl=LONG)

            def join() -> None:
                try:
                    got.append(lock.acquire(timeout=10))
                except Exception as e:  # shown by the assertion below, not lost in a thread's warning
                    got.append(e)

            joining = threading.Thread(target=join)
            joining.start()
            wait_blocked()
            assert not got, f"the join ended before it waited: {got}"
        joining.join(10)
        assert got == [True]
        lock.release()
        assert tables.rows()["locks"] == 1


def test_on_this_layout_the_same_earlier_join_finds_no_row_which_is_why_the_upgrade_waits_for_the_earlier_clients(
    tables: Tables,
) -> None:
    """The same steps on tables of this layout (a fresh install): the release removes the name's row, and the
    earlier join's second look finds nothing to lock; it would take its id unserialised. (MariaDB: its ``INSERT
    IGNORE`` keeps a shared lock that the release waits for; SQLite: one writer at a time.)"""
    if tables.dialect != "postgresql":
        pytest.skip("only PostgreSQL's ON CONFLICT DO NOTHING leaves the earlier join without a lock on the row")
    with distlock.connect(tables.url) as holder:
        with _earlier_join_across_a_release(tables, holder) as earlier:
            assert not earlier.lock_row()
    assert _layout(tables) == [LAYOUT]


def test_the_upgrade_step_marks_the_tables_once_and_clients_started_after_it_remove_the_rows(
    tables: Tables, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed DDL (for a DBA) and the command both make the marker, and again change nothing; a client that
    was running keeps the rows until it is restarted (always safe), one started after removes them."""
    _earlier_layout(tables)
    with distlock.connect(tables.url) as running:
        with running.lock("a", ttl=LONG):
            pass
        assert main(["--url", tables.url, "sql-tables", "--upgrade", "--print-only"]) == 0
        printed = capsys.readouterr().out
        for _ in range(2):
            with tables.engine.begin() as connection:
                for statement in printed.split(";\n"):
                    if statement.strip():
                        connection.execute(sa.text(statement))
        assert _layout(tables) == [LAYOUT]
        for _ in range(2):
            assert main(["--url", tables.url, "sql-tables", "--upgrade"]) == 0
        assert _layout(tables) == [LAYOUT]
        with running.lock("b", ttl=LONG):
            pass
        assert tables.rows() == {"leases": 1, "waiters": 0, "locks": 2, "marks": 0}
        with distlock.connect(tables.url) as restarted:
            with restarted.lock("a", ttl=LONG):
                pass
            assert tables.rows() == {"leases": 2, "waiters": 0, "locks": 1, "marks": 0}  # "b": its name not used since
            with restarted.lock("b", ttl=LONG):
                pass
    assert tables.rows() == {"leases": 0, "waiters": 0, "locks": 0, "marks": 0}


def test_the_upgrade_command_on_a_database_without_the_tables_makes_them_with_the_marker(
    tables: Tables, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", tables.url, "sql-tables", "--upgrade"]) == 0
    assert _layout(tables) == [LAYOUT]
    assert "INSERT" in capsys.readouterr().out
    with distlock.connect(tables.url) as client, client.lock("a", ttl=LONG):
        pass
    assert tables.rows() == {"leases": 0, "waiters": 0, "locks": 0, "marks": 0}


def _earlier_join_across_a_release(tables: Tables, holder: distlock.Client) -> EarlierJoin:
    """An earlier join of "contended" that found no row and made it as a client of this release took and released
    the name between its steps; what the join's second look finds is the test's."""
    earlier = EarlierJoin(tables, "contended")
    try:
        assert not earlier.lock_row()
        lock = holder.lock("contended", ttl=LONG)
        assert lock.acquire(timeout=10)
        earlier.make_row()  # another's row: no lock on PostgreSQL (a shared one on MariaDB)
        lock.release()
    except BaseException:
        earlier.__exit__()
        raise
    return earlier
