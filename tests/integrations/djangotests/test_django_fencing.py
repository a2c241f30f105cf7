"""FencedModel against real etcd and real databases: the lost-update race, bulk updates, strictness, bad input."""

from __future__ import annotations

import contextlib
import copy
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from _support import Worker
from django.core.management import call_command
from django.db import connections, transaction
from djangotests.testapp.models import Account, Plain
from pytest_django.fixtures import Settings

import distlock
from distlock_django import conf, fence_of, get_client, lock_name

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])


class DjangoWorker(Worker):
    """``fenceworker.py`` in its own process, on the test's database."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "fenceworker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.read(timeout=60) == {"ready": True}


@pytest.fixture
def worker(django_child_env: dict[str, str]) -> Iterator[DjangoWorker]:
    w = DjangoWorker(django_child_env)
    yield w
    w.close()


def _write(account: Account, guard: str) -> None:
    """Add 1 to what was read: ``save()``, or (``"write-only"``) ``fenced_update()``, whose guard is the lock's token
    alone (``fence_token <= :t``): what a fence without claim-on-read or read tokens would do."""
    if guard == "write-only":
        Account.objects.filter(pk=account.pk).fenced_update(balance=account.balance + 1)
    else:
        account.balance += 1
        account.save()


def _race(worker: DjangoWorker, guard: str = "claim") -> tuple[dict[str, object], int, int, bool]:
    """A reads (``guard`` "claim": with ``.fenced()``; else a plain read), stalls past its lease; B reads the same
    way; A, then B writes.

    Returns A's write answer, B's token, the final balance (it started at 100; both add 1 to what they read), and
    whether B's write landed.
    """
    account = Account.objects.create(balance=100)
    claim = guard == "claim"
    a = worker.call(op="lock_and_read", pk=account.pk, ttl=2, claim=claim)
    assert a["balance"] == 100
    worker.stop()
    try:
        with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10, timeout=20) as lock:
            assert lock.token > a["token"]
            rows = Account.objects.filter(pk=account.pk)
            b = (rows.fenced() if claim else rows).get()
            worker.cont()
            a_write = worker.call(op="write", guard=guard)  # the stalled holder wakes up and writes
            try:
                _write(b, guard)
                b_landed = True
            except distlock.StaleFenceToken:
                b_landed = False
            token = lock.token
    finally:
        worker.cont()
    return a_write, token, Account.objects.get(pk=account.pk).balance, b_landed


def test_claim_on_read_refuses_the_stalled_holder(worker: DjangoWorker) -> None:
    _refused(*_race(worker))


@pytest.fixture(params=["redis", "zookeeper", "own-database"])
def other_lock_service(
    request: pytest.FixtureRequest, django_child_env: dict[str, str], db_alias: str
) -> Iterator[dict[str, str]]:
    """``DISTLOCK["URL"]`` on another lock service than etcd, here and in the worker's environment; "own-database"
    is ``django://<alias>``: the SQL lock table in the test's own database, beside the fenced rows."""
    from django.test import override_settings
    from djangotests.testsettings import DISTLOCK

    import distlock_django

    if request.param == "own-database":
        url = f"django://{db_alias}"
    else:
        url = str(request.getfixturevalue(f"{request.param}_url"))
    distlock_django.reset_client()
    try:
        with override_settings(DISTLOCK={**DISTLOCK, "URL": url}):
            yield {**django_child_env, "DISTLOCK_DJANGO_ETCD_URL": url}
    finally:
        distlock_django.reset_client()


def test_claim_on_read_refuses_the_stalled_holder_on_every_lock_service(other_lock_service: dict[str, str]) -> None:
    """The race above on Redis, ZooKeeper and the lock table in the database itself: the fence is the database's,
    whatever hands out the tokens."""
    worker = DjangoWorker(other_lock_service)
    try:
        assert not get_client().description.startswith("etcd")
        if other_lock_service["DISTLOCK_DJANGO_ETCD_URL"].startswith("django://"):
            assert get_client().description.startswith("SQL lock table"), get_client().description
        _refused(*_race(worker))
    finally:
        worker.close()


