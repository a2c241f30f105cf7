"""The fence on every SQLAlchemy write path: write API x object state x who writes x mode x database x sync/async.

Generated, not hand-picked. Sessions have SQLAlchemy's defaults (``expire_on_commit=True``): that is the baseline
users run. Each cell seeds a row of its own, then:

- **holder**: A holds the row's lock (a real etcd lock), reads the row, and writes: the write lands, with A's token.
- **stale**: A holds the lock and reads (claims) the row; A's lock is force-released; B, in another thread, takes
  the lock and claims the row with its newer token; then A writes. Refused: the documented error, the row as B
  left it, its token B's.
- **nolock**: C reads the row holding no lock; B takes the lock and claims the row; then C writes. In strict mode:
  ``UnfencedWrite``, nothing written. Otherwise the write is plain, but a plain write based on a read that a lock
  holder has since claimed is refused (``StaleFenceToken``); with no such read (the object was refreshed after the
  claim, or its token was never loaded) it lands and leaves the token alone.
- **read_before_lock**: A reads the row holding no lock; B takes the lock and claims the row; then A takes the lock
  (a newer token) and writes. Refused (``StaleFenceToken``): the row was claimed since A read it; where A's read is
  not known (refreshed after the claim, or its token deferred) the write is blind and lands with A's token.

Every cell also asserts that the row's token never went down. The async flavour runs the same steps through an
``AsyncSession`` on the async driver (aiosqlite, psycopg async): each step is ``await session.run_sync(step)``,
which is how ``AsyncSession`` itself runs the ORM. ``docs/integrations/sqlalchemy.md`` has the table of which write
APIs are fenced, claimed or plain that these cells check.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import pickle
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqla.conftest import Database, fresh_database
from sqla.models import Account, Car, Counter, Entry, Plain
from sqlalchemy import Engine, delete, event, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, defer, make_transient_to_detached, sessionmaker

import distlock
from distlock import LockNotOwned, UnfencedWrite
from distlock_sqla import STRICT, StaleFenceToken, claim, claim_one, fenced_delete, fenced_update

# -- the dimensions -----------------------------------------------------------------------------------------------

# Writes of an object the session holds: its state matters.
OBJECT_APIS = ("update", "delete", "delete_add")
# How the object came to be what it is when written.
STATES = (
    "fresh",  # read (claimed) and kept loaded
    "expired_by_commit",  # SQLAlchemy's default after commit
    "expired_by_hand",  # session.expire(obj)
    "token_expired",  # session.expire(obj, ["fence_token"])
    "expire_all",  # session.expire_all()
    "refreshed",  # session.refresh(obj) after the newer holder's claim
    "deferred",  # a fresh read with defer(fence_token)
    "detached",  # its session closed, the object added to another
    "detached_expired",  # expired by commit, then detached and re-added
    "pickled",  # pickled, unpickled and added to another session
    "savepoint_rolled_back",  # written in a SAVEPOINT that was rolled back
    "refused_then_retried",  # the write refused once, the session rolled back, the write tried again
)
# Writes that name rows, not objects: no object state.
FENCED_HELPERS = ("claim_one", "claim", "fenced_update", "fenced_delete")
PLAIN_STATEMENTS = ("orm_update", "orm_delete", "bulk_update_mappings", "bulk_save_objects", "bulk_insert_mappings")
ROW_APIS = ("merge", *FENCED_HELPERS, *PLAIN_STATEMENTS)
WRITERS = ("holder", "stale", "nolock")
# A holder whose object was read before it took its lock, while another holder claimed the row in between (sync: the
# async flavour's event loop sees only locks taken before it starts).
READ_BEFORE_LOCK = "read_before_lock"
MODES = ("on", "strict")
FLAVOURS = ("sync", "async")

# States whose read the session still knows when it writes (the token the object's data was read with).
_READ_UNKNOWN = {"refreshed", "deferred"}


@dataclass(frozen=True)
class Target:
    """A fenced model and the column the writes change."""

    model: Any
    column: str


TARGETS = {
    "counter": Target(Counter, "value"),
    # Joined-table inheritance: fence_token is in the base table, the column written in the child's.
    "car": Target(Car, "seats"),
}


@dataclass(frozen=True)
class Cell:
    api: str
    state: str
    writer: str
    mode: str
    flavour: str
    target: str = "counter"

    @property
    def id(self) -> str:
        return "-".join((self.target, self.api, self.state, self.writer, self.mode, self.flavour))


def _cells() -> Iterator[Cell]:
    for api, state, writer, mode, flavour in itertools.product(OBJECT_APIS, STATES, WRITERS, MODES, FLAVOURS):
        if state == "savepoint_rolled_back" and writer == "nolock":
            continue  # preparing it writes inside the savepoint, which needs the lock
        yield Cell(api, state, writer, mode, flavour)
        if flavour == "sync":
            yield Cell(api, state, writer, mode, flavour, "car")
    for api, state, mode, target in itertools.product(OBJECT_APIS, STATES, MODES, ("counter", "car")):
        if state != "savepoint_rolled_back":  # preparing it writes inside the savepoint, which needs the lock
            yield Cell(api, state, READ_BEFORE_LOCK, mode, "sync", target)
    for api, writer, mode, flavour in itertools.product(ROW_APIS, WRITERS, MODES, FLAVOURS):
        yield Cell(api, "-", writer, mode, flavour)
        if api in ("merge", "claim_one", "claim") and flavour == "sync":
            yield Cell(api, "-", writer, mode, flavour, "car")


CELLS = list(_cells())

REFUSED_STALE = "StaleFenceToken"
REFUSED_UNFENCED = "UnfencedWrite"
LANDED = "landed as the holder's"
PLAIN = "plain"


def expected(cell: Cell) -> str:
    """What the docs promise for a cell (docs/integrations/sqlalchemy.md, "Which writes the fence covers")."""
    if cell.api in PLAIN_STATEMENTS:
        return REFUSED_UNFENCED if cell.mode == "strict" else PLAIN
    if cell.api in FENCED_HELPERS:
        return REFUSED_UNFENCED if cell.writer == "nolock" else REFUSED_STALE if cell.writer == "stale" else LANDED
    # ORM flushes of objects (and merge, which loads the row and flushes).
    if cell.writer == READ_BEFORE_LOCK:  # the row was claimed since the read: refused, unless the read is unknown
        return LANDED if cell.state in _READ_UNKNOWN else REFUSED_STALE
    if cell.writer == "holder":
        return LANDED
    if cell.writer == "stale":
        return REFUSED_STALE
    if cell.mode == "strict":
        return REFUSED_UNFENCED
    if cell.api == "merge" or cell.state in _READ_UNKNOWN:
        return PLAIN
    return REFUSED_STALE


# -- the databases --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def mdb(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """One database for the module's cells (each cell uses rows of its own)."""
    yield from fresh_database(request, tmp_path_factory)


