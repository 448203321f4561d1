"""Names people already know (issue 17): sample/extend, state_dict/load_state_dict, len/repr, and checkpoint
paths given as the ``.metadata`` file's own name."""

from __future__ import annotations

import io
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError
from tests.support import (
    assert_same,
    assert_unchanged,
    fill,
    full_snapshot,
    next_draws,
    objectrl_batch,
    snapshot,
    steps_of,
)

Factory = Callable[..., ReplayBuffer]


# ---------------------------------------------------------------- sample / extend
def test_sample_and_extend_are_sample_batch_and_add_batch(make_buffer: Factory) -> None:
    a, b = make_buffer(10, seed=3), make_buffer(10, seed=3)
    a.extend(objectrl_batch(0, 13))
    b.add_batch(objectrl_batch(0, 13))
    assert_same(full_snapshot(a), full_snapshot(b))
    assert_same(a.sample(5).to_dict(), b.sample_batch(5).to_dict())
    assert_same(a.sample(4, n_step=3, gamma=0.5).to_dict(), b.sample_batch(4, n_step=3, gamma=0.5).to_dict())
    assert_same(a.sample(4, recent=3).to_dict(), b.sample_batch(4, recent=3).to_dict())


def test_sample_of_a_prioritized_buffer_draws_by_priority(tmp_path: pathlib.Path) -> None:
    with PrioritizedReplayBuffer("cpu", "cpu", 8, seed=0, storage_dir=tmp_path, eps=0.0, backend="torch") as per:
        per.extend(objectrl_batch(0, 8))
        per.update_priority(list(range(8)), torch.tensor([0.0] * 7 + [5.0]))
        batch = per.sample(16)
        assert batch["index"].tolist() == [7] * 16 and "weight" in batch


# ---------------------------------------------------------------- len / repr
def test_len_and_repr_show_the_fill_level(make_buffer: Factory) -> None:
    rb = make_buffer(10)
    assert len(rb) == 0
    assert repr(rb) == "ReplayBuffer(0/10 rows, pointer=0, cpu->cpu, empty)"
    fill(rb, range(13))
    assert len(rb) == 10
    text = repr(rb)
    assert text.startswith("ReplayBuffer(10/10 rows, pointer=3, cpu->cpu, keys=[")
    assert "'state': float32 (4,)" in text and "'step': int64 ()" in text and text.endswith("])")


def test_repr_of_a_prioritized_buffer_adds_its_settings(tmp_path: pathlib.Path) -> None:
    with PrioritizedReplayBuffer("cpu", "cpu", 4, storage_dir=tmp_path, backend="torch") as per:
        assert (
            repr(per) == "PrioritizedReplayBuffer(0/4 rows, pointer=0, cpu->cpu, empty, alpha=0.6, beta=0.4, "
            "backend='torch')"
        )


def test_repr_says_how_many_rows_hold_no_data(make_buffer: Factory, tmp_path: pathlib.Path) -> None:
    source = make_buffer(10)
    fill(source, range(6))
    source.save(tmp_path / "meta")
    rb = make_buffer(10)
    with pytest.warns(RuntimeWarning):
        rb.load(tmp_path / "meta")
    assert repr(rb) == "ReplayBuffer(6/10 rows (6 hold no data), pointer=6, cpu->cpu, empty)"


