"""The test app's admin: its fenced models under ``FencedModelAdmin`` (used by test_django_admin.py)."""

from __future__ import annotations

from django.contrib import admin

from distlock_django.admin import FencedModelAdmin

from .models import Account, Entry


class EntryInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Entry
    fields = ("book", "amount", "memo")
    extra = 0


@admin.register(Account)
class AccountAdmin(FencedModelAdmin):
    list_display = ("id", "balance", "note")
    list_editable = ("balance", "note")
    fields = ("balance", "note")
    inlines = (EntryInline,)


@admin.register(Entry)
class EntryAdmin(FencedModelAdmin):
    fields = ("book", "amount", "memo")
