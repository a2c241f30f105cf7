"""The README's first command, end to end: the example bank under load, a frozen writer, the singleton report.

Each test runs ``python -m scripts.demo`` (what ``bash scripts/demo.sh`` runs once ``.venv`` exists) as a process
of its own, marked by an environment variable that every process it starts inherits: after it exits, no process with
that mark may be left (etcd, the site, the Celery worker and its children, the frozen batch job).
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from _support import REPO, child_env

from scripts import demo

MARK = "DISTLOCK_DEMO_TEST_RUN"


def _env(mark: str) -> dict[str, str]:
    env = child_env()
    env[MARK] = mark
    return env


def run_demo(*args: str, timeout: float = 150) -> tuple[subprocess.CompletedProcess[str], str]:
    mark = uuid.uuid4().hex
    result = subprocess.run(
        [sys.executable, "-m", "scripts.demo", *args],
        cwd=REPO,
        env=_env(mark),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return result, mark


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


def test_without_its_fence_the_frozen_writer_loses_updates_and_the_report_says_so(etcd_url: str) -> None:
    result, mark = run_demo("--etcd", etcd_url, "--unfenced-writer", "--clients", "3", "--duration", "3")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = report(result.stdout)
    assert "ACCEPTED" in result.stdout
    assert number(lines["stale writes rejected"]) == 0
    assert number(lines["lost updates"]) >= 1
    assert left_behind(mark) == []


@pytest.mark.parametrize(
    ("url", "reason"),
    [("etcd://127.0.0.1:1", "could not reach etcd"), ("http://127.0.0.1:2379", "unsupported distlock URL scheme")],
    ids=["unreachable", "malformed"],
)
def test_a_bad_etcd_url_ends_with_a_clear_message(url: str, reason: str) -> None:
    result, mark = run_demo("--etcd", url)
    assert result.returncode == 2
    assert f"error: cannot use --etcd {url}: " in result.stderr
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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_while_the_writer_is_frozen_it_stops_every_process(signum: int) -> None:
    mark = uuid.uuid4().hex
    process = subprocess.Popen(
        [sys.executable, "-m", "scripts.demo", "--clients", "2", "--duration", "30"],
        cwd=REPO,
        env=_env(mark),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    seen = ""
    try:
        while "SIGSTOP" not in seen:
            ready, _, _ = select.select([process.stdout], [], [], 60)
            line = process.stdout.readline() if ready else ""
            assert line, f"the demo said nothing more: {seen}"
            seen += line
        assert left_behind(mark)  # the marks are seen: etcd, site, worker, the frozen job
        os.kill(process.pid, signum)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 128 + signum, err
    assert "interrupted" in err
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
