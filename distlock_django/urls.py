"""The lock inspector's URL (``distlock:inspector``): include it under the admin, e.g.
``path("admin/distlock/", include("distlock_django.urls"))``. The page is staff-only (see ``views.py``)."""

from __future__ import annotations

from django.urls import path

from .views import inspector

app_name = "distlock"
urlpatterns = [path("", inspector, name="inspector")]
