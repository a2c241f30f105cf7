"""The Redis backend (``redis://``, ``rediss://``, ``redis+cluster://``; the ``redis`` extra): Lua scripts over
redis-py connections. ``_backend`` is ``RedisBackend``; ``_connections`` the servers, pools and the wait for a
wake-up; ``_scripts`` loads the ``lua/*.lua`` scripts and runs them; ``_keys`` names the keys; ``_url`` parses the
URLs. How it works: docs/operations/redis.md.

Importing this package imports no client library; ``_backend`` imports redis-py (and says which extra to install
when it is missing) and is loaded only when a Redis URL is used. :func:`socket_timeout` is what ``_url`` and
``_backend`` both agree on.
"""

from __future__ import annotations

__all__ = ["socket_timeout"]


def socket_timeout(connect_timeout: float, request_timeout: float) -> float:
    """The timeout of every socket operation of a connection: it also bounds the connection handshake (AUTH,
    ...), so that a paused server fails ``connect()`` within ``connect_timeout``."""
    return min(connect_timeout, request_timeout)
