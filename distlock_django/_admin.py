"""``FencedModelAdmin``: the Django admin's writes of a ``FencedModel`` made inside the row's lock.

A plain ``ModelAdmin`` writes fenced rows without their locks: plain writes (``FENCING = "on"``), refused with
``UnfencedWrite`` and an error page in strict mode. This one holds the lock of each row it writes, from before the
row is read for the write until after the admin's transaction has ended: a change or delete page takes the lock of
the row it names before its transaction begins (so the form is applied to the row as read inside the lock); the
write hooks (``save_model()``, ``delete_model()``, ``delete_queryset()``) take the locks still missing: a moved row's
new name, an added row's name when it can be known before the insert, the rows of ``list_editable`` and of "Delete
selected" (read before their locks: a row a lock holder wrote meanwhile is refused, not overwritten). Locks are taken
with ``multi_lock`` (``lock_ttl``; waiting ``lock_timeout``).

What can go wrong: the row is held elsewhere past ``lock_timeout`` (``LockNotAcquired``), it was changed by a lock
holder since the admin read it (``StaleFenceToken``), the lock service is down (``BackendUnavailable``): nothing is
written (the admin's transaction is rolled back) and the page is shown again with the error as a message. An add of a
row whose lock is named from its automatic primary key cannot be fenced: plain in mode "on"; in strict mode the add
button is hidden. Inlines are not covered. docs/integrations/django.md ("The admin") says the same to users.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import TO_FIELD_VAR
from django.contrib.admin.utils import unquote
from django.core import checks
from django.db import models
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

import distlock

from ._client import get_client
from ._conf import conf
from ._models import FencedModel, _lock_name_of, _template

__all__ = ["FencedModelAdmin"]

#: The locks the current admin request took, released when its view returns (after the admin's transaction).
_held: contextvars.ContextVar[_Held | None] = contextvars.ContextVar("distlock_admin", default=None)

#: What the admin shows as a message instead of an error page: nothing of the request was written.
_REFUSALS = (
    distlock.LockNotAcquired,
    distlock.LockNotOwned,
    distlock.LockLost,
    distlock.StaleFenceToken,
    distlock.UnfencedWrite,
    distlock.BackendError,
)


class FencedModelAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A ``ModelAdmin`` for a ``FencedModel`` that writes each row inside its lock (see the module docstring)."""

    #: The lease of the locks an admin write holds (seconds).
    lock_ttl: float = 30.0
    #: How long an admin write waits for a row whose lock is held elsewhere (seconds).
    lock_timeout: float = 10.0

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors: list[checks.CheckMessage] = super().check(**kwargs)
        models_written = [self.model, *(inline.model for inline in self.inlines)]
        if not any(issubclass(model, FencedModel) for model in models_written):
            errors.append(
                checks.Error(
                    f"{type(self).__name__} is a FencedModelAdmin for {self.model.__name__}, which is not a "
                    "FencedModel and has no inline of one: it has no row lock to hold",
                    hint="Register it with admin.ModelAdmin, or make the model inherit from FencedModel",
                    obj=type(self),
                    id="distlock.E017",
                )
            )
        return errors

    # Adds: the name must be known before the insert.

    def has_add_permission(self, request: HttpRequest) -> bool:
        new = self.model()
        fenceable = (
            conf()["FENCING"] != "strict" or not isinstance(new, FencedModel) or bool(_names_of_write(new, False))
        )
        return fenceable and super().has_add_permission(request)

    # The write hooks: each holds the locks of the rows it writes (those not held yet) until the view has returned.

    def save_model(self, request: HttpRequest, obj: Any, form: ModelForm[Any], change: bool) -> None:
        self._hold(_names_of_write(obj, change))
        super().save_model(request, obj, form, change)

    def save_formset(self, request: HttpRequest, form: ModelForm[Any], formset: Any, change: bool) -> None:
        fk = getattr(formset, "fk", None)  # an inline's link to the object of the page
        deleted = formset.deleted_forms if formset.can_delete else []
        names: set[str] = set()
        for each in formset.forms:
            obj = each.instance
            if obj.pk is None and fk is not None:
                setattr(obj, fk.attname, formset.instance.pk)  # as the formset's save_new() does, before the insert
            if each in deleted or each.has_changed():
                names |= _names_of_write(obj, obj.pk is not None and not obj._state.adding)
        self._hold(names)
        super().save_formset(request, form, formset, change)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self._hold(_name_of(obj))  # as just read: a delete changes no name, so the row is not read again
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> None:
        self._hold(name for obj in queryset for name in _name_of(obj))
        super().delete_queryset(request, queryset)

    def _hold(self, names: Iterable[str]) -> None:
        held = _held.get()
        if held is None:  # a hook called from elsewhere: nothing would release its locks after the commit
            raise distlock.ConfigurationError(
                "FencedModelAdmin's write hooks hold their rows' locks until the admin view returns; "
                "call them from its changeform_view, changelist_view or delete_view"
            )
        held.take(names, self)

    # The views that call the hooks. The rows a POST names (a change or delete page's object, the rows of a
    # ``list_editable`` save) are locked before the view's transaction begins, so the view reads them inside their
    # locks, and no lock wait happens inside a transaction (on SQLite, that would keep every other writer out).

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        named = [object_id] if object_id is not None and "_saveasnew" not in request.POST else []
        return self._fenced(request, named, super().changeform_view, request, object_id, form_url, extra_context)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        named: list[str] = []
        if self.list_editable and "_save" in request.POST:  # the changelist's formset ("form-<i>-<pk name>")
            forms = request.POST.get("form-TOTAL_FORMS", "")
            keys = (f"form-{i}-{self.opts.pk.name}" for i in range(int(forms) if forms.isdigit() else 0))
            named = [pk for pk in map(request.POST.get, keys) if pk]
        return self._fenced(request, named, super().changelist_view, request, extra_context)

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> HttpResponse:
        return self._fenced(request, [object_id], super().delete_view, request, object_id, extra_context)

    def _fenced(
        self, request: HttpRequest, named: list[str], view: Callable[..., HttpResponse], *args: Any
    ) -> HttpResponse:
        if request.method != "POST":
            return view(*args)
        response: HttpResponse | None = None
        reset = _held.set(held := _Held())
        try:
            with held.stack:  # released here: after the view's transaction has committed or rolled back
                to_field = request.POST.get(TO_FIELD_VAR, request.GET.get(TO_FIELD_VAR))
                rows = (self.get_object(request, unquote(object_id), to_field) for object_id in named)
                held.take((name for obj in rows for name in _name_of(obj)), self)
                response = view(*args)
        except _REFUSALS as e:
            if response is None:  # raised before or in the view: its transaction was rolled back
                why = str(e)
                if isinstance(e, distlock.LockNotAcquired):
                    why = f"a row it writes is locked elsewhere (not free within {self.lock_timeout:g} s)"
                self.message_user(request, f"Nothing was saved: {why}. Try again.", messages.ERROR)
                return HttpResponseRedirect(request.get_full_path())
            # Raised by a release, after the commit: the writes were fenced, so they landed before any newer holder's
            self.message_user(request, f"Saved, but the lock ended badly: {e}", messages.WARNING)
        finally:
            _held.reset(reset)
        return response