def _refused(a_write: dict[str, object], token: int, balance: int, b_landed: bool) -> None:
    assert a_write["error"] == "StaleFenceToken", a_write
    assert b_landed
    assert balance == 101  # B's increment stands, A's was refused: nothing lost, nothing doubled
    assert Account.objects.get().fence_token == token


def test_a_write_only_guard_loses_the_update(worker: DjangoWorker) -> None:
    """The race with a guard of the lock's token alone: both writes pass and one increment vanishes (the bug the
    claim and the read token are for; this is the control that shows the race test catches it)."""
    a_write, _, balance, b_landed = _race(worker, "write-only")
    assert a_write == {"ok": True} and b_landed  # both increments were accepted...
    assert balance == 101  # ...and one of them is lost


def test_a_save_without_the_claim_loses_nothing_but_the_stalled_holder_wins(worker: DjangoWorker) -> None:
    """``save()`` of rows read without ``.fenced()``: no update is lost (a save checks the token its instance was
    read with, and A's write came between B's read and B's save), but the holder refused is B, the current one:
    claiming on read is what makes the stale holder lose."""
    a_write, _, balance, b_landed = _race(worker, "save")
    assert a_write == {"ok": True}
    assert not b_landed
    assert balance == 101


def test_fenced_save_create_and_delete_carry_the_token(db_alias: str) -> None:
    account = Account.objects.create(balance=1)
    assert account.fence_token == 0  # created outside any lock: unfenced
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10) as lock:
        account.balance = 2
        account.save()
        assert Account.objects.get(pk=account.pk).fence_token == lock.token
        first = lock.token
        created = Account.objects.create(pk=account.pk + 1000, balance=5)
        assert created.fence_token == 0  # another row: its own lock is not held, and no lock of its name is
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10) as newer:
        account.delete()
        assert newer.token > first
    assert not Account.objects.filter(pk=account.pk).exists()


class _Undo(Exception):
    pass


def _a_holder_writes(pk: int) -> None:
    """A lock holder takes the row's lock, claims the row and writes it (a note of its own)."""
    with get_client().lock(lock_name(f"account:{pk}"), ttl=10):
        holder = Account.objects.filter(pk=pk).fenced().get()
        holder.note = "the holder's"
        holder.save()


def _rolled_back(using: str, step: Callable[[], object]) -> object:
    """Run ``step`` in ``transaction.atomic()``, then roll that transaction back; ``step``'s result."""
    result: list[object] = []
    with contextlib.suppress(_Undo), transaction.atomic(using=using):
        result.append(step())
        raise _Undo
    return result[0]


@pytest.mark.parametrize("locked", [True, False], ids=["in-the-lock", "no-lock"])
def test_a_save_rolled_back_with_its_transaction_can_be_made_again(db_alias: str, locked: bool) -> None:
    """A save notes its token as the instance's read; rolled back, the row keeps the earlier token, which the instance
    still accepts (tokens never go down: nobody else wrote the row), so the retry lands. A write by anyone else in
    between is still refused."""
    account = Account.objects.create(balance=1)
    name = lock_name(f"account:{account.pk}")
    read = Account.objects.get(pk=account.pk)
    with contextlib.ExitStack() as stack:
        lock = stack.enter_context(get_client().lock(name, ttl=10)) if locked else None
        read.balance = 2
        _rolled_back(db_alias, read.save)
        assert Account.objects.get(pk=account.pk).balance == 1
        read.save()  # the retry
        assert Account.objects.get(pk=account.pk).balance == 2
        assert Account.objects.get(pk=account.pk).fence_token == (lock.token if lock else 0)
    with get_client().lock(name, ttl=10):  # a lock holder writes the row meanwhile
        Account.objects.filter(pk=account.pk).fenced().get().save()
    read.balance = 3
    with pytest.raises(distlock.StaleFenceToken):
        read.save()
    assert Account.objects.get(pk=account.pk).balance == 2


