"""AsyncSequenceBuffer hardening (issue 27): ids the slot table cannot hold, a second event loop, consumers
that could never be served, tensors without data, bad paths. Every refused call raises a class of
:mod:`objectrl_buffer.errors` naming the argument and leaves the buffer as it was.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from objectrl_buffer.async_buffer import AsyncSequenceBuffer, BufferFull, Consumer
from objectrl_buffer.errors import ConcurrentUseError, InvalidArgumentError, SchemaError
from tests.async_buffer.helpers import assert_unchanged, bounded, make, reward, run, seq, snapshot

INT64_MAX = 2**63 - 1


def sample(sample_id: Any, length: int = 2) -> dict[str, Any]:
    """A sample whose tokens do not depend on the id (``seq`` would overflow for ids near 2**63)."""
    return {"ids": sample_id, "tokens": torch.ones(length, dtype=torch.int64)}


def assert_round_trips(buf: AsyncSequenceBuffer, folder: str | Path) -> None:
    """``save`` then ``load`` into a fresh buffer of the same configuration gives the same state."""
    path = Path(folder) / "async.buf"
    buf.save(path)
    other = AsyncSequenceBuffer(buf.consumers, buf.max_size)
    other.load(path)
    assert_unchanged(other, snapshot(buf))


# ---------------------------------------------------------------- ids the slot table cannot hold
BAD_IDS = [2**63, np.uint64(2**64 - 1), -(2**63) - 1, -1, np.int64(-1), torch.tensor(-1)]


@pytest.mark.parametrize("bad", BAD_IDS, ids=["2**63", "uint64_max", "below_int64", "-1", "np_-1", "tensor_-1"])
def test_an_id_outside_int64_or_minus_one_is_refused_before_a_slot_is_taken(bad: Any, tmp_path: Path) -> None:
    buf = make(3)
    buf.put_batch_nowait([seq(0)])
    before = snapshot(buf)
    with pytest.raises(InvalidArgumentError, match="ids") as info:
        buf.put_batch_nowait([seq(1), sample(bad)])
    assert "-1" in str(info.value)  # the message says what the valid range is
    assert_unchanged(buf, before)
    with pytest.raises(InvalidArgumentError, match="ids"):
        run(buf.put_batch([sample(bad)]))  # the awaited put: the same check
    assert_unchanged(buf, before)
    assert buf.put_batch_nowait([seq(1), seq(2)]).tolist() == [1, 2]  # the buffer fills up exactly
    buf.check_invariants()
    assert_round_trips(buf, tmp_path)


def test_a_tensordict_put_with_id_minus_one_is_refused(tmp_path: Path) -> None:
    buf = make(4)
    buf.put_batch_nowait([seq(0)])
    before = snapshot(buf)
    bad = TensorDict({"ids": torch.tensor([5, -1]), "tokens": torch.ones(2, 3, dtype=torch.int64)}, batch_size=[2])
    with pytest.raises(InvalidArgumentError, match=r"ids \[-1\]"):
        buf.put_batch_nowait(bad)
    assert_unchanged(buf, before)
    assert_round_trips(buf, tmp_path)


def test_the_int64_extremes_other_than_minus_one_are_ids(tmp_path: Path) -> None:
    buf = make(4, consumers=[Consumer("c", ("tokens",), 3)])
    buf.put_batch_nowait([sample(INT64_MAX), sample(-(2**63)), sample(-2)])
    assert_round_trips(buf, tmp_path)
    _, batch = run(buf.get_batch("c"))
    assert batch["ids"].tolist() == [INT64_MAX, -(2**63), -2]
    assert buf.consumed_ids() == [INT64_MAX, -(2**63), -2]


_ID_VALUES = st.one_of(
    st.integers(0, 12), st.sampled_from([-1, 2**63, 2**64 - 1, -(2**63) - 1, INT64_MAX, -(2**63), -2])
)


@settings(max_examples=60, deadline=None)
@given(
    stored=st.lists(st.integers(0, 12), unique=True, max_size=4),
    batch=st.lists(_ID_VALUES, max_size=5),
    as_numpy=st.booleans(),
)
def test_a_refused_put_changes_nothing(stored: list[int], batch: list[int], as_numpy: bool) -> None:
    max_size = 6
    buf = make(max_size)
    buf.put_batch_nowait([sample(i) for i in stored])
    before = snapshot(buf)
    fits = all(-(2**63) <= i <= INT64_MAX and i != -1 for i in batch)
    valid = fits and len(set(batch)) == len(batch) and not set(batch) & set(stored)
    valid = valid and len(batch) <= max_size - len(stored)
    samples = [sample(np.uint64(i) if as_numpy and 0 <= i < 2**64 else i) for i in batch]
    try:
        slots = buf.put_batch_nowait(samples)
    except (InvalidArgumentError, BufferFull):
        assert not valid
        assert_unchanged(buf, before)
    else:
        assert valid and len(slots) == len(batch)
    buf.check_invariants()
    free = max_size - buf.size
    assert len(buf.put_batch_nowait([sample(100 + k) for k in range(free)])) == free  # every free slot is free
    buf.check_invariants()
    with tempfile.TemporaryDirectory() as folder:
        assert_round_trips(buf, folder)


def test_default_birth_times_past_int64_are_refused() -> None:
    buf = make(4)
    buf.put_batch_nowait([seq(0)], birth_times=[INT64_MAX])
    before = snapshot(buf)
    with pytest.raises(InvalidArgumentError, match="birth_times"):
        buf.put_batch_nowait([seq(1)])  # the default birth would be INT64_MAX + 1
    assert_unchanged(buf, before)
    assert buf.put_batch_nowait([seq(1)], birth_times=[5]).tolist() == [1]


# ---------------------------------------------------------------- one event loop at a time
def _loop_in_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="trainer-loop", daemon=True)
    thread.start()
    return loop, thread


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_three_threads_with_their_own_loops_only_the_first_is_served() -> None:
    buf = make(64, consumers=[Consumer("c", ("tokens",), 2)])
    start, end = threading.Barrier(3, timeout=10), threading.Barrier(3, timeout=10)
    outcome: dict[int, BaseException | None] = {}

    def worker(k: int) -> None:
        async def go() -> None:
            await asyncio.to_thread(start.wait)
            try:
                for r in range(5):
                    await buf.put_batch([seq(100 * k + 2 * r), seq(100 * k + 2 * r + 1)])
                    await bounded(buf.get_batch("c"), 2)
                outcome[k] = None
            except BaseException as exc:  # reported below
                outcome[k] = exc
            finally:
                await asyncio.to_thread(end.wait)  # every loop still runs while the others try

        asyncio.run(go())

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    served = [k for k, exc in outcome.items() if exc is None]
    refused = [exc for exc in outcome.values() if exc is not None]
    assert len(served) == 1 and len(refused) == 2, outcome
    for exc in refused:
        assert isinstance(exc, ConcurrentUseError) and "another event loop" in str(exc), outcome
    buf.check_invariants()
    k = served[0]
    assert buf.size == 0 and sorted(buf.consumed_ids()) == list(range(100 * k, 100 * k + 10))
    assert run(buf.put_batch([seq(1000)])).tolist() == [0]  # every loop is closed: a new one is served


def test_a_call_from_a_second_running_loop_is_refused_and_changes_nothing() -> None:
    buf = make(8)
    loop, thread = _loop_in_thread()
    try:
        waiter = asyncio.run_coroutine_threadsafe(buf.get_batch("ref_logp"), loop)  # binds buf to `loop`
        buf.put_batch_threadsafe([seq(0)], loop=loop, timeout=5)
        before = snapshot(buf)
        calls = [
            lambda: buf.put_batch([seq(1)]),
            lambda: buf.amend_batch([0], [reward(0)]),
            lambda: buf.get_batch("actor_train"),
        ]
        for call in calls:
            with pytest.raises(ConcurrentUseError, match=r"another event loop.*trainer-loop.*put_batch_threadsafe"):
                run(call())
            assert_unchanged(buf, before)
        with pytest.raises(ConcurrentUseError, match="put_batch_threadsafe"):
            buf.put_batch_nowait([seq(1)])  # synchronous, from a thread other than the running loop's
        with pytest.raises(ConcurrentUseError, match="amend_batch_nowait"):
            buf.amend_batch_nowait([0], [reward(0)])
        with pytest.raises(ConcurrentUseError, match="load_state_dict"):
            buf.load_state_dict(make(8).state_dict())  # would empty the buffer under the running loop
        assert_unchanged(buf, before)
        buf.put_batch_threadsafe([seq(1)], timeout=5)  # the supported way in: runs on the buffer's loop
        assert waiter.result(5)[1]["ids"].tolist() == [0, 1]
        buf.check_invariants()
    finally:
        _stop(loop, thread)


def test_a_stopped_loop_is_given_up_unless_a_call_still_waits_on_it() -> None:
    buf = make(8, consumers=[Consumer("c", ("tokens",), 1)])
    first = asyncio.new_event_loop()
    try:
        first.run_until_complete(buf.put_batch([seq(0)]))  # `first` stays open, stopped, nothing pending on it
        assert run(buf.get_batch("c"))[1]["ids"].tolist() == [0]  # so another loop takes over
        pending = first.create_task(buf.get_batch("c"))
        first.run_until_complete(asyncio.sleep(0.01))  # the get now waits on `first`, stopped again
        before = snapshot(buf)
        with pytest.raises(ConcurrentUseError, match="1 call"):
            run(buf.put_batch([seq(1)]))
        assert_unchanged(buf, before)
        buf.put_batch_nowait([seq(1)])  # synchronous code while no loop runs: allowed, wakes the waiter
        _, batch = first.run_until_complete(asyncio.wait_for(pending, 5))
        assert batch["ids"].tolist() == [1]
        buf.check_invariants()
        assert run(buf.put_batch([seq(2)])).tolist() == [0]  # nothing waits on `first` any more
    finally:
        first.close()


# ---------------------------------------------------------------- construction
def test_a_consumer_wanting_more_entries_than_max_size_is_refused() -> None:
    consumers = [Consumer("small", ("tokens",), 4), Consumer("big", ("tokens",), 5)]
    with pytest.raises(InvalidArgumentError, match=r"'big'.*n_seqs 5.*max_size 4"):
        AsyncSequenceBuffer(consumers, 4)
    buf = AsyncSequenceBuffer([Consumer("c", ("tokens",), 4)], 4)  # exactly max_size is served
    buf.put_batch_nowait([seq(i) for i in range(4)])
    assert run(buf.get_batch("c"))[0].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("argument", ["device", "storing_device"])
def test_the_meta_device_is_refused_at_construction(argument: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"{argument} 'meta'"):
        AsyncSequenceBuffer([Consumer("c", ("tokens",), 1)], 4, **{argument: "meta"})


# ---------------------------------------------------------------- tensors without data
_NO_DATA = {
    "meta": lambda: torch.ones(3, device="meta"),
    "sparse_coo": lambda: torch.ones(3).to_sparse(),
    "sparse_csr": lambda: torch.ones(3, 2).to_sparse_csr(),
}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("kind", sorted(_NO_DATA))
def test_a_tensor_without_strided_data_is_refused_at_put_and_amend(kind: str) -> None:
    buf = make(4)
    buf.put_batch_nowait([seq(0)])
    before = snapshot(buf)
    value = _NO_DATA[kind]()
    with pytest.raises(SchemaError, match=r"samples\[0\]: key 'x'"):
        buf.put_batch_nowait([{"ids": 1, "x": value}])
    with pytest.raises(SchemaError, match=r"samples\[0\]: key 'x'"):
        buf.amend_batch_nowait([0], [{"ids": 0, "x": value}])
    assert_unchanged(buf, before)


def test_meta_ids_and_meta_tensordicts_are_refused() -> None:
    buf = make(4)
    buf.put_batch_nowait([seq(0)])
    before = snapshot(buf)
    with pytest.raises(InvalidArgumentError, match=r"samples\[0\]: 'ids'"):
        buf.put_batch_nowait([{"ids": torch.tensor(1, device="meta"), "tokens": torch.ones(2, dtype=torch.int64)}])
    meta = TensorDict({"ids": torch.arange(2), "x": torch.ones(2, 3)}, batch_size=[2]).to("meta")
    with pytest.raises((InvalidArgumentError, SchemaError), match="meta"):
        buf.put_batch_nowait(meta)
    assert_unchanged(buf, before)


# ---------------------------------------------------------------- paths
@pytest.mark.parametrize("path", [None, 3, "", b"buf"])
def test_save_and_load_name_a_bad_path(path: Any) -> None:
    buf = make(4)
    buf.put_batch_nowait([seq(0)])
    before = snapshot(buf)
    with pytest.raises(InvalidArgumentError, match="path"):
        buf.save(path)
    with pytest.raises(InvalidArgumentError, match="path"):
        buf.load(path)
    assert_unchanged(buf, before)
