"""``@distributed_lock("order:{order_id}")``: one holder at a time for a view, a class-based view or a function.

The lock name is rendered per call from the call's bound arguments (defaults applied, URL kwargs merged in), with
attribute access such as ``{request.user.pk}``; ``with distributed_lock("report:daily")`` takes a fixed name. With
``limit=N`` the name is a semaphore of N holders. A lock that ends inside ``transaction.atomic()`` or
``ATOMIC_REQUESTS`` is released when the transaction ends (``_tx``), so the next holder never reads what this one
had not committed; async views release at once. With ``stop_on_lost=True`` an async view runs in the lock's
``scope()``: a loss cancels it and answers 409; on a sync view the option is a ``ConfigurationError`` when
decorating. docs/integrations/django.md has the user's view of all this.

What can go wrong: a template naming a parameter the function cannot have fails when decorating, a value missing at
call time fails then (both ``InvalidKeyTemplate``); a bad ``limit`` is ``ConfigurationError`` when decorating, a name
used with another limit at the same time ``LockKindMismatch``. In a view (a call with an ``HttpRequest``) a busy lock
answers ``CONTENTION_STATUS`` (423) with ``Retry-After`` (or raises ``LockNotAcquired`` when it is None), and a
``LockLost`` or ``StaleFenceToken`` answers ``CONFLICT_STATUS`` (409), naming no holder or token, and a lock
service that cannot be reached (``BackendUnavailable`` while taking the lock, at once while the client fails fast)
answers ``UNAVAILABLE_STATUS`` (503) with ``Retry-After`` (or raises when it is None); elsewhere the errors propagate.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast, overload

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse

import distlock
from distlock import BackendUnavailable, InvalidKeyTemplate, KeyTemplate, LockLost, LockNotAcquired, StaleFenceToken

from ._client import get_client
from ._conf import conf, lock_name
from ._tx import release_after_commit

__all__ = ["busy_response", "conflict_answer", "conflict_response", "distributed_lock", "unavailable_answer"]

log = logging.getLogger("distlock.django")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T", bound=type)


def _plain_response(text: str, status: int, retry_after: int | None = None) -> HttpResponse:
    """A plain-text answer with ``status``, and ``Retry-After`` when ``retry_after`` is not None."""
    response = HttpResponse(text, status=status, content_type="text/plain; charset=utf-8")
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def busy_response() -> HttpResponse:
    """The answer to a request whose lock is busy (no holder or token in it)."""
    settings = conf()
    return _plain_response(
        "This resource is busy with another request. Retry shortly.\n",
        settings["CONTENTION_STATUS"],
        settings["RETRY_AFTER"],
    )


def conflict_response() -> HttpResponse:
    """The answer when the lock was lost or the database refused a stale write."""
    return _plain_response(
        "This resource was changed by another request meanwhile. Reload and retry.\n", conf()["CONFLICT_STATUS"]
    )


#: What a view answers with ``CONFLICT_STATUS`` when it escapes a lock taken for it: the lock was lost, or the
#: database refused a stale write.
CONFLICTS: tuple[type[BaseException], ...] = (LockLost, StaleFenceToken)


def conflict_answer(error: BaseException, request: HttpRequest | None) -> HttpResponse | None:
    """The one mapping of an error escaping a locked view to its answer (the decorator's and the middleware's):
    ``conflict_response()`` for a lost lock or a refused stale write, None for anything else (or no request)."""
    if request is None or not isinstance(error, CONFLICTS):
        return None
    log.warning("distlock: %s answered %s: %s", request.path, conf()["CONFLICT_STATUS"], error)
    return conflict_response()


def unavailable_answer(error: BackendUnavailable, request: HttpRequest | None) -> HttpResponse | None:
    """The answer when the lock service could not be reached to take a view's lock (the decorator's and the
    middleware's): ``UNAVAILABLE_STATUS`` with ``Retry-After``; None (raise) when it is None or there is no request."""
    settings = conf()
    if request is None or settings["UNAVAILABLE_STATUS"] is None:
        return None
    log.warning("distlock: %s answered %s: %s", request.path, settings["UNAVAILABLE_STATUS"], error)
    return _plain_response(
        "The lock service is unavailable. Retry later.\n",
        settings["UNAVAILABLE_STATUS"],
        settings["UNAVAILABLE_RETRY_AFTER"],
    )


