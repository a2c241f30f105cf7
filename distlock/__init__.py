"""distlock: distributed locks that hand every holder a fencing token, on etcd, Redis, ZooKeeper or a SQL lock table.

A lease-based lock alone is never safe: a holder can pause (GC, SIGSTOP, a slow network) past its lease while another
process takes the lock. distlock tells the holder early (``lock.lost``, ``ensure_held()``, ``on_lost``), and gives
it a *fencing token* — strictly increasing from holder to holder — so the database can reject the stale writer.

    import distlock

    client = distlock.connect("etcd://127.0.0.1:2379")
    with client.lock("order:42", ttl=30, timeout=10) as lock:
        save(order, fence_token=lock.token)

This package is the core: the client, the lock handles, the session keeper, fences, lock names and templates, above
the backends of ``distlock.backends`` (docs/architecture.md draws the layers; ``memory://`` is an in-process one for
unit tests). What can go wrong is always one of the errors exported here, all under ``DistlockError`` (the tree is
drawn in ``_errors.py``); importing distlock imports no backend's client library (grpc, redis-py, kazoo, SQLAlchemy:
only ``connect()`` with a URL of that backend does) nor OpenTelemetry (the first lock does, to record its metrics).
"""

import logging

from ._asynclock import AsyncLock
from ._client import Client, connect
from ._clientcache import ClientCache
from ._election import AsyncElection, Election, Leader
from ._errors import (
    AuthenticationFailed,
    BackendError,
    BackendUnavailable,
    ClientClosed,
    ConfigurationError,
    DistlockError,
    InvalidKeyTemplate,
    InvalidLockName,
    LockError,
    LockKindMismatch,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    StaleFenceToken,
    UnfencedWrite,
)
from ._fence import Fence, current_fence, fence_for, fence_for_write, fence_refused, stale_token_message
from ._guard import fence_guard_sql
from ._install import docs_url, install_line, require_extra
from ._lock import Lock, current_lock, current_token
from ._lockoptions import LockOptions
from ._multi import AsyncMultiLock, MultiLock
from ._protocol import Holder, LockState, Waiter
from ._rwlock import AsyncRWLock, RWLock
from ._seconds import seconds
from ._stop import STOP_SIGNAL
from ._table import format_lock_table
from ._template import KeyTemplate

__version__ = "0.1.0"

# A library logs, the application decides where it goes (lost locks are logged as warnings on "distlock").
logging.getLogger("distlock").addHandler(logging.NullHandler())

__all__ = [  # noqa: RUF022 - plain sorted() order (tests/tooling/test_public_api.py)
    "AsyncElection",
    "AsyncLock",
    "AsyncMultiLock",
    "AsyncRWLock",
    "AuthenticationFailed",
    "BackendError",
    "BackendUnavailable",
    "Client",
    "ClientCache",
    "ClientClosed",
    "ConfigurationError",
    "DistlockError",
    "Election",
    "Fence",
    "Holder",
    "InvalidKeyTemplate",
    "InvalidLockName",
    "KeyTemplate",
    "Leader",
    "Lock",
    "LockError",
    "LockKindMismatch",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "LockOptions",
    "LockState",
    "MultiLock",
    "RWLock",
    "STOP_SIGNAL",
    "StaleFenceToken",
    "UnfencedWrite",
    "Waiter",
    "__version__",
    "connect",
    "current_fence",
    "current_lock",
    "current_token",
    "docs_url",
    "fence_for",
    "fence_for_write",
    "fence_guard_sql",
    "fence_refused",
    "format_lock_table",
    "install_line",
    "require_extra",
    "seconds",
    "stale_token_message",
]
