"""A URL whose backend's extra is not installed raises ``ConfigurationError`` naming the extra to install, before any
network traffic (a row of the README's error table)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _support import child_env

# Run in a fresh interpreter: the client library is hidden from the import system there, and this process keeps it.
_PROBE = """
import sys
sys.modules[{module!r}] = None  # "import {module}" now raises ImportError, as when the package is not installed
import distlock
try:
    distlock.connect({url!r}, check=False)
except distlock.ConfigurationError as e:
    print("ConfigurationError:", e)
"""


@pytest.mark.parametrize(
    ("module", "url", "extra"),
    [
        ("grpc", "etcd://127.0.0.1:1", "pip install 'distlock-fenced[etcd]'"),
        ("redis", "redis://127.0.0.1:1", "'distlock-fenced[redis]'"),
        ("kazoo", "zk://127.0.0.1:1", "'distlock-fenced[zookeeper]'"),
        ("sqlalchemy", "sql+sqlite:////nonexistent/locks.db", "'distlock-fenced[sqltable]'"),
        ("psycopg", "sql+postgresql://127.0.0.1:1/db", "'distlock-fenced[sqltable-postgresql]'"),
        ("pymysql", "sql+mysql://127.0.0.1:1/db", "'distlock-fenced[sqltable-mysql]'"),
    ],
)
def test_a_backend_without_its_extra_raises_configuration_error(module: str, url: str, extra: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module, url=url)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ConfigurationError:") and extra in result.stdout, result.stdout
