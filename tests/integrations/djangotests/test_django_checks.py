"""System checks and settings: every DISTLOCK key checked by one validator, at check time and at run time."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import models
from django.test.utils import isolate_apps, override_settings
from pytest_django.fixtures import Settings

import distlock
from distlock.backends import SCHEMES, Scheme
from distlock_django import FencedModel, conf, distributed_lock
from distlock_django._conf import DOCS, SETTINGS
from distlock_django.checks import check_fenced_models, check_settings


def _ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def test_the_test_project_passes_its_checks(django_servers: dict[str, str]) -> None:
    assert check_settings() == []
    assert check_fenced_models() == []


#: Each key's id, a value it refuses and the words of what it allows.
BAD_VALUES = [
    ("URL", "distlock.E002", "http://x", "scheme must be one of"),
    ("URL", "distlock.E002", "etcd://h:notaport", "bad port"),
    ("URL", "distlock.E002", 2379, "must be a non-empty str"),
    ("URL", "distlock.E002", "django://nosuch", "names no database; DATABASES has default, maria, pg"),
    ("OPTIONS", "distlock.E006", ["connect_timeout", 1], "must be a dict"),
    ("OPTIONS", "distlock.E006", {"colour": "red"}, "unknown connect() option"),
    ("OPTIONS", "distlock.E006", {"request_timeout": "5"}, "finite number of seconds"),
    ("TTL", "distlock.E007", "thirty", "finite number of seconds"),
    ("TTL", "distlock.E007", 0, "> 0 seconds"),
    ("TTL", "distlock.E007", 1e12, "at most"),
    ("TTL", "distlock.E007", math.inf, "finite number of seconds"),
    ("TIMEOUT", "distlock.E008", -1, ">= 0 seconds"),
    ("TIMEOUT", "distlock.E008", "thirty", "finite number of seconds"),
    ("TIMEOUT", "distlock.E008", None, "finite number of seconds"),
    ("KEY_PREFIX", "distlock.E009", 5, "must be a str"),
    ("KEY_PREFIX", "distlock.E009", "dj\n", "control characters"),
    ("FENCING", "distlock.E010", "sometimes", "'on' or 'strict'"),
    ("FENCING", "distlock.E010", True, "'on' or 'strict'"),
    ("RULES", "distlock.E003", "mw:{name}", "must be a list of dicts"),
    ("RULES", "distlock.E003", [{"path": "^/x/"}], "needs a 'key' template"),
    ("RULES", "distlock.E003", [{"url_name": "x", "key": "a:{"}], "malformed lock key template"),
    ("RULES", "distlock.E003", [{"url_name": "x", "key": "a", "path": "("}], "bad 'path' regex"),
    ("RULES", "distlock.E003", [{"url_name": "x", "key": "a", "colour": 1}], "unknown key(s)"),
    ("RULES", "distlock.E003", [{"url_name": 5, "key": "a"}], "'url_name' must be"),
    ("RULES", "distlock.E003", [{"url_name": "x", "key": "a", "methods": 5}], "'methods' must be"),
    ("RULES", "distlock.E003", [{"url_name": "x", "key": "a", "ttl": "1"}], "finite number of seconds"),
    ("CONTENTION_STATUS", "distlock.E011", 200, "423, 409 or None"),
    ("CONTENTION_STATUS", "distlock.E011", "423", "423, 409 or None"),
    ("CONTENTION_STATUS", "distlock.E011", 423.0, "423, 409 or None"),
    ("RETRY_AFTER", "distlock.E012", "soon", "finite number of seconds"),
    ("RETRY_AFTER", "distlock.E012", -1, ">= 0 seconds"),
    ("RETRY_AFTER", "distlock.E012", 1.5, "whole seconds"),
    ("CONFLICT_STATUS", "distlock.E013", 200, "from 400 to 599"),
    ("CONFLICT_STATUS", "distlock.E013", True, "from 400 to 599"),
    ("CONFLICT_STATUS", "distlock.E013", "409", "from 400 to 599"),
    ("OPTIONS", "distlock.E006", {"fail_fast": -1}, ">= 0 seconds"),
    ("UNAVAILABLE_STATUS", "distlock.E015", 423, "from 500 to 599"),
    ("UNAVAILABLE_STATUS", "distlock.E015", "503", "from 500 to 599"),
    ("UNAVAILABLE_RETRY_AFTER", "distlock.E016", 2.5, "whole seconds"),
]


@pytest.mark.parametrize(
    ("key", "check_id", "value", "allowed"), BAD_VALUES, ids=[f"{key}={value!r}" for key, _, value, _ in BAD_VALUES]
)
def test_each_bad_value_is_one_error_with_its_key_id_and_raises_the_same_at_run_time(
    key: str, check_id: str, value: object, allowed: str, settings: Settings
) -> None:
    settings.DISTLOCK = {key: value}
    messages = check_settings()
    assert _ids(messages) == [check_id], messages
    (message,) = messages
    assert message.level == checks.ERROR
    assert f'DISTLOCK["{key}"]' in message.msg
    assert allowed in message.msg
    hint = message.hint or ""
    assert key in hint and "https://distlock.readthedocs.io/en/latest/reference/django-settings/" in hint
    assert "_conf" not in hint
    with pytest.raises(distlock.ConfigurationError) as raised:
        conf()
    assert message.msg in str(raised.value)


def test_manage_py_check_reports_five_bad_settings_at_once_with_five_ids(settings: Settings) -> None:
    settings.DISTLOCK = {"TTL": "thirty", "TIMEOUT": -1, "KEY_PREFIX": 5, "RETRY_AFTER": "soon", "FENCING": "off"}
    messages = [m for m in run_checks() if (m.id or "").startswith("distlock.")]
    assert sorted(_ids(messages)) == [
        "distlock.E007",
        "distlock.E008",
        "distlock.E009",
        "distlock.E010",
        "distlock.E012",
    ], messages
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    report = str(raised.value)
    for check_id, key in [
        ("distlock.E007", "TTL"),
        ("distlock.E008", "TIMEOUT"),
        ("distlock.E009", "KEY_PREFIX"),
        ("distlock.E010", "FENCING"),
        ("distlock.E012", "RETRY_AFTER"),
    ]:
        assert f'{check_id}) DISTLOCK["{key}"]' in report, report
    assert "identified 5 issues" in report


@pytest.mark.parametrize(
    "url",
    [
        "etcd://127.0.0.1:2379/a/path",  # a bad URL of a known scheme: OPTIONS judged by its grammar
        "sql+sqlite://:memory:",
        "django://no-such-alias",  # OPTIONS judged by the lock table's grammar
    ],
)
def test_a_bad_url_and_a_bad_option_are_reported_at_once(url: str, settings: Settings) -> None:
    settings.DISTLOCK = {"URL": url, "OPTIONS": {"colour": "red"}}
    messages = check_settings()
    assert _ids(messages) == ["distlock.E002", "distlock.E006"], messages
    assert "unknown connect() option(s) colour" in messages[1].msg


def test_a_bad_setting_raises_configuration_error_naming_the_key_on_first_use() -> None:
    with override_settings(DISTLOCK={"URL": "etcd://127.0.0.1:2379", "RETRY_AFTER": "soon", "TTL": "thirty"}):
        with pytest.raises(distlock.ConfigurationError) as raised, distributed_lock("report:daily"):
            pass
        assert 'DISTLOCK["RETRY_AFTER"]' in str(raised.value)
        assert 'DISTLOCK["TTL"]' in str(raised.value)
        assert "'soon'" in str(raised.value)


@pytest.mark.parametrize(
    "good",
    [
        {"TIMEOUT": 0},
        {"TIMEOUT": math.inf},
        {"TTL": 0.5, "TIMEOUT": 2},
        {"CONTENTION_STATUS": None},
        {"CONTENTION_STATUS": 409},
        {"RETRY_AFTER": 0},
        {"RETRY_AFTER": 2.0},
        {"CONFLICT_STATUS": 503},
        {"KEY_PREFIX": ""},
        {"OPTIONS": {"connect_timeout": 1, "request_timeout": 2.5}},
        {"RULES": [{"url_name": ["a", "b:c"], "key": "x:{pk}", "methods": ["get"], "ttl": 1, "timeout": 0}]},
        {},
    ],
)
def test_good_settings_pass(good: dict[str, Any], settings: Settings) -> None:
    settings.DISTLOCK = good
    assert check_settings() == []
    assert {key: conf()[key] for key in good} == good


def test_a_whole_float_retry_after_is_sent_as_an_integer(settings: Settings) -> None:
    settings.DISTLOCK = {"RETRY_AFTER": 2.0}
    assert conf()["RETRY_AFTER"] == 2
    assert isinstance(conf()["RETRY_AFTER"], int)


def test_distlock_that_is_not_a_dict_is_one_error(settings: Settings) -> None:
    settings.DISTLOCK = [("URL", "etcd://x")]
    assert _ids(check_settings()) == ["distlock.E001"]
    with pytest.raises(distlock.ConfigurationError, match=r"settings\.DISTLOCK must be a dict"):
        conf()


def test_an_unknown_key_is_a_warning_with_the_closest_key(settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    settings.DISTLOCK = {"TIMOUT": 1, "ttl": 3, "COLOUR": "red"}
    messages = check_settings()
    assert {m.id for m in messages} == {"distlock.W001"}
    assert all(m.level == checks.WARNING for m in messages)
    texts = sorted(m.msg for m in messages)
    assert 'did you mean "TIMEOUT"' in texts[1] and "'TIMOUT'" in texts[1]
    assert 'did you mean "TTL"' in texts[2]
    assert "'COLOUR'" in texts[0] and "did you mean" not in texts[0]
    with caplog.at_level("WARNING", logger="distlock.django"):
        assert conf()["TIMEOUT"] == 10.0  # ignored: the default is used, and the first use says so
    assert "TIMOUT" in caplog.text and "distlock.W001" in caplog.text


def test_the_reference_page_lists_every_key_with_its_id() -> None:
    page = Path(__file__).resolve().parents[3] / "docs" / "reference" / "django-settings.md"
    lines = page.read_text().splitlines()
    for key, setting in SETTINGS.items():
        rows = [line for line in lines if line.startswith(f"| `{key}` |") and setting.check_id in line]
        assert rows, f"{page} ({DOCS}) has no table row for {key} with {setting.check_id}"


@pytest.mark.parametrize("scheme", list(SCHEMES.values()), ids=list(SCHEMES))
def test_manage_py_check_accepts_every_url_connect_accepts(scheme: Scheme, settings: Settings, tmp_path: Path) -> None:
    hosts = "127.0.0.1:7001,127.0.0.1:7002" if scheme.cluster or scheme.backend == "etcd" else "127.0.0.1"
    url = f"{scheme.name}://{hosts}"
    if scheme.name == "sql+sqlite":  # a file, not a host
        url = f"sql+sqlite:///{tmp_path / 'locks.db'}"
    distlock.connect(url, check=False).close()  # connect() takes it...
    settings.DISTLOCK = {"URL": url}
    messages = run_checks()  # ...and so does manage.py check
    assert [m for m in messages if (m.id or "").startswith("distlock.") and m.id != "distlock.E004"] == []


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


@isolate_apps("djangotests.testapp")
@pytest.mark.parametrize("fencing", ["on", "strict"])
def test_a_manager_that_builds_a_plain_queryset_is_reported(fencing: str, settings: Any) -> None:
    """Every manager's own queryset class is made fenced (``models.Manager()``, ``Rich.as_manager()``); a manager whose
    ``get_queryset()`` builds Django's QuerySet itself would write past the fence and strict mode: reported by name.
    One whose ``get_queryset()`` fails when checks run is passed over, not a crash of ``manage.py check``."""
    from distlock_django import FencedQuerySet

    class Rich(models.QuerySet[Any]):
        pass

    class Mine(FencedQuerySet[Any]):
        pass

    class Own(models.Manager[Any]):
        def get_queryset(self) -> models.QuerySet[Any]:
            return models.QuerySet(self.model, using=self._db)

    class PerRequest(models.Manager[Any]):  # filters on request state: absent when checks run
        def get_queryset(self) -> models.QuerySet[Any]:
            raise AttributeError("'_thread._local' object has no attribute 'tenant'")

    class Wallet(FencedModel):
        fence_lock = "wallet:{pk}"
        plain = models.Manager()
        rich = Rich.as_manager()
        fine = Mine.as_manager()
        own = Own()
        per_request = PerRequest()

        class Meta:
            app_label = "testapp"

    settings.DISTLOCK = {**settings.DISTLOCK, "FENCING": fencing}
    messages = check_fenced_models(app_configs=[Wallet._meta.apps.get_app_config("testapp")])
    want = "distlock.E014" if fencing == "strict" else "distlock.W002"
    reported = sorted((m.msg.split(" is a manager")[0], m.id) for m in messages)
    assert reported == [("testapp.Wallet.own", want)], messages
    wallet: Any = Wallet
    assert isinstance(wallet.plain.all(), FencedQuerySet)
    assert isinstance(wallet.rich.all(), FencedQuerySet) and isinstance(wallet.rich.all(), Rich)
