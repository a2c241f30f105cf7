"""Bad input and configuration: clear errors at task definition and before sending, an unreachable etcd at enqueue
time, lock names from arguments, settings from ``app.conf`` or Django's ``DISTLOCK`` (and Django never imported
otherwise)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from _support import REPO, UNMARKED, Unmarked, child_env
from celery import Celery

import distlock
from distlock.celery import DuplicateTask, SingletonTask, get_client, set_client_factory
from distlock.celery._handover import take_over


def _work(job: str, seconds: float, caller: int = 0) -> None:
    """A task body to declare tasks with."""


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery(f"config-{uuid.uuid4().hex[:6]}", set_as_current=False)
    yield app
    app.close()


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"unique_on": ["jobb"]}, distlock.ConfigurationError, r"unique_on names 'jobb'.*parameters are: job, seconds"),
        ({"unique_on": "work:{nope}"}, distlock.InvalidKeyTemplate, r"'nope'.*not a parameter"),
        ({"unique_on": "work:{job!r}"}, distlock.InvalidKeyTemplate, "format spec or conversion"),
        ({"unique_on": 42}, distlock.ConfigurationError, "list of parameter names or a key template"),
        ({"lock_on": "start"}, distlock.ConfigurationError, "lock_on must be 'run' or 'enqueue'"),
        ({"on_duplicate": "result"}, distlock.ConfigurationError, "does not work with lock_on='run'"),
        ({"lock_on": "enqueue", "on_duplicate": "retry"}, distlock.ConfigurationError, "with lock_on='enqueue'"),
        ({"lock_ttl": 0}, distlock.ConfigurationError, r"lock_ttl \(the lease length\) must be > 0"),
        ({"lock_max_hold": float("inf")}, distlock.ConfigurationError, "lock_max_hold must be a finite number"),
        ({"lock_limit": 0}, distlock.ConfigurationError, "lock_limit must be an int from 1 to 10000"),
        ({"lock_on": "enqueue", "lock_limit": 2}, distlock.ConfigurationError, "lock_limit works with lock_on='run'"),
        ({"on_unavailable": "skip"}, distlock.ConfigurationError, "on_unavailable must be 'fail' or 'retry'"),
        (
            {"lock_on": "enqueue", "on_unavailable": "retry"},
            distlock.ConfigurationError,
            "on_unavailable='retry' works with lock_on='run' only",
        ),
        ({"unavailable_retry_delay": -1}, distlock.ConfigurationError, "unavailable_retry_delay must be >= 0"),
        ({"once": "yes"}, distlock.ConfigurationError, "once must be True or False, not 'yes'"),
        ({"once_ttl": 0}, distlock.ConfigurationError, r"once_ttl \(how long a finished task id is remembered\)"),
    ],
)
def test_a_bad_task_option_fails_when_the_task_is_defined(
    app: Celery, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    decorate: Any = app.task(base=SingletonTask, shared=False, name="t.bad", lazy=False, **options)
    with pytest.raises(error, match=match) as caught:
        decorate(_work)
    assert "t.bad" in str(caught.value)


def test_a_lazily_declared_bad_task_fails_when_the_app_is_finalized(app: Celery) -> None:
    app.task(base=SingletonTask, shared=False, name="t.lazy", unique_on=["nope"])(_work)
    with pytest.raises(distlock.ConfigurationError, match="'nope'"):
        app.finalize()


def test_a_bound_task_is_checked_without_its_self_parameter(app: Celery) -> None:
    def bound(self: SingletonTask, job: str) -> None: ...

    with pytest.raises(distlock.ConfigurationError, match=r"parameters are: job$"):
        app.task(base=SingletonTask, shared=False, bind=True, name="t.bound", unique_on=["self"], lazy=False)(bound)


def test_lock_names_come_from_the_bound_arguments(app: Celery) -> None:
    every = app.task(base=SingletonTask, shared=False, name="t.every", lazy=False)(_work)
    some = app.task(base=SingletonTask, shared=False, name="t.some", unique_on=["job"], lazy=False)(_work)
    none = app.task(base=SingletonTask, shared=False, name="t.none", unique_on=[], lazy=False)(_work)
    templated = app.task(base=SingletonTask, shared=False, name="t.tpl", unique_on="report:{job}", lazy=False)(_work)
    assert every.singleton_key(("a", 1.0)) == 'celery:t.every:{"caller":0,"job":"a","seconds":1.0}'
    assert every.singleton_key(("a",), {"seconds": 1.0, "caller": 0}) == every.singleton_key(("a", 1.0))
    assert every.singleton_key(("a", 1.0)) != every.singleton_key(("a", 1.0, 1))
    assert some.singleton_key(("a", 1.0, 1)) == some.singleton_key(("a", 9.0)) == 'celery:t.some:{"job":"a"}'
    assert none.singleton_key(("a", 1.0)) == none.singleton_key(("b", 2.0)) == "celery:t.none:{}"
    assert templated.singleton_key(("a", 1.0)) == "report:a"
    when = dt.datetime(2026, 1, 2, 3, 4, 5)
    assert some.singleton_key((when, 1.0)) == 'celery:t.some:{"job":"2026-01-02 03:04:05"}'
    long = every.singleton_key(("x" * 500, 1.0))
    assert long.startswith("celery:t.every:sha256:") and len(long) < 100
    with pytest.raises(distlock.ConfigurationError, match="no stable text form"):
        every.singleton_key((object(), 1.0))
    with pytest.raises(TypeError, match="do not fit its signature"):
        every.singleton_key((), {"nope": 1})


def test_the_apps_key_prefix_goes_in_front_of_every_lock_name_and_the_run_holds_that_lock(
    app: Celery, etcd_url: str
) -> None:
    """``app.conf.distlock_key_prefix``, for a lock service shared with others (Django's ``KEY_PREFIX``, so that the
    admin's lock page lists the tasks' locks): in front of the argument names, the templates and a per-call key."""
    app.conf.distlock_url = etcd_url
    app.conf.distlock_key_prefix = "shop:"
    held: list[str] = []

    def body(task: Any, job: str) -> None:
        held.append(task.lock.name)
        assert get_client(app).holder(task.lock.name) is not None

    every = app.task(base=SingletonTask, shared=False, name="t.every", lazy=False)(_work)
    templated = app.task(base=SingletonTask, shared=False, name="t.tpl", unique_on="report:{job}", lazy=False)(_work)
    decorate: Any = app.task(base=SingletonTask, shared=False, name="t.bound", bind=True, unique_on=["job"], lazy=False)
    bound: Any = decorate(body)
    assert every.singleton_key(("a", 1.0)) == 'shop:celery:t.every:{"caller":0,"job":"a","seconds":1.0}'
    assert templated.singleton_key(("a", 1.0)) == "shop:report:a"
    assert templated.singleton_key(("a", 1.0), key="nightly") == "shop:nightly"
    job = f"j-{uuid.uuid4().hex[:6]}"
    assert bound.apply((job,)).state == "SUCCESS"
    assert held == [bound.singleton_key((job,))] == [f'shop:celery:t.bound:{{"job":"{job}"}}']
    app.conf.distlock_key_prefix = "bad\n"
    with pytest.raises(distlock.ConfigurationError, match="distlock_key_prefix must be a str without control"):
        every.singleton_key(("a", 1.0))


def _send_invoice(invoice_id: int, copy: bool = False) -> None:
    """The task body celery.md names its locks with."""


def _rebuild_report(customer_id: int, full: bool = False) -> None:
    """The task body celery.md names its locks with."""


def test_the_lock_names_celery_md_shows_are_the_tasks(app: Celery) -> None:
    page = (REPO / "docs" / "integrations" / "celery.md").read_text()
    send_invoice = app.task(base=SingletonTask, name="billing.tasks.send_invoice", lazy=False)(_send_invoice)
    rebuild_report = app.task(
        base=SingletonTask, name="billing.tasks.rebuild_report", unique_on=["customer_id"], lazy=False
    )(_rebuild_report)
    for name in (send_invoice.singleton_key((42,)), rebuild_report.singleton_key((7,))):
        assert f"`{name}`" in page, name
    assert "'celery:billing.tasks.rebuild_report:{\"customer_id\":7}'" in page  # quoted for the shell


def test_a_bad_per_call_option_fails_before_anything_is_sent(celery_app: Celery, redis_url: str) -> None:
    work = celery_app.tasks["t.work"]
    assert isinstance(work, SingletonTask)
    nowhere = f"nowhere-{uuid.uuid4().hex[:8]}"
    bad: list[Any] = [
        {"on_duplicat": "raise"},
        {"lock_ttl": -1},
        {"on_duplicate": "result"},
        {"key": "report:{job}"},
        {"key": ""},
        "raise",
    ]
    for singleton in bad:
        with pytest.raises(distlock.ConfigurationError):
            work.apply_async(("job", 0.0), queue=nowhere, singleton=singleton)
    assert redis.Redis.from_url(redis_url).llen(nowhere) == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_etcd_at_enqueue_time_is_a_clear_error_and_nothing_is_sent(
    celery_urls: tuple[str, str, str, str], make_celery_app: Callable[[str, str, str, str], Celery], redis_url: str
) -> None:
    broker, backend, _, queue = celery_urls
    dead = f"etcd://127.0.0.1:{_closed_port()}"
    app = make_celery_app(broker, backend, dead, queue)
    app.conf.distlock_options = {"connect_timeout": 0.5, "request_timeout": 0.5}
    nowhere = f"nowhere-{uuid.uuid4().hex[:8]}"
    broker_redis = redis.Redis.from_url(redis_url)
    try:
        started = time.monotonic()
        with pytest.raises(distlock.BackendUnavailable, match=dead.removeprefix("etcd://")):
            app.tasks["t.queued"].apply_async(("job", 0.0), queue=nowhere)
        assert time.monotonic() - started < 5
        assert broker_redis.llen(nowhere) == 0  # not sent: the caller got the error instead of a dropped task
        # lock_on="run" needs no lock service to send: the worker takes the lock when the task runs.
        app.tasks["t.work"].apply_async(("job", 0.0), queue=nowhere)
        assert broker_redis.llen(nowhere) == 1
    finally:
        broker_redis.delete(nowhere)
        app.close()


@pytest.mark.parametrize("on_unavailable", ["fail", "retry"])
def test_a_run_that_cannot_reach_the_lock_service_fails_or_retries_as_chosen(app: Celery, on_unavailable: str) -> None:
    app.conf.distlock_url = f"etcd://127.0.0.1:{_closed_port()}"
    app.conf.distlock_options = {"connect_timeout": 0.3, "fail_fast": 60}
    bodies: list[str] = []

    def body(job: str) -> None:
        bodies.append(job)

    options: Any = {"base": SingletonTask, "shared": False, "lazy": False, "max_retries": 2}
    decorate: Any = app.task(name="t.down", on_unavailable=on_unavailable, unavailable_retry_delay=0, **options)
    task: Any = decorate(body)
    retries: list[int] = []
    task.retry = functools.partial(_counting_retry, task.retry, retries)
    result = task.apply(("job",))  # eagerly, in this process, with a task id as in a worker (a retry runs again)
    assert isinstance(result.result, distlock.BackendUnavailable)
    assert bodies == []
    # The first run finds the service gone (within connect_timeout), the two retries are refused at once (failing
    # fast), and each asks for a retry: the last one, past max_retries, fails with the error.
    assert retries == ([] if on_unavailable == "fail" else [0, 1, 2])
    if on_unavailable == "retry":
        assert "failing fast" in str(result.result)
    with pytest.raises(distlock.BackendUnavailable):
        task("job")  # a direct call raises whatever the option says: it has no message to retry


def _counting_retry(retry: Callable[..., Any], retries: list[int], *args: Any, **kwargs: Any) -> Any:
    retries.append(len(retries))
    return retry(*args, **kwargs)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=False,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )


def test_lock_limit_lets_that_many_direct_calls_run_at_once(app: Celery, etcd_url: str) -> None:
    app.conf.distlock_url = etcd_url
    barrier = threading.Barrier(3, timeout=10)  # the two runs and this test
    tokens: list[int] = []

    def meet(self: SingletonTask, job: str) -> str:
        tokens.append(self.lock.token)
        barrier.wait()  # both runs hold at once, or this times out
        barrier.wait()  # ... until the test's third call has been turned away
        return "ran"

    options: Any = {"base": SingletonTask, "shared": False, "bind": True, "lazy": False, "lock_limit": 2}
    decorate: Any = app.task(name="t.limited", on_duplicate="raise", **options)
    task: Any = decorate(meet)
    job = uuid.uuid4().hex
    outcomes: list[str] = []
    runs = [threading.Thread(target=lambda: outcomes.append(task(job))) for _ in range(2)]
    for thread in runs:
        thread.start()
    barrier.wait()
    with pytest.raises(DuplicateTask):
        task(job)
    barrier.wait()
    for thread in runs:
        thread.join(20)
    assert outcomes == ["ran", "ran"] and len(set(tokens)) == 2


def test_settings_come_from_app_conf_and_django_is_never_imported(etcd_url: str) -> None:
    done = _python(f"""
        import sys
        from celery import Celery
        import distlock
        from distlock.celery import SingletonTask, get_client

        app = Celery("plain", set_as_current=False)
        try:
            get_client(app)
        except distlock.ConfigurationError as e:
            assert "app.conf.distlock_url" in str(e), e
        else:
            raise AssertionError("no error without a URL")
        app.conf.distlock_url = {etcd_url!r}
        client = get_client(app)
        assert get_client(app) is client
        assert client.holder("nothing") is None
        # kombu imports django.utils whenever Django is installed; Django's settings and our Django app stay out.
        ours = ("django.conf", "django.core", "django.db", "distlock_django")
        django = [m for m in sys.modules if m.startswith(ours)]
        assert not django, django
        print("ok")
    """)
    assert done.stdout.strip() == "ok", done.stderr


def test_without_app_conf_a_configured_django_project_supplies_the_client(etcd_url: str) -> None:
    done = _python(f"""
        import django
        from django.conf import settings
        settings.configure(
            INSTALLED_APPS=["distlock_django"],
            DISTLOCK={{"URL": {etcd_url!r}, "OPTIONS": {{"connect_timeout": 2}}}},
        )
        django.setup()  # the app's ready() hands its client to distlock.celery
        from celery import Celery
        import distlock_django
        from distlock.celery import get_client

        app = Celery("django-project", set_as_current=False)
        assert get_client(app) is distlock_django.get_client()
        app.conf.distlock_url = {etcd_url!r}
        assert get_client(app) is not distlock_django.get_client()  # app.conf wins
        print("ok")
    """)
    assert done.stdout.strip() == "ok", done.stderr


def test_a_worker_started_with_django_settings_uses_the_distlock_client(etcd_url: str, tmp_path: Path) -> None:
    """Celery's Django fixup sets Django up when a worker starts; distlock_django then supplies the client."""
    (tmp_path / "workersettings.py").write_text(
        f"INSTALLED_APPS = ['distlock_django']\nDISTLOCK = {{'URL': {etcd_url!r}}}\n"
    )
    env = {**child_env(), "DJANGO_SETTINGS_MODULE": "workersettings", "CELERY_SKIP_CHECKS": "1"}
    env["PYTHONPATH"] = os.pathsep.join((str(tmp_path), env["PYTHONPATH"]))
    code = """
        import sys
        from celery import Celery
        from distlock.celery import get_client

        app = Celery("django-worker", set_as_current=False)
        assert "distlock_django" not in sys.modules
        app.loader.import_default_modules()  # what a worker does first: the fixup runs django.setup() here
        import distlock_django

        assert get_client(app) is distlock_django.get_client()
        print("ok")
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_the_public_names_stay_exported() -> None:
    import distlock.celery

    # (Its order is ruff's isort-style sort, checked by ruff.)
    assert {"DuplicateTask", "RESERVATIONS", "SingletonTask", "get_client", "set_client_factory"} <= set(
        distlock.celery.__all__
    )
    assert all(hasattr(distlock.celery, name) for name in distlock.celery.__all__)
    assert issubclass(distlock.celery.DuplicateTask, distlock.LockNotAcquired)


def test_the_takeover_lock_is_measured_under_the_tasks_family(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every lock the integration takes carries a metrics family: the take-over lock the task's, with ``#takeover``."""
    with distlock.connect(f"memory://takeover-{uuid.uuid4().hex[:6]}") as client:
        families: list[str | None] = []
        lock = client.lock("report:7", family="billing.report", ttl=5)

        def spy(name: str, **options: Any) -> distlock.Lock:
            families.append(options.get("family"))
            return distlock.Client.lock(client, name, **options)

        monkeypatch.setattr(client, "lock", spy)
        assert take_over(client, lock, token=1, wait=0)  # reservation 1 has ended: the lock is free, and taken
        lock.release()
    assert families == ["billing.report#takeover"]


