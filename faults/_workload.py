"""The workload: worker processes that increment one counter row (or append to one list row) under a distlock lock.

Each worker is a process of its own (`main`, given its `Config` as JSON), so the nemesis can SIGSTOP it,
cut its network and see its lease lapse. It prints ``{"ready": pid}`` once connected, waits for ``{"until": t}``
on stdin (the runner's barrier: all workers start together, with one deadline on CLOCK_MONOTONIC), and loops::

    lock (ttl, timeout) -> claim -> read -> work -> write value+1 (and an audit row) -> commit -> release

and appends one JSON line per operation to its history file (`Op`): times on CLOCK_MONOTONIC, which Linux shares
between processes, so they compare with the nemesis's fault windows. Three ways to write, ``api``:

- ``raw``: the lock API and SQL by hand. The claim (``UPDATE ... SET fence_token = :t WHERE fence_token <= :t``)
  commits on its own, the read and the write are separate transactions, and the write is conditional
  (``... WHERE fence_token <= :t``): the fence alone, no database lock held across the work, refuses a stale holder.
  ``fence="write-only"`` skips the claim; ``fence="off"`` also drops the write's condition (control runs).
- ``sqla``: ``distlock_sqla.claim_one`` and a flush, the idiom of its README, in one transaction; odd-numbered
  workers use SQLAlchemy's defaults the way people do: the claim commits (``expire_on_commit`` expires the object)
  and the new values are set on the expired object and flushed in a second transaction.
- ``django``: ``FencedModel.objects.filter(pk=...).fenced()`` (the claim commits at once, autocommit), then
  ``save()`` and the audit row in ``transaction.atomic()``; odd-numbered workers save an instance built from the pk
  (``Counter(pk=..., value=...)``) instead of the one read.

``kind="set"`` is Jepsen's lock-set: the row's ``items`` gets the holder's token appended instead of ``value + 1``.

Every acknowledged write also inserts ``(token, worker, value)`` into ``faults_writes`` in the same transaction:
that table's order is the commit order of the writes, which the checker reads.

Outcomes: ``ok`` (committed), ``fail`` (certainly not written: no lock, a refused claim or write, an error before
the write), ``unknown`` (an error during the write's transaction other than a refusal: it may have committed).
SIGUSR1 asks a worker to stop itself (SIGSTOP) at its next point between read and write, with the lock held: the
moment a paused holder does the most harm; SIGUSR2 withdraws the request. What can go wrong: a worker that cannot
reach the database at all records a ``fail`` per iteration, and a SQLite database locked for longer than its
timeout (30 s) likewise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import distlock
from distlock_sqla import FencedMixin, claim_one

__all__ = ["LOCK", "ROW", "Config", "Op", "create_schema", "engine_for", "main", "read_history"]

ROW = 1
LOCK = "faults:counter:{id}"
COUNTER = "faults_counter"
WRITES = "faults_writes"
SQLITE_TIMEOUT = 30.0


@dataclass(frozen=True)
class Config:
    """What one worker does; passed as JSON on its command line."""

    worker: int
    url: str  # the lock service: etcd://... or redis://...
    db_url: str  # a SQLAlchemy URL: sqlite:///path or postgresql+psycopg://...
    history: str
    api: str = "raw"  # raw | sqla | django
    kind: str = "counter"  # counter | set
    fence: str = "on"  # on | write-only | off (raw only)
    ttl: float = 2.0
    timeout: float = 10.0
    work: float = 0.02  # seconds between read and write, the application's "work"


@dataclass
class Op:
    """One iteration of a worker, as recorded in its history."""

    worker: int
    start: float
    end: float = 0.0
    granted: float | None = None
    token: int | None = None
    read: Any = None
    written: Any = None
    outcome: str = "fail"  # ok | fail | unknown
    phase: str = "acquire"  # where it ended: acquire | claim | read | write | done
    error: str | None = None
    release_error: str | None = None


class Refused(Exception):
    """The database refused a fenced claim or write (0 rows): a stale holder was stopped."""


def engine_for(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        return sa.create_engine(url, connect_args={"timeout": SQLITE_TIMEOUT})
    return sa.create_engine(url, pool_size=1)


def create_schema(url: str) -> None:
    """The counter row (value 0, items empty, fence_token 0) and the empty audit table, in a fresh database."""
    engine = engine_for(url)
    with engine.begin() as c:
        if url.startswith("sqlite"):
            c.exec_driver_sql("PRAGMA journal_mode=WAL")
        serial = "INTEGER PRIMARY KEY AUTOINCREMENT" if url.startswith("sqlite") else "BIGSERIAL PRIMARY KEY"
        c.exec_driver_sql(
            f"CREATE TABLE {COUNTER} (id INTEGER PRIMARY KEY, value INTEGER NOT NULL, items TEXT NOT NULL,"
            " fence_token BIGINT NOT NULL)"
        )
        c.exec_driver_sql(f"CREATE TABLE {WRITES} (seq {serial}, token BIGINT, worker INTEGER, value TEXT)")
        c.execute(sa.text(f"INSERT INTO {COUNTER} VALUES (:id, 0, '', 0)"), {"id": ROW})
    engine.dispose()


def read_history(path: Path) -> list[Op]:
    if not path.exists():
        return []
    return [Op(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# -- the pause point ----------------------------------------------------------------------------------------------

_pause_asked = False


def _ask_pause(signum: int, frame: object) -> None:
    global _pause_asked
    _pause_asked = signum == signal.SIGUSR1  # SIGUSR2 withdraws the request


def _pause_point(work: float) -> None:
    """Between read and write: stop ourselves if the nemesis asked (SIGUSR1), then do the "work"."""
    global _pause_asked
    if _pause_asked:
        _pause_asked = False
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(work)


def _next(kind: str, value: int, items: str, token: int) -> tuple[int, str, str]:
    """The new (value, items) and what the audit row records as written."""
    if kind == "set":
        new_items = f"{items},{token}" if items else str(token)
        return value, new_items, str(token)
    return value + 1, items, str(value + 1)


# -- one step per api: claim, read, work, write; returns (read, written) ---------------------------------------

Step = Callable[[Op, int], None]


def _audit(conn: sa.Connection, token: int, worker: int, written: str) -> None:
    conn.execute(
        sa.text(f"INSERT INTO {WRITES} (token, worker, value) VALUES (:t, :w, :v)"),
        {"t": token, "w": worker, "v": written},
    )


def _raw_step(config: Config) -> Step:
    engine = engine_for(config.db_url)
    row = {"id": ROW}
    fenced_write = "" if config.fence == "off" else " AND fence_token <= :t"

    def step(op: Op, token: int) -> None:
        if config.fence == "on":
            op.phase = "claim"
            with engine.begin() as c:
                claim = f"UPDATE {COUNTER} SET fence_token = :t WHERE id = :id AND fence_token <= :t"
                if c.execute(sa.text(claim), {**row, "t": token}).rowcount != 1:
                    raise Refused("claim refused")
        op.phase = "read"
        with engine.connect() as c:
            value, items = c.execute(sa.text(f"SELECT value, items FROM {COUNTER} WHERE id = :id"), row).one()
        op.read = items if config.kind == "set" else value
        _pause_point(config.work)
        new_value, new_items, op.written = _next(config.kind, value, items, token)
        op.phase = "write"
        with engine.begin() as c:
            write = f"UPDATE {COUNTER} SET value = :v, items = :i, fence_token = :t WHERE id = :id{fenced_write}"
            if c.execute(sa.text(write), {**row, "v": new_value, "i": new_items, "t": token}).rowcount != 1:
                raise Refused("write refused")
            _audit(c, token, config.worker, op.written)

    return step


def _sqla_step(config: Config) -> Step:
    class Base(DeclarativeBase):
        pass

    class Counter(FencedMixin, Base):
        __tablename__ = COUNTER
        fence_lock = LOCK
        id: Mapped[int] = mapped_column(primary_key=True)
        value: Mapped[int]
        items: Mapped[str]

    engine = engine_for(config.db_url)

    def step(op: Op, token: int) -> None:
        op.phase = "claim"
        with Session(engine) as session, session.begin():
            counter = claim_one(session, Counter, ROW)
            op.phase = "read"
            op.read = counter.items if config.kind == "set" else counter.value
            _pause_point(config.work)
            counter.value, counter.items, op.written = _next(config.kind, counter.value, counter.items, token)
            op.phase = "write"
            session.flush()
            _audit(session.connection(), token, config.worker, op.written)

    def expired_step(op: Op, token: int) -> None:
        # SQLAlchemy's defaults as people use them: the claim commits (expiring the object), the work happens
        # outside any transaction, and the values computed from the first read are set on the expired object.
        op.phase = "claim"
        with Session(engine) as session:
            counter = claim_one(session, Counter, ROW)
            op.phase = "read"
            value, items = counter.value, counter.items
            op.read = items if config.kind == "set" else value
            session.commit()
            _pause_point(config.work)
            new_value, new_items, op.written = _next(config.kind, value, items, token)
            op.phase = "write"
            counter.value, counter.items = new_value, new_items
            session.flush()
            _audit(session.connection(), token, config.worker, op.written)
            session.commit()

    return expired_step if config.worker % 2 else step


def _django_step(config: Config) -> Step:
    import django
    from django.conf import settings
    from django.db import connection, models, transaction

    url = sa.engine.make_url(config.db_url)
    if url.get_backend_name() == "sqlite":
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": url.database, "OPTIONS": {"timeout": 30}}
    else:
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": url.database,
            "USER": url.username or "",
            "PASSWORD": url.password or "",
            "HOST": url.host or "127.0.0.1",
            "PORT": str(url.port or ""),
        }
    settings.configure(
        INSTALLED_APPS=["distlock_django", "faults"],
        DATABASES={"default": database},
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        DISTLOCK={"URL": config.url, "KEY_PREFIX": ""},
        USE_TZ=True,
        LOGGING_CONFIG=None,
    )
    django.setup()
    from distlock_django import FencedModel

    class Counter(FencedModel):
        value: models.IntegerField[int, int] = models.IntegerField()
        items: models.TextField[str, str] = models.TextField()
        fence_lock = LOCK

        class Meta:
            app_label = "faults"
            db_table = COUNTER

    def step(op: Op, token: int) -> None:
        op.phase = "claim"
        counter = Counter.objects.filter(pk=ROW).fenced().get()
        op.phase = "read"
        op.read = counter.items if config.kind == "set" else counter.value
        _pause_point(config.work)
        counter.value, counter.items, op.written = _next(config.kind, counter.value, counter.items, token)
        if config.worker % 2:
            # The habit of building the instance from its pk to save what was computed (Django's plain UPDATE path).
            counter = Counter(pk=ROW, value=counter.value, items=counter.items)
        op.phase = "write"
        with transaction.atomic(), connection.cursor() as cursor:
            counter.save()
            cursor.execute(
                f"INSERT INTO {WRITES} (token, worker, value) VALUES (%s, %s, %s)", [token, config.worker, op.written]
            )

    return step


STEPS: dict[str, Callable[[Config], Step]] = {"raw": _raw_step, "sqla": _sqla_step, "django": _django_step}


def _is_refusal(error: BaseException) -> bool:
    from sqlalchemy.orm.exc import StaleDataError

    return isinstance(error, Refused | distlock.StaleFenceToken | StaleDataError)


@contextlib.contextmanager
def _recorded(op: Op, out: Any) -> Iterator[None]:
    """Classify how the iteration ended and append it to the history, whatever happened."""
    try:
        yield
        op.outcome, op.phase = "ok", "done"
    except Exception as error:
        op.error = type(error).__name__
        op.outcome = "unknown" if op.phase == "write" and not _is_refusal(error) else "fail"
    finally:
        op.end = _now()
        out.write(json.dumps(dataclasses.asdict(op)) + "\n")
        out.flush()


def run(config: Config) -> None:
    if config.fence != "on" and config.api != "raw":
        raise distlock.ConfigurationError(f"fence={config.fence!r} is for the raw api only (control runs)")
    step = STEPS[config.api](config)
    client = distlock.connect(config.url, request_timeout=5)
    name = LOCK.format(id=ROW)
    signal.signal(signal.SIGUSR1, _ask_pause)
    signal.signal(signal.SIGUSR2, _ask_pause)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    go = sys.stdin.readline()
    if not go:
        return
    until = json.loads(go)["until"]
    with open(config.history, "a") as out:
        while _now() < until:
            op = Op(worker=config.worker, start=_now())
            lock = client.lock(name, ttl=config.ttl, timeout=config.timeout, owner=f"w{config.worker}")
            with _recorded(op, out):
                if not lock.acquire():
                    raise distlock.LockNotAcquired(f"{name} not acquired in {config.timeout} s", name=name)
                op.granted, op.token = _now(), lock.token
                try:
                    step(op, lock.token)
                finally:
                    try:
                        lock.release()
                    except distlock.DistlockError as error:
                        op.release_error = type(error).__name__
    with contextlib.suppress(distlock.DistlockError):
        client.close()


def main() -> None:
    run(Config(**json.loads(sys.argv[1])))
