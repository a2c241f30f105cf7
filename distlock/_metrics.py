"""Metrics through the OpenTelemetry API: how long locks are waited for and held, how many are lost, refused, failing.

The instruments (``distlock.lock.wait_time``, ``.hold_time``, ``.waiters``, ``.lost``, ``distlock.fence.refused``,
``distlock.backend.errors``, ``.fast_failures``) follow OpenTelemetry's connection-pool conventions (a lock is a pool
of one); what each records and its attributes are in docs/operations/metrics.md. Attributes are bounded:
``distlock.backend`` (the backend's package in ``distlock.backends``, or ``memory``) and ``distlock.lock.family``
(the ``family`` lock option), never the lock name. The meter is fetched at the first measurement, not at import,
so a ``MeterProvider`` set after ``import distlock`` still receives everything; without ``opentelemetry-api`` every
measurement does nothing.

What can go wrong: a metrics pipeline must never break a lock. An SDK may run the application's code on the recording
thread, so every measurement catches ``Exception``: the first is logged as a warning on the ``distlock`` logger,
later ones at debug level, and the lock carries on. A lock still held when its process dies records no hold time;
one still held when its client is closed counts as lost.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "ACQUIRED",
    "CANCELLED",
    "ERROR",
    "TIMEOUT",
    "acquire_ended",
    "acquire_started",
    "backend_error",
    "backend_label",
    "fast_failure",
    "fence_refused",
    "lock_attributes",
    "lock_lost",
    "lock_released",
]

log = logging.getLogger("distlock")

#: Values of ``distlock.lock.outcome`` on ``distlock.lock.wait_time``.
ACQUIRED = "acquired"
TIMEOUT = "timeout"
CANCELLED = "cancelled"
ERROR = "error"

BACKEND = "distlock.backend"
FAMILY = "distlock.lock.family"
OUTCOME = "distlock.lock.outcome"
ERROR_TYPE = "error.type"

# Lock waits run from a millisecond (uncontended) to minutes; holds from milliseconds to an hour-long job.
_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class _Histogram(Protocol):
    def record(self, amount: float, attributes: Mapping[str, str] | None = None) -> None: ...


class _Counter(Protocol):
    def add(self, amount: int, attributes: Mapping[str, str] | None = None) -> None: ...


class _Off:
    """What every instrument is when the OpenTelemetry API is not installed."""

    def record(self, amount: float, attributes: Mapping[str, str] | None = None) -> None:
        pass

    def add(self, amount: int, attributes: Mapping[str, str] | None = None) -> None:
        pass


@dataclass(frozen=True)
class _Instruments:
    wait_time: _Histogram
    hold_time: _Histogram
    waiters: _Counter
    lost: _Counter
    refused: _Counter
    backend_errors: _Counter
    fast_failures: _Counter


_OFF = _Instruments(_Off(), _Off(), _Off(), _Off(), _Off(), _Off(), _Off())
_instruments: _Instruments | None = None
_creating = threading.Lock()
_failures = 0


def _get() -> _Instruments:
    instruments = _instruments
    return instruments if instruments is not None else _create_once()


def _create_once() -> _Instruments:
    global _instruments
    with _creating:
        if _instruments is None:
            _instruments = _create()
        return _instruments


def _create() -> _Instruments:
    try:
        from opentelemetry import metrics
    except ImportError:
        return _OFF
    # distlock is imported whenever this module is (it is one of its modules); reading its version from sys.modules
    # avoids importing the package from inside it.
    version = str(getattr(sys.modules.get("distlock"), "__version__", ""))
    try:
        meter = metrics.get_meter("distlock", version)
        return _Instruments(
            wait_time=meter.create_histogram(
                "distlock.lock.wait_time",
                unit="s",
                description="How long acquiring a lock took, by outcome (acquired, timeout, cancelled, error)",
                explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
            ),
            hold_time=meter.create_histogram(
                "distlock.lock.hold_time",
                unit="s",
                description="How long a lock was held, from acquisition to release",
                explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
            ),
            waiters=meter.create_up_down_counter(
                "distlock.lock.waiters", unit="{waiter}", description="Lock acquisitions under way in this process"
            ),
            lost=meter.create_counter(
                "distlock.lock.lost", unit="{lock}", description="Locks lost while held (lease gone, max_hold passed)"
            ),
            refused=meter.create_counter(
                "distlock.fence.refused",
                unit="{write}",
                description="Writes the database refused because a newer lock holder had claimed the row",
            ),
            backend_errors=meter.create_counter(
                "distlock.backend.errors",
                unit="{error}",
                description="Failed attempts of requests to the lock service (retried or not), by error type",
            ),
            fast_failures=meter.create_counter(
                "distlock.backend.fast_failures",
                unit="{call}",
                description="Calls refused at once because the lock service had just not answered (circuit breaker)",
            ),
        )
    except Exception as e:
        _failed(e)
        return _OFF


def _failed(error: Exception) -> None:
    global _failures
    _failures += 1
    if _failures == 1:
        log.warning("distlock: recording a metric failed (%r); locks carry on, later failures log at debug", error)
    else:
        log.debug("distlock: recording a metric failed: %r", error)


@functools.cache
def backend_label(module: str) -> str:
    """The ``distlock.backend`` value of a backend defined in ``module``: ``distlock.backends.etcd._backend`` ->
    ``etcd``, ``distlock.testing._memory`` -> ``memory``.

    Each backend lives in a package of ``distlock.backends`` named after it (``distlock.backends.SCHEMES`` lists
    them), or, outside it, in a module named after it.
    """
    parts = module.split(".")
    if "backends" in parts[:-1]:
        return parts[parts.index("backends") + 1].lstrip("_")
    return parts[-1].lstrip("_")


def lock_attributes(backend_module: str, family: str | None) -> dict[str, str]:
    """The attributes every measurement of a lock carries (made once per handle)."""
    attributes = {BACKEND: backend_label(backend_module)}
    if family is not None:
        attributes[FAMILY] = family
    return attributes


def acquire_started(attributes: Mapping[str, str]) -> None:
    try:
        _get().waiters.add(1, attributes)
    except Exception as e:
        _failed(e)


def acquire_ended(attributes: Mapping[str, str], seconds: float, outcome: str) -> None:
    """An ``acquire()`` that :func:`acquire_started` counted ended after ``seconds`` with ``outcome``."""
    try:
        instruments = _get()
        instruments.waiters.add(-1, attributes)
        instruments.wait_time.record(seconds, {**attributes, OUTCOME: outcome})
    except Exception as e:
        _failed(e)


def lock_released(attributes: Mapping[str, str], seconds: float) -> None:
    try:
        _get().hold_time.record(seconds, attributes)
    except Exception as e:
        _failed(e)


def lock_lost(attributes: Mapping[str, str]) -> None:
    try:
        _get().lost.add(1, attributes)
    except Exception as e:
        _failed(e)


def fence_refused(family: str | None) -> None:
    try:
        _get().refused.add(1, {} if family is None else {FAMILY: family})
    except Exception as e:
        _failed(e)


def backend_error(backend_module: str, error_type: str) -> None:
    """One failed attempt of a request to a backend defined in ``backend_module``."""
    try:
        _get().backend_errors.add(1, {BACKEND: backend_label(backend_module), ERROR_TYPE: error_type})
    except Exception as e:
        _failed(e)


def fast_failure(backend: str) -> None:
    """One call refused by a circuit breaker (``_breaker``) of a client of ``backend`` (its label)."""
    try:
        _get().fast_failures.add(1, {BACKEND: backend})
    except Exception as e:
        _failed(e)
