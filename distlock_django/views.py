"""The staff-only lock inspector page. Include ``distlock_django.urls`` under the admin, e.g.
``path("admin/distlock/", include("distlock_django.urls"))``.

What can go wrong: a visitor who is not staff is sent to the admin login; a ``DistlockError`` while reading the locks
(an unreachable service, bad settings) is shown on the page with status 503.
"""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

import distlock

from ._inspect import describe, lock_table


@staff_member_required
def inspector(request: HttpRequest) -> HttpResponse:
    """Every lock (``?prefix=`` narrows them; default ``DISTLOCK["KEY_PREFIX"]``), its holder and waiters."""
    prefix = request.GET.get("prefix")
    try:
        rows = lock_table(prefix)
    except distlock.DistlockError as e:
        return render(request, "distlock_django/inspector.html", {"error": describe(e), "rows": []}, status=503)
    return render(request, "distlock_django/inspector.html", {"rows": rows, "error": None})
