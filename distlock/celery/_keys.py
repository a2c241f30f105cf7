"""Lock names of singleton tasks: which arguments make two calls "the same", checked when the task is defined.

By default two calls are the same task when they have the same task name and the same bound arguments (defaults
applied, so ``f(1)`` and ``f(1, b=2)`` with ``b=2`` the default are one call). ``unique_on`` narrows that:

- a list of parameter names: only those arguments count (``[]``: one run of the task at a time, whatever the
  arguments);
- a key template such as ``"report:{customer_id}"``: the lock name itself, rendered from the bound arguments
  (so tasks that share a template exclude each other).

Names are checked against the signature of the task's ``run`` when Celery creates the task class: a name that is not
a parameter raises ``ConfigurationError`` (``InvalidKeyTemplate`` for a template) right there, not at the first call.
Arguments become part of the name as canonical JSON (sorted keys; tuples and lists alike; datetimes, UUIDs and
Decimals as text); a name longer than :data:`MAX_READABLE` characters is shortened to a SHA-256 digest. An argument
that has no stable JSON form (an arbitrary object, whose ``repr`` may change per process) raises
``ConfigurationError`` asking for ``unique_on``: a key that silently differs between calls would make the lock
useless.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import inspect
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from distlock import ConfigurationError, InvalidKeyTemplate, KeyTemplate

__all__ = ["MAX_READABLE", "KeySpec", "run_signature"]

#: Longest lock name kept readable; longer ones end in a digest of the arguments instead.
MAX_READABLE = 200
_PREFIX = "celery:"


def run_signature(task_class: type) -> inspect.Signature:
    """The signature of ``task_class.run`` as a caller sees it (without ``self`` for a method or ``bind=True``)."""
    raw = inspect.getattr_static(task_class, "run")
    if isinstance(raw, staticmethod):
        return inspect.signature(raw.__func__)
    signature = inspect.signature(raw)
    parameters = list(signature.parameters.values())
    return signature.replace(parameters=parameters[1:])


class KeySpec:
    """How one task's lock name is made from a call: checked once, applied per call."""

    def __init__(self, where: str, signature: inspect.Signature, unique_on: object) -> None:
        self.signature = signature
        self.template: KeyTemplate | None = None
        self.names: tuple[str, ...] | None = None
        if unique_on is None:
            return
        if isinstance(unique_on, str):
            try:
                self.template = KeyTemplate(unique_on)
                self.template.check_signature(signature, owner="the task")
            except InvalidKeyTemplate as e:
                raise InvalidKeyTemplate(f"{where}: unique_on: {e}") from e
            return
        if not isinstance(unique_on, Sequence) or not all(isinstance(n, str) for n in unique_on):
            raise ConfigurationError(
                f"{where}: unique_on must be a list of parameter names or a key template string, not {unique_on!r}"
            )
        KeyTemplate.check_parameters(
            unique_on, signature, what=f"{where}: unique_on", owner="the task", error=ConfigurationError
        )
        self.names = tuple(dict.fromkeys(unique_on))

    def name_for(self, task_name: str, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> str:
        """The lock name of one call of task ``task_name``; ``TypeError`` when the arguments do not fit."""
        try:
            values = KeyTemplate.call_values(self.signature, args or (), kwargs)
        except TypeError as e:
            raise TypeError(f"task {task_name!r} called with arguments that do not fit its signature: {e}") from e
        if self.template is not None:
            return self.template.render(values)
        if self.names is not None:
            missing = [n for n in self.names if n not in values]
            if missing:
                raise ConfigurationError(
                    f"task {task_name!r}: unique_on names {', '.join(map(repr, missing))}, "
                    "but this call does not pass it"
                )
            values = {n: values[n] for n in self.names}
        try:
            text = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_stable)
        except _Unstable as e:
            raise ConfigurationError(
                f"task {task_name!r}: cannot make a lock name from argument value {e.value!r} "
                f"({type(e.value).__name__} has no stable text form); leave it out with unique_on=[...] or name "
                "the lock with a key template"
            ) from None
        name = f"{_PREFIX}{task_name}:{text}"
        if len(name) > MAX_READABLE or not name.isprintable():
            name = f"{_PREFIX}{task_name}:sha256:{hashlib.sha256(text.encode()).hexdigest()}"
        return name


class _Unstable(TypeError):
    def __init__(self, value: object) -> None:
        super().__init__(repr(value))
        self.value = value


def _stable(value: object) -> object:
    if isinstance(value, dt.datetime | dt.date | dt.time | uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.hex()
    raise _Unstable(value)
