"""``SingletonTask``: the Celery ``Task`` base that runs one call per lock name at a time, on distlock leases.

``apply_async`` (also ``delay``, signatures, chains and ``self.retry()``) puts the lock name and the call's option
overrides into the message headers; with ``lock_on="enqueue"`` it first takes the lock as a reservation owned by
the new task id, or answers a duplicate at once and sends nothing. In the worker, ``__call__`` takes the lock before
the body runs (taking over the reservation, ``_handover``, else directly), the client's keeper renews it while the
body runs (``self.lock``), and the end of the run releases it, checked against its token; ``self.retry()`` keeps it
for the retry message instead. The life cycle and the options: docs/integrations/celery.md.

What can go wrong: a call whose lock another task holds is a duplicate (skipped, retried, or ``DuplicateTask``); a
run that cannot reach the lock service fails with ``BackendUnavailable`` or, with ``on_unavailable="retry"``, is
retried (``self.retry``, counted against ``max_retries``); a
redelivered copy of a task that still holds the lock waits up to ``ttl`` plus a grace period for a dead holder's
lease to lapse and is dropped (``Ignore``) if the holder lives: never run beside it. A lock lost mid-run stops the
body only with ``abort_on_lost=True`` (``LockLost`` raised in it, prefork and solo pools; ``ConfigurationError`` on
the others): otherwise only fenced writes stay safe, and the release logs an error. With ``once=True`` a delivery
of a task id whose run already ended is acknowledged without running (``_once``). ``send_task()`` bypasses this
class in the sender: no enqueue-time check or reservation, duplicates are only found when they run.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as dt
import inspect
import logging
import threading
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore, Retry

import distlock
from distlock import (
    BackendUnavailable,
    ConfigurationError,
    DistlockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)

from ._config import get_client
from ._handover import RESERVATIONS, TAKEOVER_GRACE, take_over
from ._keys import KeySpec, run_signature
from ._once import already_ran, outcome_of, remember
from ._options import Options

__all__ = ["HEADER", "DuplicateTask", "SingletonTask"]

log = logging.getLogger("distlock.celery")

#: The message header that carries the lock name, the call's option overrides and a reservation token.
HEADER = "distlock"
_OWNER_PREFIX = "celery-task:"


class DuplicateTask(LockNotAcquired):
    """Another call of a singleton task holds its lock (queued or running).

    ``name`` is the lock name, ``task_id`` the id of the task holding it (None when the holder is not a task of this
    integration), ``token`` the holder's fencing token. The attributes survive Celery's result backend.
    """

    def __init__(
        self, message: str, name: str | None = None, task_id: str | None = None, token: int | None = None
    ) -> None:
        super().__init__(message, name=name)
        self.task_id = task_id
        self.token = token
        self.args = (message, name, task_id, token)

    def __str__(self) -> str:
        return str(self.args[0])


DuplicateTask.__module__ = "distlock.celery"


@dataclasses.dataclass(eq=False)
class _Run:
    """One run of a singleton task in the current context: its lock, and how long a retry may keep that lock."""

    task: SingletonTask
    task_id: str | None
    lock: distlock.Lock
    retry_hold_for: float | None = None


_runs: contextvars.ContextVar[tuple[_Run, ...]] = contextvars.ContextVar("distlock_celery_runs", default=())


def _current_run(task: SingletonTask) -> _Run | None:
    for run in reversed(_runs.get()):
        if run.task is task:
            return run
    return None


@dataclasses.dataclass(frozen=True)
class _Busy:
    """Why a run did not get its lock: the holder, and whether it is a delivery of this very task."""

    holder: distlock.Holder | None
    same_task: bool = False


def _owner(task_id: str | None) -> str:
    return f"{_OWNER_PREFIX}{task_id}" if task_id else f"celery-call:{uuid.uuid4().hex}"


def _task_id_of(holder: distlock.Holder | None) -> str | None:
    if holder is None or not holder.owner.startswith(_OWNER_PREFIX):
        return None
    return holder.owner[len(_OWNER_PREFIX) :]


class SingletonTask(Task):  # type: ignore[type-arg]
    """A Celery task base: one call per lock name at a time, on distlock leases.

    Use it as ``@app.task(base=SingletonTask, ...)`` with these optional task options (each can be overridden per
    call with ``apply_async(..., singleton={...})``, which also takes ``key``, a lock name for that call):

    - ``unique_on``: which arguments make two calls the same: a list of parameter names, or a key template such as
      ``"report:{customer_id}"`` (default: the task name and all bound arguments). Checked at task definition.
    - ``lock_on``: ``"run"`` (default; one call running at a time) or ``"enqueue"`` (one call queued or running).
    - ``on_duplicate``: what a duplicate gets. ``lock_on="run"``: ``"skip"`` (default; the duplicate does not run: its
      result is None), ``"retry"`` (``self.retry()`` after ``duplicate_retry_delay`` s, counted against
      ``max_retries``) or ``"raise"`` (the duplicate fails with :class:`DuplicateTask`). ``lock_on="enqueue"``:
      ``"result"`` (default; ``apply_async`` returns the existing task's ``AsyncResult`` and sends nothing) or
      ``"raise"`` (``apply_async`` raises :class:`DuplicateTask` carrying the existing task id).
    - ``lock_ttl`` (default 30 s): the lease, i.e. how long the lock outlives a worker that died. Not the run time:
      the lease is renewed while the task runs.
    - ``lock_max_hold`` (default none): the longest a run may hold the lock; past it the lock is released and marked
      lost even if the task still runs.
    - ``lock_timeout`` (default 0): how long a worker waits for a busy lock before the call counts as a duplicate.
    - ``lock_max_queued`` (default ``lock_ttl``): how long an enqueue-time reservation (or the lock kept for a
      retry) waits for a worker to take it over, counted from when the task is due (its eta or countdown).
    - ``duplicate_retry_delay`` (default 5 s): the countdown of ``on_duplicate="retry"``.
    - ``lock_limit`` (default none: one): at most this many runs per lock name at once (the name is a semaphore, each
      run with its own token); ``lock_on="run"`` only. A retry of such a run does not keep its slot: it queues again.
    - ``on_unavailable``: what a run does when the lock service cannot be reached (``BackendUnavailable``, also at
      once while the client fails fast): ``"fail"`` (default; the task fails with it) or ``"retry"``
      (``self.retry()`` after ``unavailable_retry_delay`` s, default 5, counted against ``max_retries``; a direct
      call raises). The body does not run either way. ``apply_async`` with ``lock_on="enqueue"`` always raises it.
    - ``abort_on_lost`` (default False): when the run's lock is lost (its lease lapsed, ``lock_max_hold`` passed, or
      it was force-released), raise ``LockLost`` inside the running body (``self.lock.scope()``, by a signal to the
      main thread: prefork and solo pools only; elsewhere the run raises ``ConfigurationError``). The task fails with
      it, or retries with ``autoretry_for=(LockLost,)``; the lock is free for the next run.
    - ``once`` (default False): a task id's body runs once across deliveries of its message (``acks_late``
      redeliveries, a broker's ``visibility_timeout``): a run that ends marks its task id on its lock, and a later
      delivery of that attempt finds the mark and is acknowledged without running (``Ignore``: the first run's
      result stays). A run killed mid-body runs again. Needs a lock service with marks (every service distlock
      ships): elsewhere the run raises ``ConfigurationError``. ``once_ttl`` (default 86400 s, Celery's
      ``result_expires`` default): how long a finished task id is remembered.
    """

    unique_on: ClassVar[object] = None
    lock_on: ClassVar[str | None] = None
    on_duplicate: ClassVar[str | None] = None
    lock_ttl: ClassVar[float | None] = None
    lock_timeout: ClassVar[float | None] = None
    lock_max_hold: ClassVar[float | None] = None
    lock_max_queued: ClassVar[float | None] = None
    duplicate_retry_delay: ClassVar[float | None] = None
    lock_limit: ClassVar[int | None] = None
    on_unavailable: ClassVar[str | None] = None
    unavailable_retry_delay: ClassVar[float | None] = None
    abort_on_lost: ClassVar[bool | None] = None
    once: ClassVar[bool | None] = None
    once_ttl: ClassVar[float | None] = None

    _singleton_options: ClassVar[Options] = Options()
    _singleton_keys: ClassVar[KeySpec | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        where = f"task {cls.__dict__.get('name') or cls.__qualname__!r}"
        cls._singleton_options = Options.from_task(cls, where)
        if inspect.getattr_static(cls, "run") is not inspect.getattr_static(Task, "run"):
            cls._singleton_keys = KeySpec(where, run_signature(cls), cls.unique_on)
        elif cls.unique_on is not None:
            raise ConfigurationError(f"{where}: unique_on is set but the class has no run() to check it against")

    # -- the running task's lock ------------------------------------------------------------------------------

    @property
    def lock(self) -> distlock.Lock:
        """The lock this task holds while its body runs (``token``/``fence`` for fenced writes, ``ensure_held()``)."""
        run = _current_run(self)
        if run is None:
            raise LockNotOwned(f"task {self.name!r} holds no singleton lock here: it is not running in this context")
        return run.lock

    def singleton_key(self, args: Any = None, kwargs: Any = None, key: str | None = None) -> str:
        """The lock name a call with these arguments uses (``key``, a per-call lock name, wins when given), after
        ``app.conf.distlock_key_prefix``."""
        prefix = self.app.conf.get("distlock_key_prefix") or ""
        if not isinstance(prefix, str) or not prefix.isprintable():
            raise ConfigurationError(
                f"app.conf.distlock_key_prefix must be a str without control characters ('' for none), not {prefix!r}"
            )
        if key is not None:
            if not isinstance(key, str) or "{" in key or "}" in key:
                raise ConfigurationError(
                    f"task {self.name!r}: singleton key {key!r} must be a plain lock name (declare templates with "
                    "unique_on on the task)"
                )
            return prefix + distlock.KeyTemplate(key).template  # checked like any lock name
        spec = self._singleton_keys
        if spec is None:
            raise ConfigurationError(f"task {self.name!r} has no run() to take its lock name from")
        return prefix + spec.name_for(self.name, args, kwargs)

    # -- sending ----------------------------------------------------------------------------------------------

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> Any:
        where = f"task {self.name!r}"
        per_call = options.pop("singleton", None)
        if per_call is not None and not isinstance(per_call, Mapping):
            raise ConfigurationError(f"{where}: singleton= takes a dict of options, not {per_call!r}")
        headers = dict(options.pop("headers", None) or {})
        previous = headers.pop(HEADER, None)  # a retry re-sends the request's headers: keep its options, not its rest
        overrides = dict(previous.get("options") or {}) if isinstance(previous, Mapping) else {}
        overrides.update(per_call or {})
        key_override = overrides.pop("key", None)
        effective = self._singleton_options.merged(overrides, where)
        name = self.singleton_key(args, kwargs, key_override)
        if key_override is not None:
            overrides["key"] = key_override
        task_id = task_id or str(uuid.uuid4())
        header: dict[str, Any] = {"key": name, "options": overrides}
        send: dict[str, Any] = {
            "args": args,
            "kwargs": kwargs,
            "task_id": task_id,
            "producer": producer,
            "link": link,
            "link_error": link_error,
            "shadow": shadow,
            **options,
        }
        send["headers"] = {**headers, HEADER: header}  # header gains the reservation token below, if any

        run = _current_run(self)
        held = run is not None and run.task_id == task_id and run.lock.name == name and run.lock.owned()
        if run is not None and held and effective.limit is None:
            # self.retry() of the running call: the retry message inherits the lock as its reservation.
            header["reservation"] = run.lock.token
            result = super().apply_async(**send)
            run.retry_hold_for = _delay_of(options) + effective.queued_for
            return result
        if effective.lock_on == "run":
            return super().apply_async(**send)

        client = get_client(self.app)
        holder = client.holder(name)
        if holder is None:
            # An eta or countdown delays the task on purpose: the reservation lasts until it is due, and then some.
            hold_for = _delay_of(options) + effective.queued_for
            lock = client.lock(name, ttl=effective.ttl, max_hold=hold_for, owner=_owner(task_id), family=self.name)
            # A copied context: the reservation must not become the caller's current_lock().
            if contextvars.copy_context().run(lock.acquire, False):
                header["reservation"] = lock.token
                RESERVATIONS.keep(lock, hold_for)
                try:
                    return super().apply_async(**send)
                except BaseException:
                    RESERVATIONS.cancel(lock)
                    raise
            holder = client.holder(name)
        existing = _task_id_of(holder)
        if effective.on_duplicate == "result" and existing is not None:
            log.info("distlock.celery: %s is already queued or running as %s; not sent again", where, existing)
            return self.AsyncResult(existing)
        raise DuplicateTask(
            f"{where} is already queued or running (lock {name!r}, task id {existing or 'unknown'}); not sent",
            name,
            existing,
            None if holder is None else holder.token,
        )

    # -- running ----------------------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A context of its own: the lock and the run record vanish with the call, whatever the worker runs next.
        return contextvars.copy_context().run(self._call_locked, args, kwargs)

    def _call_locked(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = self.request_stack.top
        task_id = None if request is None or request.called_directly else request.id
        header = _header_of(request)
        where = f"task {self.name!r}" + (f"[{task_id}]" if task_id else "")
        overrides = {k: v for k, v in dict(header.get("options") or {}).items() if k != "key"}
        effective = self._singleton_options.merged(overrides, where)
        name = header.get("key") or self.singleton_key(args, kwargs)
        if effective.abort_on_lost and threading.current_thread() is not threading.main_thread():
            raise ConfigurationError(
                f"{where}: abort_on_lost=True stops the body with a signal, which reaches only the process's main "
                "thread: it works on the prefork and solo pools (and in a direct call from the main thread), not "
                f"in thread {threading.current_thread().name!r} (the threads, gevent and eventlet pools). There, "
                "call self.lock.ensure_held() between the steps of the task instead (fenced writes are refused "
                "after a loss anyway)"
            )
        once_id = task_id if effective.once else None  # a direct call has no task id: nothing to remember
        attempt = int(getattr(request, "retries", 0) or 0)
        options: distlock.LockOptions = {
            "ttl": effective.ttl,
            "max_hold": effective.max_hold,
            "owner": _owner(task_id),
            "family": self.name,
        }
        try:
            client = get_client(self.app)
            lock = (
                client.lock(name, **options)
                if effective.limit is None
                else client.semaphore(name, effective.limit, **options)
            )
            busy = _acquire(client, lock, header.get("reservation"), effective, same_task_possible=task_id is not None)
            if busy is None and once_id is not None and _ran_before(client, lock, once_id, attempt, where):
                raise Ignore()  # acknowledged, with no result stored over the run's (the lock is released)
        except BackendUnavailable as e:
            if effective.on_unavailable == "fail" or task_id is None:
                raise
            log.warning("distlock.celery: %s retries in %g s: %s", where, effective.unavailable_retry_delay, e)
            raise self.retry(exc=e, countdown=effective.unavailable_retry_delay) from e
        if busy is not None:
            return self._duplicate(busy, name, effective, where, direct=task_id is None)
        run = _Run(self, task_id, lock)
        _runs.set((*_runs.get(), run))
        keep_for: float | None = None  # set when the lock passes to a retry message
        error: BaseException | None = None
        try:
            # abort_on_lost: a loss raises LockLost in the body (a signal to this, the main, thread), and the task
            # fails with it, or retries when it is in autoretry_for; the release then finds the lock gone (logged).
            with lock.scope() if effective.abort_on_lost else contextlib.nullcontext():
                return super().__call__(*args, **kwargs)
        except BaseException as e:
            error = e
            if isinstance(e, Retry):
                keep_for = run.retry_hold_for
            raise
        finally:
            outcome = outcome_of(error)
            if once_id is not None and outcome is not None:  # while the lock is held: the mark is fenced by it
                remember(lock, once_id, attempt, outcome, effective.once_ttl, where)
            if keep_for is None or not _hand_over(lock, keep_for, where):
                _release(lock, where)

    def _duplicate(self, busy: _Busy, name: str, effective: Options, where: str, *, direct: bool) -> Any:
        existing = _task_id_of(busy.holder)
        if busy.same_task:
            log.warning(
                "distlock.celery: %s already runs elsewhere (lock %r is held by it); this delivery is dropped",
                where,
                name,
            )
            raise Ignore()
        error = DuplicateTask(
            f"{where} is a duplicate: lock {name!r} is held by task {existing or 'unknown'}",
            name,
            existing,
            None if busy.holder is None else busy.holder.token,
        )
        policy = effective.on_duplicate
        if policy == "raise" or (policy == "retry" and direct):
            raise error
        if policy == "retry":
            raise self.retry(exc=error, countdown=effective.retry_delay)
        log.info("distlock.celery: %s skipped: lock %r is held by task %s", where, name, existing or "unknown")
        return None


def _acquire(
    client: distlock.Client, lock: distlock.Lock, reservation: object, effective: Options, *, same_task_possible: bool
) -> _Busy | None:
    """Acquire ``lock`` for a run; None when acquired, else why not."""
    if isinstance(reservation, int) and take_over(client, lock, reservation, effective.ttl + TAKEOVER_GRACE):
        return None
    waited_for_own_task = False
    holder: distlock.Holder | None = None
    for _ in range(3):  # a lock released between our attempt and our look at its holder is simply tried again
        if lock.acquire(blocking=effective.timeout > 0, timeout=effective.timeout):
            return None
        holder = client.holder(lock.name)
        if holder is None:
            continue
        if not (same_task_possible and holder.owner == lock.owner):
            return _Busy(holder)
        if waited_for_own_task:
            return _Busy(holder, same_task=True)
        # Another delivery of this very task holds it: a dead worker's lease lapses within ttl; a live one keeps it.
        waited_for_own_task = True
        if lock.acquire(timeout=effective.ttl + TAKEOVER_GRACE):
            return None
    return _Busy(holder)


def _ran_before(client: distlock.Client, lock: distlock.Lock, task_id: str, attempt: int, where: str) -> bool:
    """Whether this attempt of ``task_id`` already ran (``once``): then, or when the mark cannot be read, the lock
    is released here."""
    try:
        ran = already_ran(client, lock.name, task_id, attempt, where)
    except BaseException:
        _release(lock, where)
        raise
    if ran:
        _release(lock, where)
    return ran


def _hand_over(lock: distlock.Lock, hold_for: float, where: str) -> bool:
    """Keep the run's lock for the retry message; False when it cannot be (lost meanwhile), and must be released."""
    try:
        RESERVATIONS.keep(lock, hold_for)
    except DistlockError as e:
        log.error("distlock.celery: %s could not keep its lock for the retry: %s", where, e)
        return False
    return True


def _release(lock: distlock.Lock, where: str) -> None:
    try:
        lock.release()
    except LockLost as e:
        log.error("distlock.celery: %s did not hold its lock to the end: %s", where, e)
    except DistlockError as e:
        log.error("distlock.celery: %s could not release its lock: %s", where, e)


def _header_of(request: Any) -> dict[str, Any]:
    headers = getattr(request, "headers", None) or {}
    value = headers.get(HEADER) if isinstance(headers, Mapping) else None
    if value is None:
        value = getattr(request, HEADER, None)
    return dict(value) if isinstance(value, Mapping) else {}


def _delay_of(options: Mapping[str, Any]) -> float:
    """Seconds until a message sent with these options becomes due (its countdown or eta)."""
    countdown = options.get("countdown")
    if isinstance(countdown, int | float):
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if isinstance(eta, dt.datetime):
        now = dt.datetime.now(eta.tzinfo) if eta.tzinfo else dt.datetime.now()
        return max(0.0, (eta - now).total_seconds())
    return 0.0