def test_a_skipped_duplicate_is_a_result_of_none_not_a_delay_returning_none(app: Celery) -> None:
    """What the README and celery.md say: ``delay()`` returns its ``AsyncResult`` as always; the duplicate is skipped,
    and its result is None (state ``SUCCESS``). Eagerly here; a worker's outcome is test_singleton_run.py's."""
    app.conf.task_always_eager = True
    app.conf.distlock_url = f"memory://eager-{uuid.uuid4().hex[:6]}"
    ran: list[int] = []

    @app.task(base=SingletonTask, unique_on=["customer_id"])
    def rebuild_report(customer_id: int) -> int:
        ran.append(customer_id)
        return customer_id

    with get_client(app).lock(rebuild_report.singleton_key((7,))):
        duplicate = rebuild_report.delay(7)
    assert (duplicate.state, duplicate.result, ran) == ("SUCCESS", None, [])
    assert rebuild_report.delay(7).result == 7


def test_once_runs_each_attempt_of_a_task_id_once(app: Celery) -> None:
    """``once=True`` eagerly, in this process, with task ids as in a worker (the broker's redeliveries:
    test_singleton_once.py): a delivery of an attempt that ended is acknowledged without running (``Ignore``), a
    retry's next attempt runs, a failed attempt counts as ended, and a direct call (no task id) always runs."""
    app.conf.distlock_url = f"memory://once-{uuid.uuid4().hex[:6]}"
    ran: list[int] = []
    options: Any = {"base": SingletonTask, "shared": False, "lazy": False, "bind": True, "once": True}

    def body(task: Any, n: int) -> int:
        ran.append(n)  # (not the request: Celery 5.3's Task.__call__ pushes a request of its own for the body)
        if n < 0:
            raise ValueError(n)
        return n

    decorate: Any = app.task(name="t.report", **options)
    report: Any = decorate(body)
    assert [report.apply((7,), task_id="a").state for _ in range(2)] == ["SUCCESS", "IGNORED"]
    assert report.apply((7,), task_id="a", retries=1).result == 7  # the retry's message: the next attempt
    assert report.apply((7,), task_id="a", retries=0).state == "IGNORED"
    assert [report.apply((-1,), task_id="b").state for _ in range(2)] == ["FAILURE", "IGNORED"]
    assert report(7) == report(7) == 7
    assert ran == [7, 7, -1, 7, 7]  # a's attempts 0 and 1, b's 0, and the two direct calls
    mark = get_client(app).read_mark(report.singleton_key((7,)), "a")
    assert mark is not None and json.loads(mark) == {"attempt": 1, "outcome": "success"}
    assert get_client(app).holder(report.singleton_key((7,))) is None


def test_once_on_a_lock_service_without_marks_fails_the_run_saying_so(app: Celery) -> None:
    app.conf.distlock_url = None
    unmarked = distlock.Client(Unmarked("celery-unmarked"))
    set_client_factory(lambda: unmarked)
    ran: list[int] = []

    def body(n: int) -> None:
        ran.append(n)

    try:
        decorate: Any = app.task(base=SingletonTask, shared=False, lazy=False, name="t.once_unmarked", once=True)
        task: Any = decorate(body)
        result = task.apply((7,))
        assert isinstance(result.result, distlock.ConfigurationError) and ran == []
        assert UNMARKED in str(result.result)
        assert get_client(app).holder(task.singleton_key((7,))) is None  # the lock was released
    finally:
        set_client_factory(None)
        unmarked.close()
