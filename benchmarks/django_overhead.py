"""Benchmark what distlock_django adds to a Django request and to a model's ``save()``, in one run.

* **Decorator overhead per request**: one small view (load a row, answer JSON) served undecorated and decorated
  with ``@distributed_lock("bench:{pk}")`` (the default TTL and timeout), each request driven in-process through
  Django's whole request stack by ``django.test.Client``; interleaved with them, the lock's own uncontended
  ``client.lock(name).acquire()`` + ``release()`` on the same etcd and client, and the plain view's request inside
  that lock taken by hand. The decorator should cost what the lock costs, plus at most 0.3 ms.
* **Round trips after a gap**: the lock's acquire + release, a one-RPC etcd read and PostgreSQL's ``SELECT 1``, each
  timed alone back to back, after a plain request and after a 1 ms sleep: what a request between two lock calls
  costs them, and whether that is etcd's, gRPC's or any server's.
* **Fenced ``save()`` vs plain ``save()``** on SQLite and PostgreSQL: one round loads a row, adds 1 to a field and
  saves it. *Plain*: a model without the mixin (same fields, ``fence_token`` included). *Fenced*: a
  ``FencedModel`` inside its held lock (acquired once before measuring, as in :mod:`benchmarks.sqla_fenced`): the
  save is ``UPDATE ... WHERE pk = :pk AND fence_token <= :t``. *Claim + fenced save*: the row read with
  ``.fenced()`` (claimed with the token first, then read), then saved, for information; and plain and fenced
  again with the round inside ``transaction.atomic()``.

Every variant runs in one process, interleaved in blocks whose order rotates (:func:`benchmarks._harness.timing.
interleaved`). Django is configured in-process; the benchmark's models belong to the app ``benchmarks``. etcd is
started by :class:`distlock.testing.EtcdServer` with fsync on (or ``--etcd-url``), PostgreSQL by
:class:`distlock.testing.PostgresServer` (or ``--postgres-url``); SQLite is a file in a temporary directory. Results
are printed and written into ``docs/BENCHMARKS.md`` between the ``django-overhead`` markers.

What can go wrong: a server that cannot start, a view that does not answer 200 (``RuntimeError``) or a statement a
database refuses stops the run with that error before anything is written into ``docs/BENCHMARKS.md``; the
benchmark's tables are dropped and its client closed in any case.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import django
from django.conf import settings
from django.db import connections, models, transaction
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import URLPattern, path
from psycopg.conninfo import conninfo_to_dict

from benchmarks._harness.figures import latency_cells, median, ms, ratio, table_row, target, verdict
from benchmarks._harness.machine import ETCD_PACKAGES, machine
from benchmarks._harness.report import publish, section
from benchmarks._harness.run import Run, database_arguments, summary
from benchmarks._harness.servers import SQLITE_DESCRIPTION, database_servers
from benchmarks._harness.timing import Timed, Variants, interleaved, variants_table

if TYPE_CHECKING:
    from distlock_django import FencedModel  # a model class: importable only once Django is set up

NAME = "django-overhead"
APP = "benchmarks"  # the benchmark's models' app: this package, an installed app without a models module
ROW = 1
LOCK = "bench:{pk}"
FENCE_LOCK = "bench-fenced:{pk}"
SLACK = 0.0003  # s: the decorator may cost the lock's acquire + release plus this much
TARGET = 1.15  # fenced save() ÷ plain save(), PostgreSQL median
CLAIM_TARGETS = {"default": 1.8, "pg": 1.35}  # claim + fenced save() ÷ plain save(), per database alias
MINUS = "\N{MINUS SIGN}"
REQUESTS = {
    "plain": "plain view",
    "decorated": '`@distributed_lock("bench:{pk}")` view',
    "hand": "plain view, the lock taken by hand around the request",
    "lock": "`client.lock(name)`: `acquire()` + `release()`",
}
# Round trips timed alone, right after each of these (untimed): to tell what a request in between costs them.
GAPS = {
    "back": "back to back",
    "request": "after a plain request",
    "sleep": "after a 1 ms sleep",
}
ROUND_TRIPS = {
    "lock": "etcd: `acquire()` + `release()` (2 RPCs)",
    "read": "etcd: `client.holder(name)` (1 RPC, no write)",
    "pg": "PostgreSQL: `SELECT 1` (psycopg, no gRPC)",
}
SAVES = {
    "plain": "plain `save()`",
    "fenced": "fenced `save()`",
    "claimed": "claim + fenced `save()`",
    "plain_atomic": "plain `save()` in `atomic()`",
    "fenced_atomic": "fenced `save()` in `atomic()`",
}


class Urls:
    """The URLconf (``ROOT_URLCONF`` may be any object with ``urlpatterns``); :func:`serve` fills it."""

    urlpatterns: ClassVar[list[URLPattern]] = []


def configure(sqlite: Path, postgres_url: str, etcd_url: str) -> None:
    """Django settings for this process: SQLite as ``default``, PostgreSQL as ``pg``, the benchmark's URLs."""
    pg = conninfo_to_dict(postgres_url)
    settings.configure(
        DEBUG=False,
        SECRET_KEY="distlock-benchmark",
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        INSTALLED_APPS=["distlock_django", APP],
        MIDDLEWARE=["django.middleware.security.SecurityMiddleware", "django.middleware.common.CommonMiddleware"],
        ROOT_URLCONF=Urls,
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(sqlite),
                "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"},
                "CONN_MAX_AGE": None,
            },
            "pg": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": pg.get("dbname", "postgres"),
                "USER": pg.get("user", ""),
                "PASSWORD": pg.get("password", ""),
                "HOST": pg.get("host", "127.0.0.1"),
                "PORT": str(pg.get("port", "")),
                "CONN_MAX_AGE": None,
            },
        },
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        DISTLOCK={"URL": etcd_url},  # TTL, TIMEOUT and the rest: the defaults
        LOGGING_CONFIG=None,
    )
    django.setup()


