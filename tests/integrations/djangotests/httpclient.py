"""An HTTP client for load-test processes (imports nothing from Django, so spawned processes start fast)."""

from __future__ import annotations

import http.client
from typing import Any


def post_many(address: str, path: str, count: int, barrier: Any, results: Any) -> None:
    """POST ``path`` ``count`` times, one connection each, after everyone reached ``barrier``; put the codes."""
    host, port = address.split(":")
    barrier.wait()
    codes = []
    for _ in range(count):
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            connection.request("POST", path)
            response = connection.getresponse()
            response.read()
            codes.append(response.status)
        finally:
            connection.close()
    results.put(codes)
