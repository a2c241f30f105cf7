"""``once=True``: a task id's body runs once across deliveries of its message, remembered by a mark of its lock.

With ``acks_late`` a broker delivers a message again when it was not acknowledged in time (Redis's
``visibility_timeout``) or its worker died, and a copy that arrives after the first delivery finished would run the
body again (celery#5935). So a run that ends (returning, failing, or calling ``self.retry()``) marks its task id
and attempt on its lock before releasing it (:func:`remember`, ``Lock.write_mark``: written only while the lock is
held, fenced by its token), and a delivery that then gets the lock reads the mark first (:func:`already_ran`): a
mark of this attempt (``request.retries``) or a later one means the body ran, and the delivery is acknowledged
without running it. The mark expires after ``once_ttl``. A run killed mid-body marks nothing, so its redelivery
runs: at least once, as ``acks_late`` intends. ``Reject`` marks nothing (the task asked for its message back).

What can go wrong: a lock service without marks (a backend of your own that declares none) raises
``ConfigurationError`` at the read; a run whose lock was lost cannot mark (``LockLost``, logged: a redelivery may
run it again, and its fenced writes were refused anyway); a mark that cannot be read as one is logged and counts as
none.
"""

from __future__ import annotations

import json
import logging

from celery.exceptions import Ignore, Reject, Retry

import distlock
from distlock import DistlockError, LockLost

__all__ = ["already_ran", "outcome_of", "remember"]

log = logging.getLogger("distlock.celery")


def already_ran(client: distlock.Client, name: str, task_id: str, attempt: int, where: str) -> bool:
    """Whether attempt ``attempt`` of task ``task_id``, or a later one, ended under lock ``name`` (logged if so)."""
    value = client.read_mark(name, task_id)
    if value is None:
        return False
    try:
        mark = json.loads(value)
        marked, outcome = int(mark["attempt"]), str(mark["outcome"])
    except (ValueError, KeyError, TypeError):
        log.error("distlock.celery: %s: mark %r of lock %r is not one of ours; running", where, value[:200], name)
        return False
    if marked < attempt:
        return False
    log.warning(
        "distlock.celery: %s already ran (attempt %d ended: %s); this delivery is acknowledged without running it",
        where,
        marked,
        outcome,
    )
    return True


def outcome_of(error: BaseException | None) -> str | None:
    """What the end of a run marks: how its body ended, or None for an end that leaves the task to run again
    (``Reject``; ``SystemExit`` and the like, which are not the body's end)."""
    if error is None:
        return "success"
    if isinstance(error, Retry):
        return "retry"
    if isinstance(error, Ignore):
        return "ignored"
    if isinstance(error, Reject) or not isinstance(error, Exception):
        return None
    return "failure"


def remember(lock: distlock.Lock, task_id: str, attempt: int, outcome: str, ttl: float, where: str) -> None:
    """Mark attempt ``attempt`` of ``task_id`` as ended with ``outcome`` on ``lock`` (held) for ``ttl`` s."""
    value = json.dumps({"attempt": attempt, "outcome": outcome}).encode()
    try:
        lock.write_mark(task_id, value, ttl)
    except LockLost as e:
        log.error("distlock.celery: %s ran, but cannot say so: %s (a redelivery may run it again)", where, e)
    except DistlockError as e:
        log.error("distlock.celery: %s ran, but could not say so: %s (a redelivery may run it again)", where, e)
