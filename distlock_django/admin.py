"""The admin: ``FencedModelAdmin`` for your fenced models, and the lock page's entry in the admin index.

``FencedModelAdmin`` (``from distlock_django.admin import FencedModelAdmin``) writes each row inside its lock: its
contract is in ``_admin.py``. The rest of this module registers "Distributed locks" under "Distlock", for every staff
user.

The page itself is served by ``distlock_django.urls`` (``admin/distlock/``); this registers the table-less
``DistributedLock`` model (``models.py``) so that the admin index, the app page and the navigation sidebar link to it.
Its changelist URL redirects to the page, and the change URL of one lock (where the admin's "Recent actions" link a
force release) to the page searched for that lock. Nothing can be added, changed or deleted through the model admin.

What can go wrong: without the URL include, following the index entry raises ``ImproperlyConfigured`` saying which
line to add to your URLconf.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import NoReverseMatch, URLPattern, path, reverse

from ._admin import FencedModelAdmin
from .models import DistributedLock

__all__ = ["DistributedLockAdmin", "FencedModelAdmin"]


def _page_url() -> str:
    try:
        return reverse("distlock:inspector")
    except NoReverseMatch as e:
        raise ImproperlyConfigured(
            'The distributed lock page is not in your URLconf: add path("admin/distlock/", '
            'include("distlock_django.urls")) before path("admin/", admin.site.urls)'
        ) from e


@admin.register(DistributedLock)
class DistributedLockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Links the admin to the lock page; the page checks who may force-release (``FORCE_RELEASE_PERMISSION``)."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", self.admin_site.admin_view(self.changelist_view), name=f"{info}_changelist"),
            path("<path:object_id>/change/", self.admin_site.admin_view(self.lock_view), name=f"{info}_change"),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, str] | None = None) -> HttpResponse:
        return HttpResponseRedirect(_page_url())

    def lock_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return HttpResponseRedirect(f"{_page_url()}?{urlencode({'q': unquote(object_id)})}")
