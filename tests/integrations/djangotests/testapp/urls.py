from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from . import views

urlpatterns = [
    path("admin/distlock/", include("distlock_django.urls")),
    path("admin/", admin.site.urls),
    path("increment/<int:pk>/", views.increment, name="increment"),
    path("gate/<str:name>/", views.gated, name="gate"),
    path("probed/<int:pk>/", views.probed_increment, name="probed"),
    path("async/<int:pk>/", views.async_view, name="async"),
    path("cbv/<int:pk>/", views.AccountView.as_view(), name="cbv"),
    path("stream/<str:name>/", views.stream, name="stream"),
    path("mw/stale/<str:name>/", views.middleware_stale_write, name="mw-stale"),
    path("mw/<str:name>/", views.middleware_plain, name="mw"),
    path("stale/<int:pk>/", views.stale_write, name="stale"),
]
