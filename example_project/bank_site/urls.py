from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    # The admin's lock page before the admin's catch-all: held locks, their holders and waiters; force release.
    path("admin/distlock/", include("distlock_django.urls")),
    path("admin/", admin.site.urls),
    path("api/", include("bank.urls")),
]