def test_a_claim_rolled_back_with_its_transaction_leaves_the_save_in_the_lock_free(db_alias: str) -> None:
    """Claimed with ``.fenced()`` in a transaction that rolls back: the row carries its earlier token again, which
    the instance never read; inside its lock the holder's save then lands (as a blind write would)."""
    account = Account.objects.create(balance=1)
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10) as lock:

        def claim_and_save() -> Account:
            claimed: Account = Account.objects.filter(pk=account.pk).fenced().get()
            claimed.balance = 2
            claimed.save()
            return claimed

        claimed = cast(Account, _rolled_back(db_alias, claim_and_save))
        assert Account.objects.get(pk=account.pk).fence_token == 0
        claimed.save()
        assert Account.objects.values_list("balance", "fence_token").get(pk=account.pk) == (2, lock.token)


@pytest.mark.parametrize("nested", [False, True], ids=["one-save", "nested-savepoints"])
def test_a_rolled_back_save_does_not_make_its_token_acceptable(db_alias: str, nested: bool) -> None:
    """An instance read outside the lock saves inside it, in a transaction that rolls back (one save; or a save, a
    save in a savepoint rolled back, a third save). Its read is again the one it had before: after a newer holder
    claims and writes the row, its save is refused (its own writes never happened)."""
    account = Account.objects.create(balance=1, note="original")
    early = Account.objects.get(pk=account.pk)

    def saves() -> None:
        early.balance = 2
        early.save()
        _rolled_back(db_alias, early.save)
        early.balance = 3
        early.save()

    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10):
        early.balance = 5
        _rolled_back(db_alias, saves if nested else early.save)
    _a_holder_writes(account.pk)
    early.balance = 6
    with pytest.raises(distlock.StaleFenceToken):
        early.save()
    assert Account.objects.values_list("balance", "note").get(pk=account.pk) == (1, "the holder's")


def test_a_claim_then_a_rolled_back_savepoint_then_all_rolled_back_lands_in_the_lock(db_alias: str) -> None:
    """A claim in an outer transaction, a save in a savepoint rolled back, a save; all rolled back: the row carries
    its earlier token again, unknown to the instance (a claim), so the holder's save lands."""
    account = Account.objects.create(balance=1)
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10) as lock:

        def claim_and_saves() -> Account:
            claimed: Account = Account.objects.filter(pk=account.pk).fenced().get()
            claimed.balance = 2
            _rolled_back(db_alias, claimed.save)
            claimed.save()
            return claimed

        claimed = cast(Account, _rolled_back(db_alias, claim_and_saves))
        claimed.save()
        assert Account.objects.values_list("balance", "fence_token").get(pk=account.pk) == (2, lock.token)


@pytest.mark.parametrize("raises", [False, True], ids=["saves", "raises"])
def test_the_applications_on_commit_callbacks_see_the_save_committed(db_alias: str, raises: bool) -> None:
    """A callback registered before the claim and save runs before distlock's would if it were last: it saves the
    instance again (landing), or raises (Django then runs no callback after it); either way the claim and save
    committed and are the instance's read: after a holder writes the row, its save outside the lock is refused."""
    account = Account.objects.create(balance=1, note="original")
    claimed: list[Account] = []

    def callback() -> None:
        if raises:
            raise RuntimeError("the mail server is down")
        claimed[0].note = "after commit"
        claimed[0].save()

    with contextlib.suppress(RuntimeError), transaction.atomic(using=db_alias):
        transaction.on_commit(callback, using=db_alias)
        with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10):
            claimed.append(Account.objects.filter(pk=account.pk).fenced().get())
            claimed[0].balance = 2
            claimed[0].save()
    instance = claimed[0]
    assert Account.objects.values_list("balance", "note").get(pk=account.pk) == (
        2,
        "original" if raises else "after commit",
    )
    _a_holder_writes(account.pk)
    with pytest.raises(distlock.StaleFenceToken):
        instance.save()


