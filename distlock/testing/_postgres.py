"""Throwaway real PostgreSQL for tests: `PostgresServer`, one server on 127.0.0.1.

Import it from `distlock.testing`. Its cluster (initdb once, on the first start), log and unix socket are in a
private temporary directory; it runs on a free loopback port on the shared lifecycle of ``_base``, with settings for
tests: trust authentication for the superuser ``distlock``, 127.0.0.1 only, ``fsync=off`` (a killed server still
keeps every commit it acknowledged). ``kill()`` and ``pause()`` reach the backends too, not only the postmaster. As
root it runs as an unprivileged user (``user``, ``$DISTLOCK_PG_USER``, ``postgres`` or ``distlock-pg``; created
only with ``create_user=True``). Binaries and users: docs/testing.md.

What can go wrong:

- No binary: `ConfigurationError`, naming the Debian package ``postgresql``. As root with no user to run as (or a
  useradd that is missing or fails, or a named user that is root): `ConfigurationError` saying what to do.
- A temporary directory that user cannot reach (``$TMPDIR`` under ``/root``) makes initdb fail: `ServerStartError`.
- postgres exits or is not ready within ``start_timeout``: `ServerStartError` with the tail of its log (a port
  taken meanwhile is retried on a first start). ``createdb`` failing is a `HarnessError`.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from distlock._errors import ConfigurationError
from distlock.testing._base import _HOST, HarnessError, _clean_env, _is_executable, _OnePortServer

__all__ = ["PostgresServer", "find_postgres_bin"]

_PG_USER = "distlock"  # the superuser initdb creates, and the database created for it
_PG_SYSTEM_USERS = ("postgres", "distlock-pg")  # looked for, in this order, when no user is named
_PG_HINT = "install the Debian/Ubuntu package postgresql (apt-get install postgresql), or run scripts/servers.sh"
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def find_postgres_bin() -> Path:
    """The directory of PostgreSQL's server binaries (``postgres``, ``initdb``, ``createdb``).

    ``$DISTLOCK_PG_BIN``, else the newest ``/usr/lib/postgresql/<version>/bin`` (Debian), else the directory of
    ``pg_ctl`` on ``$PATH``.
    """
    explicit = os.environ.get("DISTLOCK_PG_BIN")
    if explicit:
        if not _is_executable(Path(explicit) / "postgres"):
            raise ConfigurationError(f"$DISTLOCK_PG_BIN is {explicit!r}, which has no executable postgres in it")
        return Path(explicit)
    versions = [path for path in Path("/usr/lib/postgresql").glob("*/bin") if _is_executable(path / "postgres")]
    if versions:
        return max(versions, key=lambda path: [int(part) for part in re.findall(r"\d+", path.parent.name)] or [0])
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is not None:
        directory = Path(pg_ctl).resolve().parent
        if _is_executable(directory / "postgres"):
            return directory
    raise ConfigurationError(
        "no PostgreSQL server found (looked at $DISTLOCK_PG_BIN, /usr/lib/postgresql/*/bin and pg_ctl on $PATH): "
        f"{_PG_HINT}; or set $DISTLOCK_PG_BIN to a directory with postgres and initdb"
    )


def _postgres_os_user(name: str | None, create: bool) -> pwd.struct_passwd | None:
    """The unprivileged user to run PostgreSQL as when we are root; None when we are not root (it runs as us)."""
    if os.geteuid() != 0:
        return None
    name = name or os.environ.get("DISTLOCK_PG_USER") or None
    for candidate in (name,) if name else _PG_SYSTEM_USERS:
        try:
            found = pwd.getpwnam(candidate)
        except KeyError:
            continue
        if found.pw_uid == 0:
            raise ConfigurationError(f"PostgreSQL refuses to run as root, and the user {candidate} is root")
        return found
    missing = name or _PG_SYSTEM_USERS[-1]
    useradd = [
        "useradd", "--system", "--no-create-home", "--home-dir=/nonexistent", "--shell=/usr/sbin/nologin", missing,
    ]  # fmt: skip
    if not create:
        looked = name or " or ".join(_PG_SYSTEM_USERS)
        raise ConfigurationError(
            f"PostgreSQL refuses to run as root, and there is no user {looked} to run it as. Create one as root "
            f"(`{' '.join(useradd)}`; distlock's scripts/servers.sh creates $DISTLOCK_PG_USER or distlock-pg), "
            "name an existing unprivileged user with PostgresServer(user=...) or $DISTLOCK_PG_USER, or pass "
            "PostgresServer(create_user=True) to have it created"
        )
    binary = shutil.which("useradd")
    if binary is None:
        raise ConfigurationError(f"PostgresServer(create_user=True) needs useradd to create the user {missing}")
    result = subprocess.run([binary, *useradd[1:]], capture_output=True, text=True, check=False)
    try:
        return pwd.getpwnam(missing)  # a parallel test process may have created it first: that is fine
    except KeyError:
        raise ConfigurationError(f"could not create the user {missing}: {result.stderr.strip()}") from None


class PostgresServer(_OnePortServer):
    """One PostgreSQL server on 127.0.0.1, its cluster in its own temporary directory.

    The superuser ``distlock`` (trust authentication, no password) owns the database ``distlock`` that ``dsn``
    names; ``create_database()`` makes more. Stopping and killing keep the data and the port for ``start()``.

    As root, PostgreSQL runs as ``user``, else ``$DISTLOCK_PG_USER``, else ``postgres`` or ``distlock-pg``
    (whichever exists); none existing is a `ConfigurationError`, unless ``create_user=True`` asks to create
    the system user (``user``, ``$DISTLOCK_PG_USER`` or ``distlock-pg``) with useradd. As anybody else it runs
    as you, and both arguments are ignored.
    """

    _label = "PostgreSQL"
    _log_name = "postgres.log"
    _stop_signal = signal.SIGINT  # fast shutdown: ends sessions, writes a checkpoint

    def __init__(
        self,
        *,
        start_timeout: float = 60.0,
        settings: dict[str, str] | None = None,
        user: str | None = None,
        create_user: bool = False,
        port: int | None = None,
    ) -> None:
        bin_dir = find_postgres_bin()
        self._postgres = str(bin_dir / "postgres")
        self._initdb = str(bin_dir / "initdb")
        self._createdb = str(bin_dir / "createdb")
        self._user = _postgres_os_user(user, create_user)
        self._settings = {
            "listen_addresses": _HOST,
            # fsync off, but commits still write their WAL before answering (synchronous_commit stays on): a
            # killed server keeps every commit it acknowledged; only a crash of the machine could lose them.
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            "max_connections": "200",
            **(settings or {}),
        }
        super().__init__("distlock-pg-", start_timeout, port)
        try:
            if self._user is not None:
                os.chown(self._dir, self._user.pw_uid, self._user.pw_gid)
        except BaseException:
            self._finalizer()
            raise

    @property
    def socket_dir(self) -> Path:
        return self._dir / "socket"

    @property
    def dsn(self) -> str:
        """``postgresql://distlock@127.0.0.1:<port>/distlock``: a libpq URL for psycopg, SQLAlchemy, Django."""
        return self.dsn_for(_PG_USER)

    def dsn_for(self, database: str) -> str:
        """The libpq URL of another database on this server."""
        return f"postgresql://{_PG_USER}@{_HOST}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database (lower-case letters, digits, ``_``) and return its libpq URL."""
        if not isinstance(name, str) or not _DB_NAME.fullmatch(name):
            raise ConfigurationError(
                f"database name {name!r} must be 1-63 lower-case letters, digits or _, not starting with a digit"
            )
        self._createdb_run(name)
        return self.dsn_for(name)

    def _popen_kwargs(self) -> dict[str, Any]:
        env = _clean_env("PG")
        if self._user is not None:
            env.update(HOME=self._user.pw_dir, USER=self._user.pw_name, LOGNAME=self._user.pw_name)
        return {"env": env}

    def _run_as(self) -> pwd.struct_passwd | None:
        return self._user

    def _prepare(self) -> None:
        self.socket_dir.mkdir(mode=0o700)
        if self._user is not None:
            os.chown(self.socket_dir, self._user.pw_uid, self._user.pw_gid)
        command = [
            self._initdb,
            f"--pgdata={self.data_dir}",
            f"--username={_PG_USER}",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]
        self._run_step(command, "initdb")

    def _command(self) -> list[str]:
        command = [self._postgres, "-D", str(self.data_dir), "-p", str(self.port), "-k", str(self.socket_dir)]
        for key, value in self._settings.items():
            command += ["-c", f"{key}={value}"]
        return command

    def _ready(self) -> bool:
        # postgres writes its pid into line 1 of postmaster.pid and its state into line 8: "ready" means it
        # accepts connections (pg_ctl waits for the same). The pid tells a crashed server's stale file (which says
        # "ready" too) from ours. No client library needed, and no connection attempt that logs an error.
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[0].strip() == str(self.pid) and lines[7].strip() == "ready"

    def _after_first_start(self) -> None:
        self._createdb_run(_PG_USER)

    def _createdb_run(self, name: str) -> None:
        result = subprocess.run(
            [self._createdb, f"--host={_HOST}", f"--port={self.port}", f"--username={_PG_USER}", "--no-password", name],
            capture_output=True,
            text=True,
            timeout=60,
            env=_clean_env("PG"),
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise HarnessError(f"createdb {name} failed with code {result.returncode}: {result.stderr.strip()}")
