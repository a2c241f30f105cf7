"""``DISTLOCK["URL"] = "django://<alias>"``: the SQL lock table of a database of ``DATABASES``, as that alias is now.

:func:`database_url` builds the ``sql+…`` URL of the alias from its settings, without connecting, each time it is
asked: so the shared client (``_client.py``) follows the alias when a test runner swaps in the test database, when a
``--parallel`` worker gets its clone, and back. PostgreSQL and MySQL/MariaDB keep the lock table in that database.
SQLite keeps it in a file of its own beside the database (``<NAME>-distlock``): SQLite has one writer per file, so a
lock table in the database file would wait for the very transaction that asks for the lock (a test's, or
``ATOMIC_REQUESTS``') once it has written a row. An in-memory database (Django's test database on SQLite is one) gets
a lock file in a temporary directory of the process's own, removed when the process ends: its locks are then the
process's only, like the database.

:func:`close_with_test_databases` (installed by the app) has Django's test database teardown close the shared client
before a test database is dropped, and remove its SQLite lock file, so that no pooled connection keeps
PostgreSQL from dropping it ("being accessed by other users") and no file is left; it wraps
``BaseDatabaseCreation.destroy_test_db``, which Django's runner and pytest-django both call. What can go wrong: an
alias ``DATABASES`` lacks or an engine without a lock table is a ``ConfigurationError`` naming the setting.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from multiprocessing import util as multiprocessing_util
from pathlib import Path
from typing import Any
from urllib.parse import quote

from distlock import ConfigurationError

__all__ = ["DJANGO_SCHEME", "alias_of", "close_with_test_databases", "database_url"]

#: ``DISTLOCK["URL"] = "django://<alias>"``: the SQL lock table in that database of ``DATABASES``.
DJANGO_SCHEME = "django"
#: Django's database engines that have a lock table, and the ``sql+`` scheme of each.
_LOCK_TABLE_ENGINES = {
    "django.db.backends.postgresql": "postgresql",
    "django.db.backends.mysql": "mysql",
    "django.db.backends.sqlite3": "sqlite",
}
#: The suffix of a SQLite database's lock file, after SQLite's own ``-journal`` and ``-wal``.
LOCK_FILE_SUFFIX = "-distlock"
#: This process's directory of lock files for in-memory databases: (pid, path), made on first use.
_memory_directory: tuple[int, Path] | None = None


def alias_of(url: str) -> tuple[str, str] | None:
    """``(alias, "?query")`` of a ``django://<alias>?query`` URL (alias ``default`` when empty); None for others."""
    scheme, _, rest = url.partition("://")
    if scheme != DJANGO_SCHEME:
        return None
    alias, _, query = rest.partition("?")
    return alias.rstrip("/") or "default", f"?{query}" if query else ""


def database_url(url: str, what: str = 'DISTLOCK["URL"]', *, connecting: bool = True) -> str:
    """The ``sql+…`` URL that ``django://<alias>?query`` means now (``url`` unchanged if it is no ``django://``).

    Only ``connecting`` makes the temporary directory of an in-memory database's lock file: a check makes nothing."""
    parsed = alias_of(url)
    if parsed is None:
        return url
    from django.db import connections

    alias, query = parsed
    if alias not in connections.settings:
        raise ConfigurationError(
            f'{what} = "{url}" names no database; DATABASES has {", ".join(sorted(connections.settings))}'
        )
    database = connections.settings[alias]
    engine = str(database.get("ENGINE", ""))
    vendor = _LOCK_TABLE_ENGINES.get(engine)
    if vendor is None:
        raise ConfigurationError(
            f'{what} = "{url}": its ENGINE {engine!r} has no lock table (PostgreSQL, MySQL/MariaDB and SQLite have '
            "one); name a lock service URL instead"
        )
    name = str(database.get("NAME") or "")
    if vendor == "sqlite":
        return f"sql+sqlite:///{_lock_file(name, connecting)}{query}"
    user, password = str(database.get("USER") or ""), str(database.get("PASSWORD") or "")
    credentials = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "") + "@" if user else ""
    host = str(database.get("HOST") or "localhost")
    port = f":{database['PORT']}" if database.get("PORT") else ""
    return f"sql+{vendor}://{credentials}{host}{port}/{quote(name, safe='')}{query}"


def _in_memory(name: str) -> bool:
    return not name or name == ":memory:" or "mode=memory" in name


def _lock_file(name: str, connecting: bool = True) -> Path:
    """The lock file of the SQLite database ``name``: beside it, or in this process's directory if in memory."""
    if not _in_memory(name):
        return Path(f"{Path(name).resolve()}{LOCK_FILE_SUFFIX}")
    label = re.sub(r"\W", "_", name.removeprefix("file:").partition("?")[0]) or "memory"
    if not connecting:
        return Path(tempfile.gettempdir()) / "distlock-django-…" / f"{label}.sqlite3"
    global _memory_directory
    if _memory_directory is None or _memory_directory[0] != os.getpid():  # a forked child makes its own
        directory = Path(tempfile.mkdtemp(prefix="distlock-django-"))
        # Finalizers run at the exit of the main process and of multiprocessing's children (a --parallel worker);
        # a child does not run those its parent registered.
        multiprocessing_util.Finalize(
            None, shutil.rmtree, args=(directory,), kwargs={"ignore_errors": True}, exitpriority=0
        )
        _memory_directory = (os.getpid(), directory)
    return _memory_directory[1] / f"{label}.sqlite3"


def close_with_test_databases(close_client: Callable[[], None]) -> None:
    """Have Django's test database teardown call ``close_client()`` first, and remove the database's SQLite lock file
    unless the database is kept (``--keepdb``). Installed once; later calls do nothing."""
    from django.db.backends.base.creation import BaseDatabaseCreation

    destroy = BaseDatabaseCreation.destroy_test_db
    if getattr(destroy, "_distlock", False):
        return

    @functools.wraps(destroy)
    def destroy_test_db(
        self: Any, old_database_name: Any = None, verbosity: int = 1, keepdb: bool = False, suffix: Any = None
    ) -> Any:
        close_client()
        settings = self.connection.settings_dict if suffix is None else self.get_test_db_clone_settings(suffix)
        name = str(settings["NAME"] or "")  # before the teardown puts the alias's own name back
        result = destroy(self, old_database_name, verbosity, keepdb, suffix)
        if self.connection.vendor == "sqlite" and not keepdb and not _in_memory(name):
            with contextlib.suppress(OSError):
                _lock_file(name).unlink()
        return result

    destroy_test_db._distlock = True  # type: ignore[attr-defined]
    BaseDatabaseCreation.destroy_test_db = destroy_test_db  # type: ignore[method-assign]
