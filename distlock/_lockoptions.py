"""The options every lock handle takes (:class:`LockOptions`), and their one check.

``client.lock()``, ``async_lock()``, ``semaphore()``, ``rwlock()``, ``multi_lock()`` and ``election()`` all take these
keyword options; :func:`check_options` checks them, with the lock's name, where they are given (a handle, a read/write
lock), so a bad value fails when the handle is made, never at the first acquire, and returns the durations it read.

What can go wrong: an unknown option is a ``TypeError`` naming the known ones; a bad name raises ``InvalidLockName``
and a bad owner, family, ``stop_on_lost`` or duration a ``ConfigurationError`` (durations through the one validator,
``_seconds``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypedDict

from ._errors import ConfigurationError
from ._names import validate_name
from ._seconds import seconds

if TYPE_CHECKING:
    from ._lock import Lock

__all__ = ["Durations", "LockOptions", "check_options"]


class LockOptions(TypedDict, total=False):
    """The keyword options of ``client.lock(name, ...)`` and ``client.async_lock(name, ...)``, all optional.

    ``ttl`` (default 30 s): the lease, how long the lock outlives a holder that stopped answering. ``timeout``
    (default 60 s): how long ``acquire()`` and ``with`` wait; ``math.inf`` waits forever, 0 does not wait.
    ``max_hold`` (default None, no bound): the most the lock may be held at all. ``on_lost(lock)`` (default None):
    called on the client's clean-up thread when the lock becomes lost (it may be slow: lease refreshes do not
    wait for it). ``owner`` (default: a random id per acquisition):
    the id ``client.holder(name).owner`` reports while this handle holds the lock. ``family`` (default None): what
    the lock's metrics are grouped by (the ``distlock.lock.family`` attribute), a bounded label such as the template
    the name was rendered from (``"account:{pk}"``), never the name itself; the integrations set it.
    ``stop_on_lost`` (default False): ``with`` and ``async with`` on the handle run their body in the handle's
    ``scope()``, which stops the body when the lock is lost (asyncio: the task is cancelled; the main thread: a
    signal interrupts it; ``LockLost`` is raised in the body; docs/lost.md).
    """

    ttl: float
    timeout: float
    max_hold: float | None
    on_lost: Callable[[Lock], None] | None
    owner: str | None
    family: str | None
    stop_on_lost: bool


_KNOWN_OPTIONS = ", ".join(sorted(LockOptions.__optional_keys__))


class Durations(NamedTuple):
    """A handle's durations in seconds, defaults filled in: the lease, the wait, the most it may be held."""

    ttl: float
    timeout: float
    max_hold: float | None


def check_options(name: str, options: LockOptions) -> Durations:
    """Check a lock's name and the options of :class:`LockOptions`, where they are given (a handle, a read/write
    lock): ``TypeError`` for an unknown option, ``ConfigurationError`` for a bad value. Returns the durations read."""
    unknown = options.keys() - LockOptions.__optional_keys__
    if unknown:
        raise TypeError(f"unexpected lock option(s) {', '.join(sorted(unknown))}; known: {_KNOWN_OPTIONS}")
    validate_name(name)
    for option, what in (("owner", "owner"), ("family", "family (the lock's metrics label)")):
        value = options.get(option)
        if value is not None and (not isinstance(value, str) or not value.isprintable() or not 0 < len(value) <= 256):
            raise ConfigurationError(f"{what} must be a printable str of 1 to 256 characters, not {value!r}")
    if not isinstance(options.get("stop_on_lost", False), bool):
        raise ConfigurationError(f"stop_on_lost must be True or False, not {options['stop_on_lost']!r}")
    return Durations(
        ttl=seconds(options.get("ttl", 30.0), "ttl (the lease length)"),
        timeout=seconds(
            options.get("timeout", 60.0), "timeout (how long to wait)", allow_zero=True, allow_forever=True
        ),
        max_hold=seconds(options.get("max_hold"), "max_hold", allow_none=True),
    )
