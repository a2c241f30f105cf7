"""etcd only: clients from before seats and clients with them queue together on one name (a rolling upgrade).

Before seats a join's key ended in 16 random hex digits, ``<lease hex>-<nonce>``; it now ends in a seat,
``<lease hex>-0``. Both layouts put the kind first for semaphores and read/write locks (``s2.``, ``r.``, ``w.``), and
both order a queue by create revision: an old client's key is ahead of or behind a new client's exactly as its
revision says, and counts toward a semaphore's limit. The old keys here are put by hand, byte for byte as an old
client put them, on a lease of their own; an old client's join is the same transaction as a new one's with its
16-hex nonce, so the reverse is the backend's ``enqueue`` with such a nonce.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Iterator

import pytest
from _support import acquire_in_background, queued, wait_until
from etcd3 import etcdrpc

import distlock
from distlock._protocol import Lease, owner_record
from distlock.backends.etcd._backend import EtcdBackend


def _old_key(backend: EtcdBackend, name: str, lease: Lease, kind: str = "") -> tuple[bytes, int]:
    """Put the key an old client's join put for ``name`` on ``lease``; the key and its token (create revision)."""
    tail = f"{lease.id:x}-{secrets.token_hex(8)}"
    key = backend._lock_prefix(name) + (f"{kind}.{tail}" if kind else tail).encode("ascii")
    put = etcdrpc.PutRequest(key=key, value=owner_record("old-client"), lease=lease.id)
    response = backend._channels.member().kv.Put(put, timeout=10)
    return key, int(response.header.revision)


def _delete(backend: EtcdBackend, key: bytes) -> None:
    backend._channels.member().kv.DeleteRange(etcdrpc.DeleteRangeRequest(key=key), timeout=10)


@pytest.fixture
def client(etcd_url: str) -> Iterator[distlock.Client]:
    with distlock.connect(etcd_url) as client:
        yield client


def _backend(client: distlock.Client) -> EtcdBackend:
    backend = client._backend
    assert isinstance(backend, EtcdBackend)
    return backend


def test_a_new_client_queues_behind_an_old_clients_key_and_holds_once_it_is_gone(
    client: distlock.Client, lock_name: str
) -> None:
    backend = _backend(client)
    old, old_token = _old_key(backend, lock_name, backend.grant_lease(30))
    holder = client.holder(lock_name)
    assert holder is not None and (holder.token, holder.owner) == (old_token, "old-client")
    assert not client.lock(lock_name, ttl=10).acquire(blocking=False)

    waiter = client.lock(lock_name, ttl=10)
    thread, got = acquire_in_background(waiter, functools.partial(queued, client, lock_name, 1), "the new waiter")
    _delete(backend, old)  # the old client releases
    thread.join(30)
    assert got, "the new client did not get the lock after the old client's key was deleted"
    assert waiter.token > old_token
    waiter.release()


def test_an_old_clients_join_queues_behind_a_new_holder_and_holds_once_it_releases(
    client: distlock.Client, lock_name: str
) -> None:
    backend = _backend(client)
    lease = backend.grant_lease(30)
    with client.lock(lock_name, ttl=10) as lock:
        old, position = backend.enqueue(lock_name, lease, secrets.token_hex(8), owner_record("old-client"))
        assert not position.held and old.token > lock.token
        assert len(old.key.rpartition(b"-")[2]) == 16  # the old layout: 16 hex digits where the seat is now
    wait_until(lambda: backend.position(old).held, 10, "the old client's key to hold after the new holder released")
    assert not client.lock(lock_name, ttl=10).acquire(blocking=False)
    assert backend.dequeue(old)
    backend.revoke_lease(lease, [])


def test_an_old_clients_semaphore_slot_counts_toward_the_limit(client: distlock.Client, lock_name: str) -> None:
    backend = _backend(client)
    old, _ = _old_key(backend, lock_name, backend.grant_lease(30), kind="s2")
    first = client.semaphore(lock_name, 2, ttl=10)
    assert first.acquire(blocking=False), "one old slot of two: a new one holds beside it"
    assert not client.semaphore(lock_name, 2, ttl=10).acquire(blocking=False), "the two slots are taken"
    _delete(backend, old)
    assert client.semaphore(lock_name, 2, ttl=10).acquire(blocking=False)
    first.release()


def test_an_old_clients_key_of_another_kind_refuses_a_new_join(client: distlock.Client, lock_name: str) -> None:
    backend = _backend(client)
    old, _ = _old_key(backend, lock_name, backend.grant_lease(30))  # an old client's plain lock
    with pytest.raises(distlock.LockKindMismatch):
        client.semaphore(lock_name, 2, ttl=10).acquire(blocking=False)
    with pytest.raises(distlock.LockKindMismatch):
        client.rwlock(lock_name, ttl=10).read().acquire(blocking=False)
    _delete(backend, old)
