"""The ``distlock`` command line: what ``list``, ``show`` and ``force-release`` print, in text and ``--json``, and its
exit statuses (0 done, 1 nothing released, 2 bad input, 3 the service failed), on every backend.

Most tests call ``distlock._cli.main`` in this process (the same code the console script and ``python -m distlock``
run); the last ones run ``python -m distlock`` to see what a shell sees: one line on stderr, no traceback.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator

import pytest
from _support import REPO, child_env, queued, wait_until

import distlock
from distlock._cli import main

# The distlock command runs in a process of its own: it refuses a memory:// URL (another process's memory), so its
# tests run on every backend but the in-memory one (see tests/backends/memory for that refusal).
pytestmark = pytest.mark.real_server


@pytest.fixture
def held_with_two_waiters(client: distlock.Client, lock_name: str) -> Iterator[list[distlock.Lock]]:
    """``lock_name`` held by one handle, two more queued behind it in order; all released after the test."""
    locks = [client.lock(lock_name, ttl=30, owner=f"owner-{i}") for i in range(3)]
    assert locks[0].acquire()
    threads: list[threading.Thread] = []
    for lock in locks[1:]:
        threads.append(threading.Thread(target=lock.acquire, kwargs={"timeout": 30}))
        threads[-1].start()
        wait_until(functools.partial(queued, client, lock_name, len(threads)), 10, f"waiter {len(threads)} to queue")
    yield locks
    for lock, waiting in zip(locks, [None, *threads], strict=True):
        if waiting is not None:
            waiting.join(30)
        with contextlib.suppress(distlock.LockLost):  # the holder a test force-released
            lock.release()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_list_and_show_print_the_holder_then_the_waiters_in_order(
    held_with_two_waiters: list[distlock.Lock], backend_url: str, lock_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = held_with_two_waiters[0]
    for argv in (["list", "--prefix", lock_name], ["show", lock_name]):
        status, out, err = run(capsys, "--url", backend_url, *argv)
        assert (status, err) == (0, "")
        header, *lines = out.splitlines()
        assert header.split() == ["LOCK", "ROLE", "TOKEN", "LEASE", "LEFT", "OWNER"]
        assert [line.split()[1:3] for line in lines] == [
            ["holder", str(holder.token)],
            ["waiter", "1"],
            ["waiter", "2"],
        ]
        assert [line.split()[-1] for line in lines] == ["owner-0", "owner-1", "owner-2"]


def test_json_output_is_the_lock_state(
    held_with_two_waiters: list[distlock.Lock],
    backend: str,
    backend_url: str,
    lock_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, "--url", backend_url, "list", "--prefix", lock_name, "--json")
    assert status == 0
    (state,) = json.loads(out)
    assert state["name"] == lock_name
    assert state["holder"]["token"] == held_with_two_waiters[0].token
    assert state["holder"]["owner"] == "owner-0"
    if backend == "zookeeper":  # ZooKeeper does not tell one client how long another's session has left
        assert state["holder"]["ttl_left"] is None
    else:
        assert 0 < state["holder"]["ttl_left"] <= 30
    assert [w["owner"] for w in state["waiters"]] == ["owner-1", "owner-2"]
    assert state["waiters"][0]["token"] < state["waiters"][1]["token"]
    status, out, _ = run(capsys, "--json", "--url", backend_url, "show", lock_name)
    assert status == 0
    shown = json.loads(out)
    assert [shown["holder"]["token"], *(w["token"] for w in shown["waiters"])] == [
        state["holder"]["token"],
        *(w["token"] for w in state["waiters"]),
    ]


def test_show_of_a_free_lock(backend_url: str, lock_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--url", backend_url, "show", lock_name) == (
        0,
        f"lock {lock_name!r} is free: no holder, no waiters\n",
        "",
    )
    status, out, _ = run(capsys, "--url", backend_url, "show", lock_name, "--json")
    assert status == 0 and json.loads(out) is None
    assert run(capsys, "--url", backend_url, "list", "--prefix", lock_name) == (0, "no locks held\n", "")


def test_force_release_exits_0_when_released_and_1_when_the_token_is_not_the_holders(
    held_with_two_waiters: list[distlock.Lock],
    client: distlock.Client,
    backend_url: str,
    lock_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    holder, first, _ = held_with_two_waiters
    stale = str(holder.token - 1)
    status, out, err = run(capsys, "--url", backend_url, "force-release", lock_name, "--token", stale)
    assert (status, out) == (1, "")
    assert f"lock {lock_name!r} was not released: its holder's token is {holder.token} (owner owner-0)" in err
    assert err.rstrip().endswith(f"not {stale}; nothing changed")
    holder.ensure_held(verify=True)

    status, out, err = run(
        capsys, "--url", backend_url, "force-release", lock_name, "--token", str(holder.token), "--json"
    )
    assert (status, err) == (0, "")
    answer = json.loads(out)
    assert (answer["name"], answer["token"], answer["released"]) == (lock_name, holder.token, True)
    # The answer names who holds it now: the first waiter, as soon as it has taken its turn, or nobody yet.
    assert answer["holder"] is None or answer["holder"]["owner"] == "owner-1"
    wait_until(first.owned, 10, "the first waiter to get the lock")

    status, out, err = run(capsys, "--url", backend_url, "force-release", lock_name, "--token", str(holder.token))
    assert (status, out) == (1, "")
    assert f"its holder's token is {first.token} (owner owner-1), not {holder.token}; nothing changed" in err
    first.ensure_held(verify=True)


def test_the_url_comes_from_the_environment(
    backend_url: str, lock_name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DISTLOCK_URL", backend_url)
    assert run(capsys, "show", lock_name)[0] == 0
    monkeypatch.delenv("DISTLOCK_URL")
    status, out, err = run(capsys, "show", lock_name)
    assert (status, out) == (2, "")
    assert err == "distlock: no lock service: pass --url URL or set DISTLOCK_URL\n"


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--url", "bogus://127.0.0.1:1", "list"], 2, "unsupported distlock URL scheme 'bogus'"),
        (["--url", "etcd://127.0.0.1:1", "--connect-timeout", "0.5", "list"], 3, "could not reach etcd at 127.0.0.1:1"),
        (
            ["--url", "redis://127.0.0.1:1", "--connect-timeout", "0.5", "list"],
            3,
            "could not reach Redis at 127.0.0.1:1",
        ),
        (["--url", "etcd://127.0.0.1:1", "--connect-timeout", "-1", "list"], 2, "connect_timeout"),
        # A bad name is refused before connecting (nothing listens on port 1).
        (["--url", "etcd://127.0.0.1:1", "show", ""], 2, "a lock name must not be empty"),
        (["--url", "etcd://127.0.0.1:1", "force-release", "", "--token", "3"], 2, "a lock name must not be empty"),
        (["--url", "etcd://127.0.0.1:1", "show", "a\x01"], 2, "control character"),
    ],
)
def test_bad_input_is_one_line_on_stderr(
    argv: list[str], status: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (status, "")
    assert err.startswith("distlock: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize(("token", "message"), [("-3", "positive int"), ("0", "positive int")])
def test_a_bad_token_changes_nothing(
    held_with_two_waiters: list[distlock.Lock],
    backend_url: str,
    lock_name: str,
    token: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(capsys, "--url", backend_url, "force-release", lock_name, "--token", token)
    assert (status, out) == (2, "")
    assert message in err
    held_with_two_waiters[0].ensure_held(verify=True)


def _python_m_distlock(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distlock", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )


def test_python_m_distlock_fails_without_a_traceback() -> None:
    for argv, status in (
        (("--url", "bogus://x", "list"), 2),
        (("--url", "etcd://127.0.0.1:1", "--connect-timeout", "0.3", "force-release", "job", "--token", "7"), 3),
        (("--url", "etcd://127.0.0.1:1", "force-release", "job", "--token", "seven"), 2),  # argparse's own usage error
        (("--url", "etcd://127.0.0.1:1"), 2),  # no command
    ):
        result = _python_m_distlock(*argv)
        assert result.returncode == status, (argv, result.stderr)
        assert result.stdout == "" and "Traceback" not in result.stderr and result.stderr.strip(), argv


def test_python_m_distlock_lists_locks(
    held_with_two_waiters: list[distlock.Lock], backend_url: str, lock_name: str
) -> None:
    result = _python_m_distlock("--url", backend_url, "list", "--prefix", lock_name)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 4  # the header, the holder, two waiters


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"distlock {distlock.__version__}\n"


def test_the_console_script_is_declared() -> None:
    with open(REPO / "pyproject.toml", "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["distlock"] == "distlock._cli:main"
