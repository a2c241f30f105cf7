"""Removing every key under a client's key prefix: how the pytest plugin leaves a lock server as it found it.

Closing a client releases the locks it holds, but not every key a backend wrote goes with them: a Redis lock's
token counter never expires (that keeps its tokens increasing) and a wake-up list can outlive its waiter; a crashed
or unclosed client's tickets stay until its lease runs out (etcd keys, ZooKeeper nodes, SQL table rows).
`remove_keys` deletes them for one prefix, right away: every key (etcd, Redis), the waiters' nodes and the marks but
not the empty lock nodes (ZooKeeper), the queue entries and marks but not the leases and lock rows (SQL lock table).
It reaches into each backend's private helpers, as a test tool may; in memory, the prefix's queues, records and
marks.

Only for a prefix no live program uses: a holder whose keys are deleted loses its lock, and a deleted Redis token
counter starts again from the server clock. Prefixes are matched as strings, so removing ``a`` also removes the
keys of ``a/b`` (etcd) or ``a:b`` (Redis).

What can go wrong: the server errors of any request (`BackendUnavailable`, `AuthenticationFailed`), and on a
Redis Cluster a slot moving between the scan and the delete leaves that key behind.
"""

from __future__ import annotations

import contextlib
from typing import Any

import distlock
from distlock.backends import scheme_of

__all__ = ["remove_keys"]

_WHAT = "remove the test's keys"


def remove_keys(url: str, prefix: str) -> int:
    """Delete every key under ``prefix`` on the lock service at ``url``; return how many were deleted."""
    scheme = scheme_of(url.partition("://")[0])
    assert scheme is not None, url  # connect() refuses it below otherwise
    backend_name = scheme.backend
    with distlock.connect(url, prefix=prefix) as client:
        backend: Any = client._backend
        return _REMOVERS[backend_name](backend)


def _remove_etcd(backend: Any) -> int:
    from etcd3 import etcdrpc

    from distlock.backends.etcd._backend import prefix_end

    keys = etcdrpc.DeleteRangeRequest(key=backend._prefix, range_end=prefix_end(backend._prefix))
    # A transaction: EtcdBackend sends Txn and Range to the KV service, and a Txn answers the same deletion.
    request = etcdrpc.TxnRequest(success=[etcdrpc.RequestOp(request_delete_range=keys)])
    response, _ = backend._channels.unary(_WHAT, "Txn", request)
    return int(response.responses[0].response_delete_range.deleted)


def _remove_redis(backend: Any) -> int:
    pattern = "".join(f"\\{c}" if c in "\\*?[]" else c for c in backend._keys.prefix) + ":*"
    removed = 0
    for pool in backend._target.pools():
        cursor: Any = 0
        while True:
            (cursor, keys), _ = backend._request(_WHAT, pool, "SCAN", cursor, "MATCH", pattern, "COUNT", 500)
            for key in keys:
                # One key at a time, on the server the scan found it on: a Cluster refuses DEL across slots.
                deleted, _ = backend._request(_WHAT, pool, "DEL", key)
                removed += int(deleted)
            if int(cursor) == 0:
                break
    return removed


def _remove_zookeeper(backend: Any) -> int:
    # Every waiter's node under the prefix, and every mark with its bucket; the lock nodes themselves stay (empty),
    # as they do in use.
    from kazoo.exceptions import NoNodeError

    from distlock.backends.zookeeper._marks import MARKS_ROOT

    client = backend._sessions.main()
    sessions = backend._sessions
    removed = 0
    for escaped in backend._lock_nodes(client, _WHAT):
        parent = f"{backend._root}/{escaped}"
        for child in sessions.children(client, parent, _WHAT):
            removed += int(sessions.delete(client, f"{parent}/{child}", _WHAT))
    marks = f"{backend._root}/{MARKS_ROOT}"  # with its buckets, whatever their nodes' versions
    with contextlib.suppress(NoNodeError):
        for bucket in client.get_children(marks):
            with contextlib.suppress(NoNodeError):
                removed += len(client.get_children(f"{marks}/{bucket}"))
        client.delete(marks, recursive=True)
    return removed


def _remove_sqltable(backend: Any) -> int:
    # Every queue entry and mark of the prefix's tables; leases and the locks' rows stay, as they do in use.
    import sqlalchemy as sa

    tables = backend._tables

    def remove(connection: Any, each: Any) -> int:
        return int(
            connection.execute(sa.delete(tables.waiters)).rowcount
            + connection.execute(sa.delete(tables.marks)).rowcount
        )

    deleted, _ = backend._run(_WHAT, remove)
    return int(deleted)


def _remove_memory(backend: Any) -> int:
    server = backend._server
    with server.cond:
        places = [place for place in [*server.queues, *server.records] if place[0] == backend._prefix]
        removed = sum(
            len(server.queues.pop(place, ())) + (server.records.pop(place, None) is not None) for place in places
        )
        marks = [place for place in server.marks if place[0] == backend._prefix]
        removed += sum(server.marks.pop(place, None) is not None for place in marks)
        server.cond.notify_all()
    return removed


_REMOVERS = {
    "etcd": _remove_etcd,
    "redis": _remove_redis,
    "zookeeper": _remove_zookeeper,
    "sqltable": _remove_sqltable,
    "memory": _remove_memory,
}
