"""A lock held by a parent process is not held in its forked child: no token, no context, no ownership, so the child
can never write as a second holder under the parent's token. Runs on each backend."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import distlock


def _outcome(call: Callable[[], object]) -> str:
    try:
        return f"returned {call()!r}"
    except Exception as e:
        return type(e).__name__


def _in_child(report: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``report`` in a forked child and return what it reported (over a pipe, as JSON)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's clean-up (atexit, fixtures)
        code = 0
        try:
            os.close(read_end)
            try:
                answer: dict[str, Any] = report()
            except BaseException as e:
                answer = {"error": repr(e)}
            with os.fdopen(write_end, "w") as pipe:
                json.dump(answer, pipe)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    result: dict[str, Any] = json.loads(text)
    assert "error" not in result, result["error"]
    return result


def test_a_lock_the_parent_holds_is_not_owned_in_a_forked_child(client: distlock.Client, lock_name: str) -> None:
    with client.lock(lock_name, ttl=5) as lock:
        token = lock.token
        assert distlock.current_token() == token

        def report() -> dict[str, Any]:
            return {
                "owned": lock.owned(),
                "lost": lock.lost,
                "lost_event": lock.lost_event.is_set(),
                "token": _outcome(lambda: lock.token),
                "fence": _outcome(lambda: lock.fence),
                "ensure_held": _outcome(lock.ensure_held),
                "release": _outcome(lock.release),
                "current_lock": distlock.current_lock() is not None,
                "current_token": distlock.current_token(),
                "current_token_by_name": distlock.current_token(lock_name),
                "current_fence": distlock.current_fence() is not None,
                "held_for": lock.held_for,
                # The child's own attempt on the same handle and on a new one: the parent still holds the lock.
                "acquire_inherited_handle": _outcome(lambda: lock.acquire(blocking=False)),
                "acquire_new_handle": _outcome(lambda: client.lock(lock_name, ttl=5).acquire(blocking=False)),
                "leaving_the_with_block": _outcome(lambda: lock.__exit__(None, None, None)),
            }

        child = _in_child(report)
        assert child == {
            "owned": False,
            "lost": True,
            "lost_event": True,
            "token": "LockNotOwned",
            "fence": "LockNotOwned",
            "ensure_held": "LockNotOwned",
            "release": "LockNotOwned",
            "current_lock": False,
            "current_token": None,
            "current_token_by_name": None,
            "current_fence": False,
            "held_for": 0.0,
            "acquire_inherited_handle": "returned False",
            "acquire_new_handle": "returned False",
            "leaving_the_with_block": "returned None",
        }
        # The parent's hold is untouched by all that.
        assert lock.owned() and not lock.lost and lock.token == token
        assert distlock.current_token() == token
        lock.ensure_held(verify=True)
