"""Adoption: a sequence starts after mongoengine's counter and the values already stored."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import mongoengine as me
import pytest
from mongo_server import ME_SERVERS, me_db_on

from autoseq import InvalidSequenceConfig, SequenceConfig
from autoseq_mongoengine import SequenceField, adopt, adopt_sequence
from autoseq_mongoengine.cli import main as cli_main

pytestmark = [pytest.mark.mongodb, pytest.mark.usefixtures("me_db")]


@pytest.fixture(params=ME_SERVERS)
def me_db(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Each test on secantusdb, then on mongomock (tests needing a real server skip there)."""
    yield from me_db_on(request)


class LegacyTicket(me.Document):
    id = me.SequenceField(primary_key=True)
    title = me.StringField()
    meta = {"collection": "legacy"}


class NewTicket(me.Document):
    id = SequenceField(primary_key=True)
    title = me.StringField()
    meta = {"collection": "legacy"}


class LegacyLabel(me.Document):
    code = me.SequenceField(value_decorator=str)
    meta = {"collection": "labels"}


class NewLabel(me.Document):
    code = SequenceField(value_decorator=str)
    meta = {"collection": "labels"}


class Small(me.Document):
    id = SequenceField(primary_key=True, end=50)
    meta = {"collection": "legacy"}


def test_adopts_the_builtin_counter(me_db: Any) -> None:
    """Documents numbered by mongoengine's field continue from its counter with autoseq."""
    for i in range(5):
        LegacyTicket(title=str(i)).save()
    result = adopt(NewTicket)
    assert (result.name, result.counter, result.max_value, result.moved) == ("legacy", 5, 5, True)
    assert NewTicket(title="next").save().id == 6
    assert sorted(me_db["legacy"].distinct("_id")) == [1, 2, 3, 4, 5, 6]


def test_largest_stored_value_beats_a_lower_counter(me_db: Any) -> None:
    """A document numbered past the counter (by hand) moves the start past it."""
    LegacyTicket(title="a").save()
    me_db["legacy"].insert_one({"_id": 40, "title": "by hand"})
    me_db["legacy"].insert_one({"_id": "not-a-number", "title": "ignored"})
    result = adopt(NewTicket)
    assert (result.counter, result.max_value) == (1, 40)
    assert NewTicket(title="b").save().id == 41


def test_adoption_never_moves_backwards(me_db: Any) -> None:
    """A sequence already past what is stored keeps its current."""
    LegacyTicket(title="a").save()
    NewTicket.id.set_next_value(99)
    result = adopt(NewTicket)
    assert result.moved is False
    assert result.row.current == 100
    assert NewTicket(title="b").save().id == 100


def test_dry_run_writes_nothing(me_db: Any) -> None:
    """dry_run reports the new start without creating or changing the row."""
    LegacyTicket(title="a").save()
    LegacyTicket(title="b").save()
    result = adopt(NewTicket, dry_run=True)
    assert (result.moved, result.row.current) == (True, 3)
    assert me_db["sys_sequence"].find_one({"_id": "legacy"}) is None


def test_string_values_are_compared_as_numbers(me_db: Any) -> None:
    """A str-decorated field adopts past the numerically largest value, not '9' > '10'."""
    for _ in range(10):
        LegacyLabel().save()
    assert me_db["labels"].find_one(sort=[("code", -1)])["code"] == "9"
    result = adopt(NewLabel, "code")
    assert (result.name, result.max_value) == ("labels.code", 10)
    assert NewLabel().save().code == "11"


def test_nothing_to_adopt_creates_the_row_unchanged(me_db: Any) -> None:
    """With no counter and no documents the sequence starts at start."""
    result = adopt(NewTicket)
    assert (result.moved, result.counter, result.max_value) == (False, None, None)
    assert me_db["sys_sequence"].find_one({"_id": "legacy"})["current"] == 1


def test_values_past_end_are_refused(me_db: Any) -> None:
    """Adopting values beyond the sequence's end raises, naming the sequence."""
    me_db["legacy"].insert_one({"_id": 50})
    with pytest.raises(InvalidSequenceConfig, match=r"'legacy'.*end=50"):
        adopt(Small)


