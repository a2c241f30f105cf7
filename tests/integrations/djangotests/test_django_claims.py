"""How ``.fenced()`` claims: one ``UPDATE ... RETURNING`` where the database can, the long way otherwise, same results.

Every behaviour is checked both ways on SQLite and PostgreSQL: ``claim_path`` forces the long way by telling the
queryset that the database has no ``UPDATE ... RETURNING``. A deferred-field save is checked here too, since the
rows a claim returns with ``.only()`` are what such a save writes back.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from djangotests.testapp.models import Account, Entry

import distlock
import distlock_django._models
from distlock_django import get_client, lock_name

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])

TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


@pytest.fixture(params=["one statement", "long way"])
def claim_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, db_alias: str) -> str:
    if request.param == "long way":
        monkeypatch.setattr(distlock_django._models, "_returning_claims", lambda connection: False)
    return str(request.param)


@contextmanager
def book_lock(book: int) -> Iterator[int]:
    """Hold the lock of ``book``; its fencing token."""
    with get_client().lock(lock_name(f"book:{book}"), ttl=10) as lock:
        yield lock.token


@contextmanager
def statements(alias: str) -> Iterator[list[str]]:
    """The statements run on ``alias`` in the block, transaction control left out."""
    found: list[str] = []
    with CaptureQueriesContext(connections[alias]) as captured:
        yield found
    found.extend(q["sql"] for q in captured.captured_queries if not q["sql"].upper().startswith(TRANSACTION_CONTROL))


def entries(book: int = 1) -> list[Entry]:
    days = [3, 1, 2, 1, 5]
    return [
        Entry.objects.create(book=book, amount=10 * i, posted=datetime.date(2026, 1, day), memo=f"m{i}")
        for i, day in enumerate(days)
    ]


def tokens() -> dict[int, int]:
    return dict(Entry.objects.values_list("pk", "fence_token"))


def test_a_claim_claims_and_reads_every_row(db_alias: str, claim_path: str) -> None:
    made = entries()
    entries(book=2)
    with book_lock(1) as token, statements(db_alias) as ran:
        rows = list(Entry.objects.filter(book=1).fenced())
    assert [(r.pk, r.amount, r.memo, r.fence_token) for r in rows] == [
        (e.pk, e.amount, e.memo, token) for e in sorted(made, key=lambda e: (-e.posted.toordinal(), e.pk))
    ]
    assert {pk: t for pk, t in tokens().items() if pk in {e.pk for e in made}} == dict.fromkeys(
        (e.pk for e in made), token
    )
    assert set(Entry.objects.filter(book=2).values_list("fence_token", flat=True)) == {0}
    if claim_path == "one statement":
        assert len(ran) == 1, ran
        assert "RETURNING" in ran[0]
    else:
        assert len(ran) > 1


def test_a_claim_in_a_transaction_is_one_statement_in_a_savepoint(db_alias: str, claim_path: str) -> None:
    entries()
    with book_lock(1) as token, transaction.atomic(using=db_alias), statements(db_alias) as ran:
        account = Entry.objects.filter(book=1).fenced().first()
    assert account is not None
    assert account.fence_token == token
    assert len(ran) == (1 if claim_path == "one statement" else 3), ran


def test_get_claims_one_row(db_alias: str, claim_path: str) -> None:
    made = entries()
    with book_lock(1) as token, statements(db_alias) as ran:
        row = Entry.objects.filter(book=1).fenced().get(pk=made[2].pk)
    assert (row.pk, row.amount, row.fence_token) == (made[2].pk, 20, token)
    assert tokens()[made[2].pk] == token
    assert tokens()[made[0].pk] == 0, "get() claimed a row it did not return"
    assert len(ran) == (1 if claim_path == "one statement" else 3), ran


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "atomic"])
def test_a_stale_row_refuses_the_whole_claim(db_alias: str, claim_path: str, in_transaction: bool) -> None:
    made = entries()
    Entry.objects.filter(pk=made[3].pk).update(fence_token=2**62)  # a newer holder has claimed one row
    before = tokens()
    with book_lock(1) as token:
        with transaction.atomic(using=db_alias) if in_transaction else _nothing():
            with pytest.raises(distlock.StaleFenceToken) as info:
                list(Entry.objects.filter(book=1).fenced())
            # The caller's transaction is still usable after the refusal.
            assert Entry.objects.filter(book=1).count() == len(made)
    assert (info.value.row, info.value.token, info.value.current) == (made[3].pk, token, 2**62)
    assert tokens() == before, "a refused claim left some rows claimed"


def test_a_row_of_another_lock_refuses_the_claim(db_alias: str, claim_path: str) -> None:
    entries(book=1)
    entries(book=2)
    with book_lock(1), pytest.raises(distlock.LockNotOwned, match="book:2"):
        list(Entry.objects.filter(book__in=[1, 2]).fenced())
    assert set(tokens().values()) == {0}


def test_rows_of_several_held_locks_are_claimed_each_with_its_token(db_alias: str, claim_path: str) -> None:
    entries(book=1)
    entries(book=2)
    with book_lock(1) as one, book_lock(2) as two:
        rows = list(Entry.objects.filter(book__in=[1, 2]).fenced())
    assert {(r.book, r.fence_token) for r in rows} == {(1, one), (2, two)}
    assert sorted(tokens().values()) == sorted([one] * 5 + [two] * 5)


@pytest.mark.parametrize(
    "ordering",
    [(), ("amount",), ("-amount",), ("posted", "-pk"), ("-posted", "amount"), ("memo",), ("?",)],
    ids=str,
)
def test_rows_come_back_in_the_querysets_order(db_alias: str, claim_path: str, ordering: tuple[str, ...]) -> None:
    entries()
    rows = Entry.objects.filter(book=1).order_by(*ordering) if ordering else Entry.objects.filter(book=1)
    with book_lock(1), statements(db_alias) as ran:
        claimed = [r.pk for r in rows.fenced()]
    if ordering == ("?",):
        assert sorted(claimed) == sorted(r.pk for r in rows)
    else:
        assert claimed == [r.pk for r in rows]
    text_or_random = ordering in (("memo",), ("?",))  # the database's collation or randomness: the long way
    assert (len(ran) == 1) == (claim_path == "one statement" and not text_or_random), ran


def test_a_slice_claims_only_its_rows(db_alias: str, claim_path: str) -> None:
    entries()
    with book_lock(1) as token:
        first_two = list(Entry.objects.filter(book=1).order_by("amount").fenced()[:2])
    assert [r.amount for r in first_two] == [0, 10]
    assert sorted(tokens().values()) == [0, 0, 0, token, token]
    with book_lock(1):
        past_the_only_row = list(Entry.objects.filter(pk=first_two[0].pk).fenced()[1:])
    assert past_the_only_row == []
    assert sorted(tokens().values()) == [0, 0, 0, token, token], "a slice claimed a row it did not return"


def test_only_and_defer_come_back_deferred(db_alias: str, claim_path: str) -> None:
    entries()
    with book_lock(1) as token:
        only = list(Entry.objects.filter(book=1).only("amount").fenced())
        deferred = list(Entry.objects.filter(book=1).defer("memo", "posted").fenced())
    plain_only = list(Entry.objects.filter(book=1).only("amount"))
    assert [r.get_deferred_fields() for r in only] == [r.get_deferred_fields() for r in plain_only]
    # fence_token is loaded whatever only()/defer() say: it is the token the row's data was read with.
    assert only[0].get_deferred_fields() == {"book", "posted", "memo", "account_id"}
    assert {r.amount for r in only} == {0, 10, 20, 30, 40}
    assert {r.fence_token for r in only} == {token}
    assert deferred[0].get_deferred_fields() == {"memo", "posted"}
    assert {r.fence_token for r in deferred} == {token}


def test_values_and_iterator_claim_too(db_alias: str, claim_path: str) -> None:
    made = entries()
    with book_lock(1) as token:
        values = list(Entry.objects.filter(book=1).fenced().values_list("amount", "fence_token"))
    assert sorted(values) == [(e.amount, token) for e in made]
    with book_lock(1) as newer_token:
        streamed = list(Entry.objects.filter(book=1).fenced().iterator())
    assert {r.fence_token for r in streamed} == {newer_token}
    assert set(tokens().values()) == {newer_token}


def test_a_filter_across_a_join_and_a_related_manager_claim_their_rows(db_alias: str, claim_path: str) -> None:
    account = Account.objects.create(balance=5, note="joined")
    made = entries()
    Entry.objects.filter(pk__in=[made[1].pk, made[3].pk]).update(account=account)
    with book_lock(1) as token:
        with statements(db_alias) as ran:
            joined = list(Entry.objects.filter(book=1, account__note="joined").fenced())
        related = list(account.entry_set.fenced())
    assert (len(ran) == 1) == (claim_path == "one statement"), ran
    assert sorted(r.pk for r in joined) == sorted(r.pk for r in related) == sorted([made[1].pk, made[3].pk])
    assert {r.fence_token for r in joined + related} == {token}
    assert sorted(tokens().values()) == [0, 0, 0, token, token]


def test_an_explicit_fence_is_the_one_claimed_with(db_alias: str, claim_path: str) -> None:
    entries()
    with get_client().lock(lock_name("book:1"), ttl=10) as lock, get_client().lock(lock_name("book:2"), ttl=10):
        # The innermost lock held is book:2's; the fence passed is book:1's, the rows' own.
        rows = list(Entry.objects.filter(book=1).fenced(lock))
        assert {r.fence_token for r in rows} == {lock.token}
        with pytest.raises(distlock.LockNotOwned):
            list(Entry.objects.filter(book=1).fenced(distlock.Fence(lock_name("book:2"), lock.token + 1)))
        assert set(tokens().values()) == {lock.token}


@pytest.mark.parametrize("defer", [False, True], ids=["only", "defer"])
def test_a_deferred_row_saves_only_its_loaded_fields(db_alias: str, claim_path: str, defer: bool) -> None:
    account = Account.objects.create(balance=100, note="before")
    with get_client().lock(lock_name(f"account:{account.pk}"), ttl=10) as lock:
        token = lock.token
        rows = Account.objects.filter(pk=account.pk)
        row = (rows.defer("note") if defer else rows.only("balance")).fenced().get()
        Account.objects.filter(pk=account.pk).update(note="written meanwhile")  # not a field this row loaded
        row.balance += 1
        with statements(db_alias) as ran:
            row.save()
    saved = Account.objects.get(pk=account.pk)
    assert (saved.balance, saved.note, saved.fence_token) == (101, "written meanwhile", token)
    # One UPDATE of the loaded field and the token: the deferred field is neither read back nor rewritten (which
    # would overwrite a write made between that read and the UPDATE).
    assert len(ran) == 1, ran
    assert '"balance"' in ran[0]
    assert '"note"' not in ran[0]


@contextmanager
def _nothing() -> Iterator[None]:
    yield
