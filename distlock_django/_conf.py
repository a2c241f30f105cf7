"""distlock_django settings: one ``DISTLOCK`` dict in Django settings, read lazily, merged over defaults, checked.

One validator, :func:`validate`, judges a ``DISTLOCK`` value against the table :data:`SETTINGS` (each key's
default, check id, what it allows) and returns every problem at once. The system checks (``checks.py``) report its
problems as ``manage.py check`` messages; :func:`conf` runs the same validator on first use, so a setting that
passes the checks also works at run time. Durations go through :func:`distlock.seconds`; the URL and ``OPTIONS``
are judged by ``distlock.backends.parse_url``, without side effects (no connection, no file read); a ``django://``
URL is kept as it is (``_database.py`` says which database it means, at each use). Values are cached until
``settings.DISTLOCK`` changes (assigned, or changed in place) and never written back into ``settings``. The keys,
their defaults, ids and allowed values: docs/reference/django-settings.md. :func:`fixture_defaults` is the pytest
fixture ``distlock_django``'s hook: keys it puts beneath ``settings.DISTLOCK`` for one test, so that a test's later
assignments of other keys keep the fixture's URL, prefix and ``TIMEOUT``.

What can go wrong: a bad value raises ``ConfigurationError`` naming every bad key (``DISTLOCK["TTL"]``) on first use;
an unknown key is only logged as a warning (``distlock.W001`` in ``manage.py check``, with a "did you mean"), since
a setting a newer release added must not break an older one.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib.util
import logging
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from distlock import ConfigurationError, docs_url, seconds
from distlock.backends import SCHEMES, Scheme, parse_url, scheme_of

from ._database import alias_of, database_url
from ._rules import compile_rules

__all__ = ["DEFAULTS", "DOCS", "SETTINGS", "Problem", "Setting", "conf", "fixture_defaults", "lock_name", "validate"]

log = logging.getLogger("distlock.django")

#: Where the settings are documented, on the documentation site (a pip user has no docs/ folder); every hint points
#: there.
DOCS = docs_url("reference/django-settings.md")
_NOT_A_DICT = "distlock.E001"  # settings.DISTLOCK is not a dict
_MISSING_EXTRA = "distlock.E005"  # the URL's backend needs a client library that is not installed
_UNKNOWN_KEY = "distlock.W001"  # a key DISTLOCK does not have (a warning)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with ``DISTLOCK``: a check id (``distlock.E007``), what is wrong, and how to fix it."""

    check_id: str
    message: str
    hint: str

    @property
    def is_error(self) -> bool:
        return ".E" in self.check_id


@dataclass(frozen=True)
class Setting:
    """One ``DISTLOCK`` key: its default, its check id, what it allows, and the function that checks a value.

    ``parse(value, what)`` returns the value to use (``"30"`` is refused, ``30`` becomes ``30.0``) or raises
    ``ConfigurationError`` with a message that starts with ``what`` (``DISTLOCK["TTL"]``) and names the bad value.
    """

    key: str
    default: Any
    check_id: str
    allowed: str
    parse: Callable[[object, str], Any]

    @property
    def what(self) -> str:
        return f'DISTLOCK["{self.key}"]'

    def problem(self, message: str) -> Problem:
        return Problem(self.check_id, message, f"{self.what} takes {self.allowed}. See {DOCS}.")


def _scheme(url: str) -> Scheme | None:
    return scheme_of(url.partition("://")[0])


