from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    # The lock inspector (staff only) before the admin's catch-all: every held lock, its waiters, tokens, lease left.
    path("admin/distlock/", include("distlock_django.urls")),
    path("admin/", admin.site.urls),
    path("api/", include("bank.urls")),
]