@pytest.fixture(scope="module")
def mengine(mdb: Database) -> Iterator[Engine]:
    engine = mdb.engine()
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def lock_client(etcd_url: str) -> Iterator[distlock.Client]:
    with distlock.connect(etcd_url) as client:
        yield client


# -- sessions, sync or async ------------------------------------------------------------------------------------


class Side:
    """Opens sessions with SQLAlchemy's defaults (strict when asked) and runs steps on them, sync or async."""

    def __init__(self, db: Database, engine: Engine, flavour: str, strict: bool) -> None:
        self.info = {STRICT: True} if strict else {}
        self.flavour = flavour
        self._sync = sessionmaker(engine, info=self.info)
        self._runner: asyncio.Runner | None = None
        self._async_engine: Any = None
        self._db = db

    def __enter__(self) -> Side:
        if self.flavour == "async":
            # The runner copies this context when it starts: the lock held here is the one its tasks see.
            self._runner = asyncio.Runner()
            self._async_engine = self._runner.run(self._make_async_engine())
        return self

    async def _make_async_engine(self) -> Any:
        return self._db.async_engine()

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            self._runner.run(self._async_engine.dispose())
            self._runner.close()

    def open(self) -> Handle:
        if self._runner is None:
            return Handle(self._sync(), None)
        runner = self._runner

        async def make() -> AsyncSession:
            return AsyncSession(self._async_engine, info=dict(self.info))

        return Handle(runner.run(make()), runner)


