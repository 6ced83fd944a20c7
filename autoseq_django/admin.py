"""Admin for ``SysSequence``: look at sequences, move them forward safely.

Edits are validated against the freshly stored row and against ``max()`` of
every column using the sequence, then applied through the store's own
connection with a compare-and-set (see ``maintenance``), never by saving the
model in the admin's transaction. Rows cannot be added or deleted here:
sequences are created on first use or by ``manage.py autoseq create``, and a
deleted row would restart at ``start``, under keys that already exist.

What the list shows is true for the whole deployment: it comes from the
stored rows. Figures only the process serving the page knows (its rate, its
next block) are on the change form, under a heading that says so. Django's
own tables' sequences (``django_migrations``, ``auth_permission`` ...) are
hidden unless the "origin" filter asks for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.db import models, router
from django.http import HttpRequest, HttpResponse

from autoseq import AutoseqError
from autoseq_django import columns, maintenance
from autoseq_django import registry as sequences
from autoseq_django.columns import sequence_fields
from autoseq_django.models import SysSequence

if TYPE_CHECKING:
    _Form = forms.ModelForm[SysSequence]
    _Admin = admin.ModelAdmin[SysSequence]
else:
    _Form = forms.ModelForm
    _Admin = admin.ModelAdmin


def _stats(obj: SysSequence) -> dict[str, Any]:
    """``stats()`` of this process's lock of ``obj`` ({} when it has none)."""
    found = sequences.registry(sequence_alias()).stats().get(obj.name)
    return dict(found) if found else {}


def sequence_alias() -> str:
    """The database whose ``sys_sequence`` the admin shows and changes."""
    return str(router.db_for_write(SysSequence))


class SysSequenceForm(_Form):
    """Checks a change against the stored row, the columns using it and ``end``."""

    #: ``current`` as the form showed it: processes move the stored one while
    #: the form is open, and only a value the operator typed is a change.
    opened_current = forms.IntegerField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = SysSequence
        fields = ("current", "end", "step", "batch", "batch_count", "cycle")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["opened_current"].initial = self.instance.current

    def changes(self) -> dict[str, Any]:
        """The settings the operator changed, as ``maintenance.change`` takes them."""
        changes = {
            name: self.cleaned_data[name]
            for name in self.changed_data
            if name in maintenance.CHANGEABLE
        }
        opened = self.cleaned_data.get("opened_current")
        if "current" in changes and opened is not None and changes["current"] == opened:
            del changes["current"]  # untouched: the stored row moved on meanwhile
        return changes

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors or not self.instance.pk:
            return cleaned
        changes = self.changes()
        if not changes:
            return cleaned
        try:
            row = maintenance.read(sequence_alias(), self.instance.pk)
            maintenance.validate_change(sequence_alias(), row, changes)
        except AutoseqError as exc:
            field = "current" if "current" in changes else None
            self.add_error(field, str(exc))
        return cleaned


def django_sequence_names() -> set[str]:
    """Sequences of Django's own tables: its apps' models (many-to-many tables too) and
    ``django_migrations``, unless a model of the project draws from the same name."""
    from django.db.migrations.recorder import MigrationRecorder

    theirs = {MigrationRecorder.Migration._meta.db_table}
    ours: set[str] = set()
    for model in apps.get_models(include_auto_created=True):
        if model._meta.app_config is not None and model._meta.app_config.name.startswith("django."):
            theirs.add(model._meta.db_table)
        else:
            ours.update(field.sequence_name for field in sequence_fields(model))
    return theirs - ours


class OriginFilter(admin.SimpleListFilter):
    """The project's sequences by default; Django's own tables' on request."""

    title = "origin"
    parameter_name = "origin"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("django", "Django's own tables"), ("all", "all")]

    def choices(self, changelist: Any) -> Any:
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "this project's",
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(
        self, request: HttpRequest, queryset: models.QuerySet[SysSequence]
    ) -> models.QuerySet[SysSequence]:
        if self.value() == "all":
            return queryset
        if self.value() == "django":
            return queryset.filter(name__in=django_sequence_names())
        return queryset.exclude(name__in=django_sequence_names())


