"""``connect(url)`` and the client: a backend from its URL, the client's life cycle across fork.

The URL grammars live with their backends (``distlock.backends.parse_url``; the URLs are listed in
docs/getting-started.md): ``connect(url, **options)`` is ``parse_url(url, **options).open()``, a :class:`Client`
around the backend, and its ``check()`` unless ``check=False``. Keyword options override the URL: ``prefix``,
``username``, ``password``, ``ca_cert``, ``client_cert``, ``client_key``, ``connect_timeout`` (how long ``connect``
may take to reach the service, default 5 s), ``request_timeout`` (how long one operation may retry before
``BackendUnavailable``, default 5 s). ``fail_fast`` (seconds, default 5; 0: never) is the client's own: after a call
found the service unavailable, new work fails fast for that long, then one call probes again (``_breaker``).

What can go wrong: a malformed URL, an unknown scheme or option, or a missing extra raise ``ConfigurationError``
before any network traffic; an unreachable service raises ``BackendUnavailable`` within ``connect_timeout``; bad
credentials raise ``AuthenticationFailed``. After a ``BackendUnavailable``, acquiring and reading raise it at once
for ``fail_fast`` seconds (held locks are still kept alive and releases still retried). Every call on a closed
client raises ``ClientClosed``, and so does a call that was under way in another thread when the client closed,
whatever the backend raised in that race (a cancelled gRPC stream, a closed socket). A client used after ``fork()``
opens its own connection and leases in the child and leaves the parent's alone. ``close()`` (also at interpreter
exit) revokes the client's leases, which releases every lock it still holds.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self, Unpack

from ._asynclock import AsyncLock
from ._breaker import DEFAULT_FAIL_FAST, fail_fast_seconds
from ._context import Context
from ._election import AsyncElection, Election
from ._errors import ConfigurationError
from ._lock import Lock
from ._lockoptions import LockOptions
from ._multi import AsyncMultiLock, MultiLock
from ._names import validate_name
from ._protocol import KINDS, Backend, Holder, Inspectable, LockState
from ._rwlock import AsyncRWLock, RWLock
from ._session import Keeper
from ._shape import semaphore_kind
from .backends import parse_url

__all__ = ["Client", "connect"]

log = logging.getLogger("distlock")

_clients: weakref.WeakSet[Client] = weakref.WeakSet()


class Client:
    """A connection to a lock service. Thread-safe; one per process is plenty. Make locks with :meth:`lock`.

    ``fail_fast``: seconds to fail fast after the service did not answer (see :func:`connect`).
    """

    def __init__(self, backend: Backend, *, fail_fast: float = DEFAULT_FAIL_FAST) -> None:
        self._context = Context(backend, fail_fast)
        _clients.add(self)

    @property
    def description(self) -> str:
        """Where this client points, e.g. ``"etcd at 127.0.0.1:2379"``."""
        return self._context.description

    def __repr__(self) -> str:
        return f"<distlock.Client {self.description}{' closed' if self.closed else ''}>"

    def lock(self, name: str, **options: Unpack[LockOptions]) -> Lock:
        """A handle on lock ``name``: ``ttl`` is the lease length, ``timeout`` the default wait (see
        :class:`LockOptions` for every option and its default, :class:`Lock` for the handle)."""
        self._context.check_open()
        return Lock(self._context, name, **options)

    def async_lock(self, name: str, **options: Unpack[LockOptions]) -> AsyncLock:
        """The asyncio twin of :meth:`lock`."""
        return AsyncLock(self.lock(name, **options))

    def semaphore(self, name: str, limit: int, **options: Unpack[LockOptions]) -> Lock:
        """A handle on semaphore ``name``: at most ``limit`` handles hold it at once, in FIFO order, each with its
        own fencing token. The handle is a :class:`Lock` (same options, ``with``, ``token``, ``lost``...); a name is
        used with one limit at a time (``LockKindMismatch`` otherwise). Raises ``ConfigurationError`` for a
        ``limit`` that is not an int from 1 to 10,000."""
        self._context.check_open()
        kind = semaphore_kind(limit)
        self._context.require(KINDS, f"semaphore {name!r}")
        return Lock(self._context, name, kind=kind, **options)

    def async_semaphore(self, name: str, limit: int, **options: Unpack[LockOptions]) -> AsyncLock:
        """The asyncio twin of :meth:`semaphore`."""
        return AsyncLock(self.semaphore(name, limit, **options))

    def rwlock(self, name: str, **options: Unpack[LockOptions]) -> RWLock:
        """A read/write lock on ``name``: ``.read()`` and ``.write()`` make lock handles with these options (many
        readers or one writer, FIFO between them; see :class:`RWLock`)."""
        self._context.check_open()
        self._context.require(KINDS, f"read/write lock {name!r}")
        return RWLock(self._context, name, **options)

    def async_rwlock(self, name: str, **options: Unpack[LockOptions]) -> AsyncRWLock:
        """The asyncio twin of :meth:`rwlock`."""
        return AsyncRWLock(self.rwlock(name, **options))

    def multi_lock(self, names: Iterable[str], **options: Unpack[LockOptions]) -> MultiLock:
        """Locks on every name in ``names``, taken all or none in one canonical (sorted) order, so that two
        processes asking for the same names in different orders cannot deadlock; a token per name. The options
        apply to each lock; ``timeout`` bounds the whole acquisition (see :class:`MultiLock`)."""
        self._context.check_open()
        return MultiLock(self._context, names, **options)

    def async_multi_lock(self, names: Iterable[str], **options: Unpack[LockOptions]) -> AsyncMultiLock:
        """The asyncio twin of :meth:`multi_lock`."""
        return AsyncMultiLock(self.multi_lock(names, **options))

    def election(self, name: str, value: str | None = None, **options: Unpack[LockOptions]) -> Election:
        """A candidate in leader election ``name``, named ``value`` (default ``"host:pid"``): ``campaign()`` to
        lead, ``resign()``, ``leader()``, ``observe()``; the term is the leader's fencing token (see
        :class:`Election`). The options are a lock's, except ``owner``."""
        self._context.check_open()
        return Election(self._context, name, value, **options)

    def async_election(self, name: str, value: str | None = None, **options: Unpack[LockOptions]) -> AsyncElection:
        """The asyncio twin of :meth:`election`."""
        return AsyncElection(self.election(name, value, **options))

    def holder(self, name: str) -> Holder | None:
        """Who holds lock ``name`` now (its owner id, the token, the number of waiters), or None."""
        self._context.check_open()
        head = self._context.head(validate_name(name))
        return None if head is None else head.holder

    def read_mark(self, name: str, key: str) -> bytes | None:
        """Mark ``key`` of lock ``name`` as a holder wrote it (``Lock.write_mark``), or None when none was written
        or it expired. Raises ``ConfigurationError`` on a service that keeps no marks (a backend of
        your own that declares none; every service distlock ships keeps them),
        ``InvalidLockName`` for a bad name or key."""
        self._context.check_open()
        return self._context.read_mark(name, key)

    def force_release(self, name: str, token: int) -> bool:
        """Remove lock ``name``'s holder if its fencing token is still ``token``; True if removed, False if the lock
        has no holder or its holder has another token (a newer holder is never touched).

        For operators clearing a stuck lock (``distlock force-release``, the Django admin): the next waiter gets the
        lock at once, and the holder's handle becomes ``lost`` within about a third of its TTL. ``token`` is the
        holder's token as :meth:`holder` or :meth:`inspect` showed it. Raises ``InvalidLockName`` for a bad name
        and ``ConfigurationError`` for a token that is not a positive int.
        """
        self._context.check_open()
        validate_name(name)
        if isinstance(token, bool) or not isinstance(token, int) or token < 1:
            raise ConfigurationError(
                f"token must be the holder's fencing token, a positive int (as holder() shows it), not {token!r}"
            )
        released = self._context.release_at(name, token)
        if released:
            log.warning("distlock: lock %r force-released at token %d on %s", name, token, self.description)
        return released

    def inspect(self) -> list[LockState]:
        """Every lock with a holder or waiters under this client's prefix, in name order (for inspectors)."""
        self._context.check_open()
        backend = self._context.backend
        if not isinstance(backend, Inspectable):
            raise ConfigurationError(f"{self.description} cannot list its locks (no inspect() in this backend)")
        with self._context.open_for("inspect locks"):
            return backend.inspect()

    def close(self) -> None:
        """Revoke this client's leases (releasing every lock it holds) and close its connection."""
        context = self._context
        if context.closed:
            return
        context.closed = True
        try:
            context.keeper.close()
        finally:
            context.backend.close()

    @property
    def closed(self) -> bool:
        return self._context.closed

    # The backend and keeper, for this repository's tests and tooling (handles use their Context).
    @property
    def _backend(self) -> Backend:
        return self._context.backend

    @property
    def _keeper(self) -> Keeper:
        return self._context.keeper

    def _after_fork(self) -> None:
        self._context.backend.after_fork()
        self._context.keeper.after_fork()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def connect(url: str, **options: Any) -> Client:
    """Connect to the lock service at ``url`` (see the module docstring for URLs and options)."""
    check = bool(options.pop("check", True))
    fail_fast = fail_fast_seconds(options.pop("fail_fast", DEFAULT_FAIL_FAST))  # before anything is opened
    config = parse_url(url, **options)
    client = Client(config.open(), fail_fast=fail_fast)
    if check:
        try:
            client._backend.check()
        except BaseException:
            client.close()
            raise
    return client


def _after_fork_in_child() -> None:
    for client in list(_clients):
        client._after_fork()


def _close_all() -> None:
    for client in list(_clients):
        with contextlib.suppress(Exception):
            client.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all)