def test_a_deep_copy_follows_the_transaction_of_its_original(db_alias: str) -> None:
    """``copy.deepcopy`` of an instance whose save is not committed yet: rolled back, the copy's read is again the
    earlier one, as its original's, and its retry lands."""
    account = Account.objects.create(balance=1)
    early = Account.objects.get(pk=account.pk)
    copies: list[Account] = []

    def save_and_copy() -> None:
        early.save()
        copies.append(copy.deepcopy(early))

    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10):
        _rolled_back(db_alias, save_and_copy)
        copies[0].balance = 5
        copies[0].save()
    assert Account.objects.get(pk=account.pk).balance == 5


@pytest.mark.parametrize("how", [{}, {"update_fields": ["balance"]}, {"force_update": True}], ids=str)
def test_a_plain_save_of_a_row_a_holder_deleted_is_refused(db_alias: str, how: dict[str, Any]) -> None:
    """No lock: the row the instance was read from has been deleted by a lock holder. The save is refused
    (``StaleFenceToken``), not an insert of the data read before the deletion, nor Django's own DatabaseError."""
    account = Account.objects.create(balance=1)
    early = Account.objects.get(pk=account.pk)
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10):
        Account.objects.filter(pk=account.pk).fenced().get().delete()
    with pytest.raises(distlock.StaleFenceToken):
        early.save(**how)
    assert not Account.objects.filter(pk=account.pk).exists()


def test_a_copy_to_another_database_is_a_blind_write_there(django_servers: dict[str, str]) -> None:
    """Django's way of copying a row to another database, ``save(using=...)``: the token read from the first does
    not apply to the second's row, which the copy inserts (or overwrites, as a blind write)."""
    account = Account.objects.using("default").create(balance=1)
    Account.objects.using("pg").create(pk=account.pk, balance=7)
    read = Account.objects.using("default").get(pk=account.pk)
    read.save(using="pg")
    assert Account.objects.using("pg").get(pk=account.pk).balance == 1
    read.balance = 2
    read.save(using="pg")  # its read on "pg" is unknown after a plain copy: blind again
    assert Account.objects.using("pg").get(pk=account.pk).balance == 2


def test_bulk_created_objects_know_their_read(db_alias: str) -> None:
    """Objects from ``bulk_create()`` were read as inserted: a plain save after a holder wrote the row is refused."""
    (created,) = Account.objects.bulk_create([Account(balance=1, note="original")])
    _a_holder_writes(created.pk)
    created.balance = 2
    with pytest.raises(distlock.StaleFenceToken):
        created.save()


def test_a_read_in_a_transaction_that_failed_is_kept(db_alias: str) -> None:
    """Read, inside the lock, in a transaction that then fails (it only read): the data a holder had committed, with
    this lock's token. The read stands: after a newer holder writes the row, the save outside any lock is refused."""
    account = Account.objects.create(balance=1)
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10):
        written = Account.objects.filter(pk=account.pk).fenced().get()
        written.note = "the first holder's"
        written.save()
        read = cast(Account, _rolled_back(db_alias, lambda: Account.objects.get(pk=account.pk)))
    _a_holder_writes(account.pk)
    read.note = "stale"
    with pytest.raises(distlock.StaleFenceToken):
        read.save()
    assert Account.objects.get(pk=account.pk).note == "the holder's"


def test_a_rolled_back_claim_writes_blind_in_its_lock_only(db_alias: str) -> None:
    """A claim rolled back: what the row carries was never read. Outside the lock (and in a later one) the save is
    refused; inside the same lock it lands."""
    account = Account.objects.create(balance=1)
    name = lock_name(f"account:{account.pk}")
    with get_client().lock(name, ttl=10) as lock:
        claimed = cast(Account, _rolled_back(db_alias, lambda: Account.objects.filter(pk=account.pk).fenced().get()))
    claimed.balance = 2
    with pytest.raises(distlock.StaleFenceToken):
        claimed.save()
    with get_client().lock(name, ttl=10), pytest.raises(distlock.StaleFenceToken):
        claimed.save()
    with get_client().lock(name, ttl=10) as lock:
        claimed = cast(Account, _rolled_back(db_alias, lambda: Account.objects.filter(pk=account.pk).fenced().get()))
        claimed.save()
        assert Account.objects.values_list("balance", "fence_token").get(pk=account.pk) == (1, lock.token)


