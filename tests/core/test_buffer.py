"""The pure parts of serving: the buffer of blocks in hand, block sizing and back-off.

No threads, no clock and no store: each test drives one part by hand.
"""

from __future__ import annotations

import heapq
import time

import pytest

from autoseq import InvalidSequenceConfig, SequenceConfig
from autoseq.buffer import Buffer
from autoseq.pacing import (
    ACTIVE_WINDOW,
    DEFAULT_MAX_BATCH_COUNT,
    DEFAULT_RESERVATIONS_PER_SECOND,
    RANGE_SHARE,
    Backoff,
    BlockSizer,
    LowRemainingAlarm,
    ReservationBudget,
    configure,
    shared_budget,
)
from autoseq.stores.base import Block

ROW = SequenceConfig("b")


def block(first: int, last: int, step: int = 1) -> Block:
    return Block("b", first, last, step, ROW)


def loaded(*blocks: Block, prefetch_at: float | None = None) -> Buffer:
    buffer = Buffer(prefetch_at)
    for each in blocks:
        buffer.add(each)
    buffer.latest = blocks[-1]
    return buffer


def test_take_serves_the_current_block_in_runs_then_reports_it_spent() -> None:
    """take(n) hands out at most what the current block holds, in order, then None."""
    buffer = loaded(block(1, 10))
    assert buffer.take(3) is None  # nothing current until a block is started
    assert buffer.start_next()
    assert buffer.take(3) == (1, 3, 1)
    assert buffer.take(100) == (4, 10, 1)
    assert buffer.take(1) is None
    assert not buffer.start_next()


def test_take_follows_the_step() -> None:
    """A block with step 5 is served 5 apart and counted in values, not units."""
    buffer = loaded(block(10, 30, 5))
    buffer.start_next()
    assert buffer.take(2) == (10, 15, 5)
    assert buffer.current_left(buffer.next) == 3


def test_prefetch_point_is_a_share_of_the_last_block_in_hand() -> None:
    """The fast run stops at prefetch_at of the last block; with more queued it runs to the end."""
    buffer = loaded(block(1, 100), prefetch_at=0.1)
    buffer.start_next()
    assert buffer.fast_until == 10
    buffer.take(9)
    assert not buffer.past_prefetch_point()
    buffer.take(1)
    assert buffer.past_prefetch_point()
    buffer.serve_to_end()
    assert buffer.fast_until == 100
    two = loaded(block(1, 100), block(101, 200), prefetch_at=0.1)
    two.start_next()
    assert two.fast_until == 100


def test_an_armed_run_settles_to_exactly_what_it_did_not_serve() -> None:
    """Values taken from the armed iterator are served; settle() leaves next on the first left."""
    buffer = loaded(block(1, 19, 2))
    buffer.start_next()
    fast = buffer.arm()
    assert fast is not None
    assert [next(fast), next(fast)] == [1, 3]
    assert buffer.position(fast) == 5
    buffer.settle(fast)
    assert buffer.next == 5
    assert buffer.fast_stop is None
    assert list(fast) == []  # drained: nothing can be served twice
    assert buffer.take(100) == (5, 19, 2)
    assert buffer.arm() is None


@pytest.mark.parametrize("size", [2**27, 2**40, 2**64])
def test_settling_an_armed_run_takes_constant_time_whatever_the_block(size: int) -> None:
    """settle() counts what a run of 2**27 to 2**64 values left at once, without walking it.

    The first size is small enough for a walk to finish (in a second or
    more) and fail the bound; the larger ones would not finish at all.
    """
    buffer = loaded(block(2**62, 2**62 + (size - 1) * 3, 3))
    buffer.start_next()
    fast = buffer.arm()
    assert fast is not None
    assert [next(fast), next(fast)] == [2**62, 2**62 + 3]
    started = time.perf_counter()
    buffer.settle(fast)
    assert time.perf_counter() - started < 0.05
    assert buffer.next == 2**62 + 6
    assert buffer.current_left(buffer.next) == size - 2
    assert list(fast) == []  # ended: a thread holding it gets nothing more
    assert buffer.take(1) == (2**62 + 6, 2**62 + 6, 3)


