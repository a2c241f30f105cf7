"""Throwaway real MariaDB for tests: `MariaDBServer`, one mariadbd on 127.0.0.1.

Import it from `distlock.testing`. Its data directory (``mariadb-install-db`` once, on the first start), log and unix
socket are in a private temporary directory; it runs on a free loopback port on the shared lifecycle of ``_base``.
After the first start it creates the database and user ``distlock`` (password ``distlock``): ``url`` is a distlock
URL of the SQL lock table on it, ``sqlalchemy_url`` the same for SQLAlchemy. A killed server keeps every commit it
acknowledged (``innodb_flush_log_at_trx_commit=2``). Binaries: ``$DISTLOCK_MARIADB_BIN``, else ``mariadbd`` in
``/usr/sbin`` or on ``$PATH``. As root it runs as Debian's ``mysql`` user (as our direct child, so ``kill()``
crashes it for real), else with ``--user=root``.

What can go wrong:

- No binary: `ConfigurationError`, naming the Debian package ``mariadb-server``.
- ``mariadb-install-db`` fails, or mariadbd exits or is not ready within ``start_timeout``: `ServerStartError` with
  the tail of its log. Creating the user and database failing is a `HarnessError`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path

from distlock._errors import ConfigurationError
from distlock.testing._base import _HOST, HarnessError, _is_executable, _OnePortServer

__all__ = ["MariaDBServer", "find_mariadb_bin"]

_USER = "distlock"  # the SQL user, its password, and its database
_HINT = "install the Debian/Ubuntu package mariadb-server (apt-get install mariadb-server), or run scripts/servers.sh"


def find_mariadb_bin() -> dict[str, str]:
    """The paths of ``mariadbd``, ``mariadb-install-db`` and the ``mariadb`` client, by name.

    ``$DISTLOCK_MARIADB_BIN`` (a directory with all three), else Debian's ``/usr/sbin/mariadbd`` with the others on
    ``$PATH``.
    """
    names = ("mariadbd", "mariadb-install-db", "mariadb")
    explicit = os.environ.get("DISTLOCK_MARIADB_BIN")
    if explicit:
        found = {name: str(Path(explicit) / name) for name in names}
        missing = [name for name, path in found.items() if not _is_executable(Path(path))]
        if missing:
            raise ConfigurationError(f"$DISTLOCK_MARIADB_BIN is {explicit!r}, which has no {', '.join(missing)}")
        return found
    located = {name: shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin") for name in names}
    missing = [name for name, path in located.items() if path is None]
    if missing:
        raise ConfigurationError(f"no MariaDB server found ({', '.join(missing)} missing): {_HINT}")
    return {name: str(path) for name, path in located.items()}


class MariaDBServer(_OnePortServer):
    """One MariaDB server on 127.0.0.1, its data directory in its own temporary directory.

    The user ``distlock`` (password ``distlock``) owns the database ``distlock`` that ``url`` names. Stopping and
    killing keep the data and the port for ``start()``.
    """

    _label = "MariaDB"
    _log_name = "mariadb.log"
    _stop_signal = signal.SIGTERM  # a normal shutdown
    _stop_timeout = 30.0

    def __init__(self, *, start_timeout: float = 60.0, port: int | None = None) -> None:
        self._bin = find_mariadb_bin()
        self._os_user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._os_user = pwd.getpwnam("mysql")
            except KeyError:
                self._os_user = None
        super().__init__("distlock-mariadb-", start_timeout, port)
        try:
            if self._os_user is not None:
                os.chown(self._dir, self._os_user.pw_uid, self._os_user.pw_gid)
        except BaseException:
            self._finalizer()
            raise

    @property
    def socket_path(self) -> Path:
        return self._dir / "mariadb.sock"

    @property
    def sqlalchemy_url(self) -> str:
        """``mysql+pymysql://distlock:distlock@127.0.0.1:<port>/distlock``."""
        return f"mysql+pymysql://{_USER}:{_USER}@{_HOST}:{self.port}/{_USER}"

    @property
    def url(self) -> str:
        """``sql+mysql://distlock:distlock@127.0.0.1:<port>/distlock``: the SQL lock table in this server."""
        return f"sql+mysql://{_USER}:{_USER}@{_HOST}:{self.port}/{_USER}"

    def sql(self, statement: str) -> str:
        """Run SQL as root over the unix socket with the ``mariadb`` client; its output (tab-separated)."""
        result = subprocess.run(
            [self._bin["mariadb"], "--no-defaults", f"--socket={self.socket_path}", "--user=root", "--batch",
             "--skip-column-names", "--execute", statement],
            capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if result.returncode != 0:
            raise HarnessError(
                f"mariadb -e {statement!r} failed with code {result.returncode}: {result.stderr.strip()}"
            )
        return result.stdout

    def _user_options(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        return [f"--user={self._os_user.pw_name}"] if self._os_user is not None else ["--user=root"]

    def _run_as(self) -> pwd.struct_passwd | None:
        return self._os_user

    def _prepare(self) -> None:
        # Its own temporary directory: the server's internal temporary tables are files, by default in /tmp, which
        # other servers and test runs share (ci43: a bootstrap failed to delete one of its own there).
        for directory in (self.data_dir, self._tmp_dir):
            directory.mkdir(mode=0o700)
            if self._os_user is not None:
                os.chown(directory, self._os_user.pw_uid, self._os_user.pw_gid)
        command = [
            self._bin["mariadb-install-db"],
            "--no-defaults",
            f"--datadir={self.data_dir}",
            f"--tmpdir={self._tmp_dir}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *self._user_options(),
        ]
        self._run_step(command, "mariadb-install-db")

    def _command(self) -> list[str]:
        return [
            self._bin["mariadbd"],
            "--no-defaults",
            f"--datadir={self.data_dir}",
            f"--tmpdir={self._tmp_dir}",
            f"--port={self.port}",
            f"--bind-address={_HOST}",
            f"--socket={self.socket_path}",
            f"--pid-file={self._dir / 'mariadb.pid'}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=32M",
            "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=300",
            *self._user_options(),
        ]

    @property
    def _tmp_dir(self) -> Path:
        return self._dir / "tmp"

    def _ready(self) -> bool:
        return "ready for connections" in self.log_tail()

    def _after_first_start(self) -> None:
        self.sql(
            f"CREATE DATABASE {_USER}; CREATE USER '{_USER}'@'{_HOST}' IDENTIFIED BY '{_USER}'; "
            f"GRANT ALL PRIVILEGES ON {_USER}.* TO '{_USER}'@'{_HOST}';"
        )