class Handle:
    def __init__(self, session: Session | AsyncSession, runner: asyncio.Runner | None) -> None:
        self.session = session
        self.runner = runner

    def do(self, step: Callable[[Session], Any]) -> Any:
        if self.runner is None:
            assert isinstance(self.session, Session)
            return step(self.session)
        assert isinstance(self.session, AsyncSession)
        return self.runner.run(self.session.run_sync(step))

    def close(self) -> None:
        if self.runner is None:
            assert isinstance(self.session, Session)
            self.session.close()
        else:
            assert isinstance(self.session, AsyncSession)
            self.runner.run(self.session.close())


# -- one cell -------------------------------------------------------------------------------------------------------


def row(engine: Engine, row_id: int, target: Target = TARGETS["counter"]) -> tuple[int, int] | None:
    model = target.model
    with engine.connect() as conn:
        query = select(getattr(model, target.column), model.fence_token).where(model.id == row_id)
        found = conn.execute(query).one_or_none()
        return None if found is None else (found[0], found[1])


def newer_holder_claims(client: distlock.Client, engine: Engine, name: str, row_id: int, target: Target) -> int:
    """B, in a thread of its own (no lock of this thread's context), takes the lock and claims the row: its token."""
    result: list[int] = []
    failure: list[BaseException] = []

    def b() -> None:
        try:
            with client.lock(name, ttl=30, timeout=10) as lock, Session(engine) as session:
                found = claim_one(session, target.model, row_id)
                setattr(found, target.column, 20)
                session.commit()
                result.append(lock.token)
        except BaseException as exc:  # handed to the test thread
            failure.append(exc)

    thread = threading.Thread(target=b)
    thread.start()
    thread.join(30)
    if failure:
        raise failure[0]
    return result[0]


def keep_loaded(session: Session) -> None:
    """Commit without expiring (the object stays as read)."""
    session.expire_on_commit = False
    session.commit()
    session.expire_on_commit = True


def prepare(cell: Cell, side: Side, row_id: int, held: bool) -> tuple[Handle, Any]:
    """The session and object A (or C) will write, in the cell's state; every transaction is ended."""
    handle = side.open()
    model = TARGETS[cell.target].model

    def read(session: Session) -> Any:
        found = claim_one(session, model, row_id) if held else session.get(model, row_id)
        if cell.state in {"expired_by_commit", "detached_expired"}:
            session.commit()
        else:
            keep_loaded(session)
        return found

    if cell.state == "deferred":
        if held:

            def claim_first(session: Session) -> None:
                claim_one(session, model, row_id)
                session.commit()

            handle.do(claim_first)

        def read_deferred(session: Session) -> Any:
            found = session.scalars(select(model).where(model.id == row_id).options(defer(model.fence_token)))
            obj = found.one()
            keep_loaded(session)
            return obj

        return handle, handle.do(read_deferred)
    obj = handle.do(read)
    if cell.state == "expired_by_hand":
        handle.do(lambda s: s.expire(obj))
    elif cell.state == "token_expired":
        handle.do(lambda s: s.expire(obj, ["fence_token"]))
    elif cell.state == "expire_all":
        handle.do(lambda s: s.expire_all())
    elif cell.state == "savepoint_rolled_back":

        def in_savepoint(session: Session) -> None:
            nested = session.begin_nested()
            obj.value = 5
            session.flush()
            nested.rollback()
            keep_loaded(session)

        handle.do(in_savepoint)
    elif cell.state in ("detached", "detached_expired", "pickled"):
        handle.close()
        if cell.state == "pickled":
            obj = pickle.loads(pickle.dumps(obj))
        handle = side.open()
        handle.do(lambda s: s.add(obj))
    return handle, obj


def current(session: Session, row_id: int) -> int:
    return int(session.scalars(select(Counter.fence_token).where(Counter.id == row_id)).one())


