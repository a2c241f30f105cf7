"""Benchmark distlock_sqla's fenced ORM update against a plain ORM update, on SQLite and PostgreSQL in one run.

One round is what an application does per request: open a ``Session``, load one row, add 1 to a column, commit.

* **plain**: a model without the mixin (same columns, ``fence_token`` included, so rows are as wide);
* **fenced flush**: a ``FencedMixin`` model, inside its held lock: the flush finds the lock through the contextvar,
  renders the row's lock name, and writes ``SET value, fence_token = :t WHERE id = :id AND fence_token = :read``;
* **claim + fenced flush**: the read-modify-write DESIGN §3 asks for: ``claim_one`` (one claiming
  ``UPDATE ... RETURNING``) instead of ``session.get``, then the same flush;
* **fenced flush with a server_default** on ``fence_token``: why ``FencedMixin``'s column has none (SQLAlchemy reads
  a server-defaulted version column back after every UPDATE).

The lock is acquired once before measuring and held throughout (its acquisition is the etcd benchmark's subject,
not this one's). All variants run in one process, interleaved in blocks whose order rotates, so a slow spell of
the shared machine hits them alike. Results are printed and written into ``docs/BENCHMARKS.md`` between the
``sqla-fenced`` markers. PostgreSQL is started by :class:`distlock.testing.PostgresServer` (or ``--postgres-url``),
etcd by :class:`distlock.testing.EtcdServer` (or ``--etcd-url``), SQLite is a file in a temporary directory.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.metadata
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Engine, create_engine, event, make_url, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import distlock
from benchmarks.etcd_locks import Run, _checkout, _machine, _ms, _percentile, _ratio, _server, publish
from distlock.testing import PostgresServer
from distlock_sqla import FencedMixin, claim_one

MARKERS = ("<!-- sqla-fenced:begin -->", "<!-- sqla-fenced:end -->")
ROW = 1
TARGET = 1.15  # fenced flush ÷ plain, PostgreSQL median: the bound


class Base(DeclarativeBase):
    pass


class PlainRow(Base):
    __tablename__ = "bench_plain"
    id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(default=0)
    fence_token: Mapped[int] = mapped_column(BigInteger, default=0)


class FencedRow(FencedMixin, Base):
    __tablename__ = "bench_fenced"
    fence_lock = "bench-sqla:{id}"
    id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(default=0)


class ServerDefaultRow(FencedMixin, Base):
    """The fence column as it would be with a ``server_default``: SQLAlchemy then reads it back after each UPDATE."""

    __tablename__ = "bench_server_default"
    fence_lock = "bench-sqla:{id}"
    id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(default=0)
    fence_token: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")


def load_and_increment(model: type[Any]) -> Callable[[Engine], None]:
    """One round on ``model``: a session, ``session.get()``, ``value += 1``, commit."""

    def round_(engine: Engine) -> None:
        with Session(engine) as session:
            row = session.get(model, ROW)
            assert row is not None
            row.value += 1
            session.commit()

    return round_


def claimed(engine: Engine) -> None:
    with Session(engine) as session:
        claim_one(session, FencedRow, ROW).value += 1
        session.commit()


VARIANTS: dict[str, tuple[str, Callable[[Engine], None]]] = {
    "plain": ("plain ORM update", load_and_increment(PlainRow)),
    "fenced": ("fenced flush", load_and_increment(FencedRow)),
    "claimed": ("claim + fenced flush", claimed),
    "server_default": ("fenced flush, `server_default` on the column", load_and_increment(ServerDefaultRow)),
}


@dataclasses.dataclass
class Database:
    label: str
    engine: Engine
    description: str
    seconds: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def median(self, variant: str) -> float:
        return _percentile(sorted(self.seconds[variant]), 50)

    def rows(self) -> list[str]:
        lines = []
        for key, (label, _) in VARIANTS.items():
            samples = sorted(self.seconds[key])
            cells = [
                self.label,
                label,
                str(len(samples)),
                _ms(_percentile(samples, 50)),
                _ms(_percentile(samples, 99)),
                _ratio(self.median(key), self.median("plain")),
            ]
            lines.append(f"| {' | '.join(cells)} |")
        return lines


def interleaved(
    runs: Mapping[str, Callable[[], object]], rounds: int, warmup: int, block: int
) -> dict[str, list[float]]:
    """The seconds of ``rounds`` calls of each of ``runs``, after ``warmup`` calls of each: interleaved blocks of
    ``block`` calls per run, the order rotating from block to block, so a slow spell hits them alike."""
    keys = list(runs)
    for key in keys:
        for _ in range(warmup):
            runs[key]()
    seconds: dict[str, list[float]] = {key: [] for key in keys}
    clock = time.perf_counter
    for k, done in enumerate(range(0, rounds, block)):
        shift = k % len(keys)
        for key in keys[shift:] + keys[:shift]:
            run, samples = runs[key], seconds[key]
            for _ in range(min(block, rounds - done)):
                t0 = clock()
                run()
                samples.append(clock() - t0)
    return seconds


def measure(database: Database, rounds: int, warmup: int, block: int) -> None:
    """Every variant on ``database``, :func:`interleaved`."""
    Base.metadata.create_all(database.engine)
    with Session(database.engine) as session:
        session.add_all([PlainRow(id=ROW), FencedRow(id=ROW), ServerDefaultRow(id=ROW)])
        session.commit()
    runs = {key: functools.partial(run, database.engine) for key, (_, run) in VARIANTS.items()}
    database.seconds = interleaved(runs, rounds, warmup, block)


def sqlite_engine(path: Path) -> Engine:
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


@contextlib.contextmanager
def _postgres(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    if args.postgres_url:
        yield args.postgres_url, "an existing server"
        return
    settings = {"fsync": "on", "full_page_writes": "on"} if args.fsync else {}
    with PostgresServer(settings=settings) as server:
        fsync = "fsync on" if args.fsync else "fsync off (synchronous_commit on)"
        yield server.dsn, f"started by `distlock.testing.PostgresServer` on loopback, {fsync}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def render(
    *,
    run: Run,
    machine: list[str],
    args: argparse.Namespace,
    databases: list[Database],
) -> str:
    lines = [
        MARKERS[0],
        "## SQLAlchemy: fenced ORM update vs plain ORM update",
        "",
        run.when(),
        "",
        *machine,
        *(f"- {d.label}: {d.description}" for d in databases),
        run.load_line(),
        "",
        "One round: open a `Session`, load row 1, add 1 to a column, commit. *Plain*: a model without the mixin",
        "(same columns). *Fenced flush*: a `FencedMixin` model inside its held lock (acquired once, before",
        "measuring): the flush writes `SET value, fence_token = :t WHERE id = :id AND fence_token = :read`.",
        "*Claim + fenced flush*: `claim_one()` (one claiming `UPDATE ... RETURNING`) instead of `session.get()`,",
        'the read-modify-write of DESIGN §3. The last variant declares `server_default="0"` on `fence_token`, which',
        "`FencedMixin` does not: SQLAlchemy then reads the version column back (`RETURNING`) after every UPDATE.",
        f"{args.rounds} rounds per variant after {args.warmup} warm-up rounds,",
        f"interleaved in blocks of {args.block} (the order rotating), all in one process.",
        "",
        "| Database | variant | rounds | median ms | p99 ms | median ÷ plain |",
        "|---|---|---:|---:|---:|---:|",
        *(row for d in databases for row in d.rows()),
        "",
        "### Ratios",
        "",
    ]
    for d in databases:
        ratio = d.median("fenced") / d.median("plain")
        bound = (
            f" (target ≤ {TARGET:.2f}x: {'met' if ratio <= TARGET else '**missed**'})" if "Postgre" in d.label else ""
        )
        lines.append(f"- {d.label}, fenced flush ÷ plain, median: {ratio:.2f}x{bound}")
        claim_ratio = _ratio(d.median("claimed"), d.median("plain"))
        lines.append(f"- {d.label}, claim + fenced flush ÷ plain, median: {claim_ratio}")
        default_ratio = _ratio(d.median("server_default"), d.median("fenced"))
        lines.append(f"- {d.label}, fenced flush with a `server_default` ÷ without, median: {default_ratio}")
    lines.append(MARKERS[1])
    return "\n".join(lines) + "\n"


def database_arguments(prog: str, description: str, argv: Sequence[str]) -> argparse.Namespace:
    """Parse the options of a database benchmark (this one, :mod:`benchmarks.django_overhead`)."""
    parser = argparse.ArgumentParser(prog, description=description)
    parser.add_argument("--rounds", type=int, default=2000, help="rounds per variant and database (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up rounds per variant (default 200)")
    parser.add_argument("--block", type=int, default=25, help="rounds per interleaved block (default 25)")
    parser.add_argument("--fsync", action="store_true", help="start PostgreSQL with fsync on (default off)")
    parser.add_argument("--postgres-url", help="use this PostgreSQL (postgresql://...) instead of starting one")
    parser.add_argument("--etcd-url", help="use this etcd (etcd://HOST:PORT) instead of starting one")
    parser.add_argument("--metrics-url", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("docs/BENCHMARKS.md"), help="file to update")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0 or args.block < 1:
        parser.error("--rounds and --block must be positive, --warmup not negative")
    return args


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return database_arguments("python -m benchmarks.sqla_fenced", __doc__.split("\n\n")[0], argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parse_args(argv)
    run = Run.begin("benchmarks.sqla_fenced", argv)
    with (
        tempfile.TemporaryDirectory(prefix="distlock-sqla-bench-") as temp,
        _server(args) as etcd,
        _postgres(args) as (postgres_url, postgres_description),
        distlock.connect(etcd.url) as client,
        client.lock(f"bench-sqla:{ROW}", ttl=60),
    ):
        pg_engine = create_engine(make_url(postgres_url).set(drivername="postgresql+psycopg"))
        with pg_engine.connect() as conn:
            pg_version = str(conn.execute(text("SHOW server_version")).scalar())
        databases = [
            Database(
                "SQLite",
                sqlite_engine(Path(temp) / "bench.sqlite3"),
                f"{sqlite3.sqlite_version} (pysqlite), a file in a temporary directory, WAL, synchronous=NORMAL",
            ),
            Database(
                "PostgreSQL",
                pg_engine,
                f"{pg_version} via psycopg {_version('psycopg')}, {postgres_description}",
            ),
        ]
        machine = [
            _machine(etcd)[0],
            f"- Python {platform.python_version()}, SQLAlchemy {_version('sqlalchemy')}, "
            f"distlock {distlock.__version__} ({_checkout()})",
        ]
        print("\n".join(machine), flush=True)
        for database in databases:
            measure(database, args.rounds, args.warmup, args.block)
            print("\n".join(database.rows()), flush=True)
            database.engine.dispose()
        for database in databases:
            with database.engine.begin() as conn:
                Base.metadata.drop_all(conn)
            database.engine.dispose()
    section = render(
        run=run,
        machine=machine,
        args=args,
        databases=databases,
    )
    publish(args.out, section, MARKERS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
