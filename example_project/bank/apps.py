from __future__ import annotations

from django.apps import AppConfig


class BankConfig(AppConfig):
    name = "bank"
    verbose_name = "Bank"
