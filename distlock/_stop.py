"""Stop on loss: the scopes that stop a body when its lock is lost, ``Lock.scope()`` and ``AsyncLock.scope()``.

Both hang on one registry of the lock (:class:`LostHooks`), called on the thread that finds the loss (mostly the
keeper's). :class:`TaskScope` cancels the task that entered it, on its loop, and turns that cancellation into
``LockLost`` at the scope's exit, with ``asyncio.timeout()``'s accounting (``cancelling()``/``uncancel()``), so a
cancellation from outside stays a ``CancelledError`` and ``TaskGroup``s inside work. :class:`ThreadScope` works in
the main thread only: it sends :data:`STOP_SIGNAL` to the main thread, whose handler (installed for the scope's
duration) raises ``LockLost`` at the next bytecode the body runs, and in a blocking call that returns on ``EINTR``
(``time.sleep()``), as Celery's soft time limit does with SIGUSR1; inside distlock's own code it is put off to the
body's next line after that call, and it is sent again every ``RESEND_EVERY`` s until the body leaves the scope. A
signal that is not ours goes to the handler installed before. docs/lost.md has the user's view.

What can go wrong: ``ThreadScope`` in another thread, or inside a coroutine, raises ``ConfigurationError`` (no signal
reaches a thread but the main one; in a coroutine it would stop the event loop); a scope on a handle that does not
hold raises ``LockNotOwned``, on one lost already ``LockLost``. Code that does not return to Python (a C call that
retries ``EINTR``) and a ``finally`` block are not stopped until they are done; a forked child is never stopped (the
parent's hold is not the child's).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError, DistlockError, LockLost

if TYPE_CHECKING:
    from ._lock import Lock

__all__ = ["STOP_SIGNAL", "LostHooks", "TaskScope", "ThreadScope", "enter_or_release"]

#: The signal that interrupts the main thread when a lock of its ``scope()`` is lost (Celery's soft time limit uses
#: SIGUSR1; this one stays out of its way). Another handler of it keeps working: signals that are not ours go there.
STOP_SIGNAL = signal.SIGUSR2

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class LostHooks:
    """A lock's registry of what to call when its current hold is lost: ``Lock._mark_lost`` fires it on the thread
    that finds the loss (mostly the keeper's, so a hook must not block), ``_become_holder`` resets it. ``first`` is
    called on every loss of every hold, before the hooks of the hold (the lock's ``on_lost``, deferred)."""

    def __init__(self, first: Callable[[], None]) -> None:
        self._first = first
        self._mutex = threading.Lock()
        self._hooks: list[Callable[[], None]] = []
        self._fired = False

    def add(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook`` once when the hold is lost, at once if it is lost already; returns what unregisters it."""
        with self._mutex:
            fired = self._fired
            if not fired:
                self._hooks.append(hook)
        if fired:
            hook()
        return functools.partial(self._remove, hook)

    def _remove(self, hook: Callable[[], None]) -> None:
        with self._mutex:
            if hook in self._hooks:
                self._hooks.remove(hook)

    def fire(self) -> None:
        with self._mutex:
            self._fired = True
            hooks, self._hooks = self._hooks, []
        self._first()
        for hook in hooks:
            hook()

    def reset(self) -> None:
        with self._mutex:
            self._fired = False
            self._hooks = []


def _lost_error(locks: Sequence[Lock], how: str) -> LockLost:
    lock = next((lock for lock in locks if lock._lost_reason is not None), locks[0])
    return LockLost(f"lock {lock.name!r} was lost: {lock._lost_reason or 'reason unknown'}; {how}", name=lock.name)


def _unhook_all(unhooks: list[Callable[[], None]]) -> None:
    while unhooks:
        unhooks.pop()()


# -- the main thread --------------------------------------------------------------------------------------------

#: While a stopped scope's body runs on, its signal is sent again this often: a ``LockLost`` the body swallowed (an
#: ``except Exception`` of its own or of a library's, such as logging's ``emit``) or one put off because it came inside
#: distlock's own code is raised again, until the body leaves the scope (as a cancelled scope stays cancelled in Trio).
RESEND_EVERY = 0.2
#: ... and this soon after one was put off: a body that spends most of its time in distlock calls is stopped between
#: two of them within a few tries, not after many seconds of chances.
RESEND_SOON = 0.005
#: distlock's own code, where a stop is put off to the next signal: an exception raised there (between a
#: ``Condition``'s acquire and its ``with`` block, say) could leave the client's locks held. Integrations run bodies.
_OWN_CODE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_INTEGRATIONS = os.path.join(_OWN_CODE, "celery") + os.sep

#: The scopes entered in the main thread, innermost last, and the handler that was installed before the outermost.
_entered: list[ThreadScope] = []
_previous: list[_Handler] = []
#: Held while a hook sends the signal, and while a scope is disarmed: once disarmed, no signal of its is on its way.
_sending = threading.Lock()
#: True once a hook sent the signal, until the last scope is left: while it is true every STOP_SIGNAL counts as ours
#: (two signals sent at once may arrive as one or as two; the second must not reach a handler that ends the process).
_signalled = False


class ThreadScope:
    """``with lock.scope():`` in the main thread: ``LockLost`` is raised in the body when a lock is lost.

    The races, in the order they can happen. *Lost before entry*: ``ensure_held()`` raises at once; lost between that
    check and the hook's registration, the hook runs at registration and marks the scope fired before it is armed,
    and the check after arming raises. *Lost as the body ends*: ``__exit__`` first disarms the scope under the lock
    hooks send with, so no signal of this scope is sent after; one sent before may be handled by Python only later
    (in ``__exit__`` itself, or as ``signal.signal`` restores the previous handler, which runs pending handlers
    first): the handler declines to raise inside a scope's own exit, and raises for no disarmed scope, so the loss
    never surfaces after the ``with``. An outer scope whose loss arrived meanwhile raises at the end of the inner's
    exit, in its own body. *A fork in the body*: the hook of a hold in a forked child never signals (the child's
    keeper does not watch the parent's lease; the fence refuses the child's stale writes).
    """

    def __init__(self, locks: Sequence[Lock]) -> None:
        where = f"lock {locks[0].name!r}: scope() and stop_on_lost=True"
        if threading.current_thread() is not threading.main_thread():
            raise ConfigurationError(
                f"{where} interrupt the main thread only (by a signal); in another thread call lock.ensure_held() "
                "before each step instead (fenced writes refuse a stale holder's writes anyway), or run the work in "
                "asyncio, whose scope cancels the task"
            )
        if _loop_running():
            raise ConfigurationError(
                f"{where} of a sync lock inside a coroutine would stop the event loop, not the coroutine: use "
                "client.async_lock() (its scope cancels the task)"
            )
        self._locks = locks
        self._pid = os.getpid()
        self._armed = False  # True while the body runs: only then does a loss raise
        self._fired = False  # a lock of the scope was lost
        self._left = threading.Event()  # set when the scope is left: the resending stops
        self._put_off = False  # the last signal came inside distlock's own code: send the next one soon
        self._entry: FrameType | None = None  # the frame the body runs in (or is called from)
        self._unhooks: list[Callable[[], None]] = []

    def __enter__(self) -> None:
        for lock in self._locks:
            lock.ensure_held()
        self._entry = _caller()
        if not _entered:
            previous = signal.signal(STOP_SIGNAL, _on_signal)
            _previous.append(signal.SIG_DFL if previous is None else previous)  # None: refused in __init__
        _entered.append(self)
        try:
            self._unhooks.extend(lock._lost_hooks.add(self._lost) for lock in self._locks)
            self._armed = True
            if self._fired:  # fired before it was armed: its signal, if any, was declined
                raise _lost_error(self._locks, "before its scope was entered")
        except BaseException:
            self._leave()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._leave()

    def _leave(self) -> None:
        global _signalled
        with _sending:
            self._armed = False
        self._left.set()
        _stop_tracing()
        _unhook_all(self._unhooks)
        _entered.remove(self)
        if not _entered:
            signal.signal(STOP_SIGNAL, _previous.pop())  # runs a pending handler first, while ours is still in place
            _signalled = False
        pending = _pending()
        if pending is not None:  # an outer scope's loss, declined while this one was leaving: raise it in its body
            raise _lost_error(pending._locks, "its scope was stopped")

    def _lost(self) -> None:
        """The hook: on the thread that found the loss. Sends the signal, and again every ``RESEND_EVERY`` s from a
        thread of its own until the scope is left."""
        if self._send(first=True):
            threading.Thread(target=self._resend, name="distlock-stop", daemon=True).start()

    def _send(self, first: bool = False) -> bool:
        global _signalled
        with _sending:
            self._fired = True
            if not self._armed or os.getpid() != self._pid or (self._left.is_set() and not first):
                return False
            _signalled = True
            signal.pthread_kill(threading.main_thread().ident or 0, STOP_SIGNAL)
            return True

    def _resend(self) -> None:
        while not self._left.wait(RESEND_SOON if self._put_off else RESEND_EVERY):
            self._put_off = False
            if not self._send():
                return


def _pending() -> ThreadScope | None:
    return next((s for s in reversed(_entered) if s._armed and s._fired), None)


def _caller() -> FrameType | None:
    """The first frame, from the caller of ``scope().__enter__`` outwards, that is not distlock's own code: the frame
    whose ``with`` runs the body (the user's, or an integration's that runs a task in the scope)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and _own(frame):
        frame = frame.f_back
    return frame


def _own(frame: FrameType) -> bool:
    path = frame.f_code.co_filename
    return path.startswith(_OWN_CODE) and not path.startswith(_INTEGRATIONS)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if not _signalled:
        _chain(signum, frame)
        return
    pending = _pending()
    if pending is None:
        return
    # Not inside distlock's own code, between the interrupted bytecode and the body's frame: there a scope is being
    # left (it raises what is pending once it is done, see ThreadScope._leave), or the client's own locks may be
    # held half-way; the stop is put off to the body's next line (_raise_on_return), and sent again soon.
    outer = frame
    while outer is not None and outer is not pending._entry:
        if _own(outer):
            _raise_on_return(outer, pending)
            return
        outer = outer.f_back
    raise _lost_error(pending._locks, "its scope was stopped")


def _raise_on_return(own: FrameType, scope: ThreadScope) -> None:
    """Inside distlock's own code: raise at the next line of the body's code that called it, once it returns there
    (a line tracer on that frame: the exception a tracer raises is raised in its frame), and send again soon in case
    that never comes (a frame of distlock's own that runs the body, a generator)."""
    scope._put_off = True
    caller: FrameType | None = own
    while caller is not None and _own(caller):
        caller = caller.f_back
    if caller is None or caller.f_trace is not None:  # someone else traces it (a debugger): the resends will do
        return
    installed = sys.gettrace() is None

    def on_line(frame: FrameType, event: str, arg: object) -> object:
        if frame is not caller or event not in ("line", "return"):
            return on_line
        frame.f_trace = None
        if installed:
            _stop_tracing()
        if event == "line" and scope._armed and scope._fired:
            raise _lost_error(scope._locks, "its scope was stopped")
        return None

    caller.f_trace, caller.f_trace_lines = on_line, True
    if installed:
        sys.settrace(_no_new_frames)  # line events need tracing on; frames called from now on are not traced


def _no_new_frames(frame: FrameType, event: str, arg: object) -> None:
    return None


def _stop_tracing() -> None:
    """Turn off the tracing ``_raise_on_return`` turned on, if it is still ours (a scope left before the body's next
    line, or a frame that returned: left on, every later call of the thread would pay for it)."""
    if sys.gettrace() is _no_new_frames:
        sys.settrace(None)


def _chain(signum: int, frame: FrameType | None) -> None:
    """Hand a STOP_SIGNAL that is not ours to the handler installed before the first scope."""
    previous = _previous[0] if _previous else signal.SIG_DFL
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)  # the default action (ends the process), as if we were not there
        signal.raise_signal(signum)


# -- asyncio ----------------------------------------------------------------------------------------------------


class TaskScope:
    """``async with lock.scope():``: the task that entered is cancelled when a lock is lost, and ``LockLost`` raised
    at the exit (from the ``CancelledError``), as ``asyncio.timeout()`` raises ``TimeoutError``.

    The hook runs on the keeper's thread and only schedules ``_stop`` on the task's loop; ``_stop`` cancels the task
    only while the body runs, so a loss found as the body ends changes nothing. The task is always suspended inside
    the body when ``_stop`` runs (the exit sets ``_state`` before it awaits anything), so the cancellation is delivered
    there, never after the ``async with``. The exit converts only a cancellation of ours: when the task's
    ``cancelling()`` count is back at what it was on entry after ``uncancel()``, no other cancellation is under way.
    A forked child runs no loop of the parent's, and its keeper does not watch the parent's lease.
    """

    def __init__(self, locks: Sequence[Lock]) -> None:
        self._locks = locks
        self._state = "created"  # entered, stopping (cancelled by us), exited
        self._unhooks: list[Callable[[], None]] = []

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise ConfigurationError("an asynchronous lock scope runs inside an asyncio task")
        self._task, self._loop, self._cancelling = task, asyncio.get_running_loop(), task.cancelling()
        self._state = "entered"
        try:
            self._unhooks.extend(lock._lost_hooks.add(self._lost) for lock in self._locks)
            for lock in self._locks:  # after: a loss from here on finds the hook
                lock.ensure_held()
        except BaseException:
            self._state = "exited"  # a _stop scheduled by a hook of a lock lost already does nothing
            _unhook_all(self._unhooks)
            raise

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        stopping, self._state = self._state == "stopping", "exited"
        _unhook_all(self._unhooks)
        uncancelled = stopping and self._task.uncancel() <= self._cancelling  # no other cancellation under way
        if uncancelled and kind is not None and issubclass(kind, asyncio.CancelledError):
            raise _lost_error(self._locks, "its task was cancelled") from value

    def _lost(self) -> None:
        """The hook: on the thread that found the loss."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs in it to stop
            self._loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        if self._state == "entered":
            self._state = "stopping"
            self._task.cancel(f"distlock: lock {self._locks[0].name!r} was lost")


def enter_or_release(scope: ThreadScope, release: Callable[[], None]) -> ThreadScope:
    """Enter ``scope`` right after acquiring (``stop_on_lost``); if it raises (lost already), release first."""
    try:
        scope.__enter__()
    except BaseException:
        with contextlib.suppress(DistlockError):
            release()
        raise
    return scope
