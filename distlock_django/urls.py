"""The admin's lock page: ``path("admin/distlock/", include("distlock_django.urls"))`` in your ROOT_URLCONF,
*before* ``path("admin/", admin.site.urls)`` (the admin answers every other URL under ``admin/`` itself).

Names: ``distlock:inspector`` (the lock list) and ``distlock:force_release`` (confirmation and release). Both views
run inside ``admin.site.admin_view``: staff only (others go to the admin login), CSRF-checked, never cached.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from .views import force_release, inspector

__all__ = ["app_name", "urlpatterns"]

app_name = "distlock"
urlpatterns = [
    path("", admin.site.admin_view(inspector), name="inspector"),
    path("force-release/", admin.site.admin_view(force_release), name="force_release"),
]
