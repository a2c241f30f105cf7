"""A URL whose backend's extra is not installed raises ``ConfigurationError`` naming the extra to install, before any
network traffic (a row of the README's error table); an integration used without its framework raises an
``ImportError`` naming the extra too."""

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


def _run_probe(code: str) -> str:
    """What ``python -c code`` printed, in a child process without this one's Django settings; it must exit 0."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


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
    said = _run_probe(_PROBE.format(module=module, url=url))
    assert said.startswith("ConfigurationError:") and extra in said, said


_IMPORT_PROBE = """
import sys
sys.modules[{module!r}] = None
try:
    {statement}
except ImportError as e:
    print(type(e).__name__, e)
"""


@pytest.mark.parametrize(
    ("module", "statement", "message"),
    [
        # distlock_django itself imports without Django (its pytest plugin is loaded by every pytest run): its names
        # do not.
        ("django", "import distlock_django; from distlock_django import distributed_lock", "distlock_django needs"),
        ("sqlalchemy", "import distlock_sqla", "distlock_sqla needs"),
        ("celery", "import distlock.celery", "distlock.celery needs"),
    ],
    ids=["django", "sqlalchemy", "celery"],
)
def test_an_integration_without_its_extra_raises_import_error_naming_it(
    module: str, statement: str, message: str
) -> None:
    said = _run_probe(_IMPORT_PROBE.format(module=module, statement=statement)).strip()
    assert said.startswith(f"ModuleNotFoundError {message} the '{module}' extra"), said
    assert f"pip install 'distlock-fenced[{module}]'" in said, said
