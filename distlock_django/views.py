"""The admin's lock page and its force release, for ``path("admin/distlock/", include("distlock_django.urls"))``.

``inspector`` lists this project's locks (names under ``DISTLOCK["KEY_PREFIX"]``), one row per lock: its holder's
owner id, the number of waiters, the holder's fencing token and the seconds its lease has left, 100 locks a page,
searched by name prefix (``?q=``). How long the holder has held the lock is not shown: the
backends do not record when a waiter reached the head of its queue.

``force_release`` asks for confirmation (GET: the holder and the token the operator saw, and the holder as it is
now), then (POST, CSRF-checked) calls ``Client.force_release(name, token)``, which removes the holder only if its
token is still the one shown: a holder that changed meanwhile is never touched. A release is written to the admin's
log (``LogEntry``) and both outcomes are reported as admin messages.

Both views are wrapped in ``admin.site.admin_view`` by ``urls.py``: staff only, others are sent to the admin login.
What can go wrong: without the ``distlock_django.force_release_lock`` permission (``models.py``) the release answers
403; a bad ``name``/``token`` answers 400; a ``DistlockError`` (an unreachable service, bad settings) is shown on
the page with status 503, or as an error message after a POST.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

import distlock

from ._client import get_client
from ._inspect import describe, find_locks
from .models import FORCE_RELEASE_PERMISSION, DistributedLock

__all__ = ["PAGE_SIZE", "force_release", "inspector"]

#: Locks per page of the lock list.
PAGE_SIZE = 100


@dataclass(frozen=True)
class _Row:
    state: distlock.LockState
    release_url: str


def _list_url(**query: str | int) -> str:
    wanted = {key: value for key, value in query.items() if value}
    return reverse("distlock:inspector") + (f"?{urlencode(wanted)}" if wanted else "")


def _context(request: HttpRequest, title: str, **more: Any) -> dict[str, Any]:
    return {**admin.site.each_context(request), "title": title, "list_url": _list_url(), **more}


@require_GET
def inspector(request: HttpRequest) -> HttpResponse:
    """The lock list: ``?q=`` a lock-name prefix (with or without ``KEY_PREFIX``), ``?p=`` the page number."""
    search = request.GET.get("q", "").strip()
    context = _context(request, "Distributed locks", search=search, error=None, page=None)
    try:
        states = find_locks(search)
    except distlock.DistlockError as e:
        context["error"] = describe(e)
        return TemplateResponse(request, "distlock_django/inspector.html", context, status=503)
    page = Paginator(states, PAGE_SIZE).get_page(request.GET.get("p"))
    release = reverse("distlock:force_release") if request.user.has_perm(FORCE_RELEASE_PERMISSION) else ""
    context.update(
        page=page,
        rows=[
            _Row(state, f"{release}?{urlencode({'name': state.name, 'token': state.holder.token})}" if release else "")
            for state in page.object_list
        ],
        page_links=[
            (number, _list_url(q=search, p=number) if isinstance(number, int) and number != page.number else "")
            for number in page.paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1)
        ],
    )
    return TemplateResponse(request, "distlock_django/inspector.html", context)


def _parse_token(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else None


@require_http_methods(["GET", "POST"])
def force_release(request: HttpRequest) -> HttpResponse:
    """GET ``?name=&token=``: the confirmation page; POST (``name``, ``token``): release, log, report, go back."""
    if not request.user.has_perm(FORCE_RELEASE_PERMISSION):
        raise PermissionDenied(f"force-releasing a lock needs the permission {FORCE_RELEASE_PERMISSION}")
    given = request.POST if request.method == "POST" else request.GET
    name = given.get("name", "")
    token = _parse_token(given.get("token", ""))
    if not name or token is None:
        return HttpResponseBadRequest("force release needs the lock's name and the holder's token (a positive integer)")
    back = _list_url(q=name)
    client = get_client()
    if request.method == "GET":
        context = _context(request, "Force-release a lock", name=name, token=token, back_url=back, error=None)
        try:
            context["holder"] = client.holder(name)
        except distlock.DistlockError as e:
            context["error"] = describe(e)
            return TemplateResponse(request, "distlock_django/force_release.html", context, status=503)
        return TemplateResponse(request, "distlock_django/force_release.html", context)
    try:
        seen = client.holder(name)
        released = client.force_release(name, token)
        now = None if released else client.holder(name)
    except distlock.DistlockError as e:
        messages.error(request, f"Lock “{name}” was not released: {describe(e)}")
        return HttpResponseRedirect(back)
    if released:
        owner = f" (owner {seen.owner})" if seen is not None and seen.token == token else ""
        _log_release(request, name, f"Force-released at fencing token {token}{owner}.")
        messages.success(
            request,
            f"Released lock “{name}” at token {token}{owner}. The next waiter, if any, holds it now; the old holder "
            "sees its lock lost when it next renews its lease, and its fenced writes are refused.",
        )
    else:
        why = (
            "nobody holds it any more"
            if now is None
            else f"its holder has changed (now token {now.token}, owner {now.owner}; you saw token {token})"
        )
        messages.warning(request, f"Lock “{name}” was not released: {why}. Nothing was changed.")
    return HttpResponseRedirect(back)


def _log_release(request: HttpRequest, name: str, message: str) -> None:
    """The admin's audit trail: "Recent actions", and the log entries of ``DistributedLock`` objects."""
    user_id = request.user.pk
    assert user_id is not None  # admin_view lets only a logged-in staff user in
    LogEntry.objects.create(
        user_id=user_id,
        content_type=ContentType.objects.get_for_model(DistributedLock),
        object_id=name,
        object_repr=name[:200],
        action_flag=CHANGE,
        change_message=message,
    )