def write(cell: Cell, handle: Handle, obj: Any, row_id: int) -> None:
    """The write under test, committed."""
    model, column = TARGETS[cell.target].model, TARGETS[cell.target].column

    def step(session: Session) -> None:
        api = cell.api
        if api == "update":
            setattr(obj, column, 999)
        elif api == "delete":
            session.delete(obj)
        elif api == "delete_add":
            session.delete(obj)
            session.add(model(id=row_id, **{column: 999}))
        elif api == "merge":
            session.merge(model(id=row_id, **{column: 999}))
        elif api == "claim_one":
            claim_one(session, model, row_id)
        elif api == "claim":
            claim(session, select(model).where(model.id == row_id)).all()
        elif api == "fenced_update":
            fenced_update(session, model, {column: 999}, model.id == row_id)
        elif api == "fenced_delete":
            fenced_delete(session, model, model.id == row_id)
        elif api == "orm_update":
            session.execute(update(model).where(model.id == row_id).values({column: 999}))
        elif api == "orm_delete":
            session.execute(delete(model).where(model.id == row_id))
        elif api == "bulk_update_mappings":
            # SQLAlchemy's versioning: a bulk update of a versioned model names each row's version (token).
            mapping = {"id": row_id, "value": 999, "fence_token": current(session, row_id)}
            session.bulk_update_mappings(Counter, [mapping])
        elif api == "bulk_save_objects":
            detached = Counter(id=row_id, fence_token=current(session, row_id))
            make_transient_to_detached(detached)
            detached.value = 999
            session.bulk_save_objects([detached])
        elif api == "bulk_insert_mappings":
            session.bulk_insert_mappings(Counter, [{"id": -row_id, "value": 999}])
        else:
            raise AssertionError(api)
        session.commit()

    if cell.state == "refused_then_retried":
        with contextlib.suppress(StaleFenceToken, UnfencedWrite, LockNotOwned):
            handle.do(step)
            return
        handle.do(lambda s: s.rollback())
    handle.do(step)


def run_cell(cell: Cell, db: Database, engine: Engine, client: distlock.Client) -> None:
    target = TARGETS[cell.target]
    row_id = secrets.randbelow(2**31 - 2) + 1
    name = target.model.__fence_spec__.lock_name({"id": row_id})
    with Session(engine) as seeding:
        seeding.add(target.model(id=row_id, **{target.column: 10}))  # no lock held: stored with token 0
        seeding.commit()
    lock = None if cell.writer in ("nolock", READ_BEFORE_LOCK) else client.lock(name, ttl=30, timeout=10)
    if lock is not None:
        lock.acquire()  # before the async flavour's event loop starts: its tasks see the lock held here
    with Side(db, engine, cell.flavour, strict=cell.mode == "strict") as side:
        try:
            handle, obj = (side.open(), None) if cell.state == "-" else prepare(cell, side, row_id, lock is not None)
            token = None if lock is None else lock.token
            if cell.writer != "holder":
                if lock is not None:
                    assert client.force_release(name, lock.token)
                newer = newer_holder_claims(client, engine, name, row_id, target)
                assert token is None or newer > token
            if cell.writer == READ_BEFORE_LOCK:
                lock = client.lock(name, ttl=30, timeout=10)
                assert lock.acquire()
                token = lock.token
                assert token > newer
            if cell.state == "refreshed":

                def refresh(session: Session) -> None:
                    session.refresh(obj)
                    keep_loaded(session)

                handle.do(refresh)
            before = row(engine, row_id, target)
            assert before is not None
            outcome = LANDED
            try:
                write(cell, handle, obj, row_id)
            except (StaleFenceToken, UnfencedWrite, LockNotOwned) as exc:
                outcome = type(exc).__name__
            finally:
                with contextlib.suppress(Exception):
                    handle.close()
            after = row(engine, row_id, target)
        finally:
            if lock is not None:
                with contextlib.suppress(distlock.DistlockError):
                    lock.release()
    want = expected(cell)
    deletes = cell.api in ("delete", "fenced_delete", "orm_delete")
    if want in (REFUSED_STALE, REFUSED_UNFENCED):
        assert outcome == want, f"{cell.id}: expected {want}, the write {outcome}; row {before} -> {after}"
        assert after == before, f"{cell.id}: refused, yet the row changed {before} -> {after}"
        if cell.api == "bulk_insert_mappings":
            assert row(engine, -row_id) is None
        return
    assert outcome == LANDED, f"{cell.id}: expected it to land ({want}), it raised {outcome}; row {before} -> {after}"
    if cell.api == "bulk_insert_mappings":
        assert row(engine, -row_id) == (999, 0)
        assert after == before
        return
    if deletes:
        assert after is None, f"{cell.id}: the delete landed, yet the row is there: {after}"
        return
    assert after is not None, f"{cell.id}: the row is gone {before} -> {after}"
    assert after[1] >= before[1], f"{cell.id}: the token went backwards {before} -> {after}"
    if want == LANDED:
        assert after[1] == token, f"{cell.id}: landed with token {after[1]}, not the holder's {token}"
        if cell.api not in ("claim_one", "claim"):
            assert after[0] == 999, f"{cell.id}: {before} -> {after}"
    else:  # plain: the write landed, the token left alone
        assert after == (999, before[1]), f"{cell.id}: a plain write {before} -> {after}"


