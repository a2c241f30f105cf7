"""Lock-name templates such as ``"order:{order_id}"`` or ``"user:{request.user.pk}"``, shared by every integration.

A template is checked when it is declared (a decorator, a task option, a model's ``fence_lock``), so a malformed one
fails at import time; it is rendered per call from named values, so a missing value fails at call time — both with
``InvalidKeyTemplate`` naming the template and what was available. Fields are names with optional attribute access
(``{request.user.pk}``) or item access (``{data[id]}``); no conversions or format specs, since a lock name must not
change with formatting options. The rendered name is validated like any lock name.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from ._errors import InvalidKeyTemplate
from ._names import validate_name

__all__ = ["KeyTemplate"]

_formatter = string.Formatter()


class KeyTemplate:
    """A parsed lock-name template. ``fields`` are the root names it needs, in order of first use."""

    __slots__ = ("_paths", "fields", "template")

    def __init__(self, template: str) -> None:
        if not isinstance(template, str) or not template:
            raise InvalidKeyTemplate(f"a lock key template must be a non-empty str, not {template!r}")
        self.template = template
        paths: list[tuple[str, tuple[tuple[str, str], ...]]] = []
        try:
            parsed = list(_formatter.parse(template))
        except ValueError as e:
            raise InvalidKeyTemplate(f"malformed lock key template {template!r}: {e}") from e
        for _, field, spec, conversion in parsed:
            if field is None:
                continue
            if spec or conversion:
                raise InvalidKeyTemplate(
                    f"lock key template {template!r}: field {{{field}}} has a format spec or conversion; "
                    "use plain fields like {order_id} or {obj.pk}"
                )
            paths.append(_parse_field(template, field))
        self._paths = tuple(paths)
        self.fields = tuple(dict.fromkeys(root for root, _ in paths))
        if not paths:
            validate_name(template)

    def __repr__(self) -> str:
        return f"KeyTemplate({self.template!r})"

    def render(self, values: Mapping[str, Any]) -> str:
        """The lock name for ``values``; ``InvalidKeyTemplate`` when a field is missing or cannot be resolved."""
        rendered: list[str] = []
        index = 0
        for literal, field, _, _ in _formatter.parse(self.template):
            rendered.append(literal)
            if field is None:
                continue
            root, steps = self._paths[index]
            index += 1
            if root not in values:
                available = ", ".join(sorted(values)) or "nothing"
                raise InvalidKeyTemplate(
                    f"lock key template {self.template!r} needs {root!r}, but the call provides: {available}"
                )
            value = values[root]
            trail = root
            for kind, name in steps:
                try:
                    value = getattr(value, name) if kind == "." else value[name]
                except (AttributeError, KeyError, IndexError, TypeError) as e:
                    step = f".{name}" if kind == "." else f"[{name}]"
                    raise InvalidKeyTemplate(
                        f"lock key template {self.template!r}: cannot resolve {{{trail}{step}}}: {e!r}"
                    ) from e
                trail += f".{name}" if kind == "." else f"[{name}]"
            rendered.append(str(value))
        return validate_name("".join(rendered))


def _parse_field(template: str, field: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Split ``a.b[c].d`` into ``("a", ((".", "b"), ("[", "c"), (".", "d")))``."""
    root, rest = _split_root(field)
    if not root.isidentifier():
        raise InvalidKeyTemplate(
            f"lock key template {template!r}: {{{field}}} must start with a name (positional fields are not allowed)"
        )
    steps: list[tuple[str, str]] = []
    while rest:
        if rest[0] == ".":
            name, rest = _split_root(rest[1:])
            if not name.isidentifier():
                raise InvalidKeyTemplate(f"lock key template {template!r}: bad attribute in {{{field}}}")
            steps.append((".", name))
        elif rest[0] == "[":
            end = rest.find("]")
            if end <= 1:
                raise InvalidKeyTemplate(f"lock key template {template!r}: bad index in {{{field}}}")
            steps.append(("[", rest[1:end]))
            rest = rest[end + 1 :]
        else:
            raise InvalidKeyTemplate(f"lock key template {template!r}: cannot parse {{{field}}}")
    return root, tuple(steps)


def _split_root(text: str) -> tuple[str, str]:
    for i, char in enumerate(text):
        if char in ".[":
            return text[:i], text[i:]
    return text, ""
