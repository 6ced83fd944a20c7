"""System checks autoseq.E0xx / W0xx: configurations that cannot work are named at start-up."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.db import models
from django.test import override_settings
from django.test.utils import isolate_apps

from autoseq_django import checks as autoseq_checks
from autoseq_django.fields import SequenceField


def field_errors(**arguments: Any) -> list[str]:
    """The check ids a SequenceField with ``arguments`` gets, on a throwaway model."""
    with isolate_apps("django_tests.testapp"):

        class Thing(models.Model):
            code = SequenceField(**arguments)

            class Meta:
                app_label = "testapp"

        return [message.id for message in Thing._meta.get_field("code").check()]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"step": 0}, "autoseq.E001"),
        ({"step": -5}, "autoseq.E001"),
        ({"start": 10, "end": 5}, "autoseq.E002"),
        ({"batch_count": 0}, "autoseq.E003"),
        ({"cycle": True, "primary_key": True}, "autoseq.E004"),
        ({"cycle": True, "unique": True}, "autoseq.E004"),
        ({"sequence": "bad\x00name"}, "autoseq.E005"),
        ({"sequence": "x" * 192}, "autoseq.E005"),
        ({"default": 5}, "autoseq.E006"),
        ({"end": 2**63}, "autoseq.E007"),
    ],
    ids=lambda value: str(value) if isinstance(value, str) else None,
)
def test_impossible_field_configurations(arguments: dict[str, Any], expected: str) -> None:
    """Each impossible field configuration gets its own check id."""
    assert expected in field_errors(**arguments)


def test_a_sound_field_has_no_errors() -> None:
    """A usual configuration (cycle on a non-unique column included) passes."""
    assert field_errors(start=1000, step=10, batch_count=500) == []
    assert field_errors(cycle=True, end=99) == []


def test_defaults_setting_is_checked_with_the_field() -> None:
    """AUTOSEQ DEFAULTS and the field's own arguments are checked together."""
    with override_settings(AUTOSEQ={"DEFAULTS": {"start": 100}}):
        assert "autoseq.E002" in field_errors(end=50)


@pytest.mark.parametrize(
    "bad",
    [
        {"DATABSE": "default"},
        {"DATABASE": "nowhere"},
        {"AUTO_CREATE": "yes"},
        {"DEFAULTS": {"stepp": 2}},
        {"DEFAULTS": {"step": 0}},
        {"BUFFER": {"prefetch_at": 2.0}},
        {"BUFFER": {"nonsense": 1}},
        {"URLS": {"default": 5}},
        ["not", "a", "dict"],
    ],
)
def test_bad_settings_are_reported(bad: Any) -> None:
    """A malformed AUTOSEQ setting is autoseq.E008 with the reason, not a crash."""
    with override_settings(AUTOSEQ=bad):
        errors = autoseq_checks.check_settings()
    assert [error.id for error in errors] == ["autoseq.E008"]
    assert "AUTOSEQ:" in errors[0].msg


def test_database_setting_needs_the_router() -> None:
    """AUTOSEQ DATABASE without the router would make the admin show another table."""
    with override_settings(AUTOSEQ={"DATABASE": "sqlite"}, DATABASE_ROUTERS=[]):
        ids = [error.id for error in autoseq_checks.check_settings()]
    assert ids == ["autoseq.E010"]
    with override_settings(
        AUTOSEQ={"DATABASE": "sqlite"},
        DATABASE_ROUTERS=["autoseq_django.routers.SequenceRouter"],
    ):
        assert autoseq_checks.check_settings() == []


def test_shared_sequence_with_different_settings() -> None:
    """Two fields drawing from one sequence with different settings is autoseq.E009."""
    with isolate_apps("django_tests.testapp") as isolated:

        class One(models.Model):
            code = SequenceField(sequence="shared_x", step=2)

            class Meta:
                app_label = "testapp"

        class Two(models.Model):
            code = SequenceField(sequence="shared_x", step=3)

            class Meta:
                app_label = "testapp"

        errors = autoseq_checks.check_shared_sequences(isolated.get_app_configs())
    assert [error.id for error in errors] == ["autoseq.E009"]
    assert "step" in errors[0].msg


@pytest.mark.django_db(databases=["default", "sqlite", "sqlite_seq"])
def test_sqlite_needs_no_companion_alias() -> None:
    """SysSequence read from a SQLite file sees its companion: no W001 with or without alias."""
    for database in ("sqlite", "sqlite_seq"):
        with override_settings(AUTOSEQ={"DATABASE": database}):
            assert autoseq_checks.check_sqlite_admin(databases=["sqlite"]) == []
    assert not [m for m in checks.run_checks() if m.id == "autoseq.W001"]