def test_peek_and_counts_see_the_current_and_queued_blocks() -> None:
    """peek() is the next value in hand; current_left and queued count what is left."""
    buffer = loaded(block(1, 5), block(6, 10))
    assert buffer.peek(buffer.next) == 1
    buffer.start_next()
    buffer.take(5)
    assert buffer.current_left(buffer.next) == 0
    assert buffer.queued() == 5
    assert buffer.peek(buffer.next) == 6
    buffer.start_next()
    buffer.take(5)
    assert buffer.peek(buffer.next) is None


def test_give_back_puts_a_failed_calls_runs_in_front_in_order() -> None:
    """Runs a failed call took are served again first, before the rest of the block."""
    buffer = loaded(block(1, 10))
    buffer.start_next()
    runs = [buffer.take(2), buffer.take(3)]
    buffer.give_back(run for run in runs if run is not None)
    served = []
    while buffer.start_next():
        while (run := buffer.take(100)) is not None:
            served.extend(range(run[0], run[1] + 1, run[2]))
    assert served == list(range(1, 11))


def test_the_unused_tail_is_the_contiguous_run_ending_at_the_latest_reservation() -> None:
    """unused_tail() joins the current block's rest with contiguous queued blocks."""
    buffer = loaded(block(1, 10), block(11, 20))
    buffer.start_next()
    buffer.take(4)
    tail = buffer.unused_tail()
    assert tail is not None
    assert (tail.first, tail.last) == (5, 20)
    gap = loaded(block(1, 10), block(31, 40))
    gap.start_next()
    tail = gap.unused_tail()
    assert tail is not None
    assert (tail.first, tail.last) == (31, 40)
    gap.clear()
    assert gap.unused_tail() is None


def test_blocks_grow_at_most_sixteen_times_toward_block_seconds_of_the_rate() -> None:
    """A fast rate grows the size by at most 16x per reservation, in batch_count multiples."""
    sizer = BlockSizer(10, adaptive=True, block_seconds=2.0, max_batch_count=None)
    assert sizer.ceiling == DEFAULT_MAX_BATCH_COUNT
    sizer.reserved(10, at=0.0)
    assert sizer.rate is None
    sizer.reserved(10, at=0.001)  # 10,000 values/s: wants 20,000
    assert sizer.rate == pytest.approx(10_000)
    assert sizer.size == 160
    sizer.reserved(160, at=0.002)
    assert sizer.size == 2560


def test_before_a_rate_is_measured_the_pace_of_the_first_block_sizes_the_next() -> None:
    """serving(): 10 values in 1 ms grow the size (16x at most); once a rate is known, nothing."""
    sizer = BlockSizer(100, adaptive=True, block_seconds=2.0, max_batch_count=None)
    sizer.reserved(100, at=0.0)
    sizer.serving(0, 0.001)
    sizer.serving(10, 0.0)
    assert sizer.size == 100  # nothing served, or no time passed: no pace to read
    sizer.serving(10, 0.001)  # 10,000 values/s: wants 20,000
    assert sizer.size == 1600
    sizer.reserved(1600, at=0.02)
    assert sizer.rate is not None
    measured = sizer.size
    sizer.serving(1000, 0.0001)
    assert sizer.size == measured
    fixed = BlockSizer(100, adaptive=False, block_seconds=2.0, max_batch_count=None)
    fixed.serving(10, 0.001)
    assert fixed.size == 1


def test_served_counts_the_current_block_from_its_first_value() -> None:
    """served() is how far the current block has been taken, in values; 0 after a switch."""
    buffer = loaded(block(10, 30, 5), block(35, 40, 5))
    buffer.start_next()
    assert buffer.served() == 0
    buffer.take(3)
    assert buffer.served() == 3
    buffer.take(10)
    buffer.start_next()
    assert buffer.served() == 0