@dataclasses.dataclass(frozen=True)
class Models:
    plain: type[models.Model]
    fenced: type[FencedModel]


def define_models() -> Models:
    """The benchmark's two models, as alike as can be (defined once Django is set up)."""
    from distlock_django import FencedModel

    class PlainRow(models.Model):
        value: models.IntegerField[int, int] = models.IntegerField(default=0)
        fence_token: models.BigIntegerField[int, int] = models.BigIntegerField(default=0, editable=False)

        class Meta:
            app_label = APP
            db_table = "bench_plain"

    class FencedRow(FencedModel):
        value: models.IntegerField[int, int] = models.IntegerField(default=0)

        fence_lock = FENCE_LOCK

        class Meta:
            app_label = APP
            db_table = "bench_fenced"

    return Models(PlainRow, FencedRow)


def create_tables(alias: str, rows: Models) -> None:
    with connections[alias].schema_editor() as editor:
        for model in (rows.plain, rows.fenced):
            editor.create_model(model)
    for model in (rows.plain, rows.fenced):
        model._default_manager.using(alias).create(pk=ROW)


def drop_tables(alias: str, rows: Models) -> None:
    with connections[alias].schema_editor() as editor:
        for model in (rows.plain, rows.fenced):
            editor.delete_model(model)


# --- 1. the decorator, per request ---------------------------------------------------------------------------


def serve(rows: Models) -> None:
    """Route ``/plain/<pk>/`` and ``/locked/<pk>/`` to the same view, undecorated and decorated."""
    from distlock_django import distributed_lock

    def show(request: HttpRequest, pk: int) -> JsonResponse:
        row: Any = rows.plain._default_manager.get(pk=pk)
        return JsonResponse({"pk": row.pk, "value": row.value})

    Urls.urlpatterns = [
        path("plain/<int:pk>/", show),
        path("locked/<int:pk>/", distributed_lock(LOCK)(show)),
    ]