@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_write_path(cell: Cell, mdb: Database, mengine: Engine, lock_client: distlock.Client) -> None:
    run_cell(cell, mdb, mengine, lock_client)


# -- moves: a row whose lock name changes needs both locks --------------------------------------------------------


MOVE_HOLDS = ("source", "destination", "both", "both_destination_first")
MOVE_APIS = ("flush", "flush_expired", "fenced_update")


@pytest.mark.parametrize("api", MOVE_APIS)
@pytest.mark.parametrize("holds", MOVE_HOLDS)
def test_a_lock_name_change_needs_the_source_and_the_destination_lock(
    api: str, holds: str, mdb: Database, mengine: Engine, lock_client: distlock.Client
) -> None:
    source, destination = f"t-{secrets.token_hex(6)}", f"t-{secrets.token_hex(6)}"
    row_id = secrets.randbelow(2**31 - 2) + 1
    with mengine.begin() as conn:
        conn.execute(insert(Account).values(id=row_id, tenant=source, balance=1, fence_token=0))
    names = {"source": [f"tenant:{source}"], "destination": [f"tenant:{destination}"]}
    names["both"] = names["source"] + names["destination"]
    names["both_destination_first"] = names["destination"] + names["source"]
    with contextlib.ExitStack() as stack:
        locks = [stack.enter_context(lock_client.lock(n, ttl=30)) for n in names[holds]]
        with sessionmaker(mengine)() as session:
            try:
                if api == "fenced_update":
                    fenced_update(session, Account, {"tenant": destination}, Account.id == row_id)
                else:
                    obj = session.get(Account, row_id)
                    assert obj is not None
                    if api == "flush_expired":
                        session.commit()  # expired: the old tenant is not in the object any more
                    obj.tenant = destination
                session.commit()
                outcome = "landed"
            except LockNotOwned:
                outcome = "LockNotOwned"
        with mengine.connect() as conn:
            after = conn.execute(select(Account.tenant, Account.fence_token).where(Account.id == row_id)).one()
        if holds.startswith("both"):
            assert outcome == "landed"  # stored with the larger token: the lock taken last
            assert tuple(after) == (destination, max(lock.token for lock in locks))
        else:
            assert outcome == "LockNotOwned", f"moved holding only the {holds} lock"
            assert tuple(after) == (source, 0)


def test_a_claim_with_offset_and_limit_returns_the_rows_it_claimed(
    mdb: Database, mengine: Engine, lock_client: distlock.Client
) -> None:
    tenant = f"t-{secrets.token_hex(6)}"
    base = secrets.randbelow(2**30) + 10
    with mengine.begin() as conn:
        conn.execute(insert(Account), [{"id": base + i, "tenant": tenant, "balance": i} for i in range(4)])
    with lock_client.lock(f"tenant:{tenant}", ttl=30) as lock, sessionmaker(mengine)() as session:
        statement = select(Account).where(Account.tenant == tenant).order_by(Account.id).offset(1).limit(2)
        found = claim(session, statement).scalars().all()
        assert [a.id for a in found] == [base + 1, base + 2]
        session.commit()
        token = lock.token
    with mengine.connect() as conn:
        tokens = dict(conn.execute(select(Account.id, Account.fence_token).where(Account.tenant == tenant)).all())
    assert tokens == {base: 0, base + 1: token, base + 2: token, base + 3: 0}


