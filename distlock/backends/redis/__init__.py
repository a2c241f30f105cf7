"""The Redis backend (``redis://``, ``rediss://``, ``redis+cluster://``; the ``redis`` extra): Lua scripts over
redis-py connections, in ``_backend``.

Importing this package imports no client library; ``_backend`` imports redis-py and is loaded only when a Redis URL
is used; ``_url`` parses its URLs. :func:`socket_timeout` is what both agree on.
"""

from __future__ import annotations

__all__ = ["socket_timeout"]


def socket_timeout(connect_timeout: float, request_timeout: float) -> float:
    """The timeout of every socket operation of a connection: it also bounds the connection handshake (AUTH,
    ...), so that a paused server fails ``connect()`` within ``connect_timeout``."""
    return min(connect_timeout, request_timeout)