def request_runs() -> dict[str, Callable[[], object]]:
    from distlock_django import get_client, lock_name

    browser = Client()
    name = lock_name(LOCK.format(pk=ROW))

    def get(url: str) -> Callable[[], object]:
        def run() -> None:
            response = browser.get(url)
            if response.status_code != 200:
                raise RuntimeError(f"GET {url} answered {response.status_code}: {response.content[:200]!r}")

        return run

    def locked(run: Callable[[], object]) -> Callable[[], object]:
        def locked_run() -> None:
            handle = get_client().lock(name)
            handle.acquire()
            run()
            handle.release()

        return locked_run

    plain = get(f"/plain/{ROW}/")
    return {
        "plain": plain,
        "decorated": get(f"/locked/{ROW}/"),
        "hand": locked(plain),
        "lock": locked(lambda: None),
    }


def gap_timings(plain: Callable[[], object], rounds: int, warmup: int) -> dict[tuple[str, str], list[float]]:
    """The seconds of each round trip of :data:`ROUND_TRIPS`, each timed alone right after each gap of :data:`GAPS`.

    *Back to back* runs the round trip twice and times the second. If a round trip costs more after a request than
    back to back, and PostgreSQL's ``SELECT 1`` (another server, another protocol) does too, what costs is neither
    etcd nor gRPC but waking an idle server (and its client) up again, per round trip.
    """
    from distlock_django import get_client, lock_name

    client = get_client()
    name = lock_name(LOCK.format(pk=ROW))
    handle = client.lock(name)
    pg = connections["pg"].cursor()

    def lock() -> None:
        handle.acquire()
        handle.release()

    def select() -> None:
        pg.execute("SELECT 1")
        pg.fetchone()

    trips: dict[str, Callable[[], object]] = {"lock": lock, "read": lambda: client.holder(name), "pg": select}
    gaps: dict[str, Callable[[], object]] = {"request": plain, "sleep": lambda: time.sleep(0.001)}
    timings: dict[tuple[str, str], list[float]] = {(gap, trip): [] for gap in GAPS for trip in trips}
    for round_ in range(warmup + rounds):
        for gap in GAPS:
            for trip, run in trips.items():
                (gaps.get(gap) or run)()
                start = time.perf_counter()
                run()
                if round_ >= warmup:
                    timings[(gap, trip)].append(time.perf_counter() - start)
    pg.close()
    return timings


def gap_rows(timings: dict[tuple[str, str], list[float]]) -> list[str]:
    """One row per round trip: its median after each gap, and the difference to back to back."""
    rows = []
    for trip, label in ROUND_TRIPS.items():
        back = median(timings[("back", trip)])
        cells = [ms(back)]
        for gap in list(GAPS)[1:]:
            after = median(timings[(gap, trip)])
            cells.append(f"{ms(after)} ({'+' if after >= back else MINUS}{ms(abs(after - back))})")
        rows.append(table_row([label, *cells]))
    return rows


# --- 2. fenced save(), per database --------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class Database(Variants):
    alias: str


def save_runs(alias: str, rows: Models) -> dict[str, Callable[[], object]]:
    def load_and_save(model: type[models.Model]) -> Callable[[], object]:
        def run() -> None:
            row: Any = model._default_manager.using(alias).get(pk=ROW)
            row.value += 1
            row.save(using=alias)

        return run

    def claimed() -> None:
        row: Any = rows.fenced.objects.using(alias).filter(pk=ROW).fenced().get()
        row.value += 1
        row.save(using=alias)

    def atomic(run: Callable[[], object]) -> Callable[[], object]:
        def atomic_run() -> None:
            with transaction.atomic(using=alias):
                run()

        return atomic_run

    plain, fenced = load_and_save(rows.plain), load_and_save(rows.fenced)
    return {
        "plain": plain,
        "fenced": fenced,
        "claimed": claimed,
        "plain_atomic": atomic(plain),
        "fenced_atomic": atomic(fenced),
    }


# --- report --------------------------------------------------------------------------------------------------


def request_rows(requests: dict[str, Timed]) -> list[str]:
    return [table_row(latency_cells(label, requests[key].seconds)) for key, label in REQUESTS.items()]


def decorator_lines(requests: dict[str, Timed]) -> list[str]:
    def median_of(key: str) -> float:
        return median(requests[key].seconds)

    overhead, lock = median_of("decorated") - median_of("plain"), median_of("lock")
    by_hand = median_of("hand") - median_of("plain")
    own = median_of("decorated") - median_of("hand")
    # The same two RPCs cost more around a request than back to back (the interpreter and CPU caches are cold after
    # the view's work), so the target is judged against both measures of "the lock's own acquire+release".
    back_to_back = verdict(overhead <= lock + SLACK)
    in_context = verdict(overhead <= by_hand + SLACK)
    return [
        f"- decorator overhead (decorated {MINUS} plain median) {ms(overhead)} ms vs the lock's own acquire+release "
        f"back to back {ms(lock)} ms; target ≤ {ms(lock)} + {SLACK * 1000:.1f} ms: {back_to_back}",
        f"- the same lock taken by hand around the plain view's request: +{ms(by_hand)} ms over the plain view; "
        f"target against that ≤ {ms(by_hand)} + {SLACK * 1000:.1f} ms: {in_context}",
        f"- decorated {MINUS} hand-locked median: {ms(own)} ms (the decorator's own code: template, key prefix, "
        "transaction hook, status mapping)",
    ]


def save_rows(database: Database) -> list[str]:
    """Each save variant, its median ÷ the plain save's (in ``atomic()``: ÷ the plain save's in ``atomic()``)."""
    return [
        database.row(key, label, "plain_atomic" if key.endswith("_atomic") else "plain") for key, label in SAVES.items()
    ]


def save_lines(database: Database) -> list[str]:
    fenced = database.median("fenced") / database.median("plain")
    bound = target(fenced, TARGET) if database.alias == "pg" else ""
    claimed = database.median("claimed") / database.median("plain")
    claimed_bound = target(claimed, CLAIM_TARGETS[database.alias])
    atomic = ratio(database.median("fenced_atomic"), database.median("plain_atomic"))
    return [
        f"- {database.label} fenced save ÷ plain: {fenced:.2f}x{bound}",
        f"- {database.label} claim + fenced save ÷ plain: {claimed:.2f}x{claimed_bound}",
        f"- {database.label} fenced save ÷ plain, both inside `transaction.atomic()`: {atomic}",
    ]


