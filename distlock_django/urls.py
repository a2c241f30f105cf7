from __future__ import annotations

from django.urls import path

from .views import inspector

app_name = "distlock"
urlpatterns = [path("", inspector, name="inspector")]
