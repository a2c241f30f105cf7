"""``manage.py distlock``: see ``distlock.py`` in this package."""
