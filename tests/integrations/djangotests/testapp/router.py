"""Routes every query to the database chosen for the current test, so one test run covers SQLite and PostgreSQL.

A process-wide choice (tests run one at a time, and their threads must follow it); a server process takes its
database from ``DISTLOCK_DJANGO_DB``.
"""

from __future__ import annotations

import os
from typing import Any

CURRENT = [os.environ.get("DISTLOCK_DJANGO_DB", "default")]


class ContextRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str:
        return CURRENT[0]

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return CURRENT[0]

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return True
