"""Lock-name templates and fences: what the integrations build on."""

from __future__ import annotations

import inspect
import re
from types import SimpleNamespace
from typing import Any

import pytest

import distlock


def test_template_renders_names_attributes_and_items() -> None:
    template = distlock.KeyTemplate("order:{order.pk}:{request.user.id}:{data[id]}:{n}")
    assert template.fields == ("order", "request", "data", "n")
    request = SimpleNamespace(user=SimpleNamespace(id=7))
    values = {"order": SimpleNamespace(pk=42), "request": request, "data": {"id": "x"}, "n": 3}
    assert template.render(values) == "order:42:7:x:3"


@pytest.mark.parametrize("text", ["", "a{", "a}", "{}", "{0}", "{x!r}", "{x:>4}", "{x.}", "{x[]}", "{1x}"])
def test_malformed_templates_fail_when_declared(text: str) -> None:
    with pytest.raises(distlock.InvalidKeyTemplate):
        distlock.KeyTemplate(text)


def test_missing_and_unresolvable_fields_fail_when_rendered() -> None:
    template = distlock.KeyTemplate("order:{order_id}:{user.pk}")
    with pytest.raises(distlock.InvalidKeyTemplate, match="needs 'order_id', but the call provides: user"):
        template.render({"user": SimpleNamespace(pk=1)})
    with pytest.raises(distlock.InvalidKeyTemplate, match=r"cannot resolve \{user.pk\}"):
        template.render({"order_id": 1, "user": object()})


def test_a_rendered_name_is_validated() -> None:
    with pytest.raises(distlock.InvalidLockName):
        distlock.KeyTemplate("x:{v}").render({"v": "a\nb"})


def test_a_template_is_checked_against_the_signature_it_renders_from() -> None:
    def view(request: object, pk: int, page: int = 1) -> None: ...

    def flexible(pk: int, **kwargs: Any) -> None: ...

    template = distlock.KeyTemplate("order:{order_id}:{pk}")
    with pytest.raises(distlock.InvalidKeyTemplate, match=r"'order_id', which is not a parameter of '.*view'"):
        template.check_signature(view)
    assert template.check_signature(flexible) == inspect.signature(flexible)  # **kwargs may bring it
    with pytest.raises(distlock.ConfigurationError, match=r"parameters are: request, pk, page$") as caught:
        distlock.KeyTemplate.check_parameters(
            ["nope"], inspect.signature(view), what="x", owner="f", error=distlock.ConfigurationError
        )
    assert not isinstance(caught.value, distlock.InvalidKeyTemplate)


def test_call_values_bind_a_call_with_defaults_and_spread_kwargs() -> None:
    def f(a: int, b: int = 2, *args: int, **kwargs: int) -> None: ...

    values = distlock.KeyTemplate.call_values(inspect.signature(f), (1,), {"order_id": 3})
    assert values == {"a": 1, "b": 2, "args": (), "order_id": 3}
    assert distlock.KeyTemplate("o:{order_id}:{a}:{b}").render(values) == "o:3:1:2"
    with pytest.raises(TypeError):
        distlock.KeyTemplate.call_values(inspect.signature(f), (), {})


def test_fence_for_uses_the_lock_of_that_name(client: distlock.Client, lock_name: str) -> None:
    assert distlock.fence_for(f"{lock_name}:1") is None
    with client.lock(f"{lock_name}:1", ttl=5) as one, client.lock(f"{lock_name}:2", ttl=5) as two:
        assert distlock.fence_for(f"{lock_name}:1") == distlock.Fence(one.name, one.token)
        assert distlock.fence_for(f"{lock_name}:2") == two.fence
        assert distlock.fence_for(f"{lock_name}:1", one) == one.fence
        assert distlock.current_fence() == two.fence
        with pytest.raises(distlock.LockNotOwned, match="guarded by lock"):
            distlock.fence_for(f"{lock_name}:1", two.fence)


def test_fence_for_write_refuses_other_locks_and_strict_unfenced_writes(
    client: distlock.Client, lock_name: str
) -> None:
    row = f"{lock_name}:row"
    assert distlock.fence_for_write(row, what="Row pk=1", strict=False) is None
    unheld = re.escape(f"Row pk=1 is guarded by lock '{row}', which is not held here")
    with pytest.raises(distlock.UnfencedWrite, match=unheld):
        distlock.fence_for_write(row, what=lambda: "Row pk=1", strict=True)
    with client.lock(f"{lock_name}:other", ttl=5) as other:
        with pytest.raises(distlock.LockNotOwned, match=re.escape(f"the lock held here is '{other.name}'")):
            distlock.fence_for_write(row, what="Row pk=1", strict=False)
        assert distlock.fence_for_write(row, what="Row pk=1", strict=False, inserting=True) is None
        with pytest.raises(distlock.LockNotOwned, match="guarded by lock"):
            distlock.fence_for_write(row, other, what="Row pk=1", strict=False)
        with client.lock(row, ttl=5) as mine:
            assert distlock.fence_for_write(row, what="Row pk=1", strict=True) == mine.fence


@pytest.mark.parametrize(
    ("current", "read", "why"),
    [
        (None, None, "the row no longer exists"),
        (9, None, "the row carries the newer token 9: a newer holder of lock 'a:1' has claimed it"),
        (5, 3, r"written after this session read it \(read with token 3, now 5\)"),
        (5, None, "the row's token is 5"),
    ],
)
def test_the_stale_token_message_says_why(current: int | None, read: int | None, why: str) -> None:
    message = distlock.stale_token_message("update of A pk=1", 5, current, read=read, lock="a:1")
    assert message.startswith("update of A pk=1 with fencing token 5 refused: ")
    assert re.search(why, message), message
