"""ReplayBuffer: the ObjectRL contract (construction, writes, the ring, reads, memory, save/load)."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.errors import EmptyBufferError
from tests.support import (
    ACT_DIM,
    OBJECTRL_KEYS,
    OBS_DIM,
    assert_td_equal,
    fill,
    objectrl_batch,
    objectrl_transition,
    steps_of,
)

Factory = Callable[..., ReplayBuffer]


# ---------------------------------------------------------------- construction and attributes
def test_positional_construction_as_objectrl_does(tmp_path: pathlib.Path) -> None:
    rb = ReplayBuffer(torch.device("cpu"), torch.device("cpu"), 10)
    try:
        assert rb.device == torch.device("cpu")
        assert rb.storing_device == torch.device("cpu")
        assert rb.buffer_size == 10
        assert rb.data_size == 0
        assert rb.pointer == 0
        assert rb.epoch_iterator is None
        assert len(rb) == 0
        assert rb.size == 0
    finally:
        rb.close()


def test_keyword_construction_and_string_devices(tmp_path: pathlib.Path) -> None:
    rb = ReplayBuffer(device="cpu", storing_device="cpu", buffer_size=7, print_gc_warning=True, storage_dir=tmp_path)
    try:
        assert isinstance(rb.device, torch.device) and rb.device.type == "cpu"
        assert isinstance(rb.storing_device, torch.device) and rb.storing_device.type == "cpu"
        assert rb.buffer_size == 7
        assert rb.print_gc_warning is True
    finally:
        rb.close()


def test_numpy_int_buffer_size_is_accepted_as_int(make_buffer: Factory) -> None:
    rb = make_buffer(np.int64(5))
    assert rb.buffer_size == 5 and type(rb.buffer_size) is int


def test_memmaps_live_in_storage_dir(tmp_path: pathlib.Path) -> None:
    rb = ReplayBuffer("cpu", "cpu", 10, storage_dir=tmp_path)
    try:
        folder = rb.storage_folder
        assert folder is not None and pathlib.Path(folder).parent == tmp_path
        rb.add(objectrl_transition(0))
        assert len(os.listdir(folder)) >= len(OBJECTRL_KEYS)
    finally:
        rb.close()
    assert not os.path.exists(folder)


def test_memory_is_a_torchrl_buffer_whose_len_matches(make_buffer: Factory) -> None:
    rb = make_buffer(10)
    assert isinstance(rb.memory, TensorDictReplayBuffer)
    assert isinstance(rb.memory.storage, LazyMemmapStorage)  # CPU storing device
    for n_added, expected in ((3, 3), (10, 10), (4, 10)):
        fill(rb, range(n_added))
        assert len(rb) == expected
        assert len(rb.memory) == len(rb)
    rb.reset()
    assert len(rb.memory) == 0
    rb.reset(4)
    fill(rb, range(6))
    assert isinstance(rb.memory, TensorDictReplayBuffer)
    assert len(rb.memory) == len(rb) == 4


def test_repr_names_size_and_pointer(wrapped: ReplayBuffer) -> None:
    text = repr(wrapped)
    assert "10/10" in text and "pointer=5" in text


# ---------------------------------------------------------------- add / add_batch and the ring
def test_add_stores_an_objectrl_transition(rb: ReplayBuffer) -> None:
    td = objectrl_transition(3)
    rb.add(td)
    assert (len(rb), rb.size, rb.data_size, rb.pointer) == (1, 1, 1, 1)
    row = rb.sample_by_index([0])
    assert set(row.keys()) == {*OBJECTRL_KEYS, "index"}
    assert row["state"].shape == (1, OBS_DIM) and row["action"].shape == (1, ACT_DIM)
    assert row["reward"].dtype == torch.float32 and row["step"].dtype == torch.int64
    assert_td_equal(row.exclude("index"), td.unsqueeze(0))
    assert row["index"].tolist() == [0]


def test_add_copies_and_does_not_touch_its_input(rb: ReplayBuffer) -> None:
    td = objectrl_transition(1)
    original = td.clone()
    rb.add(td)
    assert set(td.keys()) == set(original.keys())  # no "index" added to the caller's TensorDict
    assert_td_equal(td, original)
    td["state"].add_(100.0)
    assert torch.equal(rb.sample_all()["state"][0], original["state"])


def test_pointer_and_data_size_through_the_wrap(rb: ReplayBuffer) -> None:
    for step in range(25):
        rb.add(objectrl_transition(step))
        assert rb.pointer == (step + 1) % 10
        assert rb.data_size == len(rb) == rb.size == min(step + 1, 10)
    assert rb.pointer == 5


def test_ring_slots_after_the_wrap(wrapped: ReplayBuffer) -> None:
    assert steps_of(wrapped.sample_by_index(range(10))) == [20, 21, 22, 23, 24, 15, 16, 17, 18, 19]
    newest = wrapped.sample_by_index([wrapped.pointer - 1])
    assert steps_of(newest) == [24]


def test_add_batch_larger_than_capacity_keeps_newest(make_buffer: Factory, wrapped: ReplayBuffer) -> None:
    rb = make_buffer(10)
    rb.add_batch(objectrl_batch(0, 25))
    assert (rb.pointer, rb.data_size, len(rb)) == (5, 10, 10)
    assert steps_of(rb.sample_all()) == list(range(15, 25))
    assert_td_equal(rb.sample_by_index(range(10)), wrapped.sample_by_index(range(10)))


@pytest.mark.parametrize("already", [0, 3, 9, 10, 13])
@pytest.mark.parametrize("n", [0, 1, 4, 7, 10, 11, 23])
def test_add_batch_equals_repeated_add(make_buffer: Factory, already: int, n: int) -> None:
    batched, single = make_buffer(10), make_buffer(10)
    fill(batched, range(already))
    fill(single, range(already))
    batched.add_batch(objectrl_batch(already, n))
    fill(single, range(already, already + n))
    assert (batched.pointer, batched.data_size) == (single.pointer, single.data_size)
    if single.data_size:
        assert_td_equal(batched.sample_by_index(range(len(single))), single.sample_by_index(range(len(single))))


def test_add_batch_of_zero_rows_changes_nothing(rb: ReplayBuffer) -> None:
    rb.add_batch(objectrl_batch(0, 0))
    assert (len(rb), rb.pointer, rb.schema) == (0, 0, None)
    fill(rb, range(3))
    rb.add_batch(objectrl_batch(3, 0))
    assert (len(rb), rb.pointer) == (3, 3)


def test_add_batch_ignores_the_index_key(rb: ReplayBuffer) -> None:
    fill(rb, range(4))
    rb.add_batch(rb.sample_by_index([3, 2]))  # a sample written back carries "index"
    assert "index" not in {f.key for f in rb.schema.fields}  # type: ignore[union-attr]
    assert steps_of(rb.sample_all()) == [0, 1, 2, 3, 3, 2]
    assert rb.sample_all()["index"].tolist() == list(range(6))


# ---------------------------------------------------------------- plain mappings as input
def test_add_accepts_a_mapping_of_tensors_arrays_and_numbers(rb: ReplayBuffer) -> None:
    rb.add({"obs": np.arange(3, dtype=np.float32), "action": torch.tensor([1, 0]), "reward": 0.5, "done": False})
    rb.add({"obs": np.arange(3, dtype=np.float64) + 1, "action": np.array([0, 1]), "reward": 2, "done": True})
    out = rb.sample_all()
    assert out["obs"].dtype == torch.float32 and out["obs"].tolist() == [[0, 1, 2], [1, 2, 3]]
    assert out["action"].tolist() == [[1, 0], [0, 1]]
    assert out["reward"].dtype == torch.float32 and out["reward"].tolist() == [0.5, 2.0]
    assert out["done"].dtype == torch.bool and out["done"].tolist() == [False, True]


def test_add_batch_accepts_a_mapping_of_arrays_and_tensors(rb: ReplayBuffer) -> None:
    rb.add_batch({"obs": np.zeros((3, 2), dtype=np.float32), "reward": torch.arange(3.0), "step": [0, 1, 2]})
    rb.add_batch({"obs": np.ones((2, 2)), "reward": np.array([3.0, 4.0]), "step": np.array([3, 4])})
    out = rb.sample_all()
    assert out.batch_size == (5,)
    assert out["obs"].sum().item() == 4.0
    assert out["reward"].tolist() == [0, 1, 2, 3, 4] and out["step"].tolist() == [0, 1, 2, 3, 4]


def test_nested_mappings_and_tensordicts_are_the_same_schema(rb: ReplayBuffer) -> None:
    rb.add({"obs": {"pixels": np.full((2, 2), 7, dtype=np.uint8), "vec": torch.ones(3)}, "reward": 1.0})
    rb.add(TensorDict({"obs": {"pixels": torch.zeros(2, 2, dtype=torch.uint8), "vec": torch.zeros(3)}, "reward": 2.0}))
    rb.add_batch({"obs": {"pixels": np.ones((2, 2, 2), dtype=np.uint8), "vec": np.zeros((2, 3))}, "reward": [3, 4]})
    out = rb.sample_all()
    assert out["obs", "pixels"].dtype == torch.uint8
    assert out["obs", "pixels"][:, 0, 0].tolist() == [7, 0, 1, 1]
    assert out["obs", "vec"].shape == (4, 3)
    assert out["reward"].tolist() == [1, 2, 3, 4]
    only = rb.sample_by_index_fields([0], ("obs", "pixels"))
    assert list(only.keys(include_nested=True, leaves_only=True)) == [("obs", "pixels")]


# ---------------------------------------------------------------- sampling
def test_sample_batch_shape_device_keys_and_rows(wrapped: ReplayBuffer) -> None:
    out = wrapped.sample_batch(32)
    assert out.batch_size == (32,)
    assert out.device == wrapped.device
    assert set(out.keys()) == {*OBJECTRL_KEYS, "index"}
    assert out["state"].shape == (32, OBS_DIM) and out["index"].dtype == torch.int64
    # each row is the stored row of its slot
    assert_td_equal(out, wrapped.sample_by_index(out["index"]))


def test_sample_random_is_sample_batch(make_buffer: Factory) -> None:
    a, b = make_buffer(10, seed=3), make_buffer(10, seed=3)
    fill(a, range(12))
    fill(b, range(12))
    assert_td_equal(a.sample_random(16), b.sample_batch(16))


def test_sample_batch_with_replacement_when_k_exceeds_len(rb: ReplayBuffer) -> None:
    fill(rb, range(3))
    out = rb.sample_batch(50)
    assert out.batch_size == (50,)
    assert set(out["index"].tolist()) <= {0, 1, 2}
    assert set(steps_of(out)) <= {0, 1, 2}


def test_sample_batch_draws_only_live_rows_uniformly(make_buffer: Factory) -> None:
    rb = make_buffer(100, seed=1)
    fill(rb, range(4))
    counts = torch.bincount(rb.sample_batch(40_000)["index"], minlength=4)
    assert counts.numel() == 4  # never a slot >= len
    assert (counts - 10_000).abs().max().item() < 600  # ~6 sigma


@pytest.mark.parametrize(
    "indices", [[7, 0, 7, 3], range(2, 6), torch.tensor([9, 1]), torch.tensor([4, 5], dtype=torch.int32), (1, 2)]
)
def test_sample_by_index_accepts_lists_ranges_tuples_tensors(wrapped: ReplayBuffer, indices: object) -> None:
    slots = [int(i) for i in indices]  # type: ignore[attr-defined]
    out = wrapped.sample_by_index(indices)  # type: ignore[arg-type]
    slot_steps = steps_of(wrapped.sample_by_index(range(10)))
    assert out.batch_size == (len(slots),)
    assert out["index"].tolist() == slots
    assert steps_of(out) == [slot_steps[s] for s in slots]


def test_sample_by_index_with_an_int_is_one_row(wrapped: ReplayBuffer) -> None:
    assert_td_equal(wrapped.sample_by_index(7), wrapped.sample_by_index([7]))


def test_sample_by_index_empty_selection(wrapped: ReplayBuffer) -> None:
    out = wrapped.sample_by_index([])
    assert out.batch_size == (0,) and out["state"].shape == (0, OBS_DIM)


def test_sample_by_index_fields_with_a_list(wrapped: ReplayBuffer) -> None:
    out = wrapped.sample_by_index_fields([0, 9], ["reward", "state"])
    assert set(out.keys()) == {"reward", "state"}
    assert out.batch_size == (2,)
    full = wrapped.sample_by_index([0, 9])
    assert torch.equal(out["reward"], full["reward"]) and torch.equal(out["state"], full["state"])


@pytest.mark.parametrize("fields", ["reward", ("reward",), ["reward"]])
def test_sample_by_index_fields_with_one_key(wrapped: ReplayBuffer, fields: object) -> None:
    out = wrapped.sample_by_index_fields(range(3), fields)  # type: ignore[arg-type]
    assert list(out.keys()) == ["reward"]
    assert out["reward"].tolist() == [s * 0.5 for s in (20, 21, 22)]


def test_sample_all_is_oldest_to_newest_after_the_wrap(wrapped: ReplayBuffer) -> None:
    out = wrapped.sample_all()
    assert steps_of(out) == list(range(15, 25))
    assert out["index"].tolist() == [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
    # sample_by_index keeps slot semantics
    assert steps_of(wrapped.sample_by_index(range(len(wrapped)))) == [*range(20, 25), *range(15, 20)]


def test_sample_all_before_the_wrap(rb: ReplayBuffer) -> None:
    fill(rb, range(6))
    out = rb.sample_all()
    assert steps_of(out) == list(range(6)) and out["index"].tolist() == list(range(6))


@pytest.mark.parametrize(
    "read",
    [
        lambda rb: rb.sample_batch(8),
        lambda rb: rb.sample_random(8),
        lambda rb: rb.sample_by_index([0, 1, 2]),
        lambda rb: rb.sample_by_index_fields([0, 1], ["state", "reward"]),
        lambda rb: rb.sample_all(),
        lambda rb: next(rb.create_epoch_iterator(4)),
        lambda rb: rb.get_next_batch(4),
    ],
    ids=["sample_batch", "sample_random", "by_index", "by_index_fields", "all", "epoch", "next_batch"],
)
def test_samples_never_alias_storage(wrapped: ReplayBuffer, read: Callable[[ReplayBuffer], TensorDict]) -> None:
    before = wrapped.sample_all()
    sample = read(wrapped)
    for value in sample.values(include_nested=True, leaves_only=True):
        if value.is_floating_point():
            value.add_(1000.0)
        else:
            value.fill_(-1)
    assert_td_equal(wrapped.sample_all(), before)


# ---------------------------------------------------------------- reset
def test_reset_empties_and_accepts_a_new_schema(wrapped: ReplayBuffer) -> None:
    wrapped.reset()
    assert (len(wrapped), wrapped.size, wrapped.pointer, wrapped.data_size, wrapped.buffer_size) == (0, 0, 0, 0, 10)
    assert wrapped.schema is None
    with pytest.raises(EmptyBufferError):
        wrapped.sample_batch(1)
    wrapped.add({"other": torch.ones(5), "key": 1})
    assert set(wrapped.sample_all().keys()) == {"other", "key", "index"}


def test_reset_with_a_new_size_resizes(wrapped: ReplayBuffer, tmp_path: pathlib.Path) -> None:
    wrapped.reset(4)
    assert (wrapped.buffer_size, len(wrapped), wrapped.pointer) == (4, 0, 0)
    fill(wrapped, range(6))
    assert (wrapped.pointer, len(wrapped)) == (2, 4)
    assert steps_of(wrapped.sample_all()) == [2, 3, 4, 5]
    assert len(os.listdir(tmp_path / "storage")) == 1  # no folder left behind by the old capacity
    wrapped.reset(4)  # same size: reuses the storage
    assert wrapped.buffer_size == 4 and len(wrapped) == 0


def test_context_manager_closes_the_storage(tmp_path: pathlib.Path) -> None:
    with ReplayBuffer("cpu", "cpu", 4, storage_dir=tmp_path) as rb:
        fill(rb, range(2))
        folder = rb.storage_folder
        assert folder is not None and os.path.isdir(folder)
    assert not os.path.exists(folder)


# ---------------------------------------------------------------- accelerators (run where CUDA is present)
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("device", "storing_device"), [("cuda", "cuda"), ("cuda", "cpu"), ("cpu", "cuda")])
def test_accelerator_devices(tmp_path: pathlib.Path, device: str, storing_device: str) -> None:
    rb = ReplayBuffer(device, storing_device, 10, seed=0, storage_dir=tmp_path)
    try:
        for step in range(13):
            rb.add(objectrl_transition(step, storing_device))
        rb.add_batch(objectrl_batch(13, 4).to(storing_device))
        expected = LazyMemmapStorage if storing_device == "cpu" else LazyTensorStorage
        assert isinstance(rb.memory.storage, expected)
        for out in (rb.sample_batch(8), rb.sample_all(), rb.sample_by_index([1, 2]), next(rb.create_epoch_iterator(4))):
            assert out.device == torch.device(device)
            assert all(
                v.device.type == torch.device(device).type for v in out.values(include_nested=True, leaves_only=True)
            )
        assert steps_of(rb.sample_all()) == list(range(7, 17))
        a = ReplayBuffer(device, storing_device, 10, seed=4, storage_dir=tmp_path)
        b = ReplayBuffer(device, storing_device, 10, seed=4, storage_dir=tmp_path)
        for buffer in (a, b):
            buffer.add_batch(objectrl_batch(0, 10).to(storing_device))
        assert_td_equal(a.sample_batch(16), b.sample_batch(16))
        a.close()
        b.close()
    finally:
        rb.close()


@pytest.mark.parametrize("num_envs", [1, 2])
def test_a_float64_reward_gives_the_float32_column_a_python_float_gives(make_buffer: Factory, num_envs: int) -> None:
    columns = []
    for reward in (0.5, np.float64(0.5), np.array(0.5)):
        rb = make_buffer(4, num_envs=num_envs)
        rb.add({"reward": np.full(num_envs, reward) if num_envs > 1 else reward})
        rb.add_batch({"reward": np.full((2, num_envs) if num_envs > 1 else 2, 0.25)})  # later writes fit
        columns.append(rb.schema.fields[0].dtype)  # type: ignore[union-attr]
    assert columns == [torch.float32] * 3
