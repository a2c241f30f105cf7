"""``DISTLOCK["RULES"]``: the rules that choose which views ``DistributedLockMiddleware`` locks, checked and compiled.

A rule is a dict: ``key`` (a lock name template), ``url_name`` (a name, ``"app:name"``, or a list) and/or ``path``
(a regex matched against ``request.path_info``), ``methods`` (default the unsafe ones: POST, PUT, PATCH, DELETE),
and optional ``ttl``/``timeout`` (seconds, through :func:`distlock.seconds`). What can go wrong:
:func:`compile_rules` raises ``ConfigurationError`` naming the first malformed rule (``DISTLOCK["RULES"][2]``) and
what is wrong with it; the settings validator (``_conf.py``) calls it, so ``manage.py check`` reports it as
``distlock.E003`` and the first use of the settings raises it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.http import HttpRequest

import distlock
from distlock import ConfigurationError, KeyTemplate

__all__ = ["UNSAFE_METHODS", "Rule", "compile_rules"]

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


def _names(value: object) -> tuple[str, ...] | None:
    """A str or a list of str as a tuple; None if ``value`` is neither."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return None


def compile_rules(rules: object) -> list[Rule]:
    """Check and compile ``DISTLOCK["RULES"]``; ``ConfigurationError`` says which rule is wrong and why."""
    if not isinstance(rules, Sequence) or isinstance(rules, str):
        raise ConfigurationError(f'DISTLOCK["RULES"] must be a list of dicts, not {type(rules).__name__}: {rules!r}')
    compiled = []
    for index, rule in enumerate(rules):
        where = f'DISTLOCK["RULES"][{index}]'
        if not isinstance(rule, Mapping):
            raise ConfigurationError(f"{where} must be a dict, not {type(rule).__name__}")
        unknown = set(rule) - _RULE_KEYS
        if unknown:
            raise ConfigurationError(f"{where} has unknown key(s) {sorted(unknown)}; known: {sorted(_RULE_KEYS)}")
        if "key" not in rule:
            raise ConfigurationError(f"{where} needs a 'key' template, e.g. 'order:{{order_id}}'")
        if "url_name" not in rule and "path" not in rule:
            raise ConfigurationError(f"{where} needs 'url_name' or 'path' to choose views")
        url_names = _names(rule.get("url_name", ()))
        if url_names is None:
            raise ConfigurationError(f"{where}: 'url_name' must be a URL name or a list, not {rule['url_name']!r}")
        try:
            path = re.compile(rule["path"]) if "path" in rule else None
        except (re.error, TypeError) as e:
            raise ConfigurationError(f"{where}: bad 'path' regex {rule['path']!r}: {e}") from e
        methods = _names(rule.get("methods", UNSAFE_METHODS))
        if methods is None or isinstance(rule.get("methods"), str):
            raise ConfigurationError(f"{where}: 'methods' must be a list of HTTP methods, not {rule['methods']!r}")
        ttl = distlock.seconds(rule.get("ttl"), f"{where}: 'ttl'", allow_none=True)
        timeout = distlock.seconds(
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
                ttl=ttl,
                timeout=timeout,
            )
        )
    return compiled
