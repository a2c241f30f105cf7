"""distlock_django settings: one ``DISTLOCK`` dict in Django settings, read lazily, merged over defaults.

    DISTLOCK = {
        "URL": "etcd://127.0.0.1:2379",   # any distlock.connect() URL
        "OPTIONS": {},                    # more connect() keyword options (connect_timeout, request_timeout, ...)
        "TTL": 30.0,                      # lease length of locks taken by the decorator and the middleware
        "TIMEOUT": 10.0,                  # how long they wait for a busy lock
        "KEY_PREFIX": "",                 # prepended to every lock name distlock_django makes (also fence_lock)
        "FENCING": "on",                  # "on": fence writes made under the row's lock; "strict": refuse all others
        "RULES": [],                      # DistributedLockMiddleware rules, see _middleware.py
        "CONTENTION_STATUS": 423,         # busy lock in a view: 423 or 409 with Retry-After; None: raise
        "RETRY_AFTER": 1,                 # seconds, for the Retry-After header
        "CONFLICT_STATUS": 409,           # LockLost / StaleFenceToken escaping a view
    }

Values are read on every use (cheap: cached until ``setting_changed`` fires), never written back into
``settings``. What can go wrong: an unknown key or a wrong type raises ``ConfigurationError`` naming the key when it is
used, and the system checks (``manage.py check``) report it earlier with an id and a hint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from distlock import ConfigurationError, seconds

__all__ = ["DEFAULTS", "conf", "lock_name"]

DEFAULTS: dict[str, Any] = {
    "URL": "etcd://127.0.0.1:2379",
    "OPTIONS": {},
    "TTL": 30.0,
    "TIMEOUT": 10.0,
    "KEY_PREFIX": "",
    "FENCING": "on",
    "RULES": [],
    "CONTENTION_STATUS": 423,
    "RETRY_AFTER": 1,
    "CONFLICT_STATUS": 409,
}

_cache: dict[str, Any] | None = None


def conf() -> Mapping[str, Any]:
    """The effective settings: ``DEFAULTS`` updated with ``settings.DISTLOCK``."""
    global _cache
    if _cache is None:
        user = getattr(settings, "DISTLOCK", {})
        if not isinstance(user, Mapping):
            raise ConfigurationError(f"settings.DISTLOCK must be a dict, not {type(user).__name__}")
        unknown = set(user) - set(DEFAULTS)
        if unknown:
            raise ConfigurationError(
                f"unknown DISTLOCK setting(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(DEFAULTS))}"
            )
        merged = {**DEFAULTS, **user}
        if merged["FENCING"] not in ("on", "strict"):
            raise ConfigurationError(f"DISTLOCK['FENCING'] must be 'on' or 'strict', not {merged['FENCING']!r}")
        seconds(merged["TTL"], "DISTLOCK['TTL']")
        seconds(merged["TIMEOUT"], "DISTLOCK['TIMEOUT']", allow_zero=True, allow_forever=True)
        if merged["CONTENTION_STATUS"] not in (423, 409, None):
            raise ConfigurationError("DISTLOCK['CONTENTION_STATUS'] must be 423, 409 or None (raise LockNotAcquired)")
        _cache = merged
    return _cache


def lock_name(rendered: str) -> str:
    """The lock name for a rendered template: ``KEY_PREFIX`` + ``rendered``."""
    prefix = conf()["KEY_PREFIX"]
    return f"{prefix}{rendered}" if prefix else rendered


@receiver(setting_changed)
def _reload(*, setting: str, **kwargs: Any) -> None:
    global _cache
    if setting == "DISTLOCK":
        _cache = None  # the shared client resets itself too (_client.py)
