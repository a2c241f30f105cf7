"""``@singleton_task("report:{user_id}")`` over Django's ``@task``: one call per lock name queued or running.

The decorator takes the ``Task`` that ``@task`` made and returns a ``Task`` of the same backend whose ``enqueue()``
(and ``aenqueue()``) first takes the lock as a *reservation*, and whose function runs holding the lock (the same
name, ``DISTLOCK["KEY_PREFIX"]`` prepended, so ``FencedModel`` rows of that name are written with the task's token).
The reservation is taken under a provisional owner before the backend stores the task, then handed, without a gap
(``Lock.take_over``), to a hold owned by the new task result's id, which the process keeps until a worker takes it
over (``Lock.hand_over``). A worker's run takes over the hold its own id owns, waits for a provisional one (its
enqueue is finishing), or finds a duplicate. The life cycle, the guarantees and what is not covered:
docs/integrations/django-tasks.md.

What can go wrong: a template naming no parameter of the function raises ``InvalidKeyTemplate`` when decorating
(as does ``@singleton_task`` below ``@task``); arguments that do not fit raise ``TypeError`` at ``enqueue()``; a key
held by another call makes ``enqueue()`` return that call's ``TaskResult`` or raise :class:`DuplicateTask`; a run
that finds the key held by another call is skipped (None) or fails with ``DuplicateTask``; an unreachable lock
service raises ``BackendUnavailable`` from ``enqueue()`` and fails the run. A lock lost mid-run stops the body only with
``stop_on_lost=True`` (``LockLost``, the run fails); either way its fenced writes are refused (``StaleFenceToken``). A
process that exits ends its reservations.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as dt
import functools
import inspect
import logging
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from asgiref.sync import async_to_sync, iscoroutinefunction, sync_to_async

import distlock
from distlock import ConfigurationError, DistlockError, InvalidKeyTemplate, KeyTemplate, LockLost, LockNotAcquired

from ._client import get_client
from ._conf import conf, lock_name
from ._tx import release_after_commit

if TYPE_CHECKING:
    from django.tasks import Task, TaskResult, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_started

    _TaskBase = Task[Any, Any]
else:
    try:
        from django.tasks import Task, TaskResult, TaskResultStatus
        from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
        from django.tasks.signals import task_started
    except ImportError:  # Django 5.2: the backport (pyproject.toml's django-tasks extra)
        from django_tasks import TaskResult, TaskResultStatus
        from django_tasks.base import Task
        from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
        from django_tasks.signals import task_started
    _TaskBase = Task

__all__ = ["DuplicateTask", "singleton_task"]

log = logging.getLogger("distlock.django")

TaskT = TypeVar("TaskT", bound="Task[Any, Any]")

#: A run's owner id names its task result (``Holder.owner``); a reservation not yet handed to one is provisional.
_RESULT_OWNER = "django-task:"
_PROVISIONAL_OWNER = "django-task-enqueue:"
#: How much longer than ``ttl`` a run waits for a reservation to pass to it (RPCs, a slow machine).
_GRACE = 2.0

# The task result whose run starts in this context (``task_started``: the worker sends it just before the call).
_starting: contextvars.ContextVar[tuple[Callable[..., Any], str] | None] = contextvars.ContextVar(
    "distlock_django_task_starting", default=None
)
# The provisional owner of the enqueue running in this context: a backend that runs the task inside enqueue()
# (Django's ImmediateBackend) takes over that reservation.
_enqueuing: contextvars.ContextVar[str | None] = contextvars.ContextVar("distlock_django_enqueuing", default=None)


class DuplicateTask(LockNotAcquired):
    """Another call of a singleton task holds its lock (queued or running).

    ``name`` is the lock name, ``result_id`` the id of the task result holding it (None when the holder is not a
    task of this integration, or its enqueue is still finishing), ``token`` the holder's fencing token.
    """

    def __init__(
        self, message: str, name: str | None = None, result_id: str | None = None, token: int | None = None
    ) -> None:
        super().__init__(message, name=name)
        self.result_id = result_id
        self.token = token
        self.args = (message, name, result_id, token)

    def __str__(self) -> str:
        return str(self.args[0])


DuplicateTask.__module__ = "distlock_django"


@dataclasses.dataclass(frozen=True)
class _Spec:
    """One singleton task's options, checked when decorating."""

    template: KeyTemplate
    signature: inspect.Signature  # the arguments enqueue() takes (without a TaskContext)
    takes_context: bool
    ttl: float | None
    max_queued: float
    on_duplicate: str
    stop_on_lost: bool

    def name_for(self, task_name: str, args: Any, kwargs: Any) -> str:
        try:
            values = KeyTemplate.call_values(self.signature, args, kwargs)
        except TypeError as e:
            raise TypeError(f"task {task_name!r} called with arguments that do not fit its signature: {e}") from e
        return lock_name(self.template.render(values))

    def lock(self, name: str, owner: str, *, max_hold: float | None = None) -> distlock.Lock:
        ttl = conf()["TTL"] if self.ttl is None else self.ttl
        return get_client().lock(name, ttl=ttl, owner=owner, max_hold=max_hold, family=self.template.template)


