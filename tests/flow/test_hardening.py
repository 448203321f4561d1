"""Issue 27, flow: a limiter handed to ``fork`` children shares its counters (as under ``spawn``), sharing and
forking never break a thread of the parent that holds or waits on the limiter, ``delete`` never counts more
rows than are held, and counts past the counters' bound are refused (never a raw ``OverflowError``).

Every forked child here has a deadline: on code that gets it wrong the test fails in a few seconds, never hangs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.flow import MinSize, Queue, RateLimiter, SampleToInsertRatio, limited
from objectrl_buffer.flow.limiter import MAX_COUNT
from tests.flow.forking import FORK, check_two_writers_of_ratio_1_20_10, counts, row, writer


def start(children: list[Any], target: Callable[..., None], *args: Any, **kwargs: Any) -> Any:
    p = FORK.Process(target=target, args=args, kwargs=kwargs, daemon=True)
    p.start()
    children.append(p)
    return p


# ---------------------------------------------------------------------- fork: the counters are shared


def test_fork_writers_share_the_limiter_of_the_buffer_handed_over(children: list[Any]) -> None:
    """2 forked writers of a SampleToInsertRatio(1, 20, 10) buffer, the sampler in the parent: with no sample,
    Reverb admits inserts while ``inserts <= min_size_to_sample`` or ``inserts * spi - samples <= max_diff``
    (= 20 * 1 + 10 = 30): 30 inserts in all, the parent's one included; the parent's samples then admit the
    rest, ``inserts * spi - samples`` staying within [min_diff, max_diff] = [10, 30]."""
    limiter = SampleToInsertRatio(1, 20, 10)
    rb = ReplayBuffer("cpu", "cpu", 1000, seed=0, rate_limiter=limiter)
    rb.add(row(-1))  # the schema, and the parent's one insert
    out = FORK.SimpleQueue()
    for w in range(2):
        start(children, writer, rb, 1000 * w, 20, out)
    check_two_writers_of_ratio_1_20_10(rb, limiter, children, out)


def insert_into(limiter: RateLimiter, n: int) -> None:
    limiter.insert(n, timeout=2)


def test_a_limiter_handed_to_fork_children_shares_its_counters(children: list[Any]) -> None:
    """A bare limiter as a fork ``Process``'s args or kwargs: the children move the parent's counters."""
    limiter = Queue(10)
    start(children, insert_into, limiter, 3)
    start(children, insert_into, limiter=limiter, n=4)
    for p in children:
        p.join(5)
        assert p.exitcode == 0
    assert counts(limiter) == (7, 0, 0)


def test_a_parent_thread_blocked_when_the_limiter_gets_shared_carries_on() -> None:
    """A sampler thread waiting in the limiter when it becomes shared (here: a ``Queue`` hands the buffer
    over) is admitted by inserts made afterwards, instead of failing on the swapped lock."""
    limiter = SampleToInsertRatio(1, 5, 3, deadlock_after_s=None)
    rb = ReplayBuffer("cpu", "cpu", 100, seed=0, rate_limiter=limiter)
    rb.add(row(0))
    got: list[Any] = []

    def sample() -> None:
        try:
            got.append(rb.sample_batch(2, timeout=5).batch_size[0])
        except Exception as exc:
            got.append(exc)

    thread = threading.Thread(target=sample)
    thread.start()
    time.sleep(0.15)  # the sampler is waiting (1 row < min_size_to_sample)
    queue = FORK.SimpleQueue()
    queue.put(rb)  # multiprocessing's pickler: rows and counters become shared
    queue.get()
    for i in range(1, 6):
        rb.add(row(i), timeout=1)
    thread.join(5)
    assert got == [2]
    assert counts(limiter) == (6, 2, 0)


def try_insert_once(limiter: RateLimiter, out: Any) -> None:
    out.put(limiter.try_insert(1))


def test_a_fork_while_a_parent_thread_holds_the_shared_limiter_does_not_hang_the_child(
    children: list[Any],
) -> None:
    """The child of a fork made while another thread of the parent is inside the shared limiter (a sampler's
    ``sample_batch``) waits for that hold to end, not forever."""
    limiter = Queue(10)
    limiter.share()
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with limiter.inserting(1):
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=hold)
    thread.start()
    assert inside.wait(5)
    out = FORK.SimpleQueue()
    p = start(children, try_insert_once, limiter, out)
    time.sleep(0.1)
    leave.set()
    thread.join(5)
    p.join(3)
    assert p.exitcode == 0, "the fork child hung on the lock held by a thread it did not inherit"
    assert out.get() is True
    assert counts(limiter) == (2, 0, 0)


# ---------------------------------------------------------------------- delete
def test_deleting_more_rows_than_held_is_refused(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 10, seed=0, rate_limiter=MinSize(1))
    rb.add(row(0))
    limiter = rb.rate_limiter
    with pytest.raises(InvalidArgumentError, match="n=5"):
        limiter.delete(5)
    assert counts(limiter) == (1, 0, 0)
    limiter.delete(1)  # exactly what is held is fine
    assert counts(limiter) == (1, 0, 1)
    with pytest.raises(InvalidArgumentError, match="n=1"):
        limiter.delete(1)
    rb.save(tmp_path / "ckpt", data=True)  # the counters stay loadable
    back = ReplayBuffer("cpu", "cpu", 10, seed=0, rate_limiter=MinSize(1))
    back.load(tmp_path / "ckpt")
    assert counts(back.rate_limiter) == (1, 0, 1)


def test_a_limited_batch_wider_than_the_ring_counts_its_evictions() -> None:
    """The gate counts a write's evictions once its inserts are counted: ``size`` ends at the rows held."""
    buffer = limited(ReplayBuffer("cpu", "cpu", 4, seed=0), MinSize(1))
    buffer.add_batch({"obs": torch.zeros(6, 3), "step": torch.arange(6)})
    assert counts(buffer.limiter) == (6, 0, 2) and buffer.limiter.size == len(buffer) == 4