def test_blocks_shrink_at_most_to_a_quarter_and_never_below_the_floor() -> None:
    """A slow rate shrinks the size to a quarter per reservation, down to batch_count."""
    sizer = BlockSizer(10, adaptive=True, block_seconds=1.0, max_batch_count=5000)
    sizer.size = 640
    sizer.reserved(640, at=0.0)
    sizer.reserved(640, at=1000.0)
    assert sizer.size == 160
    for at in (2000.0, 3000.0, 4000.0):
        sizer.reserved(10, at=at)
    assert sizer.size == 10


def test_the_ceiling_caps_growth_and_fixed_sizing_never_moves() -> None:
    """max_batch_count caps the size; adaptive=False (batch=False) keeps 1."""
    capped = BlockSizer(100, adaptive=True, block_seconds=60.0, max_batch_count=300)
    capped.reserved(100, at=0.0)
    capped.reserved(100, at=0.001)
    assert capped.size == 300
    fixed = BlockSizer(100, adaptive=False, block_seconds=60.0, max_batch_count=None)
    fixed.reserved(1, at=0.0)
    fixed.reserved(1, at=0.001)
    assert fixed.size == 1
    assert fixed.rate == pytest.approx(1000)


def test_at_full_speed_the_default_ceiling_means_a_few_reservations_a_second() -> None:
    """15M values/s reaches the 2**24 ceiling in five reservations, then about one a second."""
    rate = 15_000_000.0  # one process calling next() in memory on a small machine
    sizer = BlockSizer(100, adaptive=True, block_seconds=2.0, max_batch_count=None)
    assert sizer.ceiling == DEFAULT_MAX_BATCH_COUNT == 2**24
    now, count, sizes = 0.0, 100, []
    for _ in range(20):
        sizer.reserved(count, at=now)
        sizes.append(sizer.size)
        now += count / rate  # the block just reserved is used up at that rate
        count = sizer.size
    assert sizes.index(max(sizes)) <= 5
    assert max(sizes) == 2**24 // 100 * 100  # a multiple of batch_count, not above the ceiling
    steady = sizes[6:]
    assert set(steady) == {max(sizes)}
    assert rate / steady[0] <= 1.0  # reservations per second once warmed up


def test_on_a_short_range_blocks_hold_at_most_a_hundredth_of_it() -> None:
    """fit_range: 1/RANGE_SHARE of the range, in batch_count multiples, never below the floor."""
    assert RANGE_SHARE == 100
    sizer = BlockSizer(100, adaptive=True, block_seconds=60.0, max_batch_count=None)
    sizer.size = 409_600  # as if it had grown on a long range
    sizer.fit_range(99_999)
    assert (sizer.ceiling, sizer.size) == (900, 900)
    sizer.reserved(900, at=0.0)
    sizer.reserved(900, at=0.001)  # 900,000 values/s wants far more
    assert sizer.size == 900
    sizer.fit_range(5_000)  # a range smaller than 100 blocks: batch_count still
    assert (sizer.ceiling, sizer.size) == (100, 100)
    sizer.fit_range(2**63)  # a 64-bit range: the configured ceiling again
    assert sizer.ceiling == DEFAULT_MAX_BATCH_COUNT
    capped = BlockSizer(100, adaptive=True, block_seconds=60.0, max_batch_count=300)
    capped.fit_range(10**9)
    assert capped.ceiling == 300  # never above max_batch_count
    fixed = BlockSizer(100, adaptive=False, block_seconds=60.0, max_batch_count=None)
    fixed.fit_range(99_999)
    assert fixed.size == 1  # batch=False keeps one value per reservation


def test_a_ceiling_that_is_not_a_multiple_of_batch_count_is_never_passed() -> None:
    """max_batch_count=250 with batch_count=100 caps sizes at 200, never 300."""
    sizer = BlockSizer(100, adaptive=True, block_seconds=60.0, max_batch_count=250)
    sizer.reserved(100, at=0.0)
    sizer.reserved(100, at=0.001)
    assert sizer.size == 200
    sizer.reserved(200, at=0.002)
    assert sizer.size == 200
    assert sizer.reservation(1) == 200


