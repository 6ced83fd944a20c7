"""autoseq.W010: an app's ``default_auto_field`` that hides an autoseq ``DEFAULT_AUTO_FIELD``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.apps import AppConfig, apps
from django.core.management import call_command
from django.test import override_settings

from autoseq_django.checks import check_app_default_auto_field

SEQUENCE_KEY = "autoseq_django.fields.SequenceAutoField"


@pytest.fixture
def startapp_config(tmp_path: Path) -> Iterator[AppConfig]:
    """The AppConfig of an app freshly written by ``manage.py startapp shopw010``."""
    (tmp_path / "shopw010").mkdir()
    call_command("startapp", "shopw010", str(tmp_path / "shopw010"))
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("shopw010")
        config_class = importlib.import_module("shopw010.apps").Shopw010Config
        yield config_class("shopw010", module)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.split(".")[0] == "shopw010"]:
            del sys.modules[name]


def test_startapp_app_is_named_with_the_fix(startapp_config: AppConfig) -> None:
    """A startapp app under an autoseq DEFAULT_AUTO_FIELD gets W010 naming it and the line."""
    with override_settings(DEFAULT_AUTO_FIELD=SEQUENCE_KEY):
        messages = check_app_default_auto_field([startapp_config])
    assert [message.id for message in messages] == ["autoseq.W010"]
    assert "'shopw010'" in messages[0].msg
    assert "django.db.models.BigAutoField" in messages[0].msg
    assert messages[0].hint is not None
    assert "Delete the line `default_auto_field = 'django.db.models.BigAutoField'`" in (
        messages[0].hint
    )
    assert "shopw010.apps.Shopw010Config" in messages[0].hint


def test_no_warning_under_bigautofield(startapp_config: AppConfig) -> None:
    """With Django's own DEFAULT_AUTO_FIELD there is nothing to say."""
    with override_settings(DEFAULT_AUTO_FIELD="django.db.models.BigAutoField"):
        assert check_app_default_auto_field([startapp_config]) == []


def test_apps_that_follow_the_setting_or_name_our_key_pass() -> None:
    """An app without the line, or whose line names the same key, is fine."""
    module = importlib.import_module("django_tests.testapp")

    class Follows(AppConfig):
        name = "django_tests.testapp"

    class SameKey(AppConfig):
        name = "django_tests.testapp"
        default_auto_field = SEQUENCE_KEY

    with override_settings(DEFAULT_AUTO_FIELD=SEQUENCE_KEY):
        configs = [Follows("django_tests.testapp", module), SameKey("django_tests.testapp", module)]
        assert check_app_default_auto_field(configs) == []


def test_djangos_own_apps_are_left_alone() -> None:
    """contrib apps pin AutoField to match the migrations they ship: no warning."""
    with override_settings(DEFAULT_AUTO_FIELD=SEQUENCE_KEY):
        ids = [m.id for m in check_app_default_auto_field(None)]
    contrib = [c for c in apps.get_app_configs() if c.name.startswith("django.contrib")]
    assert any(type(c).default_auto_field is not AppConfig.default_auto_field for c in contrib)
    assert ids == []


def test_snowflake_default_is_protected_too(startapp_config: AppConfig) -> None:
    """SnowflakeAutoField as DEFAULT_AUTO_FIELD is hidden the same way, and said so."""
    path = "autoseq_django.snowflake.SnowflakeAutoField"
    with override_settings(DEFAULT_AUTO_FIELD=path):
        messages = check_app_default_auto_field([startapp_config])
    assert [m.id for m in messages] == ["autoseq.W010"]
    assert path in messages[0].msg
