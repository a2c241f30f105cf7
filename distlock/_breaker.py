"""The circuit breaker: once the lock service did not answer, fail fast for a while instead of asking it again.

A call that ends in ``BackendUnavailable`` (the service unreachable, frozen, or slower than ``request_timeout``)
opens the breaker for ``fail_fast`` seconds (a ``connect()`` option, default :data:`DEFAULT_FAIL_FAST`; 0 turns it
off). While it is open, :meth:`Breaker.admit` raises ``BackendUnavailable`` at once, saying since when and until
when it fails fast, with the failure that opened it as ``__cause__``: a web request gets its answer now instead of
waiting out another ``request_timeout``. When the interval is over, one call is admitted as the probe (half-open)
while the others still fail fast; any answer from the service closes the breaker, another ``BackendUnavailable``
opens it for a new interval. Each client has one (``Context``: new work — acquiring, reads, inspect, force release
— is admitted by it, every call reports to it); ``ClientCache`` keeps one per URL and options, for connects.

What the breaker never stops: the keeper's lease refreshes and the removal of keys (release, give-up, orphan
retries) go to the service as before, so a held lock is kept as long as its lease can be and a release is retried
in the background. What can go wrong: a bad ``fail_fast`` raises ``ConfigurationError`` where it enters; a probe
that hangs keeps the others failing fast for up to its ``request_timeout``. Fast failures are counted in
``distlock.backend.fast_failures``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from . import _clock, _metrics
from ._errors import BackendUnavailable, DistlockError
from ._seconds import seconds

__all__ = ["DEFAULT_FAIL_FAST", "Breaker", "fail_fast_seconds"]

#: Seconds a client fails fast after the lock service did not answer, unless ``connect(fail_fast=...)`` says.
DEFAULT_FAIL_FAST = 5.0


def fail_fast_seconds(value: object) -> float:
    """``value`` as a ``fail_fast`` interval, or ``ConfigurationError``."""
    return seconds(
        value, "fail_fast (seconds to fail fast after the lock service did not answer; 0: never)", allow_zero=True
    )


def _clock_time(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%H:%M:%S UTC")


class FailingFast(BackendUnavailable):
    """The breaker's own ``BackendUnavailable`` (private: callers catch ``BackendUnavailable``); not a new failure."""


class Breaker:
    """Closed (calls go through), open until a time (calls fail fast), or half-open (one probe is under way)."""

    def __init__(self, fail_fast: object, backend: str) -> None:
        self.interval = fail_fast_seconds(fail_fast)
        self._backend = backend  # its metrics label (``_metrics.backend_label``)
        self._mutex = threading.Lock()
        self._until: float | None = None  # on distlock's clock; None: closed
        self._since = 0.0  # wall-clock time of the failure that opened it (for messages)
        self._cause: BaseException | None = None
        self._prober: int | None = None  # the thread probing (half-open), which its nested calls pass too

    @contextlib.contextmanager
    def call(self, what: str, *, admit: bool = True) -> Iterator[None]:
        """Run the block, a call to the service: :meth:`admit` it first (unless ``admit`` is false), then report how it
        ended."""
        if admit:
            self.admit(what)
        try:
            yield
        except BaseException as e:
            self.ended(e)
            raise
        self.ended(None)

    def admit(self, what: str) -> None:
        """Return if ``what`` may go to the service; raise ``BackendUnavailable`` at once if the breaker is open."""
        if self._until is None:
            return
        me = threading.get_ident()
        with self._mutex:
            until = self._until
            if until is None or self._prober == me:
                return
            now = _clock.now()
            if now >= until and self._prober is None:
                self._prober = me
                return
            cause, since = self._cause, self._since
        _metrics.fast_failure(self._backend)
        wall_until = time.time() + max(until - now, 0.0)
        raise FailingFast(
            f"{what}: failing fast since {_clock_time(since)} until {_clock_time(wall_until)} (fail_fast="
            f"{self.interval:g} s; then one call tries again) after: {cause}"
        ) from cause

    def ended(self, error: BaseException | None) -> None:
        """A call to the service ended: with ``error`` (None: it answered)."""
        if self.interval == 0 or isinstance(error, FailingFast):
            return
        me = threading.get_ident()
        with self._mutex:
            if isinstance(error, BackendUnavailable):
                if self._until is None:
                    self._since = time.time()
                self._until = _clock.now() + self.interval
                self._cause = error
                self._prober = None
            elif error is None or isinstance(error, DistlockError):  # another distlock error: the service answered
                self._until = None
                self._cause = None
                self._prober = None
            elif self._prober == me:  # neither an answer nor a failure (cancelled, a bug): let another call probe
                self._prober = None
