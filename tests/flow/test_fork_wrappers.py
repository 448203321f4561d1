"""Issue 27, flow: a buffer wrapped by :func:`~objectrl_buffer.flow.limited` (the README's rate-limiting form)
handed to ``fork`` children is shared with them, rows and limiter counters, as ``multiprocessing``'s pickler
shares it under ``spawn``: the fork hook sees through the library's wrappers (``forks.HOLDS``). A wrapped
buffer that cannot be shared says why, in the parent's warning and in the child's refusal.

Every forked child here has a deadline: on code that gets it wrong the test fails in a few seconds, never hangs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed import become_shared, is_shared
from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.flow import LimitedBuffer, SampleToInsertRatio, limited
from objectrl_buffer.flow.limiter import unshared
from tests.flow.forking import FORK, check_two_writers_of_ratio_1_20_10, counts, row, writer

#: A buffer a fork child inherits without it being handed over (a global).
INHERITED: dict[str, Any] = {}


class Worker:
    """A user's worker object holding the wrapped buffer: handed over as ``target=worker.run``."""

    def __init__(self, rb: Any, first: int, n: int, out: Any) -> None:
        self.rb, self.first, self.n, self.out = rb, first, n, out

    def run(self) -> None:
        writer(self.rb, self.first, self.n, self.out)


def as_args(rb: Any, first: int, out: Any) -> Any:
    return FORK.Process(target=writer, args=(rb, first, 20, out), daemon=True)


def as_kwargs(rb: Any, first: int, out: Any) -> Any:
    return FORK.Process(target=writer, kwargs={"rb": rb, "first": first, "n": 20, "out": out}, daemon=True)


def as_worker(rb: Any, first: int, out: Any) -> Any:
    return FORK.Process(target=Worker(rb, first, 20, out).run, daemon=True)


@pytest.mark.parametrize("hand_over", [as_args, as_kwargs, as_worker], ids=["args", "kwargs", "bound-target"])
def test_fork_writers_share_the_rows_and_counters_of_a_limited_buffer(
    children: list[Any], hand_over: Callable[[Any, int, Any], Any]
) -> None:
    """2 forked writers of ``limited(ReplayBuffer, SampleToInsertRatio(1, 20, 10))``, the sampler in the
    parent: with no sample, Reverb admits ``inserts * spi - samples <= max_diff`` (= 20 * 1 + 10 = 30) inserts
    in all, the parent's one included, and the rows land in the parent's buffer; the parent's samples then
    admit the rest, ``inserts * spi - samples`` staying within [min_diff, max_diff] = [10, 30]."""
    limiter = SampleToInsertRatio(1, 20, 10)
    rb = limited(ReplayBuffer("cpu", "cpu", 1000, seed=0), limiter)
    rb.add(row(-1))  # the schema, and the parent's one insert
    out = FORK.SimpleQueue()
    for w in range(2):
        children.append(hand_over(rb, 1000 * w, out))
        children[-1].start()
    check_two_writers_of_ratio_1_20_10(rb, limiter, children, out)
    assert sorted(rb.buffer.sample_all()["step"].tolist()) == [-1, *range(20), *range(1000, 1020)]


def test_fork_writers_share_a_gated_buffer_handed_as_its_bound_add(children: list[Any]) -> None:
    """``ReplayBuffer(..., rate_limiter=)`` (a ``Gate`` on the instance) with ``target=rb.add``: the child's
    row and insert land in the parent's rows and counters."""
    limiter = SampleToInsertRatio(1, 20, 10)
    rb = ReplayBuffer("cpu", "cpu", 100, seed=0, rate_limiter=limiter)
    rb.add(row(-1))
    p = FORK.Process(target=rb.add, args=(row(7),), kwargs={"timeout": 2}, daemon=True)
    children.append(p)
    p.start()
    p.join(5)
    assert p.exitcode == 0
    assert counts(limiter) == (2, 0, 0) and sorted(rb.sample_all()["step"].tolist()) == [-1, 7]


def write_once(rb: LimitedBuffer, out: Any) -> None:
    try:
        rb.add(row(0), timeout=1)
        out.put("stored")
    except Exception as exc:  # the test reads the class name and message
        out.put(f"{type(exc).__name__}: {exc}")


def test_a_limited_buffer_that_cannot_be_shared_at_the_fork_says_why(children: list[Any]) -> None:
    """No row yet (no schema to lay shared columns out by): the parent's warning and the child's refusal name
    the reason, as for a buffer built with ``rate_limiter=``; the parent's buffer and counters are as they were."""
    limiter = SampleToInsertRatio(1, 20, 10)
    rb = limited(ReplayBuffer("cpu", "cpu", 10, seed=0), limiter)
    out = FORK.SimpleQueue()
    p = FORK.Process(target=write_once, args=(rb, out), daemon=True)
    children.append(p)
    with pytest.warns(RuntimeWarning, match="could not be shared.*add a row"):
        p.start()  # an at-fork hook cannot stop the fork: the parent is warned
    p.join(5)
    assert p.exitcode == 0
    message = out.get()
    assert message.startswith("ForkedBufferError") and "sharing it at the fork failed" in message
    assert "add a row" in message
    assert len(rb) == 0 and counts(limiter) == (0, 0, 0)  # the child's refused write counted nothing
    rb.add(row(1))  # the parent's buffer still works
    assert len(rb) == 1 and counts(limiter) == (1, 0, 0)


def write_inherited(out: Any) -> None:
    writer(INHERITED["rb"], 0, 3, out)


def test_become_shared_on_a_limited_buffer_shares_its_buffer_and_limiter(children: list[Any]) -> None:
    """``become_shared(limited(...))`` (the refusal's advice for a buffer a fork child merely inherits) shares
    the wrapped buffer and the limiter, leaving the wrapper a ``LimitedBuffer``: a child's writes land in the
    parent's rows and counters."""
    limiter = SampleToInsertRatio(1, 20, 10)
    rb = limited(ReplayBuffer("cpu", "cpu", 100, seed=0), limiter)
    rb.add(row(-1))
    assert not is_shared(rb)
    become_shared(rb)
    assert is_shared(rb) and is_shared(rb.buffer) and type(rb) is LimitedBuffer and limiter not in unshared()
    INHERITED["rb"] = rb
    out = FORK.SimpleQueue()
    p = FORK.Process(target=write_inherited, args=(out,), daemon=True)
    children.append(p)
    p.start()
    p.join(10)
    assert out.get() == (3, None) and p.exitcode == 0
    assert counts(limiter) == (4, 0, 0) and sorted(rb.sample_all()["step"].tolist()) == [-1, 0, 1, 2]


def test_become_shared_on_a_limited_buffer_without_a_row_changes_nothing() -> None:
    limiter = SampleToInsertRatio(1, 20, 10)
    rb = limited(ReplayBuffer("cpu", "cpu", 10, seed=0), limiter)
    with pytest.raises(InvalidArgumentError, match="add a row"):
        become_shared(rb)
    assert not is_shared(rb) and limiter in unshared() and type(rb) is LimitedBuffer
    rb.add(row(0))
    assert len(rb) == 1 and counts(limiter) == (1, 0, 0)