def _url(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty str, not {type(value).__name__}: {value!r}")
    if alias_of(value) is not None:  # distlock_django's own "django://<alias>": checked, kept (_client.py follows it)
        database_url(value, what, connecting=False)
        return value
    if _scheme(value) is None:
        schemes = ", ".join(f"{name}://" for name in SCHEMES)
        raise ConfigurationError(f"{what} = {value!r} is not a distlock URL; its scheme must be one of {schemes}")
    return value


def _options(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ConfigurationError(f"{what} must be a dict of connect() options, not {type(value).__name__}: {value!r}")
    if "fail_fast" in value:  # the client's own option (its circuit breaker), not the backend's
        seconds(value["fail_fast"], f'{what}["fail_fast"]', allow_zero=True)
    return dict(value)


def _key_prefix(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a str, not {type(value).__name__}: {value!r}")
    if any(unicodedata.category(char) == "Cc" for char in value):
        raise ConfigurationError(f"{what} must not contain control characters, not {value!r}")
    return value


def _fencing(value: object, what: str) -> str:
    if value not in ("on", "strict") or not isinstance(value, str):
        raise ConfigurationError(f"{what} must be 'on' or 'strict', not {value!r}")
    return value


def _rules(value: object, what: str) -> object:
    compile_rules(value)  # its messages name DISTLOCK["RULES"][i]
    return value


def _contention_status(value: object, what: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value in (423, 409)):
        return value
    raise ConfigurationError(f"{what} must be 423, 409 or None (raise LockNotAcquired), not {value!r}")


def _timeout(value: object, what: str) -> float:
    return seconds(value, what, allow_zero=True, allow_forever=True)


def _retry_after(value: object, what: str) -> int:
    number = seconds(value, what, allow_zero=True)
    if not number.is_integer():
        raise ConfigurationError(f"{what} must be whole seconds (Retry-After has no fraction), not {value!r}")
    return int(number)


def _unavailable_status(value: object, what: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and 500 <= value <= 599):
        return value
    raise ConfigurationError(
        f"{what} must be an HTTP server error status from 500 to 599 (an int) or None (raise BackendUnavailable), "
        f"not {value!r}"
    )


def _conflict_status(value: object, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
        return value
    raise ConfigurationError(f"{what} must be an HTTP error status from 400 to 599 (an int), not {value!r}")


SETTINGS: dict[str, Setting] = {
    setting.key: setting
    for setting in (
        Setting(
            "URL",
            "etcd://127.0.0.1:2379",
            "distlock.E002",
            "a distlock.connect() URL ("
            + ", ".join(f"{name}://" for name in SCHEMES)
            + "), or django://<alias>: the lock table in that database",
            _url,
        ),
        Setting("OPTIONS", {}, "distlock.E006", "a dict of distlock.connect() keyword options", _options),
        Setting(
            "TTL",
            30.0,
            "distlock.E007",
            "a lease length in seconds: a number > 0, at most ten years",
            seconds,
        ),
        Setting(
            "TIMEOUT",
            10.0,
            "distlock.E008",
            "a wait in seconds: a number >= 0 (0: do not wait) or math.inf (wait forever)",
            _timeout,
        ),
        Setting("KEY_PREFIX", "", "distlock.E009", "a str without control characters ('' for none)", _key_prefix),
        Setting("FENCING", "on", "distlock.E010", "'on' or 'strict'", _fencing),
        Setting(
            "RULES",
            [],
            "distlock.E003",
            "a list of rule dicts (key; url_name and/or path; methods, ttl, timeout)",
            _rules,
        ),
        Setting(
            "CONTENTION_STATUS", 423, "distlock.E011", "423, 409 or None (raise LockNotAcquired)", _contention_status
        ),
        Setting("RETRY_AFTER", 1, "distlock.E012", "a whole number of seconds >= 0", _retry_after),
        Setting("CONFLICT_STATUS", 409, "distlock.E013", "an int HTTP status from 400 to 599", _conflict_status),
        Setting(
            "UNAVAILABLE_STATUS",
            503,
            "distlock.E015",
            "an int HTTP status from 500 to 599, or None (raise BackendUnavailable)",
            _unavailable_status,
        ),
        Setting("UNAVAILABLE_RETRY_AFTER", 5, "distlock.E016", "a whole number of seconds >= 0", _retry_after),
    )
}

DEFAULTS: dict[str, Any] = {key: setting.default for key, setting in SETTINGS.items()}


def _unknown_key(key: object) -> Problem:
    close = difflib.get_close_matches(str(key).upper(), SETTINGS, n=1)
    guess = f'; did you mean "{close[0]}"?' if close else ""
    return Problem(
        _UNKNOWN_KEY,
        f"DISTLOCK has an unknown key {key!r}, which is ignored{guess}",
        f"The keys are {', '.join(SETTINGS)}. See {DOCS}.",
    )


def _parse_error(url: str, options: dict[str, Any]) -> str | None:
    try:
        # check and fail_fast are connect()'s own, not the backend's
        parse_url(url, **{key: value for key, value in options.items() if key not in ("check", "fail_fast")})
    except ConfigurationError as e:
        return str(e)
    return None


def _client_problems(url: str, options: dict[str, Any]) -> list[Problem]:
    """What ``connect()`` would refuse before any traffic: a client library not installed, a malformed URL, a bad
    option (parsed by ``parse_url``, which reads no TLS file: an unreadable one shows on first use)."""
    scheme = _scheme(url)
    assert scheme is not None  # _url() checked it
    missing = [module for module in scheme.requires if importlib.util.find_spec(module) is None]
    if missing:
        return [
            Problem(
                _MISSING_EXTRA,
                f'DISTLOCK["URL"] uses {scheme.name}:// but {", ".join(map(repr, missing))} is not installed',
                f"pip install 'distlock-fenced[{scheme.extra}]'",
            )
        ]
    error = _parse_error(url, {})
    if error is not None:
        return [SETTINGS["URL"].problem(f'DISTLOCK["URL"]: {error}'), *_options_beside_a_bad_url(scheme, options)]
    return _options_problems(url, options)


def _options_problems(url: str, options: dict[str, Any]) -> list[Problem]:
    error = _parse_error(url, options) if options else None
    return [] if error is None else [SETTINGS["OPTIONS"].problem(f'DISTLOCK["OPTIONS"]: {error}')]


def _options_beside_a_bad_url(scheme: Scheme | None, options: dict[str, Any]) -> list[Problem]:
    """``OPTIONS`` judged although the URL is bad, so that both are reported at once: by the grammar of the URL's
    scheme (a lock table's for ``django://``), on a well-formed URL of that scheme."""
    if scheme is None or any(importlib.util.find_spec(module) is None for module in scheme.requires):
        return []
    well_formed = f"{scheme.name}:///distlock" if scheme.backend == "sqltable" else f"{scheme.name}://127.0.0.1"
    return _options_problems(well_formed, options)


def validate(user: object) -> tuple[dict[str, Any], list[Problem]]:
    """Judge a ``DISTLOCK`` value: the settings to use (defaults filled in) and every problem found, errors first."""
    if not isinstance(user, Mapping):
        problem = Problem(
            _NOT_A_DICT,
            f"settings.DISTLOCK must be a dict, not {type(user).__name__}: {user!r}",
            f"DISTLOCK = {{'URL': 'etcd://127.0.0.1:2379'}}. See {DOCS}.",
        )
        return dict(DEFAULTS), [problem]
    problems: list[Problem] = []
    merged: dict[str, Any] = {}
    bad: set[str] = set()
    for key, setting in SETTINGS.items():
        try:
            merged[key] = setting.parse(user.get(key, setting.default), setting.what)
        except ConfigurationError as e:
            problems.append(setting.problem(str(e)))
            merged[key] = setting.default
            bad.add(key)
    if not bad & {"URL", "OPTIONS"}:
        problems.extend(_client_problems(database_url(merged["URL"], connecting=False), merged["OPTIONS"]))
    elif "OPTIONS" not in bad:
        url = str(user.get("URL"))
        scheme = SCHEMES["sql+sqlite"] if alias_of(url) is not None else _scheme(url)
        problems.extend(_options_beside_a_bad_url(scheme, merged["OPTIONS"]))
    problems.extend(_unknown_key(key) for key in user if key not in SETTINGS)
    return merged, problems


#: The ``DISTLOCK`` value last judged (a deep copy) and the settings made of it.
_cache: tuple[object, dict[str, Any]] | None = None
#: Keys beneath ``settings.DISTLOCK`` while a test fixture is in force (:func:`fixture_defaults`); else empty.
_beneath: dict[str, Any] = {}


@contextlib.contextmanager
def fixture_defaults(defaults: Mapping[str, Any]) -> Iterator[None]:
    """Within the block, :func:`conf` takes a key ``settings.DISTLOCK`` lacks from ``defaults``, and ``OPTIONS`` key
    by key: a test that assigns ``settings.DISTLOCK = {"TTL": 5}`` keeps the fixture's URL and prefix."""
    _beneath.update(defaults)
    try:
        yield
    finally:
        _beneath.clear()


def _over_fixture_defaults(user: object) -> object:
    if not _beneath or not isinstance(user, Mapping):
        return user
    options = user.get("OPTIONS", {})
    merged = {**_beneath, **user}
    if isinstance(options, Mapping):
        merged["OPTIONS"] = {**_beneath.get("OPTIONS", {}), **options}
    return merged


def conf() -> Mapping[str, Any]:
    """The effective settings: ``DEFAULTS`` updated with ``settings.DISTLOCK``, checked by :func:`validate`.

    Judged again when ``settings.DISTLOCK`` changes, whether assigned (``setting_changed``) or changed in place (a
    comparison with the copy last judged, a few keys per call). Raises ``ConfigurationError`` naming every bad key;
    logs unknown keys as warnings.
    """
    global _cache
    user = _over_fixture_defaults(getattr(settings, "DISTLOCK", {}))
    cached = _cache
    if cached is not None and cached[0] == user:
        return cached[1]
    merged, problems = validate(user)
    errors = [problem.message for problem in problems if problem.is_error]
    if errors:
        raise ConfigurationError(f"bad DISTLOCK settings (see {DOCS}): " + "; ".join(errors))
    for problem in problems:
        log.warning("%s (%s)", problem.message, problem.check_id)
    try:
        judged = copy.deepcopy(user)
    except Exception:  # a value that cannot be copied (an SSL context in OPTIONS): then only assignments count
        judged = user
    _cache = (judged, merged)
    return merged


def lock_name(rendered: str) -> str:
    """The lock name for a rendered template: ``KEY_PREFIX`` + ``rendered``."""
    prefix = conf()["KEY_PREFIX"]
    return f"{prefix}{rendered}" if prefix else rendered


@receiver(setting_changed)
def _reload(*, setting: str, **kwargs: Any) -> None:
    global _cache
    if setting == "DISTLOCK":
        _cache = None  # judged again even when the new value equals the old
