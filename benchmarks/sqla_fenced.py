"""Benchmark distlock_sqla's fenced ORM update against a plain ORM update, on SQLite and PostgreSQL in one run.

One round is what an application does per request: open a ``Session``, load one row, add 1 to a column, commit.

* **plain**: a model without the mixin (same columns, ``fence_token`` included, so rows are as wide);
* **fenced flush**: a ``FencedMixin`` model, inside its held lock: the flush finds the lock through the contextvar,
  renders the row's lock name, and writes ``SET value, fence_token = :t WHERE id = :id AND fence_token = :read``;
* **claim + fenced flush**: the read-modify-write that docs/GUARANTEES.md asks for (the row claimed before it is
  read): ``claim_one`` (one claiming ``UPDATE ... RETURNING``) instead of ``session.get``, then the same flush;
* **fenced flush with a server_default** on ``fence_token``: why ``FencedMixin``'s column has none (SQLAlchemy reads
  a server-defaulted version column back after every UPDATE).

The lock is acquired once before measuring and held throughout (its acquisition is the etcd benchmark's subject,
not this one's). All variants run in one process, interleaved in blocks whose order rotates, so a slow spell of
the shared machine hits them alike (:func:`benchmarks._harness.timing.interleaved`). Results are printed and written
into ``docs/BENCHMARKS.md`` between the ``sqla-fenced`` markers. PostgreSQL is started by
:class:`distlock.testing.PostgresServer` (or ``--postgres-url``), etcd by :class:`distlock.testing.EtcdServer` with
fsync on (or ``--etcd-url``), both through :func:`benchmarks._harness.servers.database_servers`; SQLite is a file in a
temporary directory.

What can go wrong: a server that cannot start, or a statement a database refuses, stops the run with that error
before anything is written into ``docs/BENCHMARKS.md``; the throwaway servers are removed either way, but with
``--postgres-url`` the benchmark's tables stay in that database (they are dropped after a successful run).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Engine, create_engine, event, make_url, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import distlock
from benchmarks._harness.figures import ratio, target
from benchmarks._harness.machine import cpu_line, software_line
from benchmarks._harness.report import publish, section
from benchmarks._harness.run import Run, database_arguments, summary
from benchmarks._harness.servers import SQLITE_DESCRIPTION, database_servers
from benchmarks._harness.timing import Variants, interleaved, variants_table
from distlock_sqla import FencedMixin, claim_one

NAME = "sqla-fenced"
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


@dataclasses.dataclass(kw_only=True)
class Database(Variants):
    engine: Engine

    def rows(self) -> list[str]:
        return [self.row(key, label, "plain") for key, (label, _) in VARIANTS.items()]


def measure_database(database: Database, rounds: int, warmup: int, block: int) -> None:
    """Every variant on ``database``, :func:`interleaved`."""
    Base.metadata.create_all(database.engine)
    with Session(database.engine) as session:
        session.add_all([PlainRow(id=ROW), FencedRow(id=ROW), ServerDefaultRow(id=ROW)])
        session.commit()
    runs = {key: functools.partial(run, database.engine) for key, (_, run) in VARIANTS.items()}
    database.timed = interleaved(runs, rounds, warmup, block)


def sqlite_engine(path: Path) -> Engine:
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


def render(
    *,
    run: Run,
    machine: list[str],
    args: argparse.Namespace,
    databases: list[Database],
) -> str:
    lines = [
        *run.heading(
            "## SQLAlchemy: fenced ORM update vs plain ORM update",
            [*machine, *(f"- {d.label}: {d.description}" for d in databases)],
        ),
        "One round: open a `Session`, load row 1, add 1 to a column, commit. *Plain*: a model without the mixin",
        "(same columns). *Fenced flush*: a `FencedMixin` model inside its held lock (acquired once, before",
        "measuring): the flush writes `SET value, fence_token = :t WHERE id = :id AND fence_token = :read`.",
        "*Claim + fenced flush*: `claim_one()` (one claiming `UPDATE ... RETURNING`) instead of `session.get()`,",
        'the row claimed before it is read. The last variant declares `server_default="0"` on `fence_token`, which',
        "`FencedMixin` does not: SQLAlchemy then reads the version column back (`RETURNING`) after every UPDATE.",
        f"{args.rounds} rounds per variant after {args.warmup} warm-up rounds,",
        f"interleaved in blocks of {args.block} (the order rotating), all in one process.",
        "",
        *variants_table(row for d in databases for row in d.rows()),
        "",
        "### Ratios",
        "",
    ]
    for d in databases:
        fenced = d.median("fenced") / d.median("plain")
        bound = target(fenced, TARGET) if "Postgre" in d.label else ""
        lines.append(f"- {d.label}, fenced flush ÷ plain, median: {fenced:.2f}x{bound}")
        claim_ratio = ratio(d.median("claimed"), d.median("plain"))
        lines.append(f"- {d.label}, claim + fenced flush ÷ plain, median: {claim_ratio}")
        default_ratio = ratio(d.median("server_default"), d.median("fenced"))
        lines.append(f"- {d.label}, fenced flush with a `server_default` ÷ without, median: {default_ratio}")
    return section(NAME, lines)


def main(argv: Sequence[str] | None = None) -> int:
    run = Run.begin("benchmarks.sqla_fenced", argv)
    args = database_arguments(run, summary(__doc__))
    with (
        database_servers(args, "distlock-sqla-bench-") as servers,
        distlock.connect(servers.etcd.url) as client,
        client.lock(f"bench-sqla:{ROW}", ttl=60),
    ):
        pg_engine = create_engine(make_url(servers.postgres_url).set(drivername="postgresql+psycopg"))
        with pg_engine.connect() as conn:
            pg_version = str(conn.execute(text("SHOW server_version")).scalar())
        databases = [
            Database(
                label="SQLite",
                description=SQLITE_DESCRIPTION,
                engine=sqlite_engine(servers.scratch / "bench.sqlite3"),
            ),
            Database(
                label="PostgreSQL",
                description=servers.postgres_description(pg_version),
                engine=pg_engine,
            ),
        ]
        machine = [cpu_line(), software_line({"SQLAlchemy": "sqlalchemy"})]
        print("\n".join(machine), flush=True)
        for database in databases:
            measure_database(database, args.rounds, args.warmup, args.block)
            print("\n".join(database.rows()), flush=True)
            database.engine.dispose()
        for database in databases:
            with database.engine.begin() as conn:
                Base.metadata.drop_all(conn)
            database.engine.dispose()
    report = render(run=run, machine=machine, args=args, databases=databases)
    publish(args.out, NAME, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