def test_a_reservation_covers_the_shortfall_in_whole_blocks_and_the_bulk_buffer() -> None:
    """reservation() rounds up to whole blocks of the current size, at least one."""
    sizer = BlockSizer(100, adaptive=True, block_seconds=2.0, max_batch_count=None)
    assert sizer.reservation(0) == 100
    assert sizer.reservation(250) == 300
    assert sizer.reservation(1, buffer_for=2000) == 2000


def sizers(n: int, budget: ReservationBudget | None) -> list[BlockSizer]:
    """``n`` sizers of default settings (batch_count 100, block_seconds 2.0) sharing ``budget``."""
    return [
        BlockSizer(100, adaptive=True, block_seconds=2.0, max_batch_count=None, budget=budget)
        for _ in range(n)
    ]


def round_robin(sequences: list[BlockSizer], rate: float, seconds: float) -> list[float]:
    """Each sizer's blocks taken at ``rate`` values/s until ``seconds``; when each reserved.

    A made-up clock: a block is reserved the instant the one before runs
    out, the first blocks at 1 µs intervals, as a loop taking the first value
    of each would; the second block is sized from the first one's pace, as
    `SequenceLock` does at the prefetch point.
    """
    times = []
    due = []
    for index, sizer in enumerate(sequences):
        at = index * 1e-6
        first = sizer.reservation(1)
        sizer.reserved(first, at=at)
        sizer.serving(first // 10, first / 10 / rate)  # the pace read at its prefetch point
        times.append(at)
        due.append((at + first / rate, index))
    heapq.heapify(due)
    while due[0][0] < seconds:
        at, index = heapq.heappop(due)
        sizer = sequences[index]
        count = sizer.size
        sizer.reserved(count, at=at)
        times.append(at)
        heapq.heappush(due, (at + count / rate, index))
    return times


def test_a_lone_sequence_is_sized_the_same_with_the_budget_as_without() -> None:
    """One hot sequence never meets the budget: sized as by a sizer without one, step by step."""
    budget = ReservationBudget()
    alone, shared = sizers(1, None)[0], sizers(1, budget)[0]
    now = 0.0
    for rate in [15_000_000.0] * 8 + [1_000.0] * 8 + [50_000.0] * 4:
        for sizer in (alone, shared):
            sizer.reserved(sizer.size, at=now)
        assert shared.size == alone.size
        now += alone.size / rate
    assert budget.active() == 1
    assert budget.seconds == 0.0  # 1 / 100 s: below LEAST_SECONDS, the budget does not bind
    tiny = BlockSizer(10, adaptive=True, block_seconds=1e-9, max_batch_count=None, budget=budget)
    tiny.reserved(10, at=0.0)
    tiny.reserved(10, at=1.0)
    assert tiny.size == 10  # 2 sequences active: their own block_seconds, however short


def test_with_many_sequences_active_blocks_last_long_enough_for_the_budget() -> None:
    """10,000 active sequences, 100/s: a block lasts 100 s, reached in one step from the first."""
    budget = ReservationBudget(100.0)

    def sizer(floor: int = 100, max_batch_count: int | None = None) -> BlockSizer:
        made = BlockSizer(
            floor, adaptive=True, block_seconds=2.0, max_batch_count=max_batch_count, budget=budget
        )
        made.reserved(floor, at=0.0)  # its first block
        return made

    plain, odd, capped, short, slow, burst = (
        sizer(),
        sizer(300),
        sizer(max_batch_count=20_000),
        sizer(),
        sizer(),
        sizer(),
    )
    for _ in range(10_000 - 6):
        budget.reserved(0, at=0.0)  # the other sequences' first blocks
    assert budget.active() == 10_000
    assert budget.seconds == pytest.approx(100.0)
    plain.serving(10, 0.02)  # 500 values/s, read at the first block's prefetch point
    assert plain.size == 50_000  # 500/s for 100 s, where 16x would have stopped at 1,600
    odd.serving(10, 0.03)  # 333.3 values/s wants 33,333: whole multiples of batch_count
    assert odd.size == 33_600
    capped.serving(10, 0.02)
    assert capped.size == 20_000  # max_batch_count still caps
    short.fit_range(99_999)
    short.serving(10, 0.02)
    assert short.size == 900  # and RANGE_SHARE on a short range
    slow.serving(10, 100.0)  # 0.1 value/s: the smallest size is 16 x batch_count here
    assert slow.size == 1600
    burst.serving(10, 1e-6)  # still at most 16 x (100 s / 2 s) per step
    assert burst.size == 100 * 16 * 50
    # A sequence started now: its first block is 16 x batch_count (the stretch, 50, capped).
    assert sizers(1, budget)[0].reservation(1) == 1600
    assert (
        BlockSizer(
            100, adaptive=True, block_seconds=2.0, max_batch_count=500, budget=budget
        ).reservation(1)
        == 500
    )
    assert sizers(1, ReservationBudget(100.0))[0].reservation(1) == 100  # alone: batch_count


def test_sequences_counted_as_starting_take_first_blocks_sized_for_all_of_them() -> None:
    """starting(): 2,000 sizers counted before any reserves each get the stretched first block
    (10 x batch_count), where reserving one by one gave the first 200 batch_count; the first
    reservations, in the same period, count none twice; alone, a sequence starts at 100."""
    one_by_one = sizers(2_000, ReservationBudget(100.0))
    firsts = []
    for sizer in one_by_one:
        firsts.append(sizer.reservation(1))
        sizer.reserved(firsts[-1], at=0.0)
    assert firsts[:200] == [100] * 200
    budget = ReservationBudget(100.0)
    together = sizers(2_000, budget)
    for sizer in together:
        sizer.starting(at=0.0)
    assert budget.active() == 2_000
    assert budget.seconds == pytest.approx(20.0)
    assert {sizer.reservation(1) for sizer in together} == {1000}
    for sizer in together:
        sizer.reserved(1000, at=0.5)
    assert budget.active() == 2_000
    lone = sizers(1, ReservationBudget(100.0))[0]
    lone.starting(at=0.0)
    assert lone.reservation(1) == 100


def test_thousands_of_sequences_round_robin_stay_within_the_budget() -> None:
    """2,000 sequences at 1,000 values/s each: about 100 reservations/s, not 1,000."""
    seconds, rate = 200.0, 1_000.0
    without = round_robin(sizers(2_000, None), rate, seconds)
    budget = ReservationBudget(100.0)
    within = round_robin(sizers(2_000, budget), rate, seconds)
    late = [at for at in within if at >= 100.0]  # after the ramp
    assert len(late) / (seconds - 100.0) <= 100.0 * 1.05
    late_without = [at for at in without if at >= 100.0]
    assert len(late_without) / (seconds - 100.0) >= 900.0  # a block every 2 s each
    assert len(within) < len(without) / 5
    # The ramp: the first block (up to 10 x batch_count, the stretch), then up
    # to 16 x 10 times it (the growth cap stretched alike), then the stretched
    # size, 20 s of values: three reservations at most for each sequence.
    ramp = [at for at in within if at < 20.0]
    assert len(ramp) <= 3 * 2_000


def test_idle_sequences_stop_stretching_the_others_blocks() -> None:
    """2,000 sequences reserve once and go idle: within two periods a hot one is sized as alone."""
    budget = ReservationBudget(100.0)
    idle = sizers(1_999, budget)
    for index, sizer in enumerate(idle):
        sizer.reserved(100, at=index * 1e-6)
    hot = sizers(1, budget)[0]
    now, rate = 1.0, 1_000_000.0
    hot.reserved(100, at=now)
    assert budget.seconds == pytest.approx(20.0)
    hot.serving(10, 1e-5)
    assert hot.size == 100 * 16 * 10  # stretched: 20 s wanted, growth 16 x 10 per step
    sizes = []
    while now < 300.0:
        now += hot.size / rate
        hot.reserved(hot.size, at=now)
        sizes.append((now, hot.size))
    assert budget.active() == 1
    assert budget.seconds == 0.0
    assert sizes[-1][1] == 2_000_000  # 1,000,000 values/s for block_seconds: as if alone
    # The idle ones were counted for two periods at most (each at least ACTIVE_WINDOW,
    # twice the stretched 20 s here); the shrink to a quarter per step follows.
    first_alone = min(at for at, size in sizes if size == 2_000_000)
    assert first_alone <= 2 * max(ACTIVE_WINDOW, 2 * 20.0) + 20.0


def test_the_budget_counts_each_sequence_once_per_period() -> None:
    """A sequence reserving again in the same period is not counted twice."""
    budget = ReservationBudget(1.0, window=10.0)
    one, two = sizers(2, budget)
    for at in (0.0, 1.0, 2.0, 3.0):
        one.reserved(100, at=at)
    assert budget.active() == 1
    two.reserved(100, at=4.0)
    assert budget.active() == 2
    assert budget.seconds == pytest.approx(2.0)
    one.reserved(100, at=10.5)  # a new period: the previous one's two still count
    assert budget.active() == 2
    one.reserved(100, at=21.0)  # two periods on: only the one still reserving
    assert budget.active() == 1
    one.reserved(100, at=100.0)  # after a whole period with no reservation: none before count
    assert budget.active() == 1
    budget.reset()
    assert (budget.active(), budget.seconds) == (0, 0.0)
    one.reserved(100, at=101.0)  # counted again after a reset, its old period notwithstanding
    assert budget.active() == 1


def test_closed_sequences_stop_counting_at_once() -> None:
    """2,000 sequences counted over two periods, 1,999 closed: one active, no stretch left."""
    budget = ReservationBudget(100.0, window=10.0)
    many = sizers(2_000, budget)
    for sizer in many:
        sizer.reserved(100, at=0.0)
    for sizer in many[:1_000]:
        sizer.reserved(100, at=15.0)  # a new period: 2,000 in the previous one, 1,000 in this
    assert budget.active() == 2_000
    for sizer in many[1:]:
        sizer.stopped()
        sizer.stopped()  # closing twice counts once
    assert budget.active() == 1
    assert budget.seconds == 0.0


def test_the_process_budget_is_configurable_and_refuses_nonsense() -> None:
    """configure() changes the shared budget; 0 or less is refused with what to use."""
    budget = shared_budget()
    assert configure() is budget
    assert budget.per_second == DEFAULT_RESERVATIONS_PER_SECOND
    try:
        assert configure(reservations_per_second=500).per_second == 500.0
        for bad in (0, -1.0):
            with pytest.raises(InvalidSequenceConfig, match="above 0"):
                configure(reservations_per_second=bad)
        with pytest.raises(InvalidSequenceConfig, match="reservations_per_second"):
            ReservationBudget(0.0)
    finally:
        configure(reservations_per_second=DEFAULT_RESERVATIONS_PER_SECOND)


def test_backoff_doubles_up_to_the_maximum_and_a_success_resets_it() -> None:
    """Each failure waits twice as long (from initial, capped); success clears the error."""
    backoff = Backoff(0.05, 0.3)
    error = OSError("down")
    delays = []
    for _ in range(5):
        backoff.failed(error, now=10.0)
        delays.append(backoff.delay)
    assert delays == [0.05, 0.1, 0.2, 0.3, 0.3]
    assert backoff.waiting(10.2)
    assert not backoff.waiting(10.3)
    assert backoff.error is error
    backoff.succeeded()
    assert backoff.error is None
    assert not backoff.waiting(10.0)


def test_the_low_remaining_alarm_fires_once_past_the_share_and_never_when_cycling() -> None:
    """LowRemainingAlarm reports (share used, values left) the first time only; cycles never."""
    row = SequenceConfig("b", end=100)
    alarm = LowRemainingAlarm(0.9)
    assert alarm.check(Block("b", 1, 50, 1, row)) is None
    used, left = alarm.check(Block("b", 51, 95, 1, row)) or (0.0, 0)
    assert used == pytest.approx(94 / 99)
    assert left == 5
    assert alarm.check(Block("b", 96, 100, 1, row)) is None
    ring = LowRemainingAlarm(0.5)
    assert ring.check(Block("b", 90, 100, 1, SequenceConfig("b", end=100, cycle=True))) is None
