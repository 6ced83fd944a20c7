"""Disjoint residue classes: independent stores that never hand out the same value.

Past what one row serves, or across regions that must not coordinate, each
store serves one residue class of a shared step: store ``i`` of ``n``
hands out ``start + i*step, start + (i+n)*step, ...`` (a ``SequenceConfig``
with ``start`` offset by ``i*step`` and ``step * n``), as tinyid's
delta/remainder does. No value can come from two stores, whatever each
store does, so a store may be down, lag or fail over without the others
knowing. [`check_disjoint`][autoseq.residues.check_disjoint] proves a set of configurations disjoint
before they are used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import combinations
from typing import Any

from autoseq.config import SequenceConfig
from autoseq.errors import InvalidSequenceConfig, OverlappingSequences


def residue_class(name: str, index: int, of: int, **settings: Any) -> SequenceConfig:
    """Sequence ``name`` as served by store ``index`` of ``of`` independent stores.

    ``settings`` are the shared ``SequenceConfig`` settings (``start``,
    ``step``, ``end``, ``batch_count``...); every store must be given the
    same ones. Raises ``InvalidSequenceConfig`` for an index outside
    ``0 .. of - 1``.
    """
    if not isinstance(of, int) or isinstance(of, bool) or of < 1:
        raise InvalidSequenceConfig(f"of={of!r}: give the number of stores (1 or more)")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < of:
        raise InvalidSequenceConfig(
            f"index={index!r}: give this store's number, 0 to {of - 1} (of={of})"
        )
    shared = SequenceConfig(name, **settings)
    start = shared.start + index * shared.step
    return shared.replace(start=start, step=shared.step * of, current=None)


def check_disjoint(configs: Iterable[SequenceConfig]) -> None:
    """Raise ``OverlappingSequences`` unless no value belongs to two of ``configs``."""
    for first, second in combinations(list(configs), 2):
        shared = first_shared_value(first, second)
        if shared is not None:
            raise OverlappingSequences(_describe(first), _describe(second), shared)


def first_shared_value(a: SequenceConfig, b: SequenceConfig) -> int | None:
    """The smallest value both ``a`` and ``b`` can hand out, or None (Chinese remainder)."""
    gcd = math.gcd(a.step, b.step)
    if (b.start - a.start) % gcd:
        return None
    lcm = a.step // gcd * b.step
    # x = a.start + a.step * k with a.step * k = b.start - a.start (mod b.step)
    k = (b.start - a.start) // gcd * pow(a.step // gcd, -1, b.step // gcd) % (b.step // gcd)
    common = a.start + a.step * k
    low = max(a.start, b.start)
    if common < low:
        common += -((common - low) // lcm) * lcm
    return common if common <= min(a.last_value, b.last_value) else None


def _describe(config: SequenceConfig) -> str:
    return f"{config.name!r} (start={config.start}, step={config.step})"
