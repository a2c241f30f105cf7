"""The Django app: add ``"distlock_django"`` to ``INSTALLED_APPS`` to get the system checks."""

from __future__ import annotations

from django.apps import AppConfig


class DistlockConfig(AppConfig):
    name = "distlock_django"
    verbose_name = "distlock"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