class _Held:
    """The locks one admin request holds, and what releases them."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()
        self.names: set[str] = set()

    def take(self, names: Iterable[str], admin: FencedModelAdmin) -> None:
        wanted = sorted(set(names) - self.names)
        if wanted:
            locks = get_client().multi_lock(wanted, ttl=admin.lock_ttl, timeout=admin.lock_timeout)
            self.stack.enter_context(locks)
            self.names.update(wanted)


def _name_of(obj: models.Model | None) -> set[str]:
    """The lock of ``obj``'s row as it is now: none for no row or a model that is not fenced."""
    return {_lock_name_of(obj)} if isinstance(obj, FencedModel) else set()


def _names_of_write(obj: models.Model, stored: bool) -> set[str]:
    """The locks a write of ``obj`` needs: of a ``stored`` row, its name now and the name it is stored under (read
    again: another one when the write moves it); of a new row, its name if known before the insert (not when
    rendered from a primary key the database assigns, still None)."""
    if not isinstance(obj, FencedModel):
        return set()
    if not stored:
        meta = obj._meta
        reads_pk = {"pk", meta.pk.name, meta.pk.attname} & set(_template(type(obj)).fields)
        return _name_of(obj) if not reads_pk or obj.pk is not None else set()
    return _name_of(obj) | _name_of(type(obj)._base_manager.db_manager(obj._state.db).filter(pk=obj.pk).first())
