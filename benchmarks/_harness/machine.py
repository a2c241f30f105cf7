"""What a benchmark's section says about the machine: the CPU, the software measured, the server.

:func:`machine` is those lines for a lock or database benchmark; :func:`cpu_line` and :func:`software_line` are its
parts, for a benchmark that describes its servers itself. The software line names which distlock was measured: the
git commit of its source tree, and whether that tree had uncommitted changes (a figure of code that is in no commit
says so). A package that is not installed is written as such, never an error; so is a source tree that is not a git
checkout.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import distlock

if TYPE_CHECKING:
    from benchmarks._harness.servers import ServerUnderTest

__all__ = ["ETCD_PACKAGES", "cpu_line", "machine", "package_version", "software_line"]

#: The packages that the etcd benchmarks' machine line names (label: distribution).
ETCD_PACKAGES = {"grpcio": "grpcio", "protobuf": "protobuf", "python3-etcd3": "python3-etcd3"}


def package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_line() -> str:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"- CPU: {cpu}, {os.cpu_count()} cores; {platform.system()} {platform.release()}"


def software_line(packages: Mapping[str, str]) -> str:
    """Python, the versions of ``packages`` (label: distribution), and which distlock was measured."""
    versions = "".join(f"{label} {package_version(dist)}, " for label, dist in packages.items())
    return f"- Python {platform.python_version()}, {versions}distlock {distlock.__version__} ({_checkout()})"


def machine(server: ServerUnderTest, packages: Mapping[str, str]) -> list[str]:
    """The CPU, the software (see :func:`software_line`) and the server: a section's lines on the machine."""
    return [cpu_line(), software_line(packages), f"- {server.product} {server.version()}: {server.description}"]


def _checkout() -> str:
    """Which distlock was measured: the git commit of its source tree, and whether it had local changes."""
    source = Path(distlock.__file__).parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return "not a git checkout, or no commit yet"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if git("status", "--porcelain", "--", "."):
            return f"commit {commit} with uncommitted changes"
    return f"commit {commit}"