def render(
    *,
    run: Run,
    machine: list[str],
    args: argparse.Namespace,
    requests: dict[str, Timed],
    gaps: dict[tuple[str, str], list[float]],
    databases: list[Database],
) -> str:
    lines = [
        *run.heading(
            "## Django: `@distributed_lock` per request, fenced `save()` vs plain `save()`",
            [*machine, *(f"- {d.label}: {d.description}" for d in databases)],
        ),
        f"{args.rounds} rounds per variant after {args.warmup} warm-up rounds, interleaved in blocks of",
        f"{args.block} (the order rotating), all in one process.",
        "",
        "### The decorator, per request",
        "",
        "One view loads a row from SQLite and answers it as JSON; `django.test.Client` sends a `GET` through Django's",
        "whole request stack in-process (`SecurityMiddleware`, `CommonMiddleware`). *Decorated*: the same function",
        'under `@distributed_lock("bench:{pk}")` with the default TTL and timeout, never contended. *By hand*:',
        "`get_client().lock(name)`, `acquire()`, the plain view's request, `release()`. *The lock alone*:",
        "`acquire()` + `release()` back to back, on the same client, name and etcd. The by-hand lock is the fairer",
        "yardstick for the decorator's target (its round trips come after a request's work, as the decorator's do:",
        "see *Round trips after a gap* below); both are reported. etcd keeps every released queue",
        "key until a compaction, which this etcd (`--auto-compaction-retention=0`) never runs, so acquisitions grow",
        "slower as the run goes on; the interleaving spreads that over the lock variants alike.",
        "",
        "| Variant | rounds | median ms | p99 ms |",
        "|---|---:|---:|---:|",
        *request_rows(requests),
        "",
        "Where a decorated request's time goes (measured apart from this run, short runs on a shared 2-core",
        "machine, `cProfile` and timers around each step): the `acquire()` RPCs and the `release()` RPC are all but",
        "all of it; the decorator's own code (rendering the name from the call's arguments, the handle, the settings,",
        "the check for open transactions that decides whether the release waits for a commit) costs about",
        "0.01 to 0.02 ms a request; it parses no template, connects no signal and registers no `on_commit` hook per",
        "request outside a transaction. The same lock costs more around a request than back to back because each",
        "round trip does, whatever the server: see below.",
        "",
        "### Round trips after a gap",
        "",
        f"{args.rounds} rounds: each round trip timed alone, right after the untimed gap (back to back: right after",
        "itself). The same difference on PostgreSQL (another server, another protocol, no gRPC) as on etcd, and for a",
        "read as for the lock's writes, says that what a request in between costs is neither etcd nor gRPC nor the",
        "lock: it is waking idle threads up again (the server's, and the client's waiting for the answer): the",
        "kernel's scheduler and the CPU, once per round trip.",
        "",
        "| Round trip | back to back, median ms | "
        + " | ".join(f"{label}, median ms (difference)" for label in list(GAPS.values())[1:])
        + " |",
        "|---|---:|" + "---:|" * (len(GAPS) - 1),
        *gap_rows(gaps),
        "",
        "### Fenced `save()` vs plain `save()`",
        "",
        "One round: `Model.objects.get(pk=1)`, add 1 to a field, `save()`. *Plain*: a model without the mixin (same",
        "fields). *Fenced*: a `FencedModel` inside its held lock (acquired once, before measuring): `save()` writes",
        "`UPDATE ... SET value, fence_token = :t WHERE id = :id AND fence_token <= :t`. *Claim + fenced*:",
        "`Model.objects.filter(pk=1).fenced().get()` instead of `get()` (one statement claims the row with the token",
        "and reads it: `UPDATE ... RETURNING`), then the same `save()`. Both saves of an existing row are one",
        "`UPDATE` in autocommit (the fenced one opens a transaction only for a model with multi-table parents, as",
        "Django's `save()` does), and so is the claim (a statement is atomic on its own).",
        "The *in `atomic()`* variants run the whole round inside the caller's transaction (as `ATOMIC_REQUESTS`",
        "would); their ratio is to the plain `save()` in `atomic()`.",
        "",
        *variants_table(row for d in databases for row in save_rows(d)),
        "",
        "### Ratios",
        "",
        *decorator_lines(requests),
        *(line for d in databases for line in save_lines(d)),
    ]
    return section(NAME, lines)


def main(argv: Sequence[str] | None = None) -> int:
    run = Run.begin("benchmarks.django_overhead", argv)
    args = database_arguments(run, summary(__doc__))
    with database_servers(args, "distlock-django-bench-") as servers:
        configure(servers.scratch / "bench.sqlite3", servers.postgres_url, servers.etcd.url)
        from distlock_django import get_client, lock_name, reset_client

        rows = define_models()
        with connections["pg"].cursor() as cursor:
            cursor.execute("SHOW server_version")
            pg_version = cursor.fetchone()[0]
        databases = [
            Database(alias="default", label="SQLite", description=SQLITE_DESCRIPTION),
            Database(alias="pg", label="PostgreSQL", description=servers.postgres_description(pg_version)),
        ]
        lines = [
            *machine(servers.etcd, ETCD_PACKAGES),
            f"- Django {django.get_version()}, `DEBUG = False`, persistent connections (`CONN_MAX_AGE = None`)",
        ]
        print("\n".join(lines), flush=True)
        try:
            for database in databases:
                create_tables(database.alias, rows)
            serve(rows)
            runs = request_runs()
            requests = interleaved(runs, args.rounds, args.warmup, args.block)
            print("\n".join(request_rows(requests) + decorator_lines(requests)), flush=True)
            gaps = gap_timings(runs["plain"], args.rounds, args.warmup)
            print("\n".join(gap_rows(gaps)), flush=True)
            with get_client().lock(lock_name(FENCE_LOCK.format(pk=ROW)), ttl=60):
                for database in databases:
                    database.timed = interleaved(save_runs(database.alias, rows), args.rounds, args.warmup, args.block)
                    print("\n".join(save_rows(database)), flush=True)
        finally:
            for database in databases:
                drop_tables(database.alias, rows)
            connections.close_all()
            reset_client()
    report = render(run=run, machine=lines, args=args, requests=requests, gaps=gaps, databases=databases)
    publish(args.out, NAME, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