def test_only_autoseq_fields_can_be_adopted(me_db: Any) -> None:
    """adopt() on a field that is not autoseq's SequenceField says what to do."""
    with pytest.raises(InvalidSequenceConfig, match=r"not an autoseq_mongoengine\.SequenceField"):
        adopt(LegacyTicket)
    with pytest.raises(InvalidSequenceConfig, match="field name"):
        adopt_sequence(me_db, SequenceConfig("x"), documents=me_db["legacy"], field="$where")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoseq_mongoengine", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_adopts_from_counter_and_documents(me_db: Any, mongo_server: Any) -> None:
    """`python -m autoseq_mongoengine adopt` moves the sequence and says where it starts."""
    for _ in range(3):
        LegacyTicket(title="a").save()
    url = f"{mongo_server.url}/{me_db.name}"
    common = ["--url", url, "--sequence", "legacy", "--collection", "legacy"]
    dry = run_cli("adopt", *common, "--counter", "legacy.id", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would become 4" in dry.stdout
    assert me_db["sys_sequence"].find_one({"_id": "legacy"}) is None
    done = run_cli("adopt", *common, "--counter", "legacy.id")
    assert done.returncode == 0, done.stderr
    assert "counter 3, largest _id 3; next value is now 4" in done.stdout
    assert NewTicket(title="b").save().id == 4


def test_cli_bad_input_exits_2_and_writes_nothing(
    me_db: Any, mongo_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad arguments get one line on stderr, status 2, and no row."""
    url = f"{mongo_server.url}/{me_db.name}"
    cases = [
        ["--url", url, "--sequence", "s", "--collection", "legacy", "--field", "$where"],
        ["--url", url, "--sequence", "", "--collection", "legacy"],
        ["--url", url, "--sequence", "s", "--collection", "$bad"],
        ["--url", mongo_server.url, "--sequence", "s"],
        ["--url", url, "--sequence", "s", "--step", "0"],
        ["--url", "http://nope", "--sequence", "s"],
        ["--sequence", "s"],
    ]
    for case in cases:
        try:
            status = cli_main(["adopt", *case])
        except SystemExit as exit_:  # argparse's own errors
            status = exit_.code
        assert status == 2, case
        assert capsys.readouterr().err.strip(), case
    assert me_db["sys_sequence"].count_documents({}) == 0


def test_autoseq_command_has_mongo_adopt(
    me_db: Any, mongo_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`autoseq --url mongodb://... mongo-adopt` (an autoseq.cli entry point) adopts too."""
    from autoseq.cli import main as autoseq_main

    me_db["legacy"].insert_many([{"_id": 7}, {"_id": 12}])
    url = f"{mongo_server.url}/{me_db.name}"
    status = autoseq_main(
        ["--url", url, "mongo-adopt", "--sequence", "legacy", "--collection", "legacy"]
    )
    assert status == 0, capsys.readouterr().err
    assert "next value is now 13" in capsys.readouterr().out
    assert autoseq_main(["--url", url, "mongo-adopt", "--sequence", "x", "--field", "$a"]) == 2
    assert NewTicket(title="c").save().id == 13


def test_cli_misspelled_collection_or_field_exits_2(
    me_db: Any, mongo_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """adopt --collection/--field naming what is not there: one line, exit 2, no row."""
    me_db["legacy"].insert_many([{"_id": 7, "no": 3}])
    url = f"{mongo_server.url}/{me_db.name}"
    cases = {
        "'legaci'": ["--collection", "legaci"],
        "'nr'": ["--collection", "legacy", "--field", "nr"],
    }
    for named, case in cases.items():
        status = cli_main(["adopt", "--url", url, "--sequence", "legacy", *case])
        assert status == 2, case
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1
        assert named in lines[0]
    assert "legacy" in lines[0]
    assert "legaci" not in me_db.list_collection_names()
    assert me_db["sys_sequence"].count_documents({}) == 0
