"""The admin's handle on the lock page: a model without a table, for the admin index entry and the permission.

Django attaches permissions and admin index entries to models, and locks live in the lock service (even with
``django://``, in the lock table's own tables, not in a model's). ``DistributedLock`` is unmanaged (``managed =
False``: ``migrate`` creates no table for it) and has no default add/change/delete/view permissions, only
``distlock_django.force_release_lock``, which the admin checks before it force-releases a lock (superusers always
have it). Its migration exists so that Django creates the content type and the permission, and so that
``makemigrations --check`` in your project finds nothing to do.

What can go wrong: querying it (``DistributedLock.objects.all()``) fails, as there is no table; read locks with
``get_client().inspect()`` instead.
"""

from __future__ import annotations

from django.db import models

__all__ = ["FORCE_RELEASE_PERMISSION", "DistributedLock"]

#: The permission the admin requires to force-release a lock, as ``user.has_perm()`` takes it.
FORCE_RELEASE_PERMISSION = "distlock_django.force_release_lock"


class DistributedLock(models.Model):
    """A lock as the admin names it (no table): the lock page's index entry, log entries, and the permission."""

    name: models.CharField[str, str] = models.CharField(primary_key=True, max_length=255)

    class Meta:
        managed = False
        default_permissions = ()
        permissions = (("force_release_lock", "Can force-release a distributed lock"),)
        verbose_name = "distributed lock"
        verbose_name_plural = "distributed locks"

    def __str__(self) -> str:
        return self.name
