"""etcd only: requests the client gives up on never harm the server, and a closed client fails cleanly.

etcd before 3.5.5 panics when a read-only ``Txn`` is cancelled while it reads (etcd-io/etcd#14110), and the test
etcd is 3.5.1: a queue read sent as such a ``Txn`` took the whole member down the first time a waiter's deadline ran
out in the middle of a long read. The queue reads are plain ``Range`` requests, which etcd cancels cleanly.
"""

from __future__ import annotations

import pytest
from etcd3 import etcdrpc

import distlock
from distlock._protocol import Ticket
from distlock.backends.etcd._backend import EtcdBackend
from distlock.testing import EtcdServer

LONG_QUEUE = 20_000  # keys under one lock: a read takes ~25 ms, long enough to be cut short mid-read


def test_queue_reads_cut_short_mid_read_leave_etcd_running(etcd_server: EtcdServer, lock_name: str) -> None:
    # The reads go through a second client with tiny deadlines; the holder's client keeps its normal ones, so its
    # lease stays alive while the reads are cut short.
    with distlock.connect(etcd_server.url) as client, distlock.connect(etcd_server.url) as reader:
        backend = reader._backend
        assert isinstance(backend, EtcdBackend)
        with client.lock(lock_name, ttl=5) as lock:
            prefix = backend._lock_prefix(lock_name)
            for start in range(0, LONG_QUEUE, 100):  # etcd takes at most 128 operations per transaction
                keys = (prefix + b"~%08d" % i for i in range(start, start + 100))
                puts = [etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=b"x")) for key in keys]
                backend._channels.member().kv.Txn(etcdrpc.TxnRequest(success=puts), timeout=10)
            ticket = Ticket(name=lock_name, key=prefix + b"~%08d" % (LONG_QUEUE - 1), token=1 << 40, lease_id=0)
            cut_short = 0
            for attempt in range(200):
                # Deadlines at every point of the read.
                backend._channels.request_timeout = 0.002 + (attempt % 20) * 0.001
                try:
                    backend.position(ticket)
                except distlock.BackendUnavailable:
                    cut_short += 1
            assert cut_short > 0, "no read was cut short: the test did not exercise what it is for"
            holder = client.holder(lock_name)
            assert holder is not None and holder.token == lock.token
            lock.ensure_held()
        assert etcd_server.running, etcd_server.log_tail()


def test_a_request_racing_close_fails_with_a_distlock_error(
    etcd_server: EtcdServer, lock_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = distlock.connect(etcd_server.url)
    backend = client._backend
    assert isinstance(backend, EtcdBackend)
    metadata = backend._channels.metadata

    def close_first(**options: bool) -> tuple[tuple[str, str], ...] | None:
        # Another thread's close() lands after this request took its stub and before it is sent.
        backend.close()
        return metadata(**options)

    monkeypatch.setattr(backend._channels, "metadata", close_first)
    with pytest.raises(distlock.ClientClosed, match="closed"):
        backend.head(lock_name)
    monkeypatch.undo()
    with pytest.raises(distlock.ClientClosed, match="closed"):  # and a closed backend does not reconnect
        backend.head(lock_name)
    client.close()
