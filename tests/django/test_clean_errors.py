"""Rough edges a new user meets: each ends in a message that says what to do."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import override_settings

from autoseq_django.routers import SequenceRouter


def test_settings_typo_under_the_router_is_e008() -> None:
    """A typo in AUTOSEQ with SequenceRouter installed is check autoseq.E008, not a traceback."""
    with (
        override_settings(
            AUTOSEQ={"DATABSE": "default"},
            DATABASE_ROUTERS=["autoseq_django.routers.SequenceRouter"],
        ),
        pytest.raises(SystemCheckError) as caught,
    ):
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert "autoseq.E008" in str(caught.value)
    assert "unknown key(s) 'DATABSE'" in str(caught.value)


def test_router_with_bad_settings_leaves_the_choice_to_others() -> None:
    """The router answers None while the setting is broken, so Django keeps working."""
    from autoseq_django.models import SysSequence

    with override_settings(AUTOSEQ={"DATABSE": "default"}):
        router = SequenceRouter()
        assert router.db_for_read(SysSequence) is None
        assert router.allow_migrate("default", "autoseq") is None


@pytest.mark.django_db
@pytest.mark.parametrize("configured", [None, "sqlite"])
def test_unknown_database_option_is_refused(configured: str | None) -> None:
    """--database nosuchdb names the databases there are, whatever AUTOSEQ['DATABASE'] says."""
    with (
        override_settings(AUTOSEQ={"DATABASE": configured} if configured else {}),
        pytest.raises(CommandError, match="nosuchdb") as caught,
    ):
        call_command("autoseq", "list", "--database", "nosuchdb", stdout=StringIO())
    assert "default" in str(caught.value)


@pytest.mark.django_db
def test_sync_of_an_unused_name_lists_the_used_ones() -> None:
    """sync NAME of a name no model uses names the sequences that are used there."""
    with pytest.raises(CommandError) as caught:
        call_command("autoseq", "sync", "nosuch", stdout=StringIO())
    message = str(caught.value)
    assert "'nosuch'" in message
    assert "[]" not in message
    assert "testapp_order" in message


def test_companion_alias_reads_go_to_the_main_database() -> None:
    """With the older companion alias, SysSequence reads use the main alias (which attaches it)."""
    import warnings

    from django.conf import settings

    import autoseq_django
    from autoseq_django.models import SysSequence

    databases = {
        **settings.DATABASES,
        "autoseq": autoseq_django.sqlite_companion(settings.DATABASES["sqlite"], mirror="sqlite"),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overriding DATABASES: only the router reads it here
        with override_settings(DATABASES=databases, AUTOSEQ={"DATABASE": "autoseq"}):
            router = SequenceRouter()
            assert router.db_for_read(SysSequence) == "sqlite"
            assert router.db_for_write(SysSequence) == "autoseq"
