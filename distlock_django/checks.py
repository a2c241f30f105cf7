"""System checks (``manage.py check``): every ``DISTLOCK`` setting, the URL and its backend's extra, fenced models.

The settings are judged by the same validator ``conf()`` runs on first use (``_conf.validate``), and every problem is
reported at once, one message per bad key, each with the key's own id:

- ``distlock.E001`` ``DISTLOCK`` is not a dict;
- ``distlock.E002`` ``URL`` (a scheme of ``distlock.backends.SCHEMES``, parsed by ``distlock.backends.parse_url``,
  the grammar ``connect()`` parses with; TLS files and SQL drivers are first opened when it connects);
- ``distlock.E003`` ``RULES``; ``distlock.E005`` the URL's backend client library is not installed;
- ``distlock.E006`` ``OPTIONS``, ``E007`` ``TTL``, ``E008`` ``TIMEOUT``, ``E009`` ``KEY_PREFIX``, ``E010``
  ``FENCING``, ``E011`` ``CONTENTION_STATUS``, ``E012`` ``RETRY_AFTER``, ``E013`` ``CONFLICT_STATUS``, ``E015``
  ``UNAVAILABLE_STATUS``, ``E016`` ``UNAVAILABLE_RETRY_AFTER``;
- ``distlock.W001`` an unknown key (a warning, with the closest known key);
- ``distlock.E004`` a fenced model whose ``fence_lock`` is missing, malformed, or names a field it lacks;
- ``distlock.E014`` (``FENCING = "strict"``) / ``distlock.W002`` (otherwise) a fenced model with a manager whose
  own ``get_queryset()`` returns a queryset that is not a ``FencedQuerySet`` (every manager's queryset class is made
  one; a ``get_queryset()`` that builds another class escapes that): its ``update()``, ``bulk_*`` and upserts bypass
  strict mode and the ``fence_token`` guards.

None of them connects to the lock service. The keys and ids are documented in docs/reference/django-settings.md.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db.models.manager import BaseManager

import distlock

from ._conf import validate

__all__ = ["check_fenced_models", "check_settings"]


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    _, problems = validate(getattr(settings, "DISTLOCK", {}))
    return [
        (checks.Error if problem.is_error else checks.Warning)(problem.message, hint=problem.hint, id=problem.check_id)
        for problem in problems
    ]


@checks.register(checks.Tags.models)
def check_fenced_models(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from ._models import FencedModel

    errors: list[checks.CheckMessage] = []
    candidates = (
        [model for config in app_configs for model in config.get_models()] if app_configs else apps.get_models()
    )
    for model in candidates:
        if not issubclass(model, FencedModel):
            continue
        declared = getattr(model, "fence_lock", "")
        if not declared:
            errors.append(
                checks.Error(
                    f"{model._meta.label} is a FencedModel without fence_lock",
                    hint="Declare the lock that guards each row, e.g. fence_lock = 'account:{pk}'.",
                    obj=model,
                    id="distlock.E004",
                )
            )
            continue
        try:
            template = distlock.KeyTemplate(declared)
        except distlock.InvalidKeyTemplate as e:
            errors.append(checks.Error(str(e), obj=model, id="distlock.E004"))
            continue
        errors += _plain_managers(model)
        names = {"pk", "self"} | {f.name for f in model._meta.get_fields()}
        names |= {f.attname for f in model._meta.concrete_fields}
        missing = [field for field in template.fields if field not in names and not hasattr(model, field)]
        if missing:
            errors.append(
                checks.Error(
                    f"{model._meta.label}.fence_lock {declared!r} names {', '.join(map(repr, missing))}, "
                    "which the model does not have",
                    hint="Use fields of the model, e.g. {pk} or {customer_id}.",
                    obj=model,
                    id="distlock.E004",
                )
            )
    return errors


def _plain_managers(model: Any) -> list[checks.CheckMessage]:
    """A manager of a fenced model whose ``get_queryset()`` builds a queryset of another class than its
    ``_queryset_class`` (which distlock makes fenced) returns Django's ``QuerySet``: its writes pass strict mode
    unseen. Only an overridden ``get_queryset()`` is called (building a queryset runs no query); one that fails
    here, say on request state, is passed over."""
    from ._models import FencedQuerySet

    configured = getattr(settings, "DISTLOCK", None)
    strict = isinstance(configured, dict) and configured.get("FENCING") == "strict"
    found: list[checks.CheckMessage] = []
    for manager in model._meta.managers:
        if type(manager).get_queryset is BaseManager.get_queryset:
            continue  # builds its queryset class, which distlock has made fenced
        try:
            queryset = manager.get_queryset()
        except Exception:  # e.g. a filter on request state, absent here: what it builds cannot be told here
            continue
        if isinstance(queryset, FencedQuerySet):
            continue
        level, check_id = (checks.Error, "distlock.E014") if strict else (checks.Warning, "distlock.W002")
        found.append(
            level(
                f"{model._meta.label}.{manager.name} is a manager of a FencedModel whose get_queryset() returns a "
                f"{type(queryset).__name__}, not a distlock_django.FencedQuerySet: its update(), bulk_create(), "
                "bulk_update() and upserts are plain writes that strict mode cannot refuse",
                hint="Build the queryset from the manager's own class (super().get_queryset(), or "
                "self._queryset_class(...)), or derive its class from distlock_django.FencedQuerySet.",
                obj=model,
                id=check_id,
            )
        )
    return found
