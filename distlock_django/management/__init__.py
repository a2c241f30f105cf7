"""Django management commands of distlock_django (``manage.py distlock``, the lock inspector)."""
