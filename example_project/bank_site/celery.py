"""The Celery app of the example bank, configured from Django's settings (``CELERY_*``), tasks found in the apps.

Start a worker with ``celery -A bank_site worker --pool=prefork`` from ``example_project/`` (the demo does).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bank_site.settings")

app = Celery("bank_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