# ---------------------------------------------------------------- paths naming the .metadata file
@pytest.mark.parametrize("full", [False, True])
def test_save_load_and_from_checkpoint_take_the_metadata_file_name(
    make_buffer: Factory, tmp_path: pathlib.Path, full: bool
) -> None:
    rb = make_buffer(10)
    fill(rb, range(7))
    rb.save(tmp_path / "run.metadata", data=full)  # names the file: no run.metadata.metadata
    assert sorted(p.name for p in tmp_path.iterdir() if "metadata" in p.name) == ["run.metadata"]
    other = make_buffer(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # metadata only: rows counted, not held
        other.load(str(tmp_path / "run.metadata"))
        again = ReplayBuffer.from_checkpoint(tmp_path / "run.metadata", storage_dir=tmp_path / "s")
    try:
        assert len(other) == len(again) == 7
        if full:
            assert steps_of(other.sample_all()) == steps_of(again.sample_all()) == list(range(7))
    finally:
        again.close()


def test_a_checkpoint_saved_at_a_metadata_path_by_an_older_version_still_loads(
    make_buffer: Factory, tmp_path: pathlib.Path
) -> None:
    rb = make_buffer(10)
    fill(rb, range(3))
    # what 0.1.0's save("old.metadata", data=True) left: old.metadata.metadata and old.metadata.data-*
    rb.save(tmp_path / "old.metadata.metadata", data=True)
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir() if p.name.startswith("old")) == [
        "old.metadata.data",
        "old.metadata.metadata",
    ]
    restored = make_buffer(10)
    restored.load(tmp_path / "old.metadata")  # no old.metadata file: the old meaning
    assert steps_of(restored.sample_all()) == [0, 1, 2]
    rb.save(tmp_path / "old.metadata", data=True)  # and a new save goes on writing the same checkpoint
    assert not (tmp_path / "old.metadata").exists()


def test_missing_checkpoint_names_the_file_given(make_buffer: Factory, tmp_path: pathlib.Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match=r"no buffer checkpoint at '.*nothing\.metadata'$"):
        make_buffer(10).load(tmp_path / "nothing.metadata")


