"""``DistributedLockMiddleware``: hold a lock around the views that settings rules choose.

    DISTLOCK = {"RULES": [
        {"url_name": "orders:checkout", "key": "order:{order_id}"},            # URL kwargs feed the template
        {"path": r"^/api/accounts/", "methods": ["POST"], "key": "account:{request.user.pk}", "timeout": 0},
    ]}

The first rule (``_rules``) that matches a request's URL name or path and method wins. The lock is taken before the
view runs (and before ``ATOMIC_REQUESTS`` opens its transaction) and released when the response is complete: after
the request's transaction committed, and for a streaming response only after its last chunk (or the client left).
Busy, lost and stale answer as the decorator's (one mapping, ``conflict_answer``), given in ``process_exception``
because Django turns a view's exception into a 500 before it reaches ``__call__``; so does a lock service that
cannot be reached (``unavailable_answer``: ``UNAVAILABLE_STATUS``, 503). The rule keys:
docs/reference/django-settings.md.

What can go wrong: a malformed rule raises ``ConfigurationError`` on the first request (``manage.py check`` reports
it as ``distlock.E003``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse
from django.urls import Resolver404, resolve

from distlock import BackendUnavailable, LockNotAcquired

from ._client import get_client
from ._conf import conf, lock_name
from ._decorators import busy_response, conflict_answer, release_after_commit_quietly, unavailable_answer
from ._rules import Rule, compile_rules

__all__ = ["DistributedLockMiddleware"]


class _ReleasingContent:
    """Streaming content that releases the lock after the last chunk, or when Django closes the response."""

    def __init__(self, content: Any, release: Callable[[], None]) -> None:
        self._content = content
        self._release = release

    def close(self) -> None:  # Django registers it as a resource closer: called when the response is closed
        close = getattr(self._content, "close", None)
        try:
            if close is not None:
                close()
        finally:
            self._release()


class _ReleasingIterator(_ReleasingContent):
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._content)
        except BaseException:
            self.close()
            raise


class _ReleasingAsyncIterator(_ReleasingContent):
    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._content.__anext__()
        except BaseException:
            self.close()
            raise


class DistributedLockMiddleware:
    """Lock around the views chosen by ``DISTLOCK["RULES"]`` (see the module docstring)."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self._compiled: tuple[object, list[Rule]] | None = None

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponseBase | None:
        """A lost lock or a refused stale write in a view this middleware locked: ``CONFLICT_STATUS``."""
        if not getattr(request, "_distlock_locked", False):
            return None
        return conflict_answer(exception, request)

    def _rules(self) -> list[Rule]:
        settings = conf()
        if self._compiled is None or self._compiled[0] is not settings:
            self._compiled = (settings, compile_rules(settings["RULES"]))
        return self._compiled[1]

    def _match(self, request: HttpRequest) -> tuple[Rule, dict[str, Any]] | None:
        rules = self._rules()
        if not rules:
            return None
        try:
            match = resolve(request.path_info, urlconf=getattr(request, "urlconf", None))
        except Resolver404:
            match = None
        view_name = match.view_name if match else None
        url_name = match.url_name if match else None
        for rule in rules:
            if rule.matches(request, view_name, url_name):
                values: dict[str, Any] = dict(match.kwargs) if match else {}
                values["request"] = request
                return rule, values
        return None

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        found = self._match(request)
        if found is None:
            return self.get_response(request)
        rule, values = found
        settings = conf()
        try:
            lock = get_client().lock(
                lock_name(rule.template.render(values)),
                ttl=settings["TTL"] if rule.ttl is None else rule.ttl,
                timeout=settings["TIMEOUT"] if rule.timeout is None else rule.timeout,
                family=rule.template.template,
            )
            acquired = lock.acquire()
        except BackendUnavailable as e:
            answer = unavailable_answer(e, request)
            if answer is None:
                raise
            return answer
        if not acquired:
            if settings["CONTENTION_STATUS"] is None:
                raise LockNotAcquired(f"lock {lock.name!r} is busy", name=lock.name)
            return busy_response()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                release_after_commit_quietly(lock)

        request._distlock_locked = True  # type: ignore[attr-defined]  # process_exception answers for this lock
        try:
            response = self.get_response(request)
        except BaseException:
            release()
            raise
        if isinstance(response, StreamingHttpResponse):
            content: Any = response.streaming_content
            if response.is_async:
                response.streaming_content = _ReleasingAsyncIterator(content, release)
            else:
                response.streaming_content = _ReleasingIterator(iter(content), release)
        else:
            release()
        return response