@pytest.mark.parametrize("expired", [False, True], ids=["loaded", "expired"])
@pytest.mark.parametrize("holds", MOVE_HOLDS)
def test_moving_a_child_to_another_parent_needs_both_parents_locks(
    holds: str, expired: bool, mdb: Database, mengine: Engine, lock_client: distlock.Client
) -> None:
    source, destination, entry_id = (secrets.randbelow(2**31 - 2) + 1 for _ in range(3))
    with Session(mengine) as seeding:
        seeding.add_all([Account(id=source, tenant="a", balance=0), Account(id=destination, tenant="b", balance=0)])
        seeding.flush()
        seeding.add(Entry(id=entry_id, account_id=source, amount=5))
        seeding.commit()
    names = {"source": [f"entries:{source}"], "destination": [f"entries:{destination}"]}
    names["both"] = names["source"] + names["destination"]
    names["both_destination_first"] = names["destination"] + names["source"]
    with contextlib.ExitStack() as stack:
        locks = [stack.enter_context(lock_client.lock(n, ttl=30)) for n in names[holds]]
        with Session(mengine) as session:
            entry = session.get(Entry, entry_id)
            parent = session.get(Account, destination)
            assert entry is not None and parent is not None
            if expired:
                session.commit()  # expired: the old parent's id is not in the object any more
            try:
                entry.account = parent  # the flush sets account_id from the relationship
                session.commit()
                outcome = "landed"
            except LockNotOwned:
                outcome = "LockNotOwned"
        tokens = [lock.token for lock in locks]
    with mengine.connect() as conn:
        after = tuple(conn.execute(select(Entry.account_id, Entry.fence_token).where(Entry.id == entry_id)).one())
    if holds.startswith("both"):
        assert (outcome, after) == ("landed", (destination, max(tokens)))
    else:
        assert (outcome, after) == ("LockNotOwned", (source, 0)), f"moved holding only the {holds} lock"


@pytest.mark.parametrize("expire", [False, True], ids=["kept", "expired_by_commit"])
def test_an_accepted_write_costs_no_extra_statement(
    expire: bool, mdb: Database, mengine: Engine, lock_client: distlock.Client
) -> None:
    """Read, then write: the fenced flush sends what a plain model's flush sends, statement for statement, the read
    being the claim (one UPDATE ... RETURNING); also when a commit in between expired the object (its token is not
    loaded again: the one it was claimed with is kept beside it; what SQLAlchemy itself loads, both load)."""
    row_id = secrets.randbelow(2**31 - 2) + 1
    with Session(mengine) as seeding:
        seeding.add_all([Counter(id=row_id, value=1), Plain(id=row_id, value=1)])
        seeding.commit()

    def statements(read: Callable[[Session], Any]) -> list[str]:
        sent: list[str] = []

        def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if not statement.lstrip().upper().startswith(("BEGIN", "SAVEPOINT", "RELEASE", "COMMIT", "PRAGMA")):
                sent.append(statement.split(maxsplit=1)[0].upper())

        with Session(mengine) as session:
            event.listen(mengine, "before_cursor_execute", count)
            try:
                found = read(session)
                if expire:
                    session.commit()
                found.value = 7
                session.commit()
            finally:
                event.remove(mengine, "before_cursor_execute", count)
        return sent

    plain = statements(lambda session: session.get(Plain, row_id))
    with lock_client.lock(f"counter:{row_id}", ttl=30) as lock:
        fenced = statements(lambda session: claim_one(session, Counter, row_id))
        token = lock.token
    assert row(mengine, row_id) == (7, token)
    assert plain[0] == "SELECT" and fenced[0] == "UPDATE"
    assert fenced[1:] == plain[1:], (fenced, plain)
