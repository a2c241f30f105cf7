"""Helpers shared by the lock tests: a lock holder in another process, waiting for a condition on a real clock, and
one interface over a private etcd, Redis, ZooKeeper, PostgreSQL or MariaDB server (or a SQLite file) for the
backend-neutral tests."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, ModuleType, TracebackType
from typing import Any, Self

import distlock
import distlock.backends
from distlock._protocol import MARKS
from distlock.testing import EtcdServer, MariaDBServer, MemoryBackend, PostgresServer, RedisServer, ZooKeeperServer

REPO = Path(__file__).resolve().parent.parent


def load_module(name: str, path: Path) -> ModuleType:
    """Import the file ``path`` as module ``name`` without importing the package around it."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child_env() -> dict[str, str]:
    """The environment for a process a test starts: the repo importable, and no Django settings inherited.

    ``tests/integrations/djangotests/conftest.py`` sets ``DJANGO_SETTINGS_MODULE`` in this process when it is
    collected; a Celery worker or a plain script started later must not pick it up (Celery's Django fixup would set
    Django up, and ``distlock_django``'s app would hand its ``DISTLOCK`` client to ``distlock.celery``). Tests that
    want Django in the child add the variables back themselves.
    """
    django = ("DJANGO_SETTINGS_MODULE", "DISTLOCK_DJANGO_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(django)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


class Worker:
    """A ``lockworker.py`` process: send commands, read answers, and SIGSTOP/SIGCONT/SIGKILL it. ``wrapper`` is a
    command line the worker runs under (``["faketime", "-f", "+1h"]``)."""

    #: The SQLite file of the worker's lock table, if that is its lock service (see `stop`).
    sqlite_lock_file: str | None = None

    def __init__(self, url: str, wrapper: Sequence[str] = ()) -> None:
        database = getattr(distlock.backends.parse_url(url), "url", None)  # the SQL lock table's SQLAlchemy URL
        if database is not None and database.get_backend_name() == "sqlite":
            self.sqlite_lock_file = database.database
        self.process = subprocess.Popen(
            [*wrapper, sys.executable, str(Path(__file__).with_name("lockworker.py")), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        assert self.read(timeout=30) == {"ready": True}

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, **command: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def read(self, timeout: float = 30) -> dict[str, Any]:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"worker {self.pid} said nothing within {timeout} s")
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"worker {self.pid} exited (code {self.process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, timeout: float = 30, **command: Any) -> dict[str, Any]:
        self.send(**command)
        return self.read(timeout)

    def stop(self) -> None:
        """SIGSTOP the worker. On a SQLite file, at a moment it holds none of the file's locks: a process frozen
        inside a statement keeps the file locked for every other process until it runs again (SQLite has no server
        to time it out; docs/operations/sql-table.md), which is not the pause these tests are about."""
        os.kill(self.pid, signal.SIGSTOP)
        path = self.sqlite_lock_file
        if path is None:
            return
        deadline = time.monotonic() + 30
        while True:
            probe = sqlite3.connect(path, isolation_level=None, timeout=0)
            try:
                probe.execute("BEGIN EXCLUSIVE")  # fails while any process holds a shared or write lock
                probe.execute("ROLLBACK")
                return
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
            finally:
                probe.close()
            os.kill(self.pid, signal.SIGCONT)  # let it finish the statement, then stop it again
            time.sleep(0.01)
            os.kill(self.pid, signal.SIGSTOP)

    def cont(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.process.wait(10)

    def close(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.process.kill()
        self.process.wait(10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> float:
    """Poll ``condition`` until true; return the seconds it took, fail the test after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        time.sleep(interval)
    return time.monotonic() - start


def acquire_in_background(
    waiter: distlock.Lock, ready: Callable[[], bool], what: str
) -> tuple[threading.Thread, list[float]]:
    """Start ``waiter.acquire()`` on a thread; return it once ``ready()`` (the waiter has queued), with the list that
    gets the ``time.monotonic()`` of the acquisition (it stays empty if the waiter gives up after 30 s)."""
    got: list[float] = []

    def wait() -> None:
        if waiter.acquire(timeout=30):
            got.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(ready, 10, what)
    return thread, got


def waiters(client: distlock.Client, name: str) -> int:
    """Keys queued behind the holder of ``name`` (-1 when nobody holds it)."""
    holder = client.holder(name)
    return -1 if holder is None else holder.waiters


def queue_and_record(client: distlock.Client, name: str, count: int) -> list[int]:
    """Hold ``name``, queue ``count`` waiters one after another, release; return the order they got the lock."""
    holder = client.lock(name, ttl=10)
    assert holder.acquire()
    order: list[int] = []
    threads = []
    for i in range(count):

        def wait(i: int = i) -> None:
            with client.lock(name, ttl=10, timeout=60):
                order.append(i)

        thread = threading.Thread(target=wait)
        thread.start()
        threads.append(thread)
        wait_until(functools.partial(queued, client, name, i + 1), 10, f"waiter {i} to queue")
    holder.release()
    for thread in threads:
        thread.join(60)
    return order


def queued(client: distlock.Client, name: str, count: int) -> bool:
    """Whether exactly ``count`` waiters are queued behind the holder of ``name``."""
    return waiters(client, name) == count


# Redis commands that are not lock traffic: the counting itself, and connection set-up.
_NOT_LOCK_TRAFFIC = ("info", "hello", "auth", "select", "client|")


class SQLiteFile:
    """The SQLite lock table's stand-in for a server: its file. There is no process, so ``restart()`` changes nothing
    (the file is all there is, and it stays); ``pause()`` (and ``kill()``) takes the file's exclusive lock on a
    connection of its own, so that every client waits as on a paused server and gives up after its busy timeout,
    and ``resume()`` (and ``start()``) lets it go."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._holder: sqlite3.Connection | None = None

    @property
    def url(self) -> str:
        return f"sql+sqlite:///{self.path}"

    def pause(self) -> None:
        self._holder = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self._holder.execute("BEGIN EXCLUSIVE")

    def resume(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            holder.execute("ROLLBACK")
            holder.close()

    def restart(self) -> None:
        pass

    def kill(self) -> None:
        self.pause()

    def start(self) -> None:
        self.resume()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.resume()


LockServerKind = EtcdServer | RedisServer | ZooKeeperServer | PostgresServer | MariaDBServer | SQLiteFile

#: The SQL lock table, in each database it runs on (backend parameters).
SQL_TABLES = ("postgres-table", "mariadb-table", "sqlite-table")
#: Backends whose waiters poll (no notifications): the SQL lock table on MariaDB and SQLite.
POLLING = ("mariadb-table", "sqlite-table")


class LockServer:
    """A private etcd, Redis, ZooKeeper, PostgreSQL or MariaDB server, or a SQLite file (``kind``) behind one
    interface: free to kill, pause and restart.

    ``requests()`` counts what the server was asked, for tests of how many requests a code path costs: gRPC
    messages etcd received, ZooKeeper packets received (sessions' pings too), Redis commands called (``INFO
    commandstats``: scripts' inner commands count too) other than connection set-up and the counting itself, or
    the SQL statements PostgreSQL logged (``log_statement=all``: the lock_server fixture turns it on) or MariaDB
    counted (``Questions``). SQLite cannot count.
    """

    def __init__(self, kind: str, server: LockServerKind) -> None:
        self.kind = kind  # the backend parameter: "etcd", "etcd-3.4", "redis", "zookeeper", "postgres-table", ...
        self.server = server

    @property
    def family(self) -> str:
        """The backend whichever release or database runs it, as metrics name it: "etcd" (for "etcd" and
        "etcd-3.4"), "redis", "zookeeper" or "sqltable"."""
        if isinstance(self.server, ZooKeeperServer):
            return "zookeeper"
        if isinstance(self.server, PostgresServer | MariaDBServer | SQLiteFile):
            return "sqltable"
        return "etcd" if isinstance(self.server, EtcdServer) else "redis"

    @property
    def url(self) -> str:
        if isinstance(self.server, PostgresServer):
            return f"sql+{self.server.dsn}"
        return self.server.url

    def restart(self) -> None:
        self.server.restart()

    def pause(self) -> None:
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

    def kill(self) -> None:
        self.server.kill()

    def start(self) -> None:
        self.server.start()

    def requests(self) -> int:
        if isinstance(self.server, SQLiteFile):
            raise NotImplementedError("a SQLite file cannot count the statements it was asked")
        if isinstance(self.server, PostgresServer):
            log = self.server.log_path.read_text(errors="replace")
            return log.count("LOG:  statement: ") + log.count("LOG:  execute ")  # simple and extended protocol
        if isinstance(self.server, MariaDBServer):
            return int(self.server.sql("SHOW GLOBAL STATUS LIKE 'Questions'").split()[1])
        if isinstance(self.server, EtcdServer):
            return self.server.rpc_count()
        if isinstance(self.server, ZooKeeperServer):
            return self.server.packets_received()
        stats = self.server.command_stats()
        return sum(calls for command, calls in stats.items() if not command.startswith(_NOT_LOCK_TRAFFIC))


UNMARKED = "this test's backend keeps no marks"


class Unmarked(MemoryBackend):
    """A backend of one's own that keeps no marks (every service distlock ships keeps them; a third-party backend
    may not): it says so in ``unsupported``, with ``UNMARKED`` as its reason."""

    unsupported: Mapping[str, str] = MappingProxyType({**MemoryBackend.unsupported, MARKS: UNMARKED})
