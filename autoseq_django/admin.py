"""Admin for ``SysSequence``: look at sequences, move them forward safely.

Edits are validated against the freshly stored row and against ``max()`` of
every column using the sequence, then applied through the store's own
connection with a compare-and-set (see ``maintenance``), never by saving the
model in the admin's transaction. Rows cannot be added or deleted here:
sequences are created on first use or by ``manage.py autoseq create``, and a
deleted row would restart at ``start``, under keys that already exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.db import router
from django.http import HttpRequest, HttpResponse

from autoseq import AutoseqError
from autoseq_django import maintenance
from autoseq_django.models import SysSequence

if TYPE_CHECKING:
    _Form = forms.ModelForm[SysSequence]
    _Admin = admin.ModelAdmin[SysSequence]
else:
    _Form = forms.ModelForm
    _Admin = admin.ModelAdmin


def _stats(obj: SysSequence) -> dict[str, Any]:
    """``stats()`` of this process's lock of ``obj`` ({} when it has none)."""
    from autoseq_django import sequences

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


@admin.register(SysSequence)
class SysSequenceAdmin(_Admin):
    form = SysSequenceForm
    list_display = (
        "name",
        "current",
        "end",
        "step",
        "batch",
        "batch_count",
        "cycle",
        "left",
        "rate",
        "time_to_end",
        "next_block",
        "updated_at",
    )
    search_fields = ("name",)
    fields = (
        "name",
        "start",
        "current",
        "end",
        "step",
        "batch",
        "batch_count",
        "cycle",
        "left",
        "rate",
        "time_to_end",
        "next_block",
        "used_by",
        "updated_at",
        "opened_current",
    )
    readonly_fields = (
        "name",
        "start",
        "left",
        "rate",
        "time_to_end",
        "next_block",
        "used_by",
        "updated_at",
    )

    @admin.display(description="values left before end")
    def left(self, obj: SysSequence) -> str:
        values_left = obj.values_left
        return "unlimited (cycles)" if values_left is None else f"{values_left:,}"

    @admin.display(description="rate (this process)")
    def rate(self, obj: SysSequence) -> str:
        rate = _stats(obj).get("consumption_rate")
        return "-" if not rate else f"{float(rate):,.1f}/s"

    @admin.display(description="time to end")
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
        labels = [f"{f.model._meta.label}.{f.name}" for f in maintenance.users(obj.name)]
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
