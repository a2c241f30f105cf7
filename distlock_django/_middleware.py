"""``DistributedLockMiddleware``: hold a lock around the views that settings rules choose.

    DISTLOCK = {"RULES": [
        {"url_name": "orders:checkout", "key": "order:{order_id}"},            # URL kwargs feed the template
        {"path": r"^/api/accounts/", "methods": ["POST"], "key": "account:{request.user.pk}", "timeout": 0},
    ]}

A rule matches by URL name (``url_name``: a name, namespaced ``"app:name"``, or a list) and/or a path regex
(``path``, matched against ``request.path_info``), and by method (``methods``; default the unsafe ones: POST, PUT,
PATCH, DELETE). The first matching rule wins. ``key`` is a template rendered from the URL kwargs and ``request``;
``ttl`` and ``timeout`` default to ``DISTLOCK["TTL"]``/``["TIMEOUT"]``.

The lock is taken before the view runs (and before ``ATOMIC_REQUESTS`` opens its transaction) and released after the
response is complete: for an ordinary response when the view returns — after the request's transaction committed —
and for a streaming response only when its last chunk has been sent (or the client went away). A busy lock
answers like the decorator (423/409 with ``Retry-After``; with ``CONTENTION_STATUS`` None it raises
``LockNotAcquired``), and a ``LockLost`` or ``StaleFenceToken`` escaping the view answers ``CONFLICT_STATUS``. It is
a synchronous middleware (Django adapts it for async views). What can go wrong: a malformed rule raises
``ConfigurationError`` on the first request (and ``manage.py check`` reports it as ``distlock.E003``).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse
from django.urls import Resolver404, resolve

import distlock
from distlock import ConfigurationError, KeyTemplate, LockLost, LockNotAcquired, StaleFenceToken

from ._client import get_client
from ._conf import conf, lock_name
from ._decorators import busy_response, conflict_response, release_after_commit_quietly

__all__ = ["DistributedLockMiddleware", "Rule", "compile_rules"]

UNSAFE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
_RULE_KEYS = {"key", "url_name", "path", "methods", "ttl", "timeout"}


@dataclass(frozen=True)
class Rule:
    """One compiled middleware rule."""

    template: KeyTemplate
    url_names: frozenset[str]
    path: re.Pattern[str] | None
    methods: frozenset[str]
    ttl: float | None
    timeout: float | None

    def matches(self, request: HttpRequest, view_name: str | None, url_name: str | None) -> bool:
        if request.method not in self.methods:
            return False
        if self.url_names and view_name not in self.url_names and url_name not in self.url_names:
            return False
        return self.path is None or self.path.search(request.path_info) is not None


def compile_rules(rules: object) -> list[Rule]:
    """Check and compile ``DISTLOCK["RULES"]``; ``ConfigurationError`` says which rule is wrong and why."""
    if not isinstance(rules, Sequence) or isinstance(rules, str):
        raise ConfigurationError("DISTLOCK['RULES'] must be a list of dicts")
    compiled = []
    for index, rule in enumerate(rules):
        where = f"DISTLOCK['RULES'][{index}]"
        if not isinstance(rule, Mapping):
            raise ConfigurationError(f"{where} must be a dict, not {type(rule).__name__}")
        unknown = set(rule) - _RULE_KEYS
        if unknown:
            raise ConfigurationError(f"{where} has unknown key(s) {sorted(unknown)}; known: {sorted(_RULE_KEYS)}")
        if "key" not in rule:
            raise ConfigurationError(f"{where} needs a 'key' template, e.g. 'order:{{order_id}}'")
        if "url_name" not in rule and "path" not in rule:
            raise ConfigurationError(f"{where} needs 'url_name' or 'path' to choose views")
        url_names = rule.get("url_name", ())
        url_names = (url_names,) if isinstance(url_names, str) else tuple(url_names)
        try:
            path = re.compile(rule["path"]) if "path" in rule else None
        except (re.error, TypeError) as e:
            raise ConfigurationError(f"{where}: bad 'path' regex {rule['path']!r}: {e}") from e
        methods = rule.get("methods", UNSAFE_METHODS)
        if isinstance(methods, str) or not all(isinstance(m, str) for m in methods):
            raise ConfigurationError(f"{where}: 'methods' must be a list of HTTP method names")
        distlock.seconds(rule.get("ttl"), f"{where}: 'ttl'", allow_none=True)
        distlock.seconds(
            rule.get("timeout"), f"{where}: 'timeout'", allow_zero=True, allow_forever=True, allow_none=True
        )
        try:
            template = KeyTemplate(rule["key"])
        except distlock.InvalidKeyTemplate as e:
            raise ConfigurationError(f"{where}: {e}") from e
        compiled.append(
            Rule(
                template=template,
                url_names=frozenset(url_names),
                path=path,
                methods=frozenset(m.upper() for m in methods),
                ttl=rule.get("ttl"),
                timeout=rule.get("timeout"),
            )
        )
    return compiled


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
        lock = get_client().lock(
            lock_name(rule.template.render(values)),
            ttl=settings["TTL"] if rule.ttl is None else rule.ttl,
            timeout=settings["TIMEOUT"] if rule.timeout is None else rule.timeout,
            family=rule.template.template,
        )
        if not lock.acquire():
            if settings["CONTENTION_STATUS"] is None:
                raise LockNotAcquired(f"lock {lock.name!r} is busy", name=lock.name)
            return busy_response()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                release_after_commit_quietly(lock)

        try:
            response = self.get_response(request)
        except (LockLost, StaleFenceToken):
            release()
            return conflict_response()
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
