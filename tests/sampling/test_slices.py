"""sample_slices against a plain Python model of the stored episodes, the write head included."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.core.ring import Ring
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError, SchemaError
from objectrl_buffer.sampling.slices import StoredRows, slice_positions

logging.getLogger("torchrl").setLevel(logging.WARNING)


def rows_with_ends(n: int, seed: int, p_end: float) -> dict[str, torch.Tensor]:
    """``n`` rows; ``step`` identifies a row; ends split between ``terminated`` and ``truncated``."""
    gen = torch.Generator().manual_seed(seed)
    end = torch.rand(n, generator=gen) < p_end
    kind = torch.rand(n, generator=gen) < 0.5
    return {
        "step": torch.arange(n),
        "obs": torch.arange(n).float().unsqueeze(1).repeat(1, 3),
        "terminated": (end & kind).float(),
        "truncated": (end & ~kind).float(),
    }


def segments(rows: dict[str, torch.Tensor], capacity: int) -> list[list[int]]:
    """The stored rows (steps), oldest first, cut after every episode end: the reference."""
    total = len(rows["step"])
    ends = (rows["terminated"] + rows["truncated"]).tolist()
    out: list[list[int]] = [[]]
    for step in range(max(0, total - capacity), total):
        out[-1].append(step)
        if ends[step]:
            out.append([])
    return [s for s in out if s]


def make(tmp_path: Any, capacity: int, rows: dict[str, torch.Tensor], seed: int = 0) -> ReplayBuffer:
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=seed, storage_dir=tmp_path)
    rb.add_batch(rows)
    return rb


@settings(max_examples=50, deadline=None)
@given(
    capacity=st.integers(1, 40),
    added=st.integers(1, 100),
    slice_len=st.integers(1, 8),
    p_end=st.sampled_from([0.0, 0.1, 0.3, 0.6]),
    seed=st.integers(0, 2**31 - 1),
)
def test_slices_stay_inside_one_episode_and_cover_every_valid_start(
    tmp_path_factory: Any, capacity: int, added: int, slice_len: int, p_end: float, seed: int
) -> None:
    rows = rows_with_ends(added, seed, p_end)
    rb = make(tmp_path_factory.mktemp("s"), capacity, rows, seed)
    valid = {seg[i] for seg in segments(rows, capacity) for i in range(len(seg) - slice_len + 1)}
    if slice_len > capacity:
        with pytest.raises(InvalidArgumentError, match="slice_len"):
            rb.sample_slices(2, slice_len)
    elif not valid:
        with pytest.raises(EmptyBufferError, match="longest"):
            rb.sample_slices(2, slice_len)
    else:
        out = rb.sample_slices(40 * len(valid), slice_len)
        assert out.batch_size == torch.Size([40 * len(valid), slice_len])
        steps = out["step"]
        assert torch.equal(steps, steps[:, :1] + torch.arange(slice_len))  # consecutive in time
        assert set(steps[:, 0].tolist()) == valid  # only valid starts, and all of them
        # Slots follow the ring: the next row of a slice is the next slot (mod capacity).
        assert torch.equal(out["index"][:, 1:], (out["index"][:, :-1] + 1) % capacity)
        assert torch.equal(rb.sample_by_index(out["index"].reshape(-1))["step"], steps.reshape(-1))
        assert "mask" not in out
    rb.close()


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 40),
    added=st.integers(1, 100),
    slice_len=st.integers(1, 8),
    p_end=st.sampled_from([0.1, 0.3, 0.6]),
    seed=st.integers(0, 2**31 - 1),
)
def test_padded_slices(
    tmp_path_factory: Any, capacity: int, added: int, slice_len: int, p_end: float, seed: int
) -> None:
    """With pad=True short segments come whole from their first row; padding is masked and zero."""
    rows = rows_with_ends(added, seed, p_end)
    rb = make(tmp_path_factory.mktemp("p"), capacity, rows, seed)
    if slice_len > capacity:
        return
    expected: dict[int, list[int]] = {}  # start step -> the real steps of its slice
    for seg in segments(rows, capacity):
        for i in range(max(1, len(seg) - slice_len + 1)):
            expected[seg[i]] = seg[i : i + slice_len]
    out = rb.sample_slices(40 * len(expected), slice_len, pad=True)
    mask = out["mask"]
    assert mask.dtype == torch.bool and bool(mask[:, 0].all())
    starts = set()
    for row in range(out.batch_size[0]):
        real = int(mask[row].sum())
        assert bool(mask[row, :real].all()) and not bool(mask[row, real:].any())  # a prefix
        steps = out["step"][row]
        start = int(steps[0])
        starts.add(start)
        assert steps[:real].tolist() == expected[start]
        assert not steps[real:].any() and not out["obs"][row, real:].any()  # padding is zero
        assert bool((out["index"][row, real:] == -1).all())
    assert starts == set(expected)


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("p_end", [0.05, 0.5])
def test_rejection_and_table_paths_draw_from_the_same_starts(pad: bool, p_end: float) -> None:
    """Starts drawn by rejection (tries > 0) and from the full table (tries=0): same support, same shares."""
    size, capacity, pointer, slice_len = 300, 400, 250, 5  # a wrapped-looking ring: positions != slots
    gen = torch.Generator().manual_seed(11)
    done = torch.zeros(capacity)
    done[torch.rand(capacity, generator=gen) < p_end] = 1.0
    rows = StoredRows({"done": done}, ("done",), Ring(capacity, size, pointer))
    draws = {}
    for tries in (0, 8):
        positions, mask = slice_positions(rows, 60_000, slice_len, pad, torch.Generator().manual_seed(tries))
        draws[tries] = torch.bincount(positions[:, 0], minlength=size)
        if not pad:
            assert bool(mask.all())
    support = draws[0] > 0
    assert torch.equal(support, draws[8] > 0)
    # Both uniform over the valid starts: every count within 6 standard deviations of its expectation.
    expected = 60_000 / int(support.sum())
    for counts in draws.values():
        assert bool(((counts[support] - expected).abs() < 6 * expected**0.5).all())


def test_slices_never_cross_the_write_head(tmp_path: Any) -> None:
    """Capacity 10 after 25 rows without episode ends: steps 15..24 stored, slot 4 (step 24) newest."""
    rb = make(tmp_path, 10, rows_with_ends(25, 0, 0.0))
    out = rb.sample_slices(500, 4)
    assert set(out["step"][:, 0].tolist()) == set(range(15, 22))
    assert set(out["index"][:, 0].tolist()) == {5, 6, 7, 8, 9, 0, 1}  # crosses the slot seam, not the head


def test_done_key_names_the_episode_end(tmp_path: Any) -> None:
    rows = rows_with_ends(12, 0, 0.0)
    rows["done"] = torch.zeros(12, dtype=torch.bool)
    rows["done"][[3, 7]] = True
    rows["terminated"][5] = 1.0  # ignored when done_key is given
    rb = make(tmp_path, 20, rows)
    out = rb.sample_slices(300, 4, done_key="done")
    assert set(out["step"][:, 0].tolist()) == {0, 4, 8}
    with pytest.raises(SchemaError, match="nope"):
        rb.sample_slices(2, 2, done_key="nope")


def test_no_valid_slice_names_the_longest_segment(tmp_path: Any) -> None:
    rows = rows_with_ends(9, 0, 0.0)
    rows["terminated"][[2, 5, 8]] = 1.0  # three episodes of 3 rows
    rb = make(tmp_path, 20, rows)
    before = rb.generator.get_state()
    with pytest.raises(EmptyBufferError, match="longest stored episode segment has 3 rows"):
        rb.sample_slices(2, 4)
    assert torch.equal(rb.generator.get_state(), before)
    assert rb.sample_slices(2, 4, pad=True)["mask"].sum(1).tolist() == [3, 3]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0, 3), InvalidArgumentError, "num_slices"),
        ((2, 0), InvalidArgumentError, "slice_len"),
        ((2, -1), InvalidArgumentError, "slice_len"),
        ((2, 11), InvalidArgumentError, "larger than the buffer"),
        ((2.5, 3), InvalidArgumentError, "num_slices"),
    ],
)
def test_bad_arguments_raise_and_change_nothing(tmp_path: Any, args: tuple[Any, Any], error: type, match: str) -> None:
    rb = make(tmp_path, 10, rows_with_ends(25, 0, 0.1))
    before = (rb.generator.get_state(), len(rb), rb.pointer)
    with pytest.raises(error, match=match):
        rb.sample_slices(*args)
    assert torch.equal(rb.generator.get_state(), before[0]) and (len(rb), rb.pointer) == before[1:]


def test_empty_buffer_and_missing_end_keys(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 10, storage_dir=tmp_path)
    with pytest.raises(EmptyBufferError):
        rb.sample_slices(2, 3)
    rb.add_batch({"obs": torch.zeros(5, 2)})
    with pytest.raises(SchemaError, match="terminated"):
        rb.sample_slices(2, 3)


def test_slices_from_a_prioritized_buffer(tmp_path: Any) -> None:
    rb = PrioritizedReplayBuffer("cpu", "cpu", 10, seed=0, storage_dir=tmp_path)
    rb.add_batch(rows_with_ends(25, 0, 0.0))
    assert set(rb.sample_slices(100, 9)["step"][:, 0].tolist()) == {15, 16}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_slices_on_cuda_storage() -> None:
    rb = ReplayBuffer("cuda", "cuda", 10, seed=0)
    rb.add_batch({k: v.cuda() for k, v in rows_with_ends(25, 0, 0.0).items()})
    out = rb.sample_slices(100, 4, pad=True)
    assert out["step"].device.type == "cuda"
    assert set(out["step"][:, 0].tolist()) == set(range(15, 22)) and bool(out["mask"].all())