def singleton_task(
    key: str,
    *,
    ttl: float | None = None,
    max_queued: float = 300.0,
    on_duplicate: str = "result",
    stop_on_lost: bool = False,
) -> Callable[[TaskT], TaskT]:
    """Make a ``django.tasks`` task a singleton per ``key``, a template over its arguments; put it above ``@task``.

    ``ttl`` (default ``DISTLOCK["TTL"]``): the lease, how long the lock outlives a worker or sender that died (it is
    renewed while the task runs). ``max_queued`` (default 300 s, after ``run_after``): how long a reservation waits
    for a worker. ``on_duplicate``: ``"result"`` (``enqueue()`` returns the queued or running call's ``TaskResult``,
    or raises :class:`DuplicateTask` when it cannot name one; a run that finds the key held is skipped: None) or
    ``"raise"`` (``enqueue()`` and such a run raise :class:`DuplicateTask`). ``stop_on_lost``: the run stops with
    ``LockLost`` when its lock is lost (``Lock.scope()``: a sync function in a worker's main thread, an async one on
    its event loop; a sync function run in another thread raises ``ConfigurationError``).
    """
    template = KeyTemplate(key)
    if on_duplicate not in ("result", "raise"):
        raise ConfigurationError(f"on_duplicate must be 'result' or 'raise', not {on_duplicate!r}")
    if not isinstance(stop_on_lost, bool):
        raise ConfigurationError(f"stop_on_lost must be True or False, not {stop_on_lost!r}")
    ttl = distlock.seconds(ttl, "ttl", allow_none=True)
    max_queued = distlock.seconds(max_queued, "max_queued (how long a reservation waits for a worker)")

    def decorate(task: TaskT) -> TaskT:
        if not isinstance(task, Task):
            raise InvalidKeyTemplate(
                f"@singleton_task decorates a django.tasks Task: put it above @task, not below ({task!r})"
            )
        if _spec_of(task) is not None:
            raise ConfigurationError(f"task {task.name!r} is already a singleton task: use one @singleton_task")
        signature = inspect.signature(task.func)
        if task.takes_context:
            signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        spec = _Spec(template, signature, task.takes_context, ttl, max_queued, on_duplicate, stop_on_lost)
        template.check_signature(signature, owner=repr(task.func.__qualname__))
        task_started.connect(_on_task_started, dispatch_uid="distlock_django.singleton_task")
        values = {field.name: getattr(task, field.name) for field in dataclasses.fields(task) if field.init}
        values["func"] = _locked(spec, task.func)
        return _singleton_class(type(task))(**values)  # type: ignore[return-value,arg-type]

    return decorate


