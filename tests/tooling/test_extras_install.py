"""Each extra works installed alone: a fresh venv gets only ``distlock-fenced[<extra>]`` from a wheel of this checkout
and runs that integration's smoke script (``tests/tooling/extras/``) against the session's real servers. The ``dev``
extra installs everything, so nothing else in the suite could see an integration that imports a package its extra
lacks (as ``distlock_sqla`` once needed greenlet, which SQLAlchemy 2.1 stopped installing).

The wheel is built as a release builds it (CONTRIBUTING.md, "Releasing"): ``python -m build`` makes the sdist and
then the wheel from the unpacked sdist, so a file the sdist leaves out fails here, and ``twine check --strict``
judges both. The venv's Python runs isolated (``-I``: no ``PYTHONPATH``, no current directory), so only the
installed wheel is imported, never the checkout."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest
from _support import REPO

import distlock
from distlock.testing._plugin import ThrowawayServers

#: extras -> the smoke script, and the backend of the lock service it runs on (the plugin's throwaway one).
SMOKES = {
    "etcd": ("smoke_etcd.py", "etcd"),
    "etcd,sqlalchemy": ("smoke_sqlalchemy.py", "etcd"),
    "etcd,django": ("smoke_django.py", "etcd"),
    "etcd,django-tasks": ("smoke_django_tasks.py", "etcd"),
    "etcd,celery": ("smoke_celery.py", "etcd"),
    "etcd,otel": ("smoke_otel.py", "etcd"),
    "redis": ("smoke_redis.py", "redis"),
    "zookeeper": ("smoke_zookeeper.py", "zookeeper"),
    "sqltable": ("smoke_sqltable.py", "sqlite-table"),
    "sqltable-postgresql": ("smoke_sqltable.py", "postgres-table"),
    "sqltable-mysql": ("smoke_sqltable.py", "mariadb-table"),
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "-o", str(out), str(REPO)], check=True, timeout=300)
    (sdist,) = out.glob("*.tar.gz")
    (built,) = out.glob("*.whl")
    subprocess.run([sys.executable, "-m", "twine", "check", "--strict", sdist, built], check=True, timeout=120)
    # the distribution's name, not its packages', and the version written once (distlock/__init__.py)
    assert built.name == f"distlock_fenced-{distlock.__version__}-py3-none-any.whl", built.name
    return built


@pytest.mark.parametrize("extras", list(SMOKES))
def test_extra_installed_alone_runs_its_integration(
    extras: str, wheel: Path, tmp_path: Path, distlock_servers: ThrowawayServers
) -> None:
    script, backend = SMOKES[extras]
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # This pip installs into the venv (``--python``): the venv holds only the extra's packages, and the run saves
    # a pip of its own per extra and the byte-compiling (together 6 of every 8 s here).
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile"]
    subprocess.run([*install, f"{wheel}[{extras}]"], check=True, timeout=600)
    # Isolated, from an empty directory: the checkout's packages must not shadow the installed ones.
    result = subprocess.run(
        [python, "-I", str(Path(__file__).with_name("extras") / script), distlock_servers.url(backend)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr
