"""RateLimiter: Reverb's admission formulas (table-driven and against a reference model), its argument
checks, blocking/non-blocking/asyncio calls, timeouts and deadlocks that change nothing, and the ratio
kept over 10k inserts by two threads."""

from __future__ import annotations

import asyncio
import copy
import pickle
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer.errors import InvalidArgumentError, RateLimitDeadlock, RateLimitTimeout
from objectrl_buffer.flow import MinSize, Queue, RateLimiter, SampleToInsertRatio

BIG = sys.float_info.max


def reverb_can_insert(
    spi: float, min_size: int, min_diff: float, max_diff: float, i: int, s: int, d: int, n: int
) -> bool:
    """Reverb's CanInsert, written out from its documented semantics."""
    return i + n - d <= min_size or (i + n) * spi - s <= max_diff


def reverb_can_sample(
    spi: float, min_size: int, min_diff: float, max_diff: float, i: int, s: int, d: int, n: int
) -> bool:
    """Reverb's CanSample."""
    return i - d >= min_size and i * spi - s - n >= min_diff


def at(limiter: RateLimiter, inserts: int, samples: int, deletes: int = 0) -> RateLimiter:
    limiter.inserts, limiter.samples, limiter.deletes = inserts, samples, deletes
    return limiter


# (spi, min_size, min_diff, max_diff, inserts, samples, deletes, n, insert allowed, sample allowed)
TABLE = [
    # filling up: inserts free up to min_size, samples blocked below it
    (4.0, 100, 380.0, 420.0, 0, 0, 0, 1, True, False),
    (4.0, 100, 380.0, 420.0, 99, 0, 0, 1, True, False),
    (4.0, 100, 380.0, 420.0, 100, 0, 0, 1, True, True),  # diff 400 + 4 <= 420; 400 - 1 >= 380
    (4.0, 100, 380.0, 420.0, 105, 0, 0, 1, False, True),  # 106 * 4 = 424 > 420
    (4.0, 100, 380.0, 420.0, 105, 4, 0, 1, True, True),  # 424 - 4 = 420 <= 420
    (4.0, 100, 380.0, 420.0, 100, 20, 0, 1, True, False),  # 400 - 20 - 1 = 379 < 380
    (4.0, 100, 380.0, 420.0, 100, 19, 0, 1, True, True),  # 381 - 1 = 380 >= 380
    (4.0, 100, 380.0, 420.0, 100, 0, 0, 21, False, False),  # 121 * 4 > 420; 400 - 21 < 380: batches whole
    (4.0, 100, 380.0, 420.0, 100, 0, 0, 20, False, True),
    (4.0, 100, 380.0, 420.0, 100, 80, 0, 25, True, False),  # 500 - 80 <= 420; 400 - 80 - 25 < 380
    (4.0, 100, 380.0, 420.0, 95, 0, 0, 5, True, False),  # 95 + 5 <= 100: free
    (4.0, 100, 380.0, 420.0, 95, 0, 0, 6, True, False),  # 101 * 4 = 404 <= 420
    (4.0, 100, 380.0, 420.0, 95, 0, 0, 12, False, False),  # 107 * 4 = 428 > 420
    # deletes lower the size but not the diff
    (4.0, 100, 380.0, 420.0, 110, 60, 20, 1, True, False),  # size 90 < 100
    (4.0, 100, 380.0, 420.0, 200, 400, 100, 1, True, True),  # size 100: 800 - 400 - 1 >= 380
    # Queue(3): spi 1, min_size 1, [0, 3]
    (1.0, 1, 0.0, 3.0, 0, 0, 0, 1, True, False),
    (1.0, 1, 0.0, 3.0, 3, 0, 0, 1, False, True),
    (1.0, 1, 0.0, 3.0, 3, 3, 0, 1, True, False),
    (1.0, 1, 0.0, 3.0, 3, 2, 0, 1, True, True),
    # MinSize(10)
    (1.0, 10, -BIG, BIG, 9, 0, 0, 1, True, False),
    (1.0, 10, -BIG, BIG, 10, 10**9, 0, 1, True, True),
    # fractional ratio
    (0.25, 8, -2.0, 6.0, 32, 4, 0, 1, True, True),  # 33 * 0.25 - 4 = 4.25 <= 6; 8 - 4 - 1 = 3 >= -2
    (0.25, 8, -2.0, 6.0, 40, 4, 0, 1, False, True),  # 41 * 0.25 - 4 = 6.25 > 6
]


@pytest.mark.parametrize(("spi", "size", "lo", "hi", "i", "s", "d", "n", "ins", "smp"), TABLE)
def test_admission_table(
    spi: float, size: int, lo: float, hi: float, i: int, s: int, d: int, n: int, ins: bool, smp: bool
) -> None:
    limiter = at(RateLimiter(spi, size, lo, hi), i, s, d)
    assert limiter.can_insert(n) is ins
    assert limiter.can_sample(n) is smp
    assert reverb_can_insert(spi, size, lo, hi, i, s, d, n) is ins
    assert reverb_can_sample(spi, size, lo, hi, i, s, d, n) is smp


@settings(max_examples=300, deadline=None)
@given(
    spi=st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0, 8.0]),
    size=st.integers(1, 50),
    lo=st.integers(-50, 50),
    width=st.integers(0, 100),
    i=st.integers(0, 300),
    s=st.integers(0, 1200),
    d=st.integers(0, 300),
    n=st.integers(1, 40),
)
def test_admission_matches_reverb(spi: float, size: int, lo: int, width: int, i: int, s: int, d: int, n: int) -> None:
    d = min(d, i)
    limiter = at(RateLimiter(spi, size, lo, lo + width), i, s, d)
    args = (spi, size, float(lo), float(lo + width), i, s, d, n)
    assert limiter.can_insert(n) is reverb_can_insert(*args)
    assert limiter.can_sample(n) is reverb_can_sample(*args)
    before = (limiter.inserts, limiter.samples, limiter.deletes)
    assert limiter.try_insert(n) is reverb_can_insert(*args)
    assert limiter.inserts == before[0] + (n if reverb_can_insert(*args) else 0)
    limiter.inserts = before[0]
    assert limiter.try_sample(n) is reverb_can_sample(*args)
    assert limiter.samples == before[1] + (n if reverb_can_sample(*args) else 0)


def test_factories_follow_reverb() -> None:
    ratio = SampleToInsertRatio(4, 100, 20)
    assert (ratio.samples_per_insert, ratio.min_size_to_sample, ratio.min_diff, ratio.max_diff) == (
        4.0,
        100,
        380.0,
        420.0,
    )
    pair = SampleToInsertRatio(2, 10, (-5.0, 30.0))  # a pair is used without the offset
    assert (pair.min_diff, pair.max_diff) == (-5.0, 30.0)
    minsize = MinSize(7)
    assert (minsize.samples_per_insert, minsize.min_size_to_sample, minsize.min_diff, minsize.max_diff) == (
        1.0,
        7,
        -BIG,
        BIG,
    )
    queue = Queue(5)
    assert (queue.samples_per_insert, queue.min_size_to_sample, queue.min_diff, queue.max_diff) == (1.0, 1, 0.0, 5.0)
    assert isinstance(ratio, RateLimiter) and isinstance(queue, RateLimiter)
    unbounded = RateLimiter(1.0, 1, -float("inf"), float("inf"))  # clamped: checkpoints hold finite JSON
    assert (unbounded.min_diff, unbounded.max_diff) == (-BIG, BIG)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: SampleToInsertRatio(4, 100, 3.9), "error_buffer .* too small"),  # width 7.8 < 8
        (lambda: SampleToInsertRatio(0.5, 100, 0.9), "too small"),  # width 1.8 < 2 * max(1, 0.5)
        (lambda: SampleToInsertRatio(1, 10, (11.0, 20.0)), "min_diff 11 is above"),
        (lambda: SampleToInsertRatio(1, 0, 5), "min_size_to_sample"),
        (lambda: SampleToInsertRatio(1, 10, "5"), "error_buffer"),
        (lambda: SampleToInsertRatio(1, 10, (1.0,)), "error_buffer"),
        (lambda: SampleToInsertRatio(0, 10, 5), "samples_per_insert"),
        (lambda: RateLimiter(float("nan"), 1, 0, 1), "samples_per_insert"),
        (lambda: RateLimiter(1.0, 1, 2.0, 1.0), "min_diff"),
        (lambda: RateLimiter(1.0, 1, float("nan"), 1.0), "min_diff"),
        (lambda: RateLimiter(1.0, 1, 0.0, 1.0, deadlock_after_s=-1), "timeout"),
        (lambda: MinSize(0), "min_size_to_sample"),
        (lambda: Queue(0), "size"),
    ],
)
def test_bad_arguments_are_refused(make: object, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        make()  # type: ignore[operator]


def test_ratio_below_the_fill_up_warns_as_reverb_does() -> None:
    with pytest.warns(RuntimeWarning, match="max_diff 5 is below"):
        SampleToInsertRatio(1, 10, (0.0, 5.0))


def test_bad_counts_are_refused() -> None:
    limiter = RateLimiter(1.0, 1, 0.0, 4.0)
    for call in (limiter.try_insert, limiter.try_sample, limiter.insert, limiter.sample):
        with pytest.raises(InvalidArgumentError, match="n must be"):
            call(0)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        limiter.insert(1, timeout=-1.0)
    assert (limiter.inserts, limiter.samples, limiter.deletes) == (0, 0, 0)


def test_timeouts_change_nothing() -> None:
    limiter = at(SampleToInsertRatio(4, 100, 20, deadlock_after_s=None), 105, 20)  # diff 400
    with pytest.raises(RateLimitTimeout, match=r"insert of n=6 not admitted within timeout=0\.05s") as info:
        limiter.insert(6, timeout=0.05)  # 111 * 4 - 20 > 420
    assert isinstance(info.value, TimeoutError)
    with pytest.raises(RateLimitTimeout):
        limiter.sample(30, timeout=0)  # 400 - 30 < 380
    assert (limiter.inserts, limiter.samples, limiter.deletes) == (105, 20, 0)
    limiter.sample(4, timeout=0)  # admitted at once: no wait needed
    limiter.insert(1, timeout=0)
    assert (limiter.inserts, limiter.samples) == (106, 24)


def test_a_blocked_call_proceeds_when_another_thread_moves_the_counters() -> None:
    limiter = Queue(2)
    done: list[str] = []

    def learner() -> None:
        limiter.sample(1)  # waits for the first insert
        done.append("sampled")

    thread = threading.Thread(target=learner)
    limiter.register()  # the main thread is a party: the learner is not alone
    thread.start()
    time.sleep(0.1)
    assert done == []
    limiter.insert(1)
    thread.join(5)
    assert done == ["sampled"] and (limiter.inserts, limiter.samples) == (1, 1)


def test_a_lone_thread_that_would_wait_forever_is_told() -> None:
    limiter = SampleToInsertRatio(1, 10, 2, deadlock_after_s=0)
    with pytest.raises(RateLimitDeadlock, match="sample of n=1 would wait forever: no other live writer"):
        limiter.sample(1)  # nothing inserted and nobody else to insert
    limiter.insert(11)  # 11 > min_size: diff 11 <= 12
    with pytest.raises(RateLimitDeadlock, match="insert of n=2 would wait forever: no other live sampler"):
        limiter.insert(2)
    assert (limiter.inserts, limiter.samples) == (11, 0)


def test_a_party_that_died_no_longer_counts() -> None:
    limiter = Queue(1, deadlock_after_s=0)
    helper = threading.Thread(target=limiter.register)
    helper.start()
    helper.join()
    with pytest.raises(RateLimitDeadlock):
        limiter.sample(1, timeout=5)


def test_a_live_party_that_is_not_waiting_keeps_a_call_waiting() -> None:
    limiter = Queue(1, deadlock_after_s=0)
    release = threading.Event()

    def idle() -> None:
        limiter.register()
        release.wait(10)

    thread = threading.Thread(target=idle)
    thread.start()
    try:
        time.sleep(0.05)
        with pytest.raises(RateLimitTimeout):  # the idle party might still insert: not a deadlock
            limiter.sample(1, timeout=0.2)
    finally:
        release.set()
        thread.join()


def test_a_batch_larger_than_the_window_is_refused_at_once() -> None:
    limiter = Queue(4)  # timeout=None and deadlock detection alike would otherwise wait
    with pytest.raises(RateLimitDeadlock, match="can never be admitted"):
        limiter.insert(5)
    limiter.insert(4)
    with pytest.raises(RateLimitDeadlock, match="can never be admitted"):
        limiter.sample(5)
    assert (limiter.inserts, limiter.samples) == (4, 0)


def test_the_context_managers_count_only_what_succeeded() -> None:
    limiter = Queue(4)
    with pytest.raises(KeyError), limiter.inserting(2):
        raise KeyError("the write failed")
    assert limiter.inserts == 0
    with limiter.inserting(2):
        pass
    assert limiter.inserts == 2


def test_asyncio_variants_wait_without_blocking_the_loop() -> None:
    limiter = Queue(2)

    async def main() -> list[str]:
        events: list[str] = []

        async def learner() -> None:
            await limiter.sample_async(1)
            events.append("sampled")

        async def actor() -> None:
            await asyncio.sleep(0.05)
            events.append("inserting")
            await limiter.insert_async(1)

        await asyncio.gather(learner(), actor())
        with pytest.raises(RateLimitTimeout):
            await limiter.sample_async(1, timeout=0.05)
        return events

    assert asyncio.run(main()) == ["inserting", "sampled"]
    assert (limiter.inserts, limiter.samples) == (1, 1)


def test_asyncio_waiter_woken_by_another_thread() -> None:
    limiter = Queue(2)
    timer = threading.Timer(0.05, limiter.insert)
    timer.start()
    asyncio.run(limiter.sample_async(1, timeout=5))
    timer.join()
    assert (limiter.inserts, limiter.samples) == (1, 1)


def test_ratio_holds_over_10k_inserts() -> None:
    """SampleToInsertRatio(4, ...): an actor thread inserts 10k rows, a learner samples batches of 32;
    after every admitted call the diff stays inside the error buffer, and the final ratio matches."""
    limiter = SampleToInsertRatio(4, 100, 64)
    inserts, batch = 10_000, 32
    after_insert: list[float] = []
    after_sample: list[float] = []
    stop = threading.Event()

    def actor() -> None:
        for _ in range(inserts):
            with limiter.inserting(1):
                after_insert.append(limiter.diff + 4)  # the diff this insert leaves
        stop.set()

    def learner() -> None:
        while True:
            try:
                with limiter.sampling(batch, timeout=0.05):
                    after_sample.append(limiter.diff - batch)
            except RateLimitTimeout:
                if stop.is_set():
                    return

    threads = [threading.Thread(target=actor), threading.Thread(target=learner)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert limiter.inserts == inserts
    assert max(after_insert) <= limiter.max_diff  # Reverb's guarantees, after every admitted call
    assert len(after_sample) > 1000 and min(after_sample) >= limiter.min_diff
    final = limiter.diff
    assert limiter.min_diff <= final <= limiter.max_diff
    measured = limiter.samples / (limiter.inserts - limiter.min_size_to_sample)
    assert abs(measured - 4) * (limiter.inserts - limiter.min_size_to_sample) <= 64


def test_copies_keep_counters_and_drop_waiters() -> None:
    limiter = at(SampleToInsertRatio(2, 10, 5), 30, 40, 3)
    for clone in (copy.deepcopy(limiter), pickle.loads(pickle.dumps(limiter))):
        assert type(clone) is SampleToInsertRatio
        assert (clone.inserts, clone.samples, clone.deletes, clone.min_diff) == (30, 40, 3, 15.0)
        assert clone.try_insert(1)
    assert limiter.inserts == 30


def test_record_inserts_counts_at_once_past_the_ratio_and_wakes_a_waiting_sample() -> None:
    """``record_inserts`` counts rows another admission let in (a lost coordinator's, see
    distributed/tickets.py): no wait even where ``insert`` would block, a sampler waiting on MinSize is woken,
    and a bad ``n`` is refused with nothing counted."""
    limiter = SampleToInsertRatio(1.0, 2, 1.0)  # inserts - samples may not pass 2 + 1
    limiter.insert(3)
    assert not limiter.can_insert(1)
    limiter.record_inserts(5)  # past max_diff: counted anyway
    assert limiter.state()[1]["inserts"] == 8
    waiting = MinSize(4)
    woken = threading.Event()
    thread = threading.Thread(target=lambda: (waiting.sample(1, timeout=30), woken.set()), daemon=True)
    thread.start()
    time.sleep(0.1)
    assert not woken.is_set()
    waiting.record_inserts(4)
    thread.join(timeout=30)
    assert woken.is_set()
    for bad in (-1, 1.5):
        with pytest.raises(InvalidArgumentError, match="n"):
            waiting.record_inserts(bad)  # type: ignore[arg-type]
    assert waiting.state()[1]["inserts"] == 4
