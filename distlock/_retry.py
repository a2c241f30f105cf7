"""The one retry loop of every backend: attempts with exponential back-off until a deadline, errors translated once.

Each backend brings an :class:`ErrorTable`: which of its client library's exceptions may be retried, what can be
repaired before trying again (an expired etcd auth token, a Redis Cluster's slot map), and which distlock error each
becomes (``BackendUnavailable``, ``AuthenticationFailed``, ``LeaseGone``, ``BackendError``). :func:`retrying` sleeps
20 ms after the first failure, doubling up to ``max_backoff``, never past the deadline, and hands each try an
:class:`Attempt` with its own deadline (earlier with ``attempt_budget``, so one member that does not answer costs
one short attempt). Why a request may be sent again, and the back-off: docs/design.md, "Retries".

What can go wrong: when the next pause would end after the deadline, the last error is translated and raised (a
retryable one as ``BackendUnavailable``) with the client library's exception as ``__cause__``. An exception the
table does not know (a distlock error raised inside the attempt, a programming error) passes through unchanged and
uncounted; every translated failure, retried or not, is counted in ``distlock.backend.errors``. What a timed-out
attempt means is the backend's call: only a request safe to send twice may be retried after one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from . import _clock, _metrics
from ._errors import BackendError, BackendUnavailable

__all__ = ["Attempt", "ErrorTable", "retrying"]

_R = TypeVar("_R")

_FIRST_BACKOFF = 0.02
_MAX_BACKOFF = 0.5


@dataclass(frozen=True)
class Attempt:
    """One try of a request: its ``number`` (1 for the first) and the clock time it must have answered by."""

    number: int
    deadline: float

    @property
    def timeout(self) -> float:
        """Seconds left for this attempt (may be <= 0 when its deadline has passed)."""
        return self.deadline - _clock.now()


def _never(error: Exception, deadline: float) -> bool:
    return False


@dataclass(frozen=True)
class ErrorTable:
    """How one backend's client errors read.

    ``retryable(error)``: the error means "not now", try again after a pause. ``translate(error, what)``: the
    distlock error to raise instead (None: not a client error, let it through unchanged); a function or method of the
    backend's package, whose module names the backend in ``distlock.backend.errors``. ``recover(error,
    deadline)``: repair what the error says is broken before the next attempt; True when that repair makes an
    immediate retry worthwhile (allowed once per request), False to go on with the usual rules.
    """

    description: str
    retryable: Callable[[Exception], bool]
    translate: Callable[[Exception, str], BackendError | None]
    recover: Callable[[Exception, float], bool] = _never


def retrying(
    what: str,
    attempt: Callable[[Attempt], _R],
    deadline: float,
    errors: ErrorTable,
    attempt_budget: Callable[[int], float] | None = None,
    max_backoff: float = _MAX_BACKOFF,
) -> tuple[_R, int]:
    """Run ``attempt`` until it answers or ``deadline`` passes; return its answer and the number of attempts made.

    ``what`` names the request in error messages ("enqueue for lock 'x'"). ``attempt_budget(number)``, when given,
    is how many seconds attempt ``number`` may take at most (never past ``deadline``).
    """
    delay = _FIRST_BACKOFF
    number = 0
    recovered = False
    last_error: Exception | None = None
    while True:
        if _clock.now() >= deadline:
            raise BackendUnavailable(f"{what}: {errors.description} did not answer in time") from last_error
        number += 1
        try:
            bound = deadline if attempt_budget is None else min(deadline, _clock.now() + attempt_budget(number))
            return attempt(Attempt(number, bound)), number
        except Exception as error:
            last_error = error
            translated = errors.translate(error, what)
            if translated is not None:
                # The table was built in the backend's own module: that names the backend (see _metrics).
                _metrics.backend_error(getattr(errors.translate, "__module__", ""), type(translated).__name__)
            if not recovered and errors.recover(error, deadline):
                recovered = True
                continue
            if errors.retryable(error) and _clock.now() + delay < deadline:
                time.sleep(delay)
                delay = min(delay * 2, max_backoff)
                continue
            if translated is None:
                raise
            raise translated from error
