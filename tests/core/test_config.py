"""SequenceConfig validation and the reservation arithmetic."""

from __future__ import annotations

import pytest

from autoseq import MAX_VALUE, InvalidSequenceConfig, SequenceConfig, SequenceExhausted
from autoseq.errors import InvalidStoredRow
from autoseq.stores import plan_reservation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step": 0}, "step must be 1 or more"),
        ({"step": -5}, "step must be 1 or more"),
        ({"start": 10, "end": 5}, "start=10 is greater than end=5"),
        ({"batch_count": 0}, "batch_count must be 1 or more"),
        ({"current": 0}, "outside"),
        ({"start": 1, "end": 10, "current": 11}, "outside"),
        ({"step": 2, "current": 4}, "not start \\+ k \\* step"),
        ({"step": 1.5}, "step must be an int"),
        ({"start": "1"}, "start must be an int"),
        ({"batch": "yes"}, "batch must be True or False"),
        ({"end": 2**64}, "does not fit a signed 64-bit integer"),
        ({"start": MAX_VALUE}, "leaves no room"),
    ],
)
def test_invalid_config_is_refused_with_a_reason(kwargs: dict[str, object], message: str) -> None:
    """Each impossible setting raises InvalidSequenceConfig saying what is wrong."""
    with pytest.raises(InvalidSequenceConfig, match=message):
        SequenceConfig("s", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [None, 3, b"bytes", "", " x", "a\nb", "n" * 192])
def test_invalid_names_are_refused(name: object) -> None:
    """Names that no store can key on are refused."""
    with pytest.raises(InvalidSequenceConfig):
        SequenceConfig(name)  # type: ignore[arg-type]


def test_defaults_match_the_contract() -> None:
    """Defaults are start=1, end=2**63-1, step=1, batch of 100, no cycle."""
    config = SequenceConfig("orders")
    assert (config.start, config.end, config.step, config.batch, config.batch_count) == (
        1,
        MAX_VALUE,
        1,
        True,
        100,
    )
    assert (config.current, config.next_value, config.cycle, config.block_size) == (
        None,
        1,
        False,
        100,
    )
    assert SequenceConfig("one", batch=False).block_size == 1


def test_from_row_accepts_exhausted_and_refuses_impossible() -> None:
    """A stored row may be one step past its last value; anything else impossible is refused."""
    row = {
        "name": "r",
        "start": 1,
        "end": 10,
        "step": 3,
        "current": 13,
        "batch": True,
        "batch_count": 5,
        "cycle": False,
        "updated_at": None,
    }
    assert SequenceConfig.from_row(row).exhausted
    with pytest.raises(InvalidSequenceConfig, match="stored sys_sequence row 'r' is invalid"):
        SequenceConfig.from_row(row | {"current": 16})
    with pytest.raises(InvalidSequenceConfig, match="stored sys_sequence row 'r' is invalid"):
        SequenceConfig.from_row(row | {"step": 0})


def test_plan_respects_step_end_and_cycle() -> None:
    """Blocks are cut at the last value; cycling wraps, otherwise SequenceExhausted."""
    row = SequenceConfig("p", start=5, end=20, step=5)
    block, current = plan_reservation(row, 3)
    assert (list(block.values()), current) == ([5, 10, 15], 20)
    block, current = plan_reservation(row.with_current(20), 3)
    assert (list(block.values()), current) == ([20], 25)
    with pytest.raises(SequenceExhausted, match="'p' is exhausted: next value 25 is past end 20"):
        plan_reservation(row.with_current(25), 1)
    ring = SequenceConfig("q", start=5, end=20, step=5, cycle=True).with_current(25)
    block, _ = plan_reservation(ring, 2)
    assert block.cycled
    assert list(block.values()) == [5, 10]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cycle", "false"),
        ("batch", "false"),
        ("cycle", 2),
        ("batch", None),
        ("current", 11.0),
        ("step", 1.0),
        ("end", "100"),
        ("version", 1.5),
    ],
)
def test_stored_rows_are_parsed_strictly(field: str, value: object) -> None:
    """A hand-edited flag or number is refused, naming the row and the repair command."""
    row = SequenceConfig("r", current=11).as_row() | {"updated_at": None}
    with pytest.raises(InvalidStoredRow, match=r"row 'r' is invalid.*autoseq set r VALUE --force"):
        SequenceConfig.from_row(row | {field: value})


def test_stored_flags_may_be_booleans_or_zero_and_one() -> None:
    """Drivers return booleans as bool or 0/1 (MySQL TINYINT); both read; no version reads as 0."""
    row = SequenceConfig("r").as_row() | {"updated_at": None}
    del row["version"]
    parsed = SequenceConfig.from_row(row | {"batch": 0, "cycle": 1})
    assert (parsed.batch, parsed.cycle, parsed.version) == (False, True, 0)


