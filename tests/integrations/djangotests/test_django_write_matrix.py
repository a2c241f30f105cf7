"""The write-path matrix: every way Django writes a fenced row, generated as a product and asserted cell by cell.

write API (``save`` and its variants, an instance built from a pk, ``delete``, ``QuerySet.update/delete``,
``bulk_create`` and its upsert, ``bulk_update``, ``update_or_create``, ``F()``, reverse foreign key
``add``/``remove``, a cascade from a plain parent, ``.fenced()`` iteration, ``iterator()`` and ``aiterator()``,
``asave``/``adelete``, ``fenced_update``) x model (one table; a multi-table child, whose ``fence_token`` is its
parent's) x object state (fresh: read by the writer with ``.fenced()`` under its lock, or a plain read with no
lock; built from a pk; read, then ``refresh_from_db()`` just before the write; deferred with ``only()``; pickled
and unpickled) x who writes (the current holder; a stale holder: A reads, is force-released, B takes the lock and
claims the row with a newer token, then A writes; no lock; and, for APIs that take an object, an object read with no
lock before a holder claimed and wrote the row, then written by a holder of a newer lock or with no lock) x
``FENCING`` mode (on, strict) x database (strict mode on SQLite and MariaDB: ``pytest_generate_tests`` says why).

Each API is classified as the docs' table classifies it (docs/integrations/django.md, "Which writes the fence
covers"): *fenced* (the statement carries the token, or the row is claimed in the deletion's transaction), *claim*
(needs the row's lock: a fenced read or ``fenced_update``) or *plain*. The expected outcome follows from that class,
the writer and the mode alone; each cell asserts exactly one of: refused with the documented distlock error, the
row (and every other row the call could touch) unchanged; landed as the current holder's (its token stored); or a
documented plain write that did not lower the row's token. Strict mode refuses every plain write.

Cells share one set of test databases and one etcd (module-scoped, no flush between cells): each cell has rows and
locks of its own. Which cells exist is decided by rules below (``_applies``), never by listing them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, models
from django.db.models import F
from django.test.utils import override_settings
from djangotests.testapp import router
from djangotests.testapp.matrix_models import MxBase, MxItem, MxOwner, MxQuerySet, MxShelved, MxSub

import distlock
from distlock_django import FencedQuerySet, conf, get_client, lock_name

DATABASES = {"sqlite": "default", "postgres": "pg", "mariadb": "maria"}
_pks = itertools.count(1)


def _committing(*aliases: str) -> pytest.MarkDecorator:
    """Every cell commits (its locks are real, and asave() writes from another thread): transactional, flushing after
    each test only the test app's tables (``available_apps``) of the databases it names, which keeps the matrix
    CI-sized (a cell writes one database: flushing all three after each of 4,000 cells took five minutes)."""
    return pytest.mark.django_db(transaction=True, databases=list(aliases), available_apps=["djangotests.testapp"])


pytestmark = _committing(*DATABASES.values())


@pytest.fixture(scope="module")
def matrix_db(django_servers: dict[str, str]) -> None:
    """The session's etcd for every cell."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each database (``alias``) and ``FENCING`` mode, but strict mode not on PostgreSQL: what strict mode adds is
    refused in Python before any statement (a write without its lock, a plain write), and a strict write inside the
    lock sends what mode "on" sends, which PostgreSQL's cells run; SQLite takes PostgreSQL's claim path (``UPDATE ...
    RETURNING``) and MariaDB the other, and both run strict."""
    if "alias" not in metafunc.fixturenames:
        return
    databases = [pytest.param(name, marks=_committing(alias), id=name) for name, alias in DATABASES.items()]
    if "mode" not in metafunc.fixturenames:
        metafunc.parametrize("alias", databases, indirect=True, scope="module")
        return
    cells = [
        pytest.param(mode, name, marks=_committing(alias), id=f"{mode}-{name}")
        for mode in ("on", "strict")
        for name, alias in DATABASES.items()
        if not (mode == "strict" and name == "postgres")
    ]
    metafunc.parametrize(("mode", "alias"), cells, indirect=True, scope="module")


@pytest.fixture(scope="module")
def alias(request: pytest.FixtureRequest, matrix_db: None) -> Iterator[str]:
    router.CURRENT[0] = DATABASES[request.param]
    try:
        yield DATABASES[request.param]
    finally:
        router.CURRENT[0] = "default"


@pytest.fixture(scope="module")
def mode(request: pytest.FixtureRequest, alias: str) -> Iterator[str]:
    with override_settings(DISTLOCK={**conf(), "FENCING": request.param}):
        yield request.param


# --- the rows of a cell -------------------------------------------------------------------------------------------


@dataclass
class Cell:
    model: Any  # a FencedModel class
    pk: int
    owner: MxOwner
    owner2: MxOwner

    @property
    def name(self) -> str:
        return lock_name(_template(self.model).format(pk=self.pk))

    @property
    def new_pk(self) -> int:
        return self.pk + 1_000_000

    @property
    def related(self) -> str:
        return "items" if self.model is MxItem else "bases"


def _template(model: Any) -> str:
    return str(model.fence_lock)


@dataclass(frozen=True)
class Snapshot:
    exists: bool
    value: int | None
    owner_id: int | None
    keeper_id: int | None
    token: int | None
    new_exists: bool
    owners: int


def _snapshot(cell: Cell) -> Snapshot:
    row = cell.model._base_manager.filter(pk=cell.pk).values("value", "owner_id", "keeper_id", "fence_token").first()
    return Snapshot(
        exists=row is not None,
        value=None if row is None else row["value"],
        owner_id=None if row is None else row["owner_id"],
        keeper_id=None if row is None else row["keeper_id"],
        token=None if row is None else row["fence_token"],
        new_exists=cell.model._base_manager.filter(pk=cell.new_pk).exists(),
        owners=MxOwner.objects.filter(pk__in=[cell.owner.pk, cell.owner2.pk]).count(),
    )


def _make(model: Any) -> Cell:
    """A row of its own (value 1, owned), created under its lock: its token is a real one, above 0."""
    cell = Cell(model, next(_pks), MxOwner.objects.create(), MxOwner.objects.create())
    with get_client().lock(cell.name, ttl=10):
        model.objects.create(pk=cell.pk, value=1, owner=cell.owner, keeper=cell.owner2)
    return cell


# --- object states --------------------------------------------------------------------------------------------------

STATES = ["fresh", "from_pk", "refreshed", "deferred", "pickled"]


def _read(cell: Cell, state: str, locked: bool) -> Any:
    """The object the writer will write, as it reads it (``refreshed`` and ``pickled`` finish in ``_ready``)."""
    rows = cell.model.objects.filter(pk=cell.pk)
    if state == "fresh":
        return rows.fenced().get() if locked else rows.get()
    if state == "from_pk":
        # ``id`` too: a multi-table child built from its pk alone has no parent pk, and Django's own delete() fails.
        return cell.model(pk=cell.pk, id=cell.pk, value=1, owner_id=cell.owner.pk, keeper_id=cell.owner2.pk)
    if state == "deferred":
        return rows.only("value").get()
    if state == "pickled":
        return pickle.dumps(rows.get())
    return rows.get()


def _ready(obj: Any, state: str) -> Any:
    """Just before the write: refresh (it sees a newer holder's token) or unpickle."""
    if state == "refreshed":
        obj.refresh_from_db()
    elif state == "pickled":
        obj = pickle.loads(obj)
    return obj


# --- write APIs -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Api:
    name: str
    kind: str  # "fenced", "claim" (needs the row's lock) or "plain"
    landed: str  # what the write does when it lands: see _landed
    write: Callable[[Cell, Any], object]
    instance: bool = True  # takes an object in a state
    multi_table: bool = True  # Django supports it on a multi-table child


def _set(obj: Any, value: Any = 999) -> Any:
    obj.value = value
    return obj


async def _collect(rows: Any) -> list[Any]:
    return [row async for row in rows]


def _run(awaitable: Any) -> Any:
    """Run an async ORM call; then close the connections its worker thread opened (Django's async ORM runs in
    asgiref's one thread; an open connection would keep the test database from being dropped at the end)."""

    async def run_and_close() -> Any:
        try:
            return await awaitable
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(run_and_close())


def _upsert(cell: Cell, obj: Any) -> None:
    features = connections[router.CURRENT[0]].features
    target = {"unique_fields": ["id"]} if features.supports_update_conflicts_with_target else {}
    cell.model.objects.bulk_create(
        [cell.model(pk=cell.pk, value=999)], update_conflicts=True, update_fields=["value"], **target
    )


APIS = [
    Api("save", "fenced", "value", lambda c, o: _set(o).save()),
    Api("save_update_fields", "fenced", "value", lambda c, o: _set(o).save(update_fields=["value"])),
    Api("save_force_update", "fenced", "value", lambda c, o: _set(o).save(force_update=True)),
    Api("save_F", "fenced", "value", lambda c, o: _set(o, F("value") + 998).save()),
    Api("asave", "fenced", "value", lambda c, o: _run(_set(o).asave())),
    Api("delete", "fenced", "gone", lambda c, o: o.delete()),
    Api("adelete", "fenced", "gone", lambda c, o: _run(o.adelete())),
    Api("reverse_add_bulk_false", "fenced", "owner2", lambda c, o: getattr(c.owner2, c.related).add(o, bulk=False)),
    Api("reverse_add", "plain", "owner2", lambda c, o: getattr(c.owner2, c.related).add(o)),
    Api("reverse_remove", "plain", "unowned", lambda c, o: getattr(c.owner, c.related).remove(o)),
    Api("bulk_update", "plain", "value", lambda c, o: c.model.objects.bulk_update([_set(o)], ["value"])),
    Api(
        "update_or_create",
        "fenced",
        "value",
        lambda c, o: c.model.objects.update_or_create(pk=c.pk, defaults={"value": 999}),
        instance=False,
    ),
    Api("qs_delete", "fenced", "gone", lambda c, o: c.model.objects.filter(pk=c.pk).delete(), instance=False),
    Api("cascade", "fenced", "gone", lambda c, o: MxOwner.objects.filter(pk=c.owner.pk).delete(), instance=False),
    Api(
        "cascade_set_null",
        "plain",
        "unkept",
        lambda c, o: MxOwner.objects.filter(pk=c.owner2.pk).delete(),
        instance=False,
    ),
    Api("qs_update", "plain", "value", lambda c, o: c.model.objects.filter(pk=c.pk).update(value=999), instance=False),
    Api(
        "qs_update_F",
        "plain",
        "value",
        lambda c, o: c.model.objects.filter(pk=c.pk).update(value=F("value") + 998),
        instance=False,
    ),
    Api(
        "bulk_create",
        "plain",
        "new",
        lambda c, o: c.model.objects.bulk_create([c.model(pk=c.new_pk, value=999)]),
        instance=False,
        multi_table=False,
    ),
    Api("upsert", "plain", "value", _upsert, instance=False, multi_table=False),
    # A user's managers on Django's own QuerySet (models.Manager(), MyQuerySet.as_manager()): fenced querysets too.
    Api(
        "manager_update",
        "plain",
        "value",
        lambda c, o: c.model.plain.filter(pk=c.pk).update(value=999),
        instance=False,
    ),
    Api(
        "custom_queryset_bulk_update",
        "plain",
        "value",
        lambda c, o: c.model.mine.valued().bulk_update([_set(o)], ["value"]),
    ),
    Api(
        "manager_fenced_update",
        "claim",
        "value",
        lambda c, o: c.model.plain.filter(pk=c.pk).fenced_update(value=999),
        instance=False,
    ),
    Api("fenced_iter", "claim", "claimed", lambda c, o: list(c.model.objects.filter(pk=c.pk).fenced()), False),
    Api(
        "fenced_iterator",
        "claim",
        "claimed",
        lambda c, o: list(c.model.objects.filter(pk=c.pk).fenced().iterator()),
        instance=False,
    ),
    Api(
        "fenced_aiterator",
        "claim",
        "claimed",
        lambda c, o: _run(_collect(c.model.objects.filter(pk=c.pk).fenced().aiterator())),
        instance=False,
    ),
    Api(
        "fenced_update",
        "claim",
        "value",
        lambda c, o: c.model.objects.filter(pk=c.pk).fenced_update(value=999),
        instance=False,
    ),
]
MODELS = {"table": MxItem, "multi_table": MxSub}
WRITERS = ["holder", "stale", "none", "read_before_lock", "none_after_claim"]
# Writers whose object was read, plainly, before a lock holder claimed and wrote the row: the holder that read before
# taking its own (newer) lock, and code holding no lock. Their write must not undo what was written since their read.
READ_BEFORE_A_CLAIM = {"read_before_lock", "none_after_claim"}
# States whose write checks the token the object was read with (the others: refreshed after the claim, or no read).
_READ_KNOWN = {"fresh", "deferred", "pickled"}


def _applies(api: Api, model: str, state: str, writer: str) -> bool:
    """The rules that decide which cells exist: a state only for APIs that take an object (the others read the row
    themselves: state ``-``, and so have no earlier read); a multi-table child only where Django supports the API on
    one (not ``bulk_create``)."""
    if (state != "-") != api.instance:
        return False
    if writer in READ_BEFORE_A_CLAIM and not api.instance:
        return False
    if api.name == "reverse_add" and state == "from_pk":
        return False  # Django's add() refuses an instance it considers unsaved (ValueError), before any write
    return model != "multi_table" or api.multi_table


def _in_cover(state: str, writer: str) -> bool:
    """The cover: every API and model with every state and every writer, not every pair of them. A fresh object
    meets every writer, each other state one writer (the diagonal of ``STATES`` and ``WRITERS``); APIs that take no
    object keep all their cells. The version environments (tox.ini: an older or newer Django, the same code of
    ours) run it, about 44% of the cells; the whole suite runs every cell."""
    return state in ("-", "fresh") or STATES.index(state) == WRITERS.index(writer)


CELLS = [
    pytest.param(
        api,
        model,
        state,
        writer,
        id=f"{api.name}-{model}-{state}-{writer}",
        marks=() if _in_cover(state, writer) else pytest.mark.write_matrix_rest,
    )
    for api, model, state, writer in itertools.product(APIS, MODELS, [*STATES, "-"], WRITERS)
    if _applies(api, model, state, writer)
]


def _expected(api: Api, state: str, writer: str, mode: str) -> str:
    """What the docs promise for this cell: ``landed`` (as the holder's), ``plain``, or the error's name."""
    if api.kind == "plain":
        return "UnfencedWrite" if mode == "strict" else "plain"
    if writer in READ_BEFORE_A_CLAIM:
        if writer == "none_after_claim" and mode == "strict":
            return "UnfencedWrite"
        if state in _READ_KNOWN:
            return "StaleFenceToken"  # the row was claimed and written since the object was read
        writer = "holder" if writer == "read_before_lock" else "none"  # refreshed since, or a blind write
    if writer == "holder":
        return "landed"
    if writer == "stale":
        return "StaleFenceToken"
    if mode == "strict":
        return "UnfencedWrite"
    return "LockNotOwned" if api.kind == "claim" else "plain"


def _landed(what: str, cell: Cell, after: Snapshot, token: int | None) -> bool:
    outcomes: dict[str, bool] = {
        "value": after.value == 999,
        "gone": not after.exists,
        "owner2": after.owner_id == cell.owner2.pk,
        "unowned": after.exists and after.owner_id is None,
        "unkept": after.exists and after.keeper_id is None,
        "new": after.new_exists,
        "claimed": after.token == token,
    }
    return outcomes[what]


REFUSALS = (distlock.StaleFenceToken, distlock.LockNotOwned, distlock.UnfencedWrite)


def _attempt(write: Callable[[], object]) -> str:
    try:
        write()
    except REFUSALS as e:
        return type(e).__name__
    return "wrote"


def _context() -> contextvars.Context:
    return contextvars.copy_context()


@pytest.mark.parametrize(("api", "model", "state", "writer"), CELLS)
def test_write_path(api: Api, model: str, state: str, writer: str, mode: str, alias: str) -> None:
    cell = _make(MODELS[model])
    client = get_client()
    holder_token: int | None = None
    if writer == "holder":
        ours = _context()
        lock = client.lock(cell.name, ttl=10)
        assert ours.run(lock.acquire)
        holder_token = lock.token
        try:
            obj = None if state == "-" else ours.run(lambda: _ready(_read(cell, state, True), state))
            before = _snapshot(cell)
            result = ours.run(_attempt, lambda: api.write(cell, obj))
        finally:
            ours.run(lock.release)
    elif writer == "stale":
        a_context, b_context = _context(), _context()
        a = client.lock(cell.name, ttl=10)
        assert a_context.run(a.acquire)
        obj = None if state == "-" else a_context.run(_read, cell, state, True)
        assert client.force_release(cell.name, a.token)
        b = client.lock(cell.name, ttl=10)
        assert b_context.run(b.acquire)
        try:
            b_context.run(lambda: list(cell.model.objects.filter(pk=cell.pk).fenced()))
            assert b.token > a.token
            obj = None if state == "-" else a_context.run(_ready, obj, state)
            before = _snapshot(cell)
            assert before.token == b.token
            result = a_context.run(_attempt, lambda: api.write(cell, obj))
        finally:
            b_context.run(b.release)
            with contextlib.suppress(distlock.DistlockError):
                a_context.run(a.release)  # A's lock was taken from it: releasing it is refused or a no-op
    elif writer in READ_BEFORE_A_CLAIM:
        obj = _read(cell, state, False)
        with client.lock(cell.name, ttl=10):  # a lock holder claims the row and writes it (its token) meanwhile
            cell.model.objects.filter(pk=cell.pk).fenced().get().save()
        if writer == "read_before_lock":
            ours = _context()
            lock = client.lock(cell.name, ttl=10)
            assert ours.run(lock.acquire)
            holder_token = lock.token
            try:
                obj = ours.run(_ready, obj, state)
                before = _snapshot(cell)
                result = ours.run(_attempt, lambda: api.write(cell, obj))
            finally:
                ours.run(lock.release)
        else:
            obj = _ready(obj, state)
            before = _snapshot(cell)
            result = _attempt(lambda: api.write(cell, obj))
    else:
        obj = None if state == "-" else _ready(_read(cell, state, False), state)
        before = _snapshot(cell)
        result = _attempt(lambda: api.write(cell, obj))

    after = _snapshot(cell)
    expected = _expected(api, state, writer, mode)
    if expected == "landed":
        assert result == "wrote", f"the current holder's write was refused: {result}"
        assert _landed(api.landed, cell, after, holder_token), after
        if after.exists:
            assert after.token == holder_token, f"landed without the holder's token: {after.token} != {holder_token}"
    elif expected == "plain":
        assert result == "wrote", f"a documented plain write was refused: {result}"
        assert _landed(api.landed, cell, after, holder_token), after
        if after.exists and before.exists:
            assert after.token == before.token, f"a plain write changed the token: {before.token} -> {after.token}"
    else:
        assert result == expected, f"expected {expected}, got {result}: {before} -> {after}"
        assert after == before, "a refused write changed something"


# --- moves: a lock-name change needs both locks ---------------------------------------------------------------------

MOVE_STATES = ["fresh", "from_pk", "refreshed", "deferred", "pickled"]
MOVE_HOLDS = ["destination", "source", "both"]
MOVE_APIS = ["save", "save_update_fields", "fenced_update"]


def _shelf_lock(shelf: int) -> str:
    return lock_name(f"shelf:{shelf}")


@pytest.mark.parametrize(
    ("api", "state", "holds"),
    [
        (api, state, holds)
        for api, state, holds in itertools.product(MOVE_APIS, [*MOVE_STATES, "-"], MOVE_HOLDS)
        if (state == "-") == (api == "fenced_update")
    ],
)
def test_a_move_needs_both_locks(api: str, state: str, holds: str, mode: str, alias: str) -> None:
    source, destination = next(_pks), next(_pks)
    client = get_client()
    with client.lock(_shelf_lock(source), ttl=10) as made:
        row = MxShelved.objects.create(shelf=source, value=1)
        assert row.fence_token == made.token
    names = {"source": [source], "destination": [destination], "both": [source, destination]}[holds]
    locks = [client.lock(_shelf_lock(shelf), ttl=10) for shelf in names]
    ours = _context()
    for lock in locks:
        assert ours.run(lock.acquire)
    newest = max(lock.token for lock in locks)

    def read() -> Any:
        rows = MxShelved.objects.filter(pk=row.pk)
        if state == "fresh":
            return rows.fenced().get() if holds != "destination" else rows.get()
        if state == "from_pk":
            return MxShelved(pk=row.pk, shelf=source, value=1)
        if state == "deferred":
            return rows.only("value", "shelf").get()
        if state == "pickled":
            return pickle.dumps(rows.get())
        return rows.get()

    def write(obj: Any) -> None:
        if api == "fenced_update":
            MxShelved.objects.filter(pk=row.pk).fenced_update(shelf=destination, value=999)
            return
        obj = _ready(obj, state)
        obj.shelf, obj.value = destination, 999
        obj.save(update_fields=["shelf", "value"]) if api == "save_update_fields" else obj.save()

    try:
        obj = None if state == "-" else ours.run(read)
        before = MxShelved.objects.values("shelf", "value", "fence_token").get(pk=row.pk)
        result = ours.run(_attempt, lambda: write(obj))
    finally:
        for lock in reversed(locks):
            ours.run(lock.release)
    after = MxShelved.objects.values("shelf", "value", "fence_token").get(pk=row.pk)
    if holds == "both":
        assert result == "wrote"
        assert after["shelf"] == destination
        assert after["value"] == 999
        assert after["fence_token"] == newest
    else:
        assert result == "LockNotOwned", f"a move holding only the {holds}'s lock: {result}"
        assert after == before


@pytest.mark.parametrize("held", [True, False], ids=["locked", "unlocked"])
def test_django_own_save_errors_are_raised_as_django_raises_them(held: bool, mode: str, alias: str) -> None:
    """``save(update_fields=["typo"])`` and an unsaved related object raise Django's ``ValueError`` before anything
    is written; a related object saved after assignment is stored by its pk, not as NULL."""
    cell = _make(MxItem)
    lock = get_client().lock(cell.name, ttl=10)
    ours = _context()
    if held:
        assert ours.run(lock.acquire)
    try:
        item = ours.run(MxItem.objects.get, pk=cell.pk)
        before = _snapshot(cell)
        item.value = 999
        if held or mode == "on":
            with pytest.raises(ValueError, match="typo"):
                ours.run(item.save, update_fields=["typo"])
            item.owner = MxOwner(name="unsaved")
            with pytest.raises(ValueError, match="unsaved related object"):
                ours.run(item.save)
            assert _snapshot(cell) == before
            owner = item.owner
            owner.save()  # saved after it was assigned: Django stores its pk
            ours.run(item.save)
            assert MxItem.objects.get(pk=cell.pk).owner_id == owner.pk
        else:
            with pytest.raises(distlock.UnfencedWrite):
                ours.run(item.save, update_fields=["value"])
            assert _snapshot(cell) == before
    finally:
        if held:
            ours.run(lock.release)


# --- multi-table inheritance under a racing claim (PostgreSQL) ----------------------------------------------------

RACE_OPS = ["save", "save_update_fields", "delete", "fenced_iter", "fenced_update"]


@pytest.mark.parametrize("op", RACE_OPS)
def test_a_multi_table_write_never_overwrites_a_claim_committed_before_it(op: str, matrix_db: None) -> None:
    """A (stale) writes a multi-table child; B's claim (newer token) commits just before A's first UPDATE or DELETE
    of the parent's table (where ``fence_token`` is), or waits for A's transaction if A holds the row. Either A is
    refused, or B's claim comes after A's write: the row's token ends as B's and the row exists.

    The race is made, not hoped for: a database execute wrapper on A's connection runs B (in a thread, its own
    connection) before that statement, and waits until B has committed or is seen waiting for A's row lock."""
    router.CURRENT[0] = "pg"
    try:
        _race(op)
    finally:
        router.CURRENT[0] = "default"


def _race(op: str) -> None:
    cell = _make(MxSub)
    client = get_client()
    a_context, b_context = _context(), _context()
    a = client.lock(cell.name, ttl=10)
    assert a_context.run(a.acquire)
    obj: Any = a_context.run(_read, cell, "fresh", True) if op in {"save", "save_update_fields", "delete"} else None
    assert client.force_release(cell.name, a.token)
    b = client.lock(cell.name, ttl=10)
    assert b_context.run(b.acquire)
    b_token = b.token
    b_done = threading.Event()
    b_result: list[str] = []
    b_waited = [False]

    def claim_b() -> None:
        try:
            b_result.append(b_context.run(_attempt, lambda: list(MxSub.objects.filter(pk=cell.pk).fenced())))
        finally:
            connections["pg"].close()
            b_done.set()

    parent = MxBase._meta.db_table

    def before_a_writes(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        writes = sql.lstrip().upper().startswith(("UPDATE", "DELETE")) and parent in sql
        if writes and not b_done.is_set() and not b_result:
            b_result.append("started")
            threading.Thread(target=claim_b).start()
            b_waited[0] = _until_done_or_waiting(b_done)  # B committed, or B waits for a row lock A holds
        return execute(sql, params, many, context)

    def write() -> None:
        if op == "save":
            _set(obj).save()
        elif op == "save_update_fields":
            _set(obj).save(update_fields=["value"])
        elif op == "delete":
            obj.delete()
        elif op == "fenced_iter":
            list(MxSub.objects.filter(pk=cell.pk).fenced())
        else:
            MxSub.objects.filter(pk=cell.pk).fenced_update(value=999)

    try:
        with connections["pg"].execute_wrapper(before_a_writes):
            a_result = a_context.run(_attempt, write)
        b_done.wait(30)
    finally:
        b_context.run(b.release)
        with contextlib.suppress(distlock.DistlockError):
            a_context.run(a.release)
    assert b_result and b_result[-1] == "wrote", f"B's claim: {b_result}"
    after = _snapshot(cell)
    assert after.exists, "A's stale delete removed a row B had claimed"
    assert after.token == b_token, f"the row's token went back: {after.token} < B's {b_token} (A: {a_result})"
    if a_result == "wrote":
        assert b_waited[0], "A's write landed after B's claim had committed"
    else:
        assert a_result == "StaleFenceToken"


def _stack_of(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or 0)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(not running)"


def _until_done_or_waiting(done: threading.Event) -> bool:
    """Wait until ``done`` or a PostgreSQL session of the test database waits for a row lock: whether one waited."""
    deadline = time.monotonic() + 30
    while not done.wait(0.01):
        with connections["pg"].cursor() as probe:
            # A's connection, inside A's transaction, which caches pg_stat_activity at its first read
            # (stats_fetch_consistency): without a fresh snapshot, a wait that began after the first probe never shows.
            probe.execute("SELECT pg_stat_clear_snapshot()")
            probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if probe.fetchone()[0]:
                return True
        assert time.monotonic() < deadline, "the holder neither committed nor waited"
    return False


def test_a_plain_save_of_a_childs_own_fields_never_overwrites_a_claim(matrix_db: None) -> None:
    """No lock: A saves only a multi-table child's own fields (nothing of the parent's table, where ``fence_token``
    is). A holder that claims and writes the row just before A's UPDATE of the child's table either waits for A's
    transaction (A's check of its read locked the parent row) and writes after it, or A is refused: the holder's
    write stands. A database execute wrapper on A's connection runs the holder then, in a thread."""
    router.CURRENT[0] = "pg"
    try:
        cell = _make(MxSub)
        obj: Any = MxSub.objects.get(pk=cell.pk)
        done = threading.Event()
        waited: list[bool] = []

        def holder_writes() -> None:
            try:
                with get_client().lock(cell.name, ttl=10):
                    row = MxSub.objects.filter(pk=cell.pk).fenced().get()
                    row.extra = 7
                    row.save(update_fields=["extra"])
            finally:
                connections["pg"].close()
                done.set()

        child = MxSub._meta.db_table

        def before_the_child_table(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
            if sql.lstrip().upper().startswith("UPDATE") and child in sql and not waited:
                holder.start()  # a new thread: no lock of A's context
                waited.append(_until_done_or_waiting(done))
            return execute(sql, params, many, ctx)

        holder = threading.Thread(target=holder_writes)
        obj.extra = 5
        with connections["pg"].execute_wrapper(before_the_child_table):
            result = _attempt(lambda: obj.save(update_fields=["extra"]))
        # A's save has committed: nothing of A's stands in the holder's way. (Once, on a machine loaded by other
        # work, the holder had not finished 30 s later: the bound is generous, and the message says where it was.)
        assert done.wait(90), f"the holder did not finish: it was at\n{_stack_of(holder)}"
        extra = MxSub.objects.filter(pk=cell.pk).values_list("extra", flat=True).get()
        if result == "wrote":
            assert waited == [True], "A's write landed after the holder's had committed"
            assert extra == 7, "the holder's write, made after A's, is lost"
        else:
            assert result == "StaleFenceToken" and extra == 7
    finally:
        router.CURRENT[0] = "default"


def test_a_user_managers_queryset_keeps_its_methods_and_pickles(alias: str) -> None:
    """A manager declared on Django's own QuerySet gets FencedQuerySet in front of its queryset class: its own
    methods stay, and its querysets pickle (the class is importable under a name of its own)."""
    cell = _make(MxItem)
    rows = MxItem.mine.valued().filter(pk=cell.pk)
    assert isinstance(rows, FencedQuerySet) and isinstance(rows, MxQuerySet)
    again = pickle.loads(pickle.dumps(rows))
    assert type(again) is type(rows)
    assert [row.pk for row in again.valued()] == [cell.pk]


def test_the_matrix_is_generated_whole() -> None:
    """Every API is in the matrix, for every writer, on both models where Django supports it."""
    apis: list[Any] = [cell.values[0] for cell in CELLS]
    assert {api.name for api in apis} == {api.name for api in APIS}
    per_api = {api.name: sum(1 for used in apis if used is api) for api in APIS}
    for api in APIS:
        models_of = 2 if api.multi_table else 1
        states = (len(STATES) - (api.name == "reverse_add")) if api.instance else 1
        writers = len(WRITERS) if api.instance else len(WRITERS) - len(READ_BEFORE_A_CLAIM)
        assert per_api[api.name] == models_of * states * writers


def test_the_cover_meets_every_state_and_every_writer_of_each_api() -> None:
    """What the version environments run (the cells not marked ``write_matrix_rest``) still has, for each API and
    model, every state and every writer of the whole matrix."""

    def seen(cells: list[Any]) -> dict[tuple[str, str], tuple[set[str], set[str]]]:
        result: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
        for cell in cells:
            api, model, state, writer = cell.values
            states, writers = result.setdefault((api.name, model), (set(), set()))
            states.add(state)
            writers.add(writer)
        return result

    cover = [cell for cell in CELLS if not cell.marks]
    assert seen(cover) == seen(CELLS)
    assert len(cover) < len(CELLS) / 2


_ = models  # the models module is imported for its side effect: the matrix's tables exist