def _locked(spec: _Spec, func: Callable[..., Any]) -> Callable[..., Any]:
    """The task's function, run holding its lock (an async function too: the lock is taken outside its loop)."""

    def call(lock: distlock.Lock, *args: Any, **kwargs: Any) -> Any:
        if not iscoroutinefunction(func):
            if spec.stop_on_lost and threading.current_thread() is not threading.main_thread():
                raise ConfigurationError(
                    f"task {func.__qualname__!r} has stop_on_lost=True but runs outside the main thread, where no "
                    "signal can stop it: run the worker without its autoreloader (manage.py db_worker --no-reload; "
                    "DEBUG=True turns it on), not in a server's request thread (ImmediateBackend), or make the task "
                    "async"
                )
            with lock.scope() if spec.stop_on_lost else contextlib.nullcontext():
                return func(*args, **kwargs)

        async def run() -> Any:  # the scope on the function's own loop: a loss cancels it there
            async with distlock.AsyncLock(lock).scope() if spec.stop_on_lost else contextlib.nullcontext():
                return await func(*args, **kwargs)

        return async_to_sync(run)()

    @functools.wraps(func)
    def locked(*args: Any, **kwargs: Any) -> Any:
        context, arguments = (args[0], args[1:]) if spec.takes_context else (None, args)
        starting = _starting.get()
        _starting.set(None)
        if context is not None:
            result_id: str | None = str(context.task_result.id)
        else:
            result_id = starting[1] if starting is not None and starting[0] is locked else None
        name = spec.name_for(func.__qualname__, arguments, kwargs)
        lock = spec.lock(name, f"{_RESULT_OWNER}{result_id or uuid.uuid4().hex}")
        busy = _acquire(lock, {lock.owner, _enqueuing.get()}, spec)
        if busy is not None:
            return _duplicate_run(spec, func.__qualname__, name, busy)
        try:
            result = call(lock, *args, **kwargs)
        except BaseException:
            _release_quietly(lock)
            raise
        release_after_commit(lock)
        return result

    locked._distlock_singleton = spec  # type: ignore[attr-defined]
    return locked


def _acquire(lock: distlock.Lock, own: set[str | None], spec: _Spec) -> distlock.Holder | None:
    """Acquire ``lock`` for a run: None when held, else the holder that makes the run a duplicate."""
    wait = lock.ttl + _GRACE
    holder: distlock.Holder | None = None
    for _ in range(3):  # a lock released between our attempt and our look at its holder is simply tried again
        if lock.acquire(blocking=False):
            return None
        holder = get_client().holder(lock.name)
        if holder is None:
            continue
        if holder.owner in own:  # the reservation of this very call
            if lock.take_over(holder.token, timeout=wait):
                return None
        elif holder.owner.startswith(_PROVISIONAL_OWNER):  # its enqueue hands the reservation to it any moment
            if lock.acquire(timeout=wait):
                return None
        else:
            return holder
    return holder


def _duplicate_run(spec: _Spec, task_name: str, name: str, holder: distlock.Holder | None) -> None:
    existing = _result_id_of(holder)
    if spec.on_duplicate == "raise":
        raise DuplicateTask(
            f"task {task_name!r} is a duplicate: lock {name!r} is held by task {existing or 'unknown'}",
            name,
            existing,
            None if holder is None else holder.token,
        )
    log.info("distlock: task %r skipped: lock %r is held by task %s", task_name, name, existing or "unknown")


def _result_id_of(holder: distlock.Holder | None) -> str | None:
    if holder is None or not holder.owner.startswith(_RESULT_OWNER):
        return None
    return holder.owner[len(_RESULT_OWNER) :]


def _release_quietly(lock: distlock.Lock) -> None:
    try:
        release_after_commit(lock)
    except LockLost as e:
        log.warning("%s", e)


# -- enqueue ------------------------------------------------------------------------------------------------------