@pytest.mark.parametrize(
    ("row", "left"),
    [
        ({"start": 1, "end": 10}, 10),
        ({"start": 1, "end": 10, "current": 10}, 1),
        ({"start": 1, "end": 10, "current": 11}, 0),
        ({"start": 0, "end": 10, "step": 3, "current": 9}, 1),  # 9; 12 is past end
        ({"start": 0, "end": 10, "step": 3, "current": 12}, 0),
        ({"start": 5, "end": 5}, 1),
        ({"start": 1, "end": 10, "current": 11, "cycle": True}, 0),
        ({"start": MAX_VALUE - 2, "current": MAX_VALUE - 1}, 1),  # 2**63 - 1 is never handed
    ],
)
def test_values_left_counts_the_unreserved_values_up_to_end(
    row: dict[str, object], left: int
) -> None:
    """values_left is 0 on an exhausted row, 1 on its last value, never negative."""
    config = SequenceConfig.from_row(
        {"name": "s", "end": MAX_VALUE, "step": 1, "batch": True, "batch_count": 10}
        | {"cycle": False, "current": row.get("start", 1)}
        | row
    )
    assert config.values_left == left


def test_range_size_counts_every_value_of_the_series() -> None:
    """range_size counts start, start + step, ... up to the last value."""
    assert SequenceConfig("s", start=0, end=10, step=3).range_size == 4  # 0 3 6 9
    assert SequenceConfig("s", start=7, end=7).range_size == 1


@pytest.mark.parametrize(
    ("value", "after", "from_"),
    [
        (None, 10, None),
        (-100, 10, 10),  # below start
        (9, 10, 10),
        (10, 15, 10),  # on the series: after is the next, from is itself
        (11, 15, 15),
        (14, 15, 15),
        (30, 35, 30),  # at end: after lies past the last value (an exhausted current)
    ],
)
def test_first_value_after_and_from_stay_on_the_series(
    value: int | None, after: int, from_: int | None
) -> None:
    """first_value_after(v) > v and first_value_from(v) >= v, both start + k * step."""
    config = SequenceConfig("s", start=10, end=30, step=5)
    assert config.first_value_after(value) == after
    if value is not None:
        assert config.first_value_from(value) == from_


def test_first_value_after_near_the_top_of_the_range() -> None:
    """Past the last value the answer is one step beyond it, as an exhausted row stores."""
    config = SequenceConfig("s", start=MAX_VALUE - 10, step=4)
    assert config.last_value == MAX_VALUE - 6
    assert config.first_value_after(config.last_value) == MAX_VALUE - 2
    assert config.with_current(config.first_value_after(config.last_value)).exhausted


@pytest.mark.parametrize(
    ("kwargs", "setting", "rule"),
    [
        ({"step": 0}, "step", "minimum"),
        ({"batch_count": 0}, "batch_count", "minimum"),
        ({"start": 10, "end": 5}, "start", "order"),
        ({"end": 2**64}, "end", "size"),
        ({"cycle": 1}, "cycle", "type"),
        ({"start": MAX_VALUE}, "start", "room"),
        ({"start": 1, "end": 10, "current": 11}, "current", "range"),
        ({"step": 2, "current": 4}, "current", "grid"),
    ],
)
def test_a_refusal_names_the_setting_and_the_rule(
    kwargs: dict[str, object], setting: str, rule: str
) -> None:
    """InvalidSequenceConfig.setting/rule say what failed, for integrations to map to codes."""
    with pytest.raises(InvalidSequenceConfig) as refused:
        SequenceConfig("s", **kwargs)  # type: ignore[arg-type]
    assert (refused.value.setting, refused.value.rule) == (setting, rule)


def test_the_settings_table_is_the_config_defaults() -> None:
    """SETTINGS declares every setting of SequenceConfig, with the defaults it applies."""
    from autoseq.config import SETTINGS

    config = SequenceConfig("s")
    assert {s.name: s.default for s in SETTINGS} == {
        "start": config.start,
        "end": config.end,
        "step": config.step,
        "batch": config.batch,
        "batch_count": config.batch_count,
        "cycle": config.cycle,
    }


def test_gapless_is_declared_on_the_config_and_kept_out_of_the_row() -> None:
    """SequenceConfig(gapless=True) is validated like the other flags and never stored."""
    from autoseq import GaplessUnavailable, SequenceRegistry, Serial
    from autoseq.stores import MemoryStore

    with pytest.raises(InvalidSequenceConfig, match="gapless must be True or False"):
        SequenceConfig("g", gapless="yes")  # type: ignore[arg-type]
    config = SequenceConfig("g", gapless=True)
    assert "gapless" not in config.as_row()
    assert SequenceConfig.from_row(config.as_row()).gapless is False
    assert config.replace(name="h").gapless is True
    # A registry serves blocks, which would leave gaps: it refuses a gapless config.
    registry = SequenceRegistry(MemoryStore())
    with pytest.raises(GaplessUnavailable, match="never served from a block"):
        registry.register(config)
    # Serial declares gapless on its config: one place says it.
    serial = Serial(registry, "plain", "P{n}")
    assert serial.config.gapless is False
    assert serial.gapless is False