def test_fenced_writes_add_no_on_commit_callback(db_alias: str, django_capture_on_commit_callbacks: Any) -> None:
    """Django's documented test of on-commit callbacks counts exactly the application's: fenced creates, claims and
    saves in a transaction add none of distlock's."""
    with transaction.atomic(using=db_alias), django_capture_on_commit_callbacks(using=db_alias) as callbacks:
        account = Account.objects.create(balance=1)
        with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10):
            claimed = Account.objects.filter(pk=account.pk).fenced().get()
            claimed.balance = 2
            claimed.save()
        transaction.on_commit(lambda: None, using=db_alias)
    assert len(callbacks) == 1


def test_a_refresh_of_some_fields_keeps_the_earlier_read(db_alias: str) -> None:
    """``refresh_from_db(from_queryset=....only(...))`` copies the loaded fields only: the others were read with the
    earlier token, so a save after a holder wrote the row is refused."""
    account = Account.objects.create(balance=1, note="original")
    early = Account.objects.get(pk=account.pk)
    _a_holder_writes(account.pk)
    early.refresh_from_db(from_queryset=Account.objects.only("balance"))
    early.balance += 1
    with pytest.raises(distlock.StaleFenceToken):
        early.save()
    early.refresh_from_db(from_queryset=Account.objects.all())  # all of it: the row's token is its read now
    early.save()
    assert Account.objects.values_list("balance", "note").get(pk=account.pk) == (1, "the holder's")


def test_a_manager_on_djangos_own_queryset_is_fenced_on_a_model_loaded_at_start_up(
    db_alias: str, settings: Settings
) -> None:
    """``Entry.plain = models.Manager()`` (a model of an app Django loads when it starts): its queryset is fenced, so
    strict mode refuses its plain writes, and ``only()`` still loads ``fence_token``."""
    from djangotests.testapp.models import Entry

    from distlock_django import FencedQuerySet

    entry = Entry.objects.create(book=1, amount=1)
    assert isinstance(Entry.plain.all(), FencedQuerySet)
    assert "fence_token" not in Entry.plain.only("amount").get(pk=entry.pk).get_deferred_fields()
    settings.DISTLOCK = {**settings.DISTLOCK, "FENCING": "strict"}
    with pytest.raises(distlock.UnfencedWrite):
        Entry.plain.filter(pk=entry.pk).update(amount=5)
    assert Entry.objects.get(pk=entry.pk).amount == 1


def test_a_stale_save_is_refused_and_writes_nothing(db_alias: str) -> None:
    account = Account.objects.create(balance=1)
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10) as old:
        stale = Account.objects.filter(pk=account.pk).fenced().get()
        old_fence = old.fence
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10):
        Account.objects.filter(pk=account.pk).fenced().get()
    stale.balance = 99
    with pytest.raises(distlock.StaleFenceToken) as info:
        stale.save(fence=old_fence)
    assert info.value.token == old_fence.token
    assert info.value.current is not None
    assert info.value.current > old_fence.token
    assert Account.objects.get().balance == 1
    with pytest.raises(distlock.StaleFenceToken):
        stale.delete(fence=old_fence)
    assert Account.objects.filter(pk=account.pk).exists()


def test_fenced_update_is_all_or_nothing(db_alias: str) -> None:
    accounts = [Account.objects.create(balance=0) for _ in range(5)]
    client = get_client()
    locks = [client.lock(lock_name(f"account:{a.pk}"), ttl=10) for a in accounts]
    for lock in locks:
        assert lock.acquire()
    try:
        # One row has meanwhile been claimed by a newer holder (a token far above ours).
        Account.objects.filter(pk=accounts[2].pk).update(fence_token=2**62)
        with pytest.raises(distlock.StaleFenceToken):
            Account.objects.filter(pk__in=[a.pk for a in accounts]).fenced_update(note="bulk")
        assert not Account.objects.filter(note="bulk").exists(), "a bulk update wrote some rows"
        Account.objects.filter(pk=accounts[2].pk).update(fence_token=0)
        assert Account.objects.filter(pk__in=[a.pk for a in accounts]).fenced_update(note="bulk") == 5
        assert Account.objects.filter(note="bulk").count() == 5
    finally:
        for lock in locks:
            lock.release()


