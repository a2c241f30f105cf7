"""The admin: accounts with their ``fence_token`` beside the live state of their locks (read from etcd).

The account list shows, for each row, the token of the last lock holder that wrote it and who holds its lock now;
under the list, every account lock with its holder and each queued waiter (the lock page at ``admin/distlock/``
shows every lock, one row each, and can force-release a holder). Accounts are read-only here: an edit from the admin
would be a write outside the account's lock.
"""

from __future__ import annotations

import contextvars
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

import distlock
from distlock_django import get_client, lock_name

from .models import Account, Movement, ReportRun

#: The account locks as read for the changelist being rendered (one read per page, not one per row).
_states: contextvars.ContextVar[dict[str, dict[str, int]] | None] = contextvars.ContextVar("bank_locks", default=None)


def account_locks() -> tuple[list[dict[str, Any]], str | None]:
    """Rows of the account locks (holder first, then waiters in queue order), or an error message."""
    prefix = lock_name("account:")
    try:
        states = [s for s in get_client().inspect() if s.name.startswith(prefix)]
    except distlock.DistlockError as e:
        return [], f"{type(e).__name__}: {e}"
    rows = []
    for state in states:
        for position, waiter in enumerate((state.holder, *state.waiters)):
            rows.append(
                {
                    "name": state.name,
                    "role": "holder" if position == 0 else f"waiter {position}",
                    "token": waiter.token,
                    "ttl_left": waiter.ttl_left,
                    "owner": waiter.owner,
                }
            )
    return rows, None


class ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Account)
class AccountAdmin(ReadOnly):
    list_display = ("id", "owner", "balance", "fence_token", "lock")
    change_list_template = "admin/bank/account/change_list.html"

    @admin.display(description="lock now")
    def lock(self, account: Account) -> str:
        state = (_states.get() or {}).get(lock_name(f"account:{account.pk}"))
        if state is None:
            return "free"
        waiting = f", {state['waiting']} waiting" if state["waiting"] else ""
        return f"held by token {state['token']}{waiting}"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        rows, error = account_locks()
        states: dict[str, dict[str, int]] = {}
        for row in rows:
            state = states.setdefault(row["name"], {"token": row["token"], "waiting": 0})
            state["waiting"] += row["role"] != "holder"
        context = {**(extra_context or {}), "lock_rows": rows, "lock_error": error}
        reset = _states.set(states)
        try:
            response = super().changelist_view(request, context)
            if isinstance(response, TemplateResponse):
                response.render()  # now, while the "lock now" column can see this read of the locks
            return response
        finally:
            _states.reset(reset)


@admin.register(Movement)
class MovementAdmin(ReadOnly):
    list_display = ("id", "account", "kind", "amount", "balance_after", "fence_token", "created")
    list_filter = ("kind",)


@admin.register(ReportRun)
class ReportRunAdmin(ReadOnly):
    list_display = ("id", "started", "finished", "total_balance", "ledger_total", "balanced", "fence_token")