@admin.register(SysSequence)
class SysSequenceAdmin(_Admin):
    form = SysSequenceForm
    # Stored rows only: true whatever process serves the page, and narrow
    # enough for a 1280 px screen.
    list_display = ("name", "current", "end", "left", "block", "cycle", "updated_at")
    list_filter = (OriginFilter,)
    search_fields = ("name",)
    readonly_fields = (
        "name",
        "start",
        "left",
        "block",
        "rate",
        "time_to_end",
        "next_block",
        "used_by",
        "updated_at",
    )

    def get_fieldsets(self, request: HttpRequest, obj: SysSequence | None = None) -> Any:
        import os

        return [
            (
                None,
                {
                    "fields": (
                        "name",
                        "used_by",
                        "start",
                        "current",
                        "end",
                        "step",
                        "batch",
                        "batch_count",
                        "cycle",
                        "opened_current",
                    )
                },
            ),
            ("Whole deployment (the stored row)", {"fields": ("left", "block", "updated_at")}),
            (
                f"This process only (pid {os.getpid()}, the one serving this page)",
                {
                    "fields": ("rate", "time_to_end", "next_block"),
                    "description": "Each worker has its own figures; another request may "
                    "be served by another worker.",
                },
            ),
        ]

    @admin.display(description="values left before end")
    def left(self, obj: SysSequence) -> str:
        values_left = obj.values_left
        if values_left is None:
            return "unlimited (cycles)"
        span = obj.as_config().range_size
        return f"{values_left:,} ({100 * (1 - values_left / span):.0f}% used)"

    @admin.display(description="reserved per block")
    def block(self, obj: SysSequence) -> str:
        if not obj.batch:
            return "1 (no batch)"
        return f"{obj.batch_count:,} x step {obj.step}" if obj.step != 1 else f"{obj.batch_count:,}"

    @admin.display(description="rate (this process)")
    def rate(self, obj: SysSequence) -> str:
        rate = _stats(obj).get("consumption_rate")
        return "-" if not rate else f"{float(rate):,.1f}/s"

    @admin.display(description="time to end (at this process's rate)")
    def time_to_end(self, obj: SysSequence) -> str:
        from autoseq.doctor import format_duration

        rate = _stats(obj).get("consumption_rate")
        values_left = obj.values_left
        if values_left is None:
            return "cycles"
        if not rate:
            return "-"
        return format_duration(values_left / float(rate))

    @admin.display(description="next block (this process)")
    def next_block(self, obj: SysSequence) -> str:
        stats = _stats(obj)
        if not stats:
            return "not used by this process"
        buffered = int(stats.get("next_block_left") or 0)
        if buffered:
            return f"ready ({buffered:,} values)"
        if stats.get("loading"):
            return "reserving"
        if stats.get("store_error"):
            return f"store failing: {stats['store_error']}"
        return f"not yet ({int(stats.get('current_block_left') or 0):,} left in this block)"

    @admin.display(description="used by")
    def used_by(self, obj: SysSequence) -> str:
        labels = [f"{f.model._meta.label}.{f.name}" for f in columns.users(obj.name)]
        return ", ".join(labels) or "no model in this project"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: SysSequence | None = None) -> bool:
        return False

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # Without the admin's usual transaction on the sequence database:
        # changes go through the store's own connection, and on SQLite an
        # open read transaction here would make that write wait for us.
        response: HttpResponse = self._changeform_view(  # type: ignore[attr-defined]
            request, object_id, form_url, extra_context
        )
        return response

    def save_model(self, request: HttpRequest, obj: SysSequence, form: Any, change: bool) -> None:
        changes = form.changes()
        if not changes:
            return
        try:
            stored = maintenance.change(sequence_alias(), obj.pk, changes)
        except AutoseqError as exc:
            self.message_user(request, f"Not changed: {exc}", level=messages.ERROR)
            return
        obj.current = stored.next_value
        obj.updated_at = stored.updated_at
