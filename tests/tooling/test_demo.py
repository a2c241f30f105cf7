"""The README's first command, end to end: the example bank under load, a frozen writer, the singleton report.

Each test runs ``python -m scripts.demo`` (what ``bash scripts/demo.sh`` runs once ``.venv`` exists) as a process
of its own, marked by an environment variable that every process it starts inherits: after it exits, no process with
that mark may be left (etcd, the site, the Celery worker and its children, the frozen batch job).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support import REPO, child_env

from scripts import demo

MARK = "DISTLOCK_DEMO_TEST_RUN"


def _env(mark: str) -> dict[str, str]:
    env = child_env()
    env[MARK] = mark
    return env


def left_behind(mark: str) -> list[str]:
    """Processes still alive that the demo run marked ``mark`` started (their command lines)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"pid {entry.name}: {command[:160]}")
        except OSError:  # gone meanwhile, or a zombie
            continue
    return found


def report(out: str) -> dict[str, str]:
    """The closing report's lines, label -> the text after it."""
    assert "\nreport\n" in out, out
    lines = out.split("\nreport\n", 1)[1].splitlines()
    return {m[1]: m[2] for line in lines if (m := re.match(r"  ([a-z ]+):\s+(.*)", line))}


def number(text: str) -> int:
    match = re.match(r"\d+", text)
    assert match, text
    return int(match[0])


@contextlib.contextmanager
def running_demo(mark: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """The demo in the background; stopped (SIGTERM, so that it cleans up; then SIGKILL) if still running after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "scripts.demo", *args],
        cwd=REPO,
        env=_env(mark),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


def read_until(process: subprocess.Popen[bytes], text: str, timeout: float = 60) -> str:
    """The demo's output up to ``text`` (read from the pipe unbuffered: select() must see every byte)."""
    assert process.stdout is not None
    seen = b""
    while text.encode() not in seen:
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        chunk = os.read(process.stdout.fileno(), 65536) if ready else b""
        assert chunk, f"the demo said nothing more (exit code {process.poll()}): {seen.decode()}"
        seen += chunk
    return seen.decode()


def stop(process: subprocess.Popen[bytes], signum: int) -> str:
    """Send ``signum`` and wait for the demo to exit; its stderr."""
    os.kill(process.pid, signum)
    _, err = process.communicate(timeout=30)
    return err.decode()


def run_demo(*args: str, timeout: float = 150) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the demo to its end; what it printed, and its mark."""
    mark = uuid.uuid4().hex
    with running_demo(mark, *args) as process:
        out, err = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, out.decode(), err.decode()), mark


def test_the_demo_refuses_the_frozen_writer_and_loses_no_update() -> None:
    result, mark = run_demo("--clients", "3", "--duration", "4", "--reports", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = report(result.stdout)
    assert number(lines["lost updates"]) == 0
    assert number(lines["stale writes rejected"]) >= 1
    assert "REFUSED by the database" in result.stdout
    expected, actual = re.findall(r"\d+", lines["balances"])[:2]
    assert expected == actual
    assert number(lines["requests"]) > 0
    assert number(lines["lock acquisitions"]) > 0
    assert "contention answers" in lines
    runs, skipped = number(lines["report runs"]), number(lines["duplicate tasks skipped"])
    assert runs >= 1
    assert skipped >= 1  # five enqueues at once, one 1 s run at a time: the others meet it
    assert runs + skipped == 5
    assert "overlapping: 0; failed: 0" in lines["report runs"]
    assert left_behind(mark) == []


def test_without_its_fence_the_frozen_writer_loses_updates_and_the_report_says_so(redis_url: str) -> None:
    """On Redis (``--lock-url``): the demo runs on any lock service, and the lost updates are the fence's to stop."""
    result, mark = run_demo("--lock-url", redis_url, "--unfenced-writer", "--clients", "3", "--duration", "3")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = report(result.stdout)
    assert "ACCEPTED" in result.stdout
    assert number(lines["stale writes rejected"]) == 0
    assert number(lines["lost updates"]) >= 1
    assert left_behind(mark) == []


def test_the_demo_runs_on_a_sql_lock_table(tmp_path: Path) -> None:
    """``--lock-url`` with a SQLite lock table (its ``?prefix=`` added to a four-slash URL without losing a slash)."""
    url = f"sql+sqlite:///{tmp_path / 'locks.db'}"
    result, mark = run_demo("--lock-url", url, "--clients", "3", "--duration", "3", "--reports", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "locks:     SQL lock table" in result.stdout
    with sqlite3.connect(tmp_path / "locks.db") as db:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert any(name.startswith("distlock_demo_") and name.endswith("_waiters") for name in tables), tables
    assert number(report(result.stdout)["lost updates"]) == 0
    assert "REFUSED by the database" in result.stdout
    assert left_behind(mark) == []


@pytest.mark.parametrize(
    ("url", "reason"),
    [("etcd://127.0.0.1:1", "could not reach etcd"), ("http://127.0.0.1:2379", "unsupported distlock URL scheme")],
    ids=["unreachable", "malformed"],
)
def test_a_bad_etcd_url_ends_with_a_clear_message(url: str, reason: str) -> None:
    result, mark = run_demo("--etcd", url)  # the older name of --lock-url
    assert result.returncode == 2
    assert "error: cannot use --lock-url: " in result.stderr
    assert reason in result.stderr
    assert "Traceback" not in result.stderr
    assert left_behind(mark) == []


def test_an_occupied_port_ends_with_a_clear_message_and_stops_etcd_and_the_worker() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result, mark = run_demo("--port", str(port))
    assert result.returncode == 2
    assert f"error: port {port} is in use: choose another with --port" in result.stderr
    assert "throwaway etcd" in result.stdout  # etcd and the worker had been started when the site failed
    assert "Traceback" not in result.stderr
    assert left_behind(mark) == []


def test_interrupted_while_the_writer_is_frozen_it_stops_every_process() -> None:
    mark = uuid.uuid4().hex
    with running_demo(mark, "--clients", "2", "--duration", "30") as process:
        read_until(process, "SIGSTOP")
        assert left_behind(mark)  # etcd, the site, the worker and its children, the frozen job
        err = stop(process, signal.SIGINT)  # Ctrl-C
    assert process.returncode == 130, err
    assert "interrupted (SIGINT); every process the demo started is stopped" in err
    assert left_behind(mark) == []


def test_serve_keeps_the_site_up_after_the_report_until_sigterm() -> None:
    mark = uuid.uuid4().hex
    with running_demo(mark, "--clients", "1", "--duration", "1", "--reports", "1", "--serve") as process:
        out = read_until(process, "Ctrl-C stops everything")
        port = int(re.findall(r"http://127\.0\.0\.1:(\d+)/admin/distlock/", out)[-1])
        accounts = demo.request(port, "GET", "/api/accounts/")
        assert accounts.status == 200
        assert len(accounts.body["accounts"]) == 4
        err = stop(process, signal.SIGTERM)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "interrupted (SIGTERM)" in err
    assert left_behind(mark) == []


@pytest.mark.parametrize(
    "args",
    [["--clients", "0"], ["--duration", "0"], ["--port", "70000"], ["--accounts", "1"], ["--ttl", "-1"]],
    ids=["clients", "duration", "port", "accounts", "ttl"],
)
def test_bad_options_are_refused_before_anything_starts(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        demo.parse(args)
    assert exit_info.value.code == 2
    assert "error: --" in capsys.readouterr().err
