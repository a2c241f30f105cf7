"""A transfer between two FencedModel rows under one multi-lock: each row claimed and saved with its own token."""

from __future__ import annotations

import pytest
from django.db import transaction
from djangotests.testapp.models import Account

import distlock
from distlock_django import get_client, lock_name

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])


def test_a_transfer_claims_and_saves_each_row_with_its_own_lock(db_alias: str) -> None:
    source, target = Account.objects.create(balance=100), Account.objects.create(balance=0)
    names = {row.pk: lock_name(f"account:{row.pk}") for row in (source, target)}
    # Given target first: the multi-lock takes them in its own order, and each row finds its own lock.
    both = get_client().multi_lock([names[target.pk], names[source.pk]], ttl=10)
    with both, transaction.atomic(using=db_alias):
        frm = Account.objects.filter(pk=source.pk).fenced().get()
        to = Account.objects.filter(pk=target.pk).fenced().get()
        frm.balance -= 30
        to.balance += 30
        frm.save()
        to.save()
        tokens = both.tokens
    found = {row.pk: (row.balance, row.fence_token) for row in Account.objects.all()}
    assert found == {source.pk: (70, tokens[names[source.pk]]), target.pk: (30, tokens[names[target.pk]])}


def test_a_stale_multi_lock_writes_neither_row(db_alias: str) -> None:
    source, target = Account.objects.create(balance=100), Account.objects.create(balance=0)
    names = [lock_name(f"account:{row.pk}") for row in (source, target)]
    client = get_client()
    stale = client.multi_lock(names, ttl=10)
    assert stale.acquire()
    frm = Account.objects.filter(pk=source.pk).fenced().get()
    to = Account.objects.filter(pk=target.pk).fenced().get()
    target_name = lock_name(f"account:{target.pk}")
    assert client.force_release(target_name, stale.tokens[target_name])
    with client.lock(target_name, ttl=10):
        Account.objects.filter(pk=target.pk).fenced().get()  # the newer holder claims the row
    frm.balance -= 30
    to.balance += 30

    def transfer() -> None:
        with transaction.atomic(using=db_alias):
            frm.save()
            to.save()

    with pytest.raises(distlock.StaleFenceToken):
        transfer()
    with pytest.raises(distlock.LockLost):
        stale.release()
    assert {row.pk: row.balance for row in Account.objects.all()} == {source.pk: 100, target.pk: 0}
