"""Marks (``Lock.write_mark``, ``Client.read_mark``): a holder's small value under a key of its lock, written only
while the hold lasts, kept after it, and gone by itself after its TTL; never a lock. On the services that keep them
(every service: memory, etcd, Redis, ZooKeeper, the SQL lock table on its three databases: ``every_database``, their
SQL differs); a backend that declares none refuses them where they are asked for. How the SQL lock table sweeps
expired marks: tests/backends/sqltable/test_sqltable_residue.py; ZooKeeper's buckets:
tests/backends/zookeeper/test_zookeeper_residue.py."""

from __future__ import annotations

import uuid

import pytest
from _support import SQL_TABLES, UNMARKED, Unmarked, wait_until

import distlock
from distlock._protocol import Lease
from distlock.testing._cleanup import remove_keys

pytestmark = pytest.mark.every_database

#: Every service keeps marks.
MARKING = pytest.mark.parametrize("backend", ["memory", "etcd", "redis", "zookeeper", *SQL_TABLES], indirect=True)


@MARKING
def test_a_mark_written_while_holding_is_read_after_the_hold_and_is_never_a_lock(
    client: distlock.Client, lock_name: str
) -> None:
    lock = client.lock(lock_name, ttl=10)
    with lock:
        lock.write_mark("task-1", b'{"attempt": 0}', ttl=60)
        lock.write_mark("task-1", b'{"attempt": 1}', ttl=60)  # written again: the newer value
        lock.write_mark("a/b{c}%2F", b"odd key", ttl=60)
        lock.write_mark("largest", bytes(range(256)) * 256, ttl=60)  # 64 KiB, every byte value
        (state,) = [state for state in client.inspect() if state.name == lock_name]
        assert (len(state.holders), state.waiters) == (1, ())
        holder = client.holder(lock_name)
        assert holder is not None and (holder.token, holder.holders, holder.waiters) == (lock.token, 1, 0)
    assert client.read_mark(lock_name, "task-1") == b'{"attempt": 1}'
    assert client.read_mark(lock_name, "a/b{c}%2F") == b"odd key"
    assert client.read_mark(lock_name, "largest") == bytes(range(256)) * 256
    assert client.read_mark(lock_name, "task-2") is None
    assert client.read_mark(lock_name + "/other", "task-1") is None
    assert client.holder(lock_name) is None
    assert all(not state.name.startswith(lock_name) for state in client.inspect())
    with client.lock(lock_name, ttl=10, timeout=0) as again:  # the lock is free: no mark stands in its queue
        assert again.token > 0


@MARKING
def test_a_mark_is_refused_once_the_hold_is_gone(client: distlock.Client, lock_name: str) -> None:
    lock = client.lock(lock_name, ttl=10)
    lock.acquire()
    assert client.force_release(lock_name, lock.token)
    with pytest.raises(distlock.LockLost, match="its key is gone: mark 'task-1' was not written"):
        lock.write_mark("task-1", b"late", ttl=60)
    assert lock.lost
    assert client.read_mark(lock_name, "task-1") is None
    with pytest.raises(distlock.LockNotOwned):
        client.lock(lock_name, ttl=10).write_mark("task-1", b"never held", ttl=60)


@MARKING
def test_the_backend_refuses_a_mark_of_a_ticket_whose_lease_was_revoked(
    client: distlock.Client, lock_name: str
) -> None:
    with client.lock(lock_name, ttl=10) as lock:
        ticket = lock._own_ticket()
        assert ticket is not None
        backend = client._backend
        assert isinstance(backend, distlock._protocol.Marking)
        assert backend.write_mark(ticket, "k", b"held", 60)
        backend.revoke_lease(Lease(ticket.lease_id, 10), [ticket])
        assert not backend.write_mark(ticket, "k", b"revoked", 60)
        assert not backend.write_mark(ticket, "k2", b"revoked", 60)
        assert backend.read_mark(lock_name, "k") == b"held"
        assert backend.read_mark(lock_name, "k2") is None
        with pytest.raises(distlock.LockLost):
            lock.release()


@MARKING
def test_a_mark_expires_by_itself_after_its_ttl(client: distlock.Client, lock_name: str) -> None:
    with client.lock(lock_name, ttl=10) as lock:
        lock.write_mark("short", b"v", ttl=1)
        lock.write_mark("long", b"v", ttl=600)
        assert client.read_mark(lock_name, "short") == b"v"
    # At least 1 s, at most a tenth of it or a second more (etcd: whole seconds, and its minimum lease of about
    # 2 s); 10 s is a generous bound for a loaded machine. No sweeper runs: the service expires it.
    wait_until(lambda: client.read_mark(lock_name, "short") is None, 10, "the mark to expire")
    assert client.read_mark(lock_name, "long") == b"v"


def test_a_backend_without_marks_refuses_them_where_they_are_asked_for(lock_name: str) -> None:
    with distlock.Client(Unmarked("unmarked")) as client:
        with client.lock(lock_name, ttl=10) as lock:
            with pytest.raises(distlock.ConfigurationError, match=UNMARKED):
                lock.write_mark("task-1", b"v", ttl=60)
            assert lock.owned()
        with pytest.raises(distlock.ConfigurationError, match=UNMARKED):
            client.read_mark(lock_name, "task-1")


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_bad_marks_are_refused_before_anything_is_sent(client: distlock.Client, lock_name: str) -> None:
    with client.lock(lock_name, ttl=10) as lock:
        with pytest.raises(distlock.InvalidLockName, match="a mark key must not be empty"):
            lock.write_mark("", b"v", ttl=60)
        with pytest.raises(distlock.ConfigurationError, match="a mark's value must be bytes"):
            lock.write_mark("k", "text", ttl=60)  # type: ignore[arg-type]
        with pytest.raises(distlock.ConfigurationError, match="at most 65536"):
            lock.write_mark("k", b"x" * 65537, ttl=60)
        with pytest.raises(distlock.ConfigurationError, match="ttl"):
            lock.write_mark("k", b"v", ttl=0)
        with pytest.raises(distlock.InvalidLockName, match="mark key"):
            client.read_mark(lock_name, "bad\x00key")
        assert lock.owned()


@MARKING
def test_the_pytest_plugins_clean_up_removes_marks(backend_url: str, lock_name: str) -> None:
    prefix = f"cleanup_{uuid.uuid4().hex[:12]}"  # a table prefix too
    with distlock.connect(backend_url, prefix=prefix) as client, client.lock(lock_name, ttl=10) as lock:
        lock.write_mark("task-1", b"v", ttl=60)
    assert remove_keys(backend_url, prefix) >= 1
    with distlock.connect(backend_url, prefix=prefix) as client:
        assert client.read_mark(lock_name, "task-1") is None