# ---------------------------------------------------------------------- the counters' bound
@pytest.mark.parametrize("shared", [False, True])
def test_counts_past_the_counters_bound_are_refused(shared: bool) -> None:
    limiter = MinSize(1)
    if shared:
        limiter.share()
    assert limiter.try_insert(2**62)
    assert limiter.try_sample(2**62)
    before = counts(limiter)
    for call in (limiter.try_insert, limiter.insert, limiter.try_sample, limiter.sample):
        with pytest.raises(InvalidArgumentError, match=f"n={2**62}"):
            call(2**62)
        assert counts(limiter) == before
    with pytest.raises(InvalidArgumentError, match="n=1 inserts"):
        limiter.try_insert(1)  # the bound (the most a checkpoint's counters may hold) is reached
    assert counts(limiter) == before == (MAX_COUNT, MAX_COUNT, 0)
    arrays, values = limiter.state()  # counters at the bound stay loadable from a checkpoint
    back = MinSize(1)
    back.check(arrays, values, 0, "ckpt")
    back.restore(arrays, values)
    assert counts(back) == before


def try_insert_near_the_bound(limiter: RateLimiter, out: Any) -> None:
    try:
        out.put(limiter.try_insert(8))
    except InvalidArgumentError:
        out.put("refused")


def test_the_bound_holds_across_processes(children: list[Any]) -> None:
    """Two processes racing to the bound of shared counters: one is admitted, the other refused."""
    limiter = MinSize(1)
    limiter.share()
    assert limiter.try_insert(MAX_COUNT - 10)
    out = FORK.SimpleQueue()
    for _ in range(2):
        start(children, try_insert_near_the_bound, limiter, out)
    for p in children:
        p.join(5)
        assert p.exitcode == 0
    assert sorted(map(str, (out.get(), out.get()))) == ["True", "refused"]
    assert counts(limiter) == (MAX_COUNT - 2, 0, 0)
