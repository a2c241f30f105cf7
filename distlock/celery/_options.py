"""The options of a singleton task: their defaults, their checks, and how a call overrides them.

A task sets them as class attributes (``@app.task(base=SingletonTask, lock_ttl=10, ...)``); a call overrides any of
them, and the lock name, with ``apply_async(..., singleton={"on_duplicate": "raise", "key": "report:7"})``. The
overrides travel to the worker in the message headers, so the worker applies what the caller chose. Every value is
checked where it is given — a task's when Celery creates the task class, a call's in ``apply_async`` before anything
is sent — and a bad one raises ``ConfigurationError`` naming the option and what would work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from distlock import ConfigurationError, seconds

__all__ = ["CALL_KEYS", "LOCK_ON", "ON_DUPLICATE", "ON_UNAVAILABLE", "Options"]

LockOn = Literal["run", "enqueue"]
OnDuplicate = Literal["skip", "retry", "raise", "result"]
OnUnavailable = Literal["fail", "retry"]

ON_UNAVAILABLE: tuple[OnUnavailable, ...] = ("fail", "retry")

LOCK_ON: tuple[LockOn, ...] = ("run", "enqueue")
ON_DUPLICATE: dict[LockOn, tuple[OnDuplicate, ...]] = {
    "run": ("skip", "retry", "raise"),
    "enqueue": ("result", "raise"),
}
DEFAULT_ON_DUPLICATE: dict[LockOn, OnDuplicate] = {"run": "skip", "enqueue": "result"}

#: Task attribute -> field of :class:`Options`.
_ATTRIBUTES = {
    "lock_on": "lock_on",
    "on_duplicate": "on_duplicate",
    "lock_ttl": "ttl",
    "lock_timeout": "timeout",
    "lock_max_hold": "max_hold",
    "lock_max_queued": "max_queued",
    "duplicate_retry_delay": "retry_delay",
    "lock_limit": "limit",
    "on_unavailable": "on_unavailable",
    "unavailable_retry_delay": "unavailable_retry_delay",
    "abort_on_lost": "abort_on_lost",
    "once": "once",
    "once_ttl": "once_ttl",
}
#: What ``singleton={...}`` may hold in one call: the task attributes, and ``key`` (a lock name for this call).
CALL_KEYS = frozenset({*_ATTRIBUTES, "key"})


@dataclasses.dataclass(frozen=True)
class Options:
    """The effective options of one task, or of one call of it.

    ``ttl`` is the lease (how long the lock outlives a worker that died), ``timeout`` how long a worker waits for a
    busy lock before the call counts as a duplicate, ``max_hold`` the most a run may hold the lock, ``max_queued``
    how long an enqueue-time reservation waits for a worker to take the task over (default: ``ttl``), and
    ``retry_delay`` the countdown of ``on_duplicate="retry"``, and ``limit`` (None: one) how many runs may hold the
    lock name at once (a semaphore; ``lock_on="run"`` only). ``on_unavailable`` is what a run does when the lock
    service cannot be reached: ``"fail"`` (raise ``BackendUnavailable``) or ``"retry"`` (after
    ``unavailable_retry_delay``). ``abort_on_lost`` raises ``LockLost`` inside the running body when its lock is lost.
    ``once`` runs a task id's body once across deliveries, remembering a finished one for ``once_ttl`` s.
    """

    lock_on: LockOn = "run"
    on_duplicate: OnDuplicate = "skip"
    ttl: float = 30.0
    timeout: float = 0.0
    max_hold: float | None = None
    max_queued: float | None = None
    retry_delay: float = 5.0
    limit: int | None = None
    on_unavailable: OnUnavailable = "fail"
    unavailable_retry_delay: float = 5.0
    abort_on_lost: bool = False
    once: bool = False
    #: Celery's ``result_expires`` default: a task id is remembered as long as its result is, by default.
    once_ttl: float = 86400.0

    @property
    def queued_for(self) -> float:
        """How long an enqueue-time reservation may wait for its worker."""
        return self.ttl if self.max_queued is None else self.max_queued

    @classmethod
    def from_task(cls, task: Any, where: str) -> Options:
        """The options a task class declares (its attributes, None meaning the default)."""
        given = {attribute: getattr(task, attribute, None) for attribute in _ATTRIBUTES}
        return cls().merged({k: v for k, v in given.items() if v is not None}, where)

    def merged(self, overrides: Mapping[str, Any], where: str) -> Options:
        """These options with ``overrides`` (task attribute names) applied and checked."""
        if not overrides:
            return self  # checked when made (every Options comes from here), and a call without overrides is common
        unknown = set(overrides) - set(_ATTRIBUTES)
        if unknown:
            raise ConfigurationError(
                f"{where}: unknown singleton option(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(CALL_KEYS))}"
            )
        fields = {_ATTRIBUTES[name]: value for name, value in overrides.items()}
        lock_on = fields.get("lock_on", self.lock_on)
        if lock_on not in LOCK_ON:
            raise ConfigurationError(f"{where}: lock_on must be 'run' or 'enqueue', not {lock_on!r}")
        if "on_duplicate" not in fields and lock_on != self.lock_on and self.on_duplicate not in ON_DUPLICATE[lock_on]:
            fields["on_duplicate"] = DEFAULT_ON_DUPLICATE[lock_on]
        on_duplicate = fields.get("on_duplicate", self.on_duplicate)
        if on_duplicate not in ON_DUPLICATE[lock_on]:
            choices = ", ".join(repr(c) for c in ON_DUPLICATE[lock_on])
            raise ConfigurationError(
                f"{where}: on_duplicate={on_duplicate!r} does not work with lock_on={lock_on!r}; "
                f"choose one of {choices}"
            )
        if fields.get("on_unavailable", self.on_unavailable) not in ON_UNAVAILABLE:
            raise ConfigurationError(
                f"{where}: on_unavailable must be 'fail' or 'retry', not {fields['on_unavailable']!r}"
            )
        for flag in ("abort_on_lost", "once"):
            if not isinstance(fields.get(flag, getattr(self, flag)), bool):
                raise ConfigurationError(f"{where}: {flag} must be True or False, not {fields[flag]!r}")
        options = dataclasses.replace(self, **fields)
        seconds(options.ttl, f"{where}: lock_ttl (the lease length)")
        seconds(options.timeout, f"{where}: lock_timeout (how long a worker waits for a busy lock)", allow_zero=True)
        seconds(options.retry_delay, f"{where}: duplicate_retry_delay", allow_zero=True)
        seconds(options.unavailable_retry_delay, f"{where}: unavailable_retry_delay", allow_zero=True)
        seconds(options.max_hold, f"{where}: lock_max_hold", allow_none=True)
        seconds(options.max_queued, f"{where}: lock_max_queued", allow_none=True)
        seconds(options.once_ttl, f"{where}: once_ttl (how long a finished task id is remembered)")
        limit = options.limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000):
            raise ConfigurationError(f"{where}: lock_limit must be an int from 1 to 10000 (or None), not {limit!r}")
        if options.on_unavailable == "retry" and options.lock_on == "enqueue":
            raise ConfigurationError(
                f"{where}: on_unavailable='retry' works with lock_on='run' only (the retry of an enqueue-time "
                "reservation would need the lock service to send it)"
            )
        if limit is not None and options.lock_on == "enqueue":
            raise ConfigurationError(
                f"{where}: lock_limit works with lock_on='run' only (an enqueue-time reservation is one holder)"
            )
        return options
