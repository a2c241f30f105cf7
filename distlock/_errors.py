"""The exceptions distlock raises, all under one root; client libraries' errors (grpc, redis-py, kazoo, SQLAlchemy) are
translated at the backend boundary and kept as ``__cause__``::

    DistlockError
    ├── ConfigurationError (also ValueError)   a bad URL, option or argument; a missing extra
    │   ├── InvalidLockName                    empty, too long, control characters, not text
    │   └── InvalidKeyTemplate                 a malformed lock-name template, or a field the call lacks
    ├── BackendError                           the lock service failed us
    │   ├── BackendUnavailable (also ConnectionError)
    │   │                                      unreachable, timed out, no leader; names the endpoint
    │   └── AuthenticationFailed               wrong user or password, or permission denied
    ├── LockError                              about one lock; carries ``name``
    │   ├── LockNotAcquired                    not acquired within ``timeout`` (or at once when not blocking)
    │   ├── LockNotOwned                       released or read while this handle does not hold it
    │   ├── LockLost                           the lease behind it expired, was revoked, or the hold time ran out
    │   └── LockKindMismatch                   one name used as two primitives at once (a lock and a semaphore, ...)
    ├── ClientClosed                           the client was closed (a wait on it ends with this too)
    ├── StaleFenceToken                        the database refused a write made with an older fencing token
    └── UnfencedWrite                          strict mode: a write to a fenced row without its lock's token

``LockLost`` says the lock *may already be held by someone else*: only fenced writes still protect the work.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationFailed",
    "BackendError",
    "BackendUnavailable",
    "ClientClosed",
    "ConfigurationError",
    "DistlockError",
    "InvalidKeyTemplate",
    "InvalidLockName",
    "LockError",
    "LockKindMismatch",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "StaleFenceToken",
    "UnfencedWrite",
]


class DistlockError(Exception):
    """Root of every error distlock raises on purpose."""


class ConfigurationError(DistlockError, ValueError):
    """A URL, option or argument that cannot work; the message says which and what would."""


class InvalidLockName(ConfigurationError):
    """A lock name that cannot be used as a key: empty, too long, with control characters, or not text."""


class InvalidKeyTemplate(ConfigurationError):
    """A lock-name template that cannot be parsed, or a call that lacks a field the template names."""


class BackendError(DistlockError):
    """The lock service (etcd, Redis) did not do what was asked."""


class BackendUnavailable(BackendError, ConnectionError):
    """The lock service could not be reached, or did not answer in time."""


class AuthenticationFailed(BackendError):
    """The lock service refused the credentials (or their permissions)."""


class LockError(DistlockError):
    """An error about one lock; ``name`` is the lock's name."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class LockNotAcquired(LockError):
    """The lock was not acquired: it was held and the wait ran out (or waiting was not allowed)."""


class LockNotOwned(LockError):
    """An operation that needs the lock held was called on a handle that does not hold it."""


class LockLost(LockError):
    """The lock was held, but is no longer known to be: its lease expired or was revoked, or its hold time ran out.

    Another process may hold it now. Only fenced writes are still safe.
    """


class LockKindMismatch(LockError):
    """A lock name used as two different primitives at once (a lock and a semaphore, two semaphore limits, a
    read/write lock and a plain lock): its queue could not say who holds. Use one kind (and one limit) per name."""


class ClientClosed(DistlockError):
    """The client was closed (``close()``, the end of its ``with`` block, or interpreter exit): nothing more can be
    done with it, and a call that was waiting on it when it closed ends with this error. Its leases were revoked, so
    every lock it held is released."""


class StaleFenceToken(DistlockError):
    """The database rejected a fenced write: a newer lock holder has claimed the row.

    ``token`` is the token the write carried, ``row`` identifies the row (a primary key or the model instance),
    ``current`` is the token found on the row when it could be read.
    """

    def __init__(self, message: str, *, token: int | None = None, row: Any = None, current: int | None = None):
        super().__init__(message)
        self.token = token
        self.row = row
        self.current = current


class UnfencedWrite(DistlockError):
    """Strict fencing: a write to a fenced row was attempted without holding the lock that guards it."""


# Tracebacks, reprs and pickles name each error where users import it from (``distlock.LockLost``), not this module.
for _error in (globals()[_name] for _name in __all__):
    _error.__module__ = "distlock"
del _error