class distributed_lock:  # noqa: N801 - used like a function: @distributed_lock(...), with distributed_lock(...)
    """Decorate a view/function (or use as a context manager) to hold a distributed lock around it."""

    def __init__(
        self,
        key: str,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        blocking: bool = True,
        limit: int | None = None,
        stop_on_lost: bool = False,
    ) -> None:
        if not isinstance(stop_on_lost, bool):
            raise distlock.ConfigurationError(f"stop_on_lost must be True or False, not {stop_on_lost!r}")
        self.stop_on_lost = stop_on_lost
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000):
            raise distlock.ConfigurationError(
                f"limit (how many calls may hold the name at once) must be an int from 1 to 10000, not {limit!r}"
            )
        self.limit = limit
        self.template = KeyTemplate(key)
        self.ttl = distlock.seconds(ttl, "ttl", allow_none=True)
        self.timeout = distlock.seconds(timeout, "timeout", allow_zero=True, allow_forever=True, allow_none=True)
        self.blocking = blocking
        self._held: contextvars.ContextVar[tuple[distlock.Lock, ...]] = contextvars.ContextVar(
            f"distlock_django_{id(self)}", default=()
        )

    def __repr__(self) -> str:
        return f"distributed_lock({self.template.template!r})"

    def _lock(self, name: str) -> distlock.Lock:
        settings = conf()
        options: distlock.LockOptions = {
            "ttl": settings["TTL"] if self.ttl is None else self.ttl,
            "timeout": settings["TIMEOUT"] if self.timeout is None else self.timeout,
            "family": self.template.template,
        }
        if self.limit is not None:
            return get_client().semaphore(lock_name(name), self.limit, **options)
        return get_client().lock(lock_name(name), **options)

    # -- decorator --------------------------------------------------------------------------------------------

    @overload
    def __call__(self, target: T) -> T: ...

    @overload
    def __call__(self, target: Callable[P, R]) -> Callable[P, R]: ...

    def __call__(self, target: Any) -> Any:
        if isinstance(target, type):
            # A class-based view: lock around dispatch(), so every handler method is covered.
            dispatch = getattr(target, "dispatch", None)
            if dispatch is None:
                raise InvalidKeyTemplate(f"@distributed_lock on a class needs a view class with dispatch(): {target!r}")
            if getattr(target, "view_is_async", False):
                target.dispatch = self._wrap_async(dispatch, awaits_result=True)  # type: ignore[attr-defined]
            else:
                target.dispatch = self._wrap_sync(self._sync(dispatch))  # type: ignore[attr-defined]
            return target
        if not callable(target):
            raise InvalidKeyTemplate(f"@distributed_lock decorates a function or a view class, not {target!r}")
        if iscoroutinefunction(target):
            return self._wrap_async(target, awaits_result=False)
        return self._wrap_sync(self._sync(target))

    def _sync(self, func: Callable[P, R]) -> Callable[P, R]:
        if self.stop_on_lost:
            raise distlock.ConfigurationError(
                f"@distributed_lock(stop_on_lost=True) on {getattr(func, '__qualname__', func)!r}: only an async view "
                "or function can be stopped this way (its task is cancelled). A sync view runs in a worker thread, "
                "which no signal reaches: it stops at its next fenced write or ensure_held() with 409 anyway, so "
                "leave stop_on_lost out. A sync function in the main thread can run its body in the lock's scope: "
                "with get_client().lock(lock_name(...)) as lock, lock.scope(): ... (docs/lost.md)"
            )
        return func

    def _name_for(self, signature: inspect.Signature, args: Any, kwargs: Any) -> tuple[str, HttpRequest | None]:
        values = KeyTemplate.call_values(signature, args, kwargs)
        request = next((value for value in values.values() if isinstance(value, HttpRequest)), None)
        return self.template.render(values), request

    def _wrap_sync(self, func: Callable[P, R]) -> Callable[P, R]:
        signature = self.template.check_signature(func)

        @functools.wraps(func)
        def locked(*args: P.args, **kwargs: P.kwargs) -> R:
            name, request = self._name_for(signature, args, kwargs)
            try:
                lock = self._lock(name)
                acquired = lock.acquire(blocking=self.blocking)
            except BackendUnavailable as e:
                return cast(R, _unavailable(e, request))
            if not acquired:
                return cast(R, self._busy(lock, request))
            try:
                result = func(*args, **kwargs)
            except BaseException as e:
                release_after_commit_quietly(lock)
                answer = conflict_answer(e, request)
                if answer is None:
                    raise
                return cast(R, answer)
            if request is None:
                release_after_commit(lock)
            else:
                release_after_commit_quietly(lock)
            return result

        return locked

    def _wrap_async(self, func: Callable[..., Any], *, awaits_result: bool) -> Callable[..., Any]:
        signature = self.template.check_signature(func)

        @functools.wraps(func)
        async def locked(*args: Any, **kwargs: Any) -> Any:
            name, request = self._name_for(signature, args, kwargs)
            try:
                lock = distlock.AsyncLock(self._lock(name))
                acquired = await lock.acquire(blocking=self.blocking)
            except BackendUnavailable as e:
                return _unavailable(e, request)
            if not acquired:
                return self._busy(lock.sync, request)
            try:
                async with lock.scope() if self.stop_on_lost else contextlib.nullcontext():
                    result = func(*args, **kwargs)
                    if awaits_result or inspect.isawaitable(result):
                        result = await cast(Awaitable[Any], result)
            except BaseException as e:
                await _arelease_quietly(lock)
                answer = conflict_answer(e, request)
                if answer is None:
                    raise
                return answer
            if request is None:
                await lock.release()
            else:
                await _arelease_quietly(lock)
            return result

        return locked

    def _busy(self, lock: distlock.Lock, request: HttpRequest | None) -> HttpResponse:
        if request is None or conf()["CONTENTION_STATUS"] is None:
            raise LockNotAcquired(
                f"lock {lock.name!r} is busy (waited {lock.timeout if self.blocking else 0:g} s)", name=lock.name
            )
        return busy_response()

    # -- context manager --------------------------------------------------------------------------------------

    def _fixed_name(self) -> str:
        if self.stop_on_lost:
            raise distlock.ConfigurationError(
                f"distributed_lock({self.template.template!r}, stop_on_lost=True) as a context manager: the option "
                "is for decorated async views and functions; here enter the lock's scope yourself: "
                "`with distributed_lock(...) as lock, lock.scope():` (main thread) or "
                "`async with distributed_lock(...) as lock, lock.scope():`"
            )
        if self.template.fields:
            raise InvalidKeyTemplate(
                f"lock key template {self.template.template!r} has fields; as a context manager "
                "distributed_lock needs a complete name (format it first), or use it as a decorator"
            )
        return self.template.template

    def __enter__(self) -> distlock.Lock:
        lock = self._lock(self._fixed_name())
        if not lock.acquire(blocking=self.blocking):
            raise LockNotAcquired(f"lock {lock.name!r} is busy", name=lock.name)
        self._held.set((*self._held.get(), lock))
        return lock

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        *rest, lock = self._held.get()
        self._held.set(tuple(rest))
        if kind is None:
            release_after_commit(lock)
        else:
            release_after_commit_quietly(lock)

    async def __aenter__(self) -> distlock.AsyncLock:
        lock = distlock.AsyncLock(self._lock(self._fixed_name()))
        if not await lock.acquire(blocking=self.blocking):
            raise LockNotAcquired(f"lock {lock.name!r} is busy", name=lock.name)
        self._held.set((*self._held.get(), lock.sync))
        return lock

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        *rest, lock = self._held.get()
        self._held.set(tuple(rest))
        if kind is None:
            await distlock.AsyncLock(lock).release()
        else:
            await _arelease_quietly(distlock.AsyncLock(lock))


def _unavailable(error: BackendUnavailable, request: HttpRequest | None) -> HttpResponse:
    answer = unavailable_answer(error, request)
    if answer is None:
        raise error
    return answer


def release_after_commit_quietly(lock: distlock.Lock) -> None:
    """Release (after commit), logging instead of raising a loss: the caller is already answering or raising."""
    try:
        release_after_commit(lock)
    except LockLost as e:
        log.warning("%s", e)


async def _arelease_quietly(lock: distlock.AsyncLock) -> None:
    try:
        await lock.release()
    except LockLost as e:
        log.warning("%s", e)
