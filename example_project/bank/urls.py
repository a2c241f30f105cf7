from __future__ import annotations

from django.urls import path

from . import views

app_name = "bank"
urlpatterns = [
    path("accounts/", views.accounts, name="accounts"),
    path("accounts/<int:pk>/deposit", views.deposit, name="deposit"),
    path("accounts/<int:pk>/withdraw", views.withdraw, name="withdraw"),
    path("transfers", views.transfer, name="transfer"),
    path("reports/", views.reports, name="reports"),
    path("reports/run", views.run_report, name="run-report"),
    path("tasks/<str:task_id>", views.task_result, name="task"),
    path("health", views.health, name="health"),
]
