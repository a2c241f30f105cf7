"""System checks and settings: clear errors with ids, without connecting to anything."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import models
from django.test.utils import isolate_apps
from pytest_django.fixtures import Settings

import distlock
from distlock.backends import SCHEMES, Scheme
from distlock_django import FencedModel, conf
from distlock_django.checks import check_fenced_models, check_settings


def _ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def test_the_test_project_passes_its_checks(django_servers: dict[str, str]) -> None:
    assert check_settings() == []
    assert check_fenced_models() == []


@pytest.mark.parametrize(
    ("distlock_settings", "expected"),
    [
        ({"URL": "http://x"}, "distlock.E002"),
        ({"URL": "etcd://h:notaport"}, "distlock.E002"),
        ({"RULES": [{"path": "^/x/"}]}, "distlock.E003"),
        ({"RULES": [{"url_name": "x", "key": "a:{"}]}, "distlock.E003"),
        ({"RULES": [{"url_name": "x", "key": "a", "path": "("}]}, "distlock.E003"),
        ({"RULES": [{"url_name": "x", "key": "a", "colour": 1}]}, "distlock.E003"),
        ({"FENCING": "sometimes"}, "distlock.E001"),
        ({"TTL_SECONDS": 3}, "distlock.E001"),
        ({"TTL": 0}, "distlock.E001"),
        ({"TTL": 1e12}, "distlock.E001"),
        ({"TIMEOUT": "thirty"}, "distlock.E001"),
    ],
)
def test_bad_settings_are_reported(distlock_settings: dict[str, Any], expected: str, settings: Settings) -> None:
    settings.DISTLOCK = distlock_settings
    assert expected in _ids(check_settings())


@pytest.mark.parametrize("scheme", list(SCHEMES.values()), ids=list(SCHEMES))
def test_manage_py_check_accepts_every_url_connect_accepts(scheme: Scheme, settings: Settings) -> None:
    hosts = "127.0.0.1:7001,127.0.0.1:7002" if scheme.cluster or scheme.backend == "etcd" else "127.0.0.1"
    url = f"{scheme.name}://{hosts}"
    distlock.connect(url, check=False).close()  # connect() takes it...
    settings.DISTLOCK = {"URL": url}
    messages = run_checks()  # ...and so does manage.py check
    assert [m for m in messages if m.id in ("distlock.E001", "distlock.E002", "distlock.E005")] == []


def test_unknown_settings_raise_on_use(settings: Settings) -> None:
    settings.DISTLOCK = {"TIMEOUTS": 1}
    with pytest.raises(distlock.ConfigurationError, match="TIMEOUTS"):
        conf()


@isolate_apps("djangotests.testapp")
def test_a_fenced_model_whose_template_names_a_missing_field_is_reported() -> None:
    class Broken(FencedModel):
        fence_lock = "account:{number}"

        class Meta:
            app_label = "testapp"

    class Unset(FencedModel):
        class Meta:
            app_label = "testapp"

    class Good(FencedModel):
        number: models.IntegerField[int, int] = models.IntegerField()
        fence_lock = "account:{number}"

        class Meta:
            app_label = "testapp"

    messages = check_fenced_models(app_configs=[Good._meta.apps.get_app_config("testapp")])
    by_model = {m.obj.__name__: m.id for m in messages}
    assert by_model == {"Broken": "distlock.E004", "Unset": "distlock.E004"}, messages