# ---------------------------------------------------------------- state_dict
def _round_trip(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_state_dict_round_trips_rows_ring_schema_generator_and_settings(make_buffer: Factory) -> None:
    rb = make_buffer(10, seed=5, shuffle=True)
    fill(rb, range(23))  # wrapped: pointer 3
    rb.sample_batch(3)  # move the generator
    state = _round_trip(rb.state_dict())
    assert state["format"] == "objectrl_buffer.state_dict" and state["buffer_size"] == 10
    expected = full_snapshot(rb)
    draws = next_draws(rb)
    other = make_buffer(10, seed=99)
    other.load_state_dict(state)
    assert_same(full_snapshot(other), expected)
    assert_same(next_draws(other), draws)


def test_state_dict_into_an_empty_buffer_of_another_capacity(make_buffer: Factory) -> None:
    rb = make_buffer(6)
    fill(rb, range(4))
    other = make_buffer(20)
    other.load_state_dict(rb.state_dict())
    assert other.buffer_size == 6 and steps_of(other.sample_all()) == [0, 1, 2, 3]
    other.extend(objectrl_batch(4, 3))
    assert steps_of(other.sample_all()) == [1, 2, 3, 4, 5, 6]


def test_state_dict_is_a_snapshot(make_buffer: Factory) -> None:
    rb = make_buffer(10)
    fill(rb, range(4))
    state = rb.state_dict()
    fill(rb, range(4, 8))
    assert all(t.device.type == "cpu" for t in state["columns"].values())
    assert state["columns"]["step"].tolist() == [0, 1, 2, 3]


def test_state_dict_keeps_phantom_rows(make_buffer: Factory, tmp_path: pathlib.Path) -> None:
    source = make_buffer(10)
    fill(source, range(8))
    source.save(tmp_path / "meta")  # metadata only
    rb = make_buffer(10)
    with pytest.warns(RuntimeWarning):
        rb.load(tmp_path / "meta")  # counts 8 rows, holds none
    fill(rb, range(100, 103))  # slots 8, 9, 0: 10 counted, the 3 newest held
    assert repr(rb).startswith("ReplayBuffer(10/10 rows (7 hold no data), pointer=1,")
    other = make_buffer(10)
    other.load_state_dict(_round_trip(rb.state_dict()))
    assert (len(other), other.pointer) == (10, 1)
    assert steps_of(other.sample_all()) == steps_of(rb.sample_all()) == [100, 101, 102]
    with pytest.raises(IndexError):
        other.sample_by_index([1])  # a phantom row is never read


def test_state_dict_of_an_empty_buffer(make_buffer: Factory) -> None:
    other = make_buffer(10)
    fill(other, range(3))
    other.load_state_dict(make_buffer(10).state_dict())
    assert len(other) == 0 and other.schema is None


def test_state_dict_of_a_prioritized_buffer_keeps_priorities(tmp_path: pathlib.Path) -> None:
    with (
        PrioritizedReplayBuffer("cpu", "cpu", 8, seed=0, storage_dir=tmp_path / "a", backend="torch") as per,
        PrioritizedReplayBuffer("cpu", "cpu", 8, seed=1, storage_dir=tmp_path / "b", backend="torch") as other,
    ):
        per.extend(objectrl_batch(0, 6))
        per.update_priority([0, 3], torch.tensor([4.0, 0.5]))
        state = _round_trip(per.state_dict())
        assert "prioritized.priority" in state["extra_arrays"]
        other.load_state_dict(state)
        assert torch.equal(other.priorities(), per.priorities())
        assert other.max_priority == per.max_priority
        assert_same(other.sample(5).to_dict(), per.sample(5).to_dict())


def _bad(state: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    bad = dict(state)
    bad["columns"] = dict(state["columns"])
    bad["fields"] = [dict(f) for f in state["fields"]]
    bad["extra_arrays"] = dict(state["extra_arrays"])
    change(bad)
    return bad


BAD_STATES: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "not a buffer state": (lambda s: s.pop("format"), "not a state_dict of objectrl_buffer"),
    "future version": (lambda s: s.update(format_version=99), "format version 99"),
    "ring": (lambda s: s.update(pointer=11), "inconsistent ring state"),
    "missing key": (lambda s: s.pop("pointer"), "lacks the key 'pointer'"),
    "rows of a column": (lambda s: s["columns"].update(step=s["columns"]["step"][:3]), "column 'step'"),
    "dtype of a column": (lambda s: s["columns"].update(step=s["columns"]["step"].float()), "column 'step'"),
    "missing column": (lambda s: s["columns"].pop("reward"), "column 'reward'"),
    "unknown dtype": (lambda s: s["fields"][0].update(dtype="float99"), "dtype 'float99'"),
    "phantom": (lambda s: s.update(phantom=-1), "phantom"),
    "generator": (lambda s: s.update(generator_state=torch.zeros(3, dtype=torch.uint8)), "generator"),
    "num_envs": (lambda s: s.update(num_envs=3), "num_envs"),
    "shuffle": (lambda s: s.update(shuffle="yes"), "shuffle"),
}


@pytest.mark.parametrize("name", list(BAD_STATES))
def test_a_bad_state_dict_is_refused_and_changes_nothing(make_buffer: Factory, name: str) -> None:
    source = make_buffer(10)
    fill(source, range(12))
    change, message = BAD_STATES[name]
    rb = make_buffer(10)
    fill(rb, range(50, 55))
    before = snapshot(rb)
    with pytest.raises(CheckpointError, match=message):
        rb.load_state_dict(_bad(source.state_dict(), change))
    assert_unchanged(rb, before)


def test_a_state_dict_of_another_schema_is_refused_by_a_buffer_that_holds_rows(make_buffer: Factory) -> None:
    source = make_buffer(10)
    source.add({"x": torch.zeros(2)})
    rb = make_buffer(10)
    fill(rb, range(3))
    before = snapshot(rb)
    with pytest.raises(CheckpointError, match="reset"):
        rb.load_state_dict(source.state_dict())
    assert_unchanged(rb, before)


def test_bad_priorities_in_a_state_dict_are_refused(tmp_path: pathlib.Path) -> None:
    with (
        PrioritizedReplayBuffer("cpu", "cpu", 8, seed=0, storage_dir=tmp_path / "a", backend="torch") as per,
        PrioritizedReplayBuffer("cpu", "cpu", 8, seed=1, storage_dir=tmp_path / "b", backend="torch") as other,
    ):
        per.extend(objectrl_batch(0, 6))
        state = per.state_dict()
        state["extra_arrays"] = {"prioritized.priority": -state["extra_arrays"]["prioritized.priority"]}
        other.extend(objectrl_batch(0, 2))
        before = other.priorities()
        with pytest.raises(CheckpointError, match="negative"):
            other.load_state_dict(state)
        assert torch.equal(other.priorities(), before) and len(other) == 2
