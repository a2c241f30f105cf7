"""Every duration distlock takes is checked by one validator: a bad one is a ConfigurationError naming the option."""

from __future__ import annotations

import math
from typing import Any

import pytest

import distlock

BAD = [float("nan"), float("inf"), -math.inf, 1e12, 10**400, -1, "thirty", "30", True, None]


@pytest.mark.parametrize(
    ("option", "value"),
    # max_hold=None means no bound, so None is bad only for ttl.
    [("ttl", v) for v in BAD] + [("max_hold", v) for v in BAD if v is not None],
)
def test_bad_lock_durations_name_the_option(
    client: distlock.Client, lock_name: str, option: str, value: object
) -> None:
    options: dict[str, Any] = {option: value}
    with pytest.raises(distlock.ConfigurationError, match=option):
        client.lock(lock_name, **options)


@pytest.mark.parametrize("value", [v for v in BAD if v != float("inf")])
def test_bad_timeouts_name_the_option(client: distlock.Client, lock_name: str, value: object) -> None:
    with pytest.raises(distlock.ConfigurationError, match="timeout"):
        client.lock(lock_name, timeout=value)  # type: ignore[arg-type]
    if value is not None:  # acquire(timeout=None) means the handle's timeout
        with pytest.raises(distlock.ConfigurationError, match="timeout"):
            client.lock(lock_name).acquire(timeout=value)  # type: ignore[arg-type]


def test_an_infinite_timeout_waits_forever(client: distlock.Client, lock_name: str) -> None:
    lock = client.lock(lock_name, timeout=math.inf)
    assert lock.timeout == math.inf
    with lock:
        assert lock.owned()


@pytest.mark.parametrize("value", [*BAD, 0])
@pytest.mark.parametrize("option", ["connect_timeout", "request_timeout"])
def test_bad_connect_timeouts_name_the_option(option: str, value: object) -> None:
    with pytest.raises(distlock.ConfigurationError, match=option):
        distlock.connect("etcd://127.0.0.1:1", check=False, **{option: value})
    with pytest.raises(distlock.ConfigurationError, match=option):
        distlock.connect("redis://127.0.0.1:1", check=False, **{option: value})


def test_ten_years_is_the_longest_duration_and_every_backend_keeps_it(client: distlock.Client, lock_name: str) -> None:
    ten_years = 315_360_000
    with client.lock(lock_name, ttl=ten_years, max_hold=ten_years) as lock:
        assert lock.ttl == ten_years
        lock.ensure_held(verify=True)
    assert client.holder(lock_name) is None
    with pytest.raises(distlock.ConfigurationError, match=r"ttl .*at most 315360000 seconds"):
        client.lock(lock_name, ttl=ten_years + 1)


def test_the_validator_returns_a_float_and_passes_none_and_forever() -> None:
    assert distlock.seconds(3, "x") == 3.0 and isinstance(distlock.seconds(3, "x"), float)
    assert distlock.seconds(0, "x", allow_zero=True) == 0.0
    assert distlock.seconds(None, "x", allow_none=True) is None
    assert distlock.seconds(math.inf, "x", allow_forever=True) == math.inf
    with pytest.raises(distlock.ConfigurationError, match=r"^DISTLOCK\['TTL'\] must be > 0 seconds, not 0$"):
        distlock.seconds(0, "DISTLOCK['TTL']")


def test_an_unknown_lock_option_is_a_type_error(client: distlock.Client, lock_name: str) -> None:
    options: dict[str, Any] = {"tll": 30}
    with pytest.raises(TypeError, match=r"tll.*known: family, max_hold, on_lost, owner, stop_on_lost, timeout, ttl"):
        client.lock(lock_name, **options)
    with pytest.raises(TypeError, match="tll"):
        client.async_lock(lock_name, **options)