def test_project_checks_pass() -> None:
    """The test project's own models raise no autoseq error."""
    errors = [m for m in checks.run_checks() if m.id.startswith("autoseq.E")]
    assert errors == []


def serial_field_errors(*arguments: Any, field: Any = None, **options: Any) -> list[str]:
    """The check ids a SerialField (or ``field``) gets, on a throwaway model."""
    from autoseq_django.fields import SerialField

    with isolate_apps("django_tests.testapp"):

        class Thing(models.Model):
            code = field if field is not None else SerialField(*arguments, **options)

            class Meta:
                app_label = "testapp"

        return [message.id for message in Thing._meta.get_field("code").check()]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"max_length": 10}, "autoseq.E012"),
        ({"default": "X"}, "autoseq.E013"),
        ({"cycle": True, "unique": True}, "autoseq.E015"),
        ({"cycle": True, "primary_key": True}, "autoseq.E015"),
    ],
    ids=lambda value: str(value) if isinstance(value, str) else None,
)
def test_impossible_serial_field_configurations(options: dict[str, Any], expected: str) -> None:
    """SerialField's own problems get their own ids, as SequenceField's do."""
    assert expected in serial_field_errors("INV-{date:%Y}-{n:06d}", period="year", **options)


def test_a_sound_serial_field_has_no_errors() -> None:
    """A serial that fits its column, gapless on a database holding its sequences, passes."""
    template = "INV-{date:%Y}-{n:06d}"
    assert serial_field_errors(template, period="year", unique=True) == []
    assert serial_field_errors(template, period="year", gapless=True) == []
    assert serial_field_errors(template, period="year", max_length=15) == []
    assert serial_field_errors(template, period="year", cycle=True) == []


def test_gapless_fields_whose_sequences_live_elsewhere_are_errors() -> None:
    """With AUTOSEQ DATABASE sending sequences to another database, gapless fields get E014
    (their numbers could not share the row's transaction); block-served ones do not."""
    with override_settings(AUTOSEQ={"DATABASE": "sqlite"}):
        assert "autoseq.E014" in serial_field_errors("G{n}", gapless=True)
        assert "autoseq.E014" in serial_field_errors(field=SequenceField(gapless=True))
        assert serial_field_errors("G{n}") == []
        assert serial_field_errors(field=SequenceField()) == []


@pytest.mark.parametrize(
    ("template", "options", "message"),
    [
        ("ORD-{date:%Y%d}-{n:05d}", {"period": "day"}, "does not show the month"),
        ("ORD-{date:%a %d %Y}-{n:05d}", {"period": "day"}, "does not show the month"),
        ("ORD-{date:%x}-{n:05d}", {"period": "day"}, "%x is not allowed"),
        ("INV-{date:%G}-{n:05d}", {"period": "year"}, "ISO week-based year"),
        ("INV-{n:05d}", {"period": "week"}, "period='week'"),
        ("INV-{date:%Y}-{n:05d}", {"period": "year", "tz": "Mars/Olympus"}, "time zone"),
    ],
)
def test_a_template_serial_refuses_is_check_error_e016(
    template: str, options: dict[str, Any], message: str
) -> None:
    """What Serial refuses is autoseq.E016 alone, with Serial's message; the field still loads."""
    from autoseq_django.fields import SerialField

    with isolate_apps("django_tests.testapp"):

        class Thing(models.Model):
            code = SerialField(template, **options)

            class Meta:
                app_label = "testapp"

        messages = Thing._meta.get_field("code").check()
    assert [m.id for m in messages] == ["autoseq.E016"]
    assert message in messages[0].msg
    assert "InvalidSequenceConfig" in (messages[0].hint or "")


def test_a_refused_serial_field_raises_at_its_first_serial_and_writes_nothing() -> None:
    """A refused field (as an old migration declares it) raises at its first serial, no row made."""
    from autoseq import InvalidSequenceConfig
    from autoseq_django import registry as sequences
    from autoseq_django.fields import SerialField

    field = SerialField(
        template="ORD-{date:%Y%d}-{n:05d}", period="day", max_length=15, sequence="old_e016"
    )
    assert field.deconstruct()[3]["template"] == "ORD-{date:%Y%d}-{n:05d}"
    with pytest.raises(InvalidSequenceConfig, match="does not show the month"):
        field.serial("default")
    store = sequences.registry(sequences.sequence_database("default")).store
    assert not [row for row in store.read_all() if row.name.startswith("old_e016")]