def test_a_token_of_another_lock_is_refused(db_alias: str) -> None:
    one, two = Account.objects.create(balance=1), Account.objects.create(balance=2)
    with get_client().lock(lock_name(f"account:{two.pk}"), ttl=10) as other:
        one.balance = 50
        with pytest.raises(distlock.LockNotOwned, match="guarded by lock"):
            one.save()  # the only lock held is another row's
        with pytest.raises(distlock.LockNotOwned, match="guarded by lock"):
            one.save(fence=other.fence)
        with pytest.raises(distlock.LockNotOwned):
            list(Account.objects.filter(pk=one.pk).fenced())
    assert Account.objects.get(pk=one.pk).balance == 1


def test_strict_mode_refuses_unfenced_writes(db_alias: str, settings: Settings) -> None:
    account = Account.objects.create(balance=1)
    settings.DISTLOCK = {**conf(), "FENCING": "strict"}
    account.balance = 7
    with pytest.raises(distlock.UnfencedWrite):
        account.save()
    with pytest.raises(distlock.UnfencedWrite):
        Account.objects.create(balance=3)
    with pytest.raises(distlock.UnfencedWrite):
        Account.objects.filter(pk=account.pk).update(balance=9)
    with pytest.raises(distlock.UnfencedWrite):
        account.delete()
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10):
        account.save()
    assert Account.objects.count() == 1
    assert Account.objects.get().balance == 7


def test_strict_mode_lets_loaddata_in_and_a_create_needs_its_pk_and_lock(
    db_alias: str, settings: Settings, tmp_path: Path
) -> None:
    """What django.md's "Strict mode in tests, fixtures and the admin" says: ``loaddata`` (``TestCase.fixtures``)
    writes raw, outside the fence; a ``create()`` whose lock name needs its automatic pk is refused, leaving nothing;
    with the pk given, inside its lock, it is fenced; with ``FENCING = "on"`` for the set-up, it is plain."""
    settings.DISTLOCK = {**conf(), "FENCING": "strict"}
    fixture = tmp_path / "accounts.json"
    fixture.write_text('[{"model": "testapp.account", "pk": 70, "fields": {"balance": 1}}]')
    call_command("loaddata", str(fixture), database=db_alias, verbosity=0)
    with pytest.raises(distlock.UnfencedWrite, match="automatic primary key exists only after the insert"):
        Account.objects.create(balance=3)
    assert list(Account.objects.values_list("pk", flat=True)) == [70]
    with get_client().lock(lock_name("account:71"), ttl=10) as lock:
        assert Account.objects.create(pk=71, balance=3).fence_token == lock.token
    settings.DISTLOCK = {**conf(), "FENCING": "on"}
    Account.objects.create(balance=5)
    assert Account.objects.count() == 3


def test_fenced_apis_on_a_plain_model_are_refused(db_alias: str) -> None:
    plain = Plain.objects.create(value=1)
    with pytest.raises(distlock.ConfigurationError, match="not a FencedModel"):
        fence_of(plain)
    with pytest.raises(distlock.ConfigurationError, match="not a FencedModel"):
        Plain.objects.all().fenced()
    with pytest.raises(distlock.ConfigurationError, match="not a FencedModel"):
        Plain.objects.all().fenced_update(value=5)
    assert Plain.objects.get().value == 1


def test_claims_happen_in_the_database(db_alias: str) -> None:
    """A claim is a real UPDATE: a reader of the table sees the holder's token on the row."""
    account = Account.objects.create(balance=1)
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10) as lock:
        Account.objects.filter(pk=account.pk).fenced().get()
        with connections[db_alias].cursor() as cursor:
            cursor.execute("SELECT fence_token FROM testapp_account WHERE id = %s", [account.pk])
            assert cursor.fetchone() == (lock.token,)
