"""distlock_sqla: placeholder; the integration lands with its own issue."""
