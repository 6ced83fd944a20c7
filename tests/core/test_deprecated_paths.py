"""Old import paths keep working for one release, with a DeprecationWarning (issue 32)."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("autoseq.snowflake_cli", "register_commands", "autoseq.cli.snowflake"),
        ("autoseq.doctor", "run_cli", "autoseq.cli.doctor"),
        ("autoseq.doctor", "configure_cli", "autoseq.cli.doctor"),
        ("autoseq.doctor", "HELP", "autoseq.cli.doctor"),
        ("autoseq.serial_sqlalchemy", "SerialField", "autoseq.sqlalchemy"),
        ("autoseq.serial_sqlalchemy", "SerialSpec", "autoseq.sqlalchemy"),
        ("autoseq.serial_sqlalchemy", "SerialTarget", "autoseq.sqlalchemy"),
        ("autoseq.serial_sqlalchemy", "serial_spec", "autoseq.sqlalchemy"),
        ("autoseq.serial_sqlalchemy", "gapless_sequence_field", "autoseq.sqlalchemy"),
        ("autoseq.serial_sqlalchemy", "SERIAL_INFO_KEY", "autoseq.sqlalchemy"),
        ("autoseq.alembic", "convert_column", "autoseq.sqlalchemy.alembic"),
        ("autoseq.alembic", "drop_store_table", "autoseq.sqlalchemy.alembic"),
        ("autoseq.alembic", "STORE_TABLES", "autoseq.sqlalchemy.alembic"),
        ("autoseq_django.snowflake_fields", "SnowflakeField", "autoseq_django.snowflake"),
        ("autoseq_django.snowflake_fields", "SnowflakeAutoField", "autoseq_django.snowflake"),
        ("autoseq_django.snowflake_fields", "close_generators", "autoseq_django.snowflake"),
        ("autoseq_django.snowflake_fields", "generator", "autoseq_django.snowflake"),
        ("autoseq_django.sequences", "lock", "autoseq_django.registry"),
        ("autoseq_django.sequences", "registry", "autoseq_django.registry"),
        ("autoseq_django.sequences", "store", "autoseq_django.registry"),
        ("autoseq_django.sequences", "sequence_database", "autoseq_django.registry"),
        ("autoseq_django.sequences", "reset", "autoseq_django.registry"),
    ],
)
def test_an_old_path_warns_and_gives_the_same_object(old: str, name: str, new: str) -> None:
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=new):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    doctor = importlib.import_module("autoseq.doctor")
    with pytest.raises(AttributeError, match="no_such_thing"):
        doctor.no_such_thing  # noqa: B018


def test_usage_error_is_one_class_at_both_homes() -> None:
    from autoseq.cli import UsageError as FromCli
    from autoseq.errors import UsageError

    assert FromCli is UsageError


@pytest.mark.parametrize(
    ("old", "name"),
    [
        ("autoseq.serial", "InvalidSerial"),
        ("autoseq", "InvalidSerial"),
        ("autoseq.stores.sql", "MissingDriver"),
        ("autoseq.stores.sql._urls", "MissingDriver"),
        ("autoseq.stores.sql._statements", "Conflict"),
    ],
)
def test_an_exception_lives_in_errors_and_its_old_home_gives_the_same_class(
    old: str, name: str
) -> None:
    from autoseq import errors

    assert getattr(importlib.import_module(old), name) is getattr(errors, name)
    assert getattr(errors, name).__module__ == "autoseq.errors"
