"""etcd-side surprises the local lease deadline cannot see: a lease revoked on the server while its waiter waits."""

from __future__ import annotations

import threading

from _support import wait_until

import distlock
from distlock.testing import EtcdServer


def test_a_waiter_whose_lease_is_revoked_never_holds_without_its_key(etcd_server: EtcdServer, lock_name: str) -> None:
    with distlock.connect(etcd_server.url) as holder_client, distlock.connect(etcd_server.url) as waiter_client:
        holder = holder_client.lock(lock_name, ttl=30)
        assert holder.acquire()
        waiter = waiter_client.lock(lock_name, ttl=30)
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
        thread.start()
        wait_until(lambda: (holder_client.holder(lock_name) or holder).waiters == 1, 5, "the waiter to queue")  # type: ignore[union-attr]
        current = holder_client.holder(lock_name)
        assert current is not None
        # Revoke the waiter's lease behind its back (as an operator, or a server-side expiry, would): its key goes.
        # The waiter's own deadline is 30 s away, so only re-reading its key can tell it.
        leases = etcd_server.etcdctl("lease", "list").split()
        for lease in (item for item in leases if len(item) >= 8 and all(c in "0123456789abcdef" for c in item)):
            if int(lease, 16) != current.lease_id:
                etcd_server.etcdctl("lease", "revoke", lease)
        holder.release()
        thread.join(20)
        assert got == [True]
        now = waiter_client.holder(lock_name)
        assert now is not None, "the waiter believes it holds the lock, but it has no key in etcd"
        assert now.token == waiter.token
        waiter.ensure_held(verify=True)
        waiter.release()
