"""System checks (``manage.py check``): settings, the URL, its backend's extra, middleware rules, fenced models.

Ids: ``distlock.E001`` bad settings, ``distlock.E002`` bad or unsupported URL, ``distlock.E003`` malformed middleware
rules, ``distlock.E004`` a fenced model whose ``fence_lock`` is missing, malformed, or names a field it lacks,
``distlock.E005`` the backend's client library is not installed. None of them connects to the lock service. The URL
is judged by the one scheme table of ``distlock.backends.SCHEMES`` and by ``distlock.connect(url, check=False)``,
so the checks accept exactly the URLs ``connect()`` accepts.
"""

from __future__ import annotations

import importlib.util
from typing import Any
from urllib.parse import urlsplit

from django.apps import apps
from django.core import checks

import distlock
from distlock.backends import SCHEMES

from ._conf import conf

__all__ = ["check_fenced_models", "check_settings"]


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from ._middleware import compile_rules

    try:
        settings = conf()
    except distlock.ConfigurationError as e:
        return [checks.Error(str(e), hint="See distlock_django._conf for the keys.", id="distlock.E001")]
    errors: list[checks.CheckMessage] = []
    url = settings["URL"]
    scheme = SCHEMES.get(urlsplit(url).scheme.lower() if isinstance(url, str) else "")
    requires = () if scheme is None else scheme.requires
    missing = [module for module in requires if importlib.util.find_spec(module) is None]
    if scheme is None:
        errors.append(
            checks.Error(
                f"DISTLOCK['URL'] = {url!r} is not a distlock URL",
                hint="Use one of " + ", ".join(f"{name}://" for name in SCHEMES) + " (etcd://host:2379).",
                id="distlock.E002",
            )
        )
    elif missing:
        errors.append(
            checks.Error(
                f"DISTLOCK['URL'] uses {scheme.name}:// but {', '.join(map(repr, missing))} is not installed",
                hint=f"pip install 'distlock[{scheme.extra}]'",
                id="distlock.E005",
            )
        )
    else:
        try:
            distlock.connect(url, check=False, **dict(settings["OPTIONS"])).close()
        except distlock.ConfigurationError as e:
            errors.append(checks.Error(str(e), hint="Fix DISTLOCK['URL'] or ['OPTIONS'].", id="distlock.E002"))
    try:
        compile_rules(settings["RULES"])
    except distlock.ConfigurationError as e:
        errors.append(checks.Error(str(e), hint="See distlock_django._middleware for rules.", id="distlock.E003"))
    return errors


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
