"""WSGI entry point (``gunicorn bank_site.wsgi``); the demo uses ``manage.py runserver`` instead."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bank_site.settings")

application = get_wsgi_application()
