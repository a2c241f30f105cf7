"""Settings of the example bank: SQLite, etcd for the locks, Celery on a broker that is a folder.

Everything that differs between runs comes from the environment, so the demo (``scripts/demo.py``), a worker and
``manage.py`` started by hand all agree:

- ``BANK_DATA_DIR``: where the SQLite database, the Celery broker folder and the task results live
  (default: ``$TMPDIR/distlock-example``);
- ``DISTLOCK_URL``: the lock service (default ``etcd://127.0.0.1:2379``);
- ``BANK_RUN_ID``: an id ``/api/health`` answers with, so the demo knows it talks to the server it started.

What can go wrong: an unreachable lock service makes the locked views fail with ``BackendUnavailable`` (and the
inspector answer 503); the rest of the site keeps working.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

DATA_DIR = Path(os.environ.get("BANK_DATA_DIR") or Path(tempfile.gettempdir()) / "distlock-example")
DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("BANK_SECRET_KEY", "distlock-example-only-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "bank_site.urls"
WSGI_APPLICATION = "bank_site.wsgi.application"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "distlock_django",
    "bank",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Locks around the views DISTLOCK["RULES"] names (here: withdrawals), after authentication so that a rule's
    # key could use request.user.
    "distlock_django.DistributedLockMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "bank.sqlite3",
        # Writers wait for each other instead of failing with "database is locked"; IMMEDIATE takes the write lock
        # when a transaction begins, so a transaction never has to upgrade a read lock (which SQLite refuses at
        # once when another writer got there first).
        "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
    }
}

DISTLOCK = {
    "URL": os.environ.get("DISTLOCK_URL", "etcd://127.0.0.1:2379"),
    "OPTIONS": {"connect_timeout": 5},
    "TTL": 10,  # a holder that stops answering keeps an account locked for at most 10 s
    "TIMEOUT": 5,  # a deposit or transfer waits up to 5 s for a busy account, then answers 423
    "RULES": [
        # A withdrawal never queues: if another request holds the account, it answers 423 at once.
        {"url_name": "bank:withdraw", "key": "account:{pk}", "timeout": 0},
    ],
}

# Celery, configured from these settings (bank_site/celery.py reads the CELERY_* names). The broker is a folder
# (kombu's filesystem transport) and results are files: no server to install. Locks of singleton tasks use the
# DISTLOCK settings above.
_BROKER_DIR = DATA_DIR / "broker"
_BROKER_DIR.mkdir(exist_ok=True)
(DATA_DIR / "results").mkdir(exist_ok=True)
(DATA_DIR / "broker-control").mkdir(exist_ok=True)
CELERY_BROKER_URL = "filesystem://"
CELERY_BROKER_TRANSPORT = "bank_site.broker:Transport"  # kombu's, writing each message whole (see broker.py)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "data_folder_in": str(_BROKER_DIR),
    "data_folder_out": str(_BROKER_DIR),
    "control_folder": str(DATA_DIR / "broker-control"),
    "store_processed": False,
    "polling_interval": 0.05,
}
CELERY_RESULT_BACKEND = f"file://{DATA_DIR / 'results'}"
CELERY_TASK_SERIALIZER = "json"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

BANK_RUN_ID = os.environ.get("BANK_RUN_ID", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"distlock": {"handlers": ["console"], "level": "WARNING"}},
}
