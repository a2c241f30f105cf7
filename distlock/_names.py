"""Lock names: validation, and the escaping that keeps one lock's keys out of another lock's key range.

A backend stores each lock under ``<prefix>/<escaped name>/`` and ranges over that prefix to find the lock's holder and
waiters. With a naive ``name + "/"`` the range of lock ``a`` would contain the keys of lock ``a/b``, and ``a`` would
queue behind ``a/b``'s waiters. Escaping ``%`` and ``/`` (and nothing else, so keys stay readable) makes the escaped
name free of ``/`` and the mapping injective: ``a/b`` becomes ``a%2Fb``, and a literal ``a%2Fb`` becomes ``a%252Fb``.
A backend whose keys reserve more characters (Redis: the braces of a hash tag) names them, and they are escaped the
same way; there is one escaper and one inverse for every backend.

What can go wrong is only bad input, and that raises :class:`~distlock.InvalidLockName` before anything is sent.
"""

from __future__ import annotations

import re
import unicodedata

from ._errors import InvalidLockName

__all__ = ["MAX_NAME_BYTES", "escape_name", "unescape_name", "validate_name"]

#: Longest accepted name, in UTF-8 bytes. etcd keys may be larger, but a name this long is a bug in the caller.
MAX_NAME_BYTES = 1024

_ESCAPE = re.compile("%([0-9A-F]{2})")


def validate_name(name: object, what: str = "lock name") -> str:
    """Return ``name`` if it can name a lock (``what``: a lock name, or a mark's key, which keeps the same rules),
    else raise :class:`InvalidLockName` saying why."""
    if not isinstance(name, str):
        raise InvalidLockName(f"a {what} must be a str, not {type(name).__name__}: {name!r}")
    if not name:
        raise InvalidLockName(f"a {what} must not be empty")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidLockName(f"{what} {name[:60]!r} is not valid Unicode text (lone surrogate)") from e
    if size > MAX_NAME_BYTES:
        raise InvalidLockName(
            f"{what} is {size} bytes long; the limit is {MAX_NAME_BYTES} (name starts {name[:40]!r}). "
            "Hash long identifiers into the name instead."
        )
    for position, char in enumerate(name):
        if unicodedata.category(char) == "Cc":
            raise InvalidLockName(
                f"{what} {name[:60]!r} has a control character {char!r} at position {position}; "
                "use printable characters only"
            )
    return name


def escape_name(name: str, reserved: str = "/") -> str:
    """The key-safe form of a validated name: ``%`` and every (ASCII) character of ``reserved`` become ``%XX``.

    Injective and free of the reserved characters: ``a/b`` → ``a%2Fb``, ``a%2Fb`` → ``a%252Fb``. etcd keys reserve
    ``/``; Redis keys also reserve the braces of their hash tags (``{`` → ``%7B``, ``}`` → ``%7D``).
    """
    escaped = name.replace("%", "%25")
    for char in reserved:
        escaped = escaped.replace(char, f"%{ord(char):02X}")
    return escaped


def unescape_name(escaped: str) -> str:
    """Inverse of :func:`escape_name`, whatever was reserved (for inspection tools)."""
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 16)), escaped)
