"""Lock-name templates such as ``"order:{order_id}"`` or ``"user:{request.user.pk}"``, shared by every integration.

A template is checked when it is declared (a decorator, a task option, a model's ``fence_lock``), so a malformed one
fails at import time; it is rendered per call from named values, so a missing value fails at call time — both with
``InvalidKeyTemplate`` naming the template and what was available. Fields are names with optional attribute access
(``{request.user.pk}``) or item access (``{data[id]}``); no conversions or format specs, since a lock name must not
change with formatting options. The rendered name is validated like any lock name.

A template rendered from a function's arguments (Django's ``@distributed_lock``, Celery's ``unique_on``) is bound in
two steps written once here: :meth:`KeyTemplate.check_signature`, when the function is decorated, refuses a field the
function has no parameter for (``InvalidKeyTemplate``), and :meth:`KeyTemplate.call_values` turns each call's
arguments into the values to render from (``TypeError`` when they do not fit the signature, as the call itself would).
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ._errors import ConfigurationError, InvalidKeyTemplate
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

    def check_signature(
        self, target: Callable[..., Any] | inspect.Signature, *, owner: str | None = None
    ) -> inspect.Signature:
        """Check that a call of ``target`` (a function, or its signature) can always fill every field; return the
        signature. ``InvalidKeyTemplate`` for a field that is not a parameter, unless ``target`` takes ``**kwargs``.
        ``owner`` names the function in the message (default: its qualified name).
        """
        if isinstance(target, inspect.Signature):
            signature = target
        else:
            signature = inspect.signature(target)
            owner = owner or repr(getattr(target, "__qualname__", target))
        self.check_parameters(
            self.fields, signature, what=f"lock key template {self.template!r}", owner=owner or "the function"
        )
        return signature

    @staticmethod
    def check_parameters(
        names: Iterable[str],
        signature: inspect.Signature,
        *,
        what: str,
        owner: str,
        error: type[ConfigurationError] = InvalidKeyTemplate,
    ) -> None:
        """Raise ``error`` when one of ``names`` (which ``what`` declares) is not a parameter of ``signature`` and it
        takes no ``**kwargs`` that could bring it: a lock name that no call can make must fail where it is declared.
        """
        parameters = signature.parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return
        missing = [name for name in dict.fromkeys(names) if name not in parameters]
        if missing:
            one = len(missing) == 1
            raise error(
                f"{what} names {', '.join(map(repr, missing))}, which "
                f"{'is not a parameter' if one else 'are not parameters'} of {owner}, and it has no parameter "
                f"**kwargs to take {'it' if one else 'them'} from; its parameters are: "
                f"{', '.join(parameters) or 'none'}"
            )

    @staticmethod
    def call_values(
        signature: inspect.Signature, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The named values of one call, to render from: its bound arguments with defaults applied, and the items of
        ``**kwargs`` as names of their own (``*args`` stays one tuple). ``TypeError`` when the arguments do not fit.
        """
        bound = signature.bind(*args, **(kwargs or {}))
        bound.apply_defaults()
        values = dict(bound.arguments)
        for parameter in signature.parameters.values():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                values.update(values.pop(parameter.name, {}))
        return values


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
