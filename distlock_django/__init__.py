"""distlock_django: placeholder; the integration lands with its own issue."""