def enqueue(task: Task[Any, Any], spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TaskResult[Any, Any]:
    """Enqueue one call of a singleton ``task`` unless its key is held; see :func:`singleton_task`."""
    name = spec.name_for(task.name, args, kwargs)
    hold_for = _delay_of(task.run_after) + spec.max_queued
    provisional = spec.lock(name, f"{_PROVISIONAL_OWNER}{uuid.uuid4().hex}", max_hold=hold_for)
    # A copied context: the reservation must not become the caller's current_lock().
    if not contextvars.copy_context().run(provisional.acquire, False):
        return _duplicate_enqueue(task, spec, name)
    # Handed over at once: its key's removal by a take-over (the run of a backend that runs the task inside
    # enqueue(), or the result's reservation below) is the end it waits for, not a loss to warn about.
    provisional.hand_over(hold_for)
    token = provisional.token
    reset = _enqueuing.set(provisional.owner)
    try:
        result: TaskResult[Any, Any] = task.get_backend().enqueue(task, list(args), kwargs)
    except BaseException:
        _end(provisional)
        raise
    finally:
        _enqueuing.reset(reset)
    if result.status != TaskResultStatus.READY:  # run during enqueue(): its run has taken the reservation over
        _end(provisional)
        return result
    reservation = spec.lock(name, f"{_RESULT_OWNER}{result.id}", max_hold=hold_for)
    if contextvars.copy_context().run(reservation.take_over, token, 0):
        reservation.hand_over(hold_for)
    # else a worker's run already holds it (it waited behind the provisional hold), or another call does
    _end(provisional)  # its key is gone (taken over, or the reservation lapsed): this only forgets it
    return result


def _duplicate_enqueue(task: Task[Any, Any], spec: _Spec, name: str) -> TaskResult[Any, Any]:
    holder = get_client().holder(name)
    existing = _result_id_of(holder)
    if spec.on_duplicate == "result" and existing is not None:
        with contextlib.suppress(TaskResultDoesNotExist, TaskResultMismatch, NotImplementedError):
            found = task.get_result(existing)
            log.info("distlock: task %r is already queued or running as %s; not enqueued", task.name, existing)
            return found
    raise DuplicateTask(
        f"task {task.name!r} is already queued or running (lock {name!r}, task result {existing or 'unknown'}); "
        "not enqueued",
        name,
        existing,
        None if holder is None else holder.token,
    )


def _end(lock: distlock.Lock) -> None:
    with contextlib.suppress(DistlockError):
        lock.release()


def _delay_of(run_after: dt.datetime | None) -> float:
    if run_after is None:
        return 0.0
    now = dt.datetime.now(run_after.tzinfo) if run_after.tzinfo else dt.datetime.now()
    return max(0.0, (run_after - now).total_seconds())


# -- hooks into django.tasks ---------------------------------------------------------------------------------------


def _spec_of(task: Task[Any, Any]) -> _Spec | None:
    spec = getattr(task.func, "_distlock_singleton", None)
    return spec if isinstance(spec, _Spec) else None


def _on_task_started(sender: Any, task_result: TaskResult[Any, Any], **kwargs: Any) -> None:
    if _spec_of(task_result.task) is not None:
        _starting.set((task_result.task.func, str(task_result.id)))


class _SingletonEnqueue:
    """``enqueue()``/``aenqueue()`` through the reservation (:func:`enqueue`), mixed into the backend's task class."""

    __slots__ = ()

    def enqueue(self, *args: Any, **kwargs: Any) -> TaskResult[Any, Any]:
        task = cast("Task[Any, Any]", self)
        return enqueue(task, cast(_Spec, _spec_of(task)), args, kwargs)

    async def aenqueue(self, *args: Any, **kwargs: Any) -> TaskResult[Any, Any]:
        task = cast("Task[Any, Any]", self)
        return await sync_to_async(enqueue)(task, cast(_Spec, _spec_of(task)), args, kwargs)


class SingletonTask(_SingletonEnqueue, _TaskBase):
    """A ``Task`` made by :func:`singleton_task` (on a backend whose task class is Django's own)."""

    __slots__ = ()


@functools.cache
def _singleton_class(base: type[Task[Any, Any]]) -> type[Task[Any, Any]]:
    if base is Task:
        return SingletonTask
    if issubclass(base, _SingletonEnqueue):
        return base
    return type(f"Singleton{base.__name__}", (_SingletonEnqueue, base), {"__slots__": ()})
