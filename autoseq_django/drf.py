"""Django REST framework: snowflake ids as JSON strings.

Imported only by projects that use DRF (``autoseq_django`` itself never
imports ``rest_framework``). A snowflake id is above 2**53, where a
JavaScript number (an IEEE double) can no longer hold every integer:
``384286390961045504`` reads back as ``384286390961045500``. Sent as a
string, it arrives exactly; a string or an integer is accepted on input::

    from autoseq_django.drf import SnowflakeStringsMixin

    class EventSerializer(SnowflakeStringsMixin, serializers.ModelSerializer):
        class Meta:
            model = Event
            fields = "__all__"

maps every snowflake column of the model, and every foreign key to a model
keyed by snowflakes, to strings. ``IdString()`` is the field itself, for a
serializer declared by hand.

Sequence and serial columns need nothing: ``SequenceField`` and
``SerialField`` are not editable unless the model says ``editable=True``,
so a ``ModelSerializer`` maps them read-only, as it does ``AutoField``.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from rest_framework import serializers
from rest_framework.relations import PrimaryKeyRelatedField

from autoseq_django.snowflake import SnowflakeAutoField, SnowflakeField

__all__ = ["IdString", "SnowflakeStringsMixin", "is_snowflake"]

_SNOWFLAKE_FIELDS = (SnowflakeField, SnowflakeAutoField)


def is_snowflake(field: models.Field[Any, Any] | None) -> bool:
    """True when ``field`` holds snowflake ids."""
    return isinstance(field, _SNOWFLAKE_FIELDS)


class IdString(serializers.IntegerField):  # type: ignore[misc] # DRF ships no types
    """An integer id sent as a JSON string; a string of digits or an integer is accepted."""

    default_error_messages = {"invalid": "A valid integer id (a string of digits) is required."}

    def to_representation(self, value: Any) -> str:
        return str(int(value))

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, (bool, float)):
            self.fail("invalid")  # a float has already lost the id's low digits
        value: int = super().to_internal_value(data)
        return value


class SnowflakeStringsMixin:
    """For a ``ModelSerializer``: snowflake columns and keys to snowflake rows as strings."""

    def build_standard_field(
        self, field_name: str, model_field: Any
    ) -> tuple[type, dict[str, Any]]:
        field_class, kwargs = super().build_standard_field(field_name, model_field)  # type: ignore[misc]
        if is_snowflake(model_field):
            field_class = IdString
        return field_class, kwargs

    def build_relational_field(
        self, field_name: str, relation_info: Any
    ) -> tuple[type, dict[str, Any]]:
        build = super().build_relational_field  # type: ignore[misc] # on ModelSerializer
        field_class, kwargs = build(field_name, relation_info)
        # Many-to-many links are built here too (DRF wraps them in a ManyRelatedField).
        related_key = relation_info.related_model._meta.pk
        if is_snowflake(related_key) and issubclass(field_class, PrimaryKeyRelatedField):
            kwargs["pk_field"] = IdString()
        return field_class, kwargs
