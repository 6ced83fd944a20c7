"""Residue classes: configurations for independent stores that never share a value."""

from __future__ import annotations

import pytest

from autoseq import SequenceConfig
from autoseq.errors import InvalidSequenceConfig, OverlappingSequences
from autoseq.residues import check_disjoint, first_shared_value, residue_class


@pytest.mark.parametrize("of", [1, 2, 3, 7])
def test_residue_classes_partition_the_shared_sequence(of: int) -> None:
    """Store i of n serves start + i*step + k*n*step: together every value once."""
    configs = [residue_class("orders", i, of, start=5, step=3) for i in range(of)]
    check_disjoint(configs)
    served = sorted(c.start + k * c.step for c in configs for k in range(50))
    assert served == [5 + 3 * k for k in range(50 * of)]


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        ({"start": 1, "step": 2}, {"start": 3, "step": 2}, 3),  # one class twice
        ({"start": 1, "step": 3}, {"start": 2, "step": 2}, 4),  # different steps meet
        ({"start": 10, "step": 3}, {"start": 2, "step": 2}, 10),
    ],
)
def test_overlapping_classes_are_refused_naming_a_shared_value(
    a: dict[str, int], b: dict[str, int], shared: int
) -> None:
    """check_disjoint raises OverlappingSequences with the smallest value both hand out."""
    first, second = SequenceConfig("orders", **a), SequenceConfig("orders", **b)
    assert first_shared_value(first, second) == shared
    with pytest.raises(OverlappingSequences, match=f"both hand out {shared}") as raised:
        check_disjoint([first, second])
    assert raised.value.value == shared
    assert "residue_class" in str(raised.value)


def test_progressions_that_meet_only_past_end_are_disjoint() -> None:
    """Two classes whose only common values lie past one's end share nothing."""
    low = SequenceConfig("orders", start=1, step=4, end=5)
    high = SequenceConfig("orders", start=9, step=2)
    assert first_shared_value(low, high) is None
    check_disjoint([low, high])


@pytest.mark.parametrize(("index", "of"), [(3, 3), (-1, 3), (0, 0), (True, 2)])
def test_a_store_number_outside_the_classes_is_refused(index: int, of: int) -> None:
    """residue_class refuses an index outside 0..of-1 or a count below 1."""
    with pytest.raises(InvalidSequenceConfig, match=r"index|of="):
        residue_class("orders", index, of)
