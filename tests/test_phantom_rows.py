"""After a metadata-only load the counters count rows that hold no data ("phantom" rows): never return them.

ObjectRL's ``save(path)`` writes counters only; ``load`` restores ``len()`` and ``pointer`` over storage that
holds nothing. Rows written afterwards fill the ring from ``pointer`` on, so the rows holding data are always
the newest ones; every read path must use only those.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import fill, objectrl_batch, steps_of

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.errors import CheckpointError, EmptyBufferError, SlotIndexError

Factory = Callable[..., ReplayBuffer]


def counters_only(tmp_path: Any, capacity: int, size: int, pointer: int) -> str:
    """A metadata-only checkpoint as ObjectRL's ``save`` writes it; returns its path."""
    path = str(tmp_path / "meta")
    torch.save({"buffer_size": capacity, "data_size": size, "pointer": pointer}, path + ".metadata")
    return path


def loaded(buffer: ReplayBuffer, path: str) -> ReplayBuffer:
    with pytest.warns(RuntimeWarning, match="hold no data"):
        buffer.load(path)
    return buffer


def test_issue_scenario_in_a_new_process(tmp_path: Any) -> None:
    source = ReplayBuffer("cpu", "cpu", 10, seed=0, storage_dir=tmp_path)
    source.add_batch({"x": torch.arange(5.0)})
    source.save(tmp_path / "ckpt")  # ObjectRL's default: counters only
    source.close()
    script = textwrap.dedent(
        """
        import sys, warnings, torch
        from objectrl_buffer import ReplayBuffer
        rb = ReplayBuffer("cpu", "cpu", 10, storage_dir=sys.argv[1])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rb.load(sys.argv[1] + "/ckpt")
        rb.add({"x": 42.0})
        print(len(rb), rb.pointer, sorted(set(rb.sample_batch(64)["x"].tolist())), rb.sample_all()["x"].tolist())
        print([str(w.message) for w in caught if w.category is RuntimeWarning])
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120, env=env, check=True
    ).stdout.splitlines()
    assert out[0] == "6 6 [42.0] [42.0]"
    assert "5 rows" in out[1]


@pytest.fixture
def phantom(make_buffer: Factory, tmp_path: Any) -> ReplayBuffer:
    """Capacity 10 loaded from counters (10 rows, pointer 5), then steps 100..102 written at slots 5..7."""
    rb = loaded(make_buffer(10), counters_only(tmp_path, 10, 10, 5))
    fill(rb, range(100, 103))
    return rb


HELD = [100, 101, 102]


def test_counters_are_kept_as_restored(phantom: ReplayBuffer) -> None:
    assert (len(phantom), phantom.pointer, phantom.size) == (10, 8, 10)


def test_random_sampling_draws_only_written_rows(phantom: ReplayBuffer) -> None:
    for batch in (phantom.sample_batch(300), phantom.sample_random(300), phantom.get_next_batch(300)):
        assert set(steps_of(batch)) == set(HELD)
        assert set(batch["index"].tolist()) == {5, 6, 7}
    assert set(steps_of(phantom.sample_batch(100, recent=2))) == {101, 102}
    assert set(steps_of(phantom.sample_batch(100, recent=50))) == set(HELD)
    phantom.get_steps_and_iterator(0, 5, 8, recent=1)
    assert set(steps_of(phantom.get_next_batch(50))) == {102}


def test_n_step_sums_stop_at_the_newest_written_row(phantom: ReplayBuffer) -> None:
    batch = phantom.sample_batch(200, n_step=3, gamma=0.5)
    rewards = {s: 0.5 * s for s in HELD}
    expected = {100: (rewards[100] + 0.5 * rewards[101] + 0.25 * rewards[102], 0.125), 101: None, 102: None}
    expected[101] = (rewards[101] + 0.5 * rewards[102], 0.25)
    expected[102] = (rewards[102], 0.5)
    slots = batch["index"].tolist()
    assert set(slots) == {5, 6, 7}
    for slot, reward, discount in zip(slots, batch["reward"].tolist(), batch["discount"].tolist(), strict=True):
        assert (reward, discount) == pytest.approx(expected[95 + slot])


def test_sample_all_and_epochs_cover_exactly_the_written_rows(phantom: ReplayBuffer) -> None:
    everything = phantom.sample_all()
    assert steps_of(everything) == HELD and everything["index"].tolist() == [5, 6, 7]
    assert phantom.calculate_num_batches(2) == 2
    assert phantom.get_steps_and_iterator(2, 0, 2) == 4
    batches = [steps_of(phantom.get_next_batch(2)) for _ in range(4)]
    assert batches == [[100, 101], [102], [100, 101], [102]]
    shuffled = [s for b in phantom.create_epoch_iterator(2, shuffle=True) for s in steps_of(b)]
    assert sorted(shuffled) == HELD
    assert [steps_of(b) for b in phantom.create_epoch_iterator(5, recent=2)] == [[101, 102]]


def test_slices_stay_inside_the_written_rows(phantom: ReplayBuffer) -> None:
    slices = phantom.sample_slices(20, 2)
    assert {tuple(row) for row in slices["step"].tolist()} <= {(100, 101), (101, 102)}
    assert phantom.sample_slices(3, 3)["step"].tolist() == [HELD] * 3
    with pytest.raises(EmptyBufferError):
        phantom.sample_slices(1, 4)


@pytest.mark.parametrize("slot", [0, 4, 8, 9])
def test_index_of_a_phantom_slot_is_refused(phantom: ReplayBuffer, slot: int) -> None:
    with pytest.raises(SlotIndexError, match=rf"\b{slot}\b.*no data"):
        phantom.sample_by_index([5, slot])
    with pytest.raises(SlotIndexError, match=rf"\b{slot}\b.*no data"):
        phantom.sample_by_index_fields(slot, ["reward"])
    assert steps_of(phantom.sample_by_index([7, 5])) == [102, 100]
    assert phantom.sample_by_index_fields([6], ["step"])["step"].tolist() == [101]


def test_writes_overwrite_phantom_rows_first_as_the_ring_wraps(make_buffer: Factory, tmp_path: Any) -> None:
    rb = loaded(make_buffer(4), counters_only(tmp_path, 4, 4, 2))
    written: list[int] = []
    for step in range(6):
        rb.add({"step": step})
        written.append(step)
        expected = written[-4:]
        assert len(rb) == 4
        assert rb.sample_all()["step"].tolist() == expected
        assert set(rb.sample_batch(200)["step"].tolist()) == set(expected)
    rb2 = loaded(make_buffer(4), counters_only(tmp_path, 4, 4, 2))
    rb2.add_batch({"step": torch.arange(3)})
    assert rb2.sample_all()["step"].tolist() == [0, 1, 2]
    rb2.add_batch({"step": torch.arange(3, 9)})  # more than the capacity: every phantom row is gone
    assert rb2.sample_all()["step"].tolist() == [5, 6, 7, 8]
    assert rb2.sample_by_index(range(4))["step"].tolist() == [6, 7, 8, 5]  # pointer 2 + 9 rows: slot 2 newest


def test_partly_filled_counters(make_buffer: Factory, tmp_path: Any) -> None:
    rb = loaded(make_buffer(10), counters_only(tmp_path, 10, 5, 5))
    with pytest.raises(EmptyBufferError, match="no data"):
        rb.sample_batch(4)
    rb.add({"step": 7})
    assert (len(rb), rb.pointer) == (6, 6)
    assert rb.sample_all()["index"].tolist() == [5]
    assert set(rb.sample_batch(50)["step"].tolist()) == {7}


def test_loading_its_own_counters_back_keeps_the_rows(make_buffer: Factory, tmp_path: Any) -> None:
    rb = make_buffer(6)
    fill(rb, range(9))
    rb.save(tmp_path / "own")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.load(tmp_path / "own")
    assert steps_of(rb.sample_all()) == list(range(3, 9))


def test_full_checkpoint_keeps_the_phantom_rows_out(phantom: ReplayBuffer, tmp_path: Any) -> None:
    phantom.save(tmp_path / "full", data=True)
    back = ReplayBuffer.from_checkpoint(tmp_path / "full", storage_dir=tmp_path / "s2")
    try:
        assert (len(back), back.pointer) == (10, 8)
        assert steps_of(back.sample_all()) == HELD
        assert set(steps_of(back.sample_batch(100))) == set(HELD)
    finally:
        back.close()


def test_reset_and_copies(phantom: ReplayBuffer) -> None:
    twin = copy.deepcopy(phantom)
    assert steps_of(twin.sample_all()) == HELD
    twin.close()
    phantom.reset()
    phantom.add_batch(objectrl_batch(0, 10))
    assert steps_of(phantom.sample_all()) == list(range(10))


def test_prioritized_draws_only_written_rows(tmp_path: Any) -> None:
    rb = PrioritizedReplayBuffer("cpu", "cpu", 8, seed=0, storage_dir=tmp_path / "s")
    loaded(rb, counters_only(tmp_path, 8, 8, 3))
    rb.add_batch({"step": torch.tensor([10, 11])})
    rb.update_priority([3, 4], [1.0, 3.0])
    batch = rb.sample_batch(400)
    assert set(batch["index"].tolist()) == {3, 4}
    assert batch["weight"].max() == 1.0
    share = (batch["index"] == 4).float().mean().item()
    expected = 3.0**0.6 / (1.0**0.6 + 3.0**0.6)
    assert abs(share - expected) < 0.1
    with pytest.raises(SlotIndexError, match="no data"):
        rb.update_priority([0], [1.0])
    rb.close()


@pytest.mark.parametrize("value", [-1, 11, "3", 2.0])
def test_a_bad_phantom_count_in_a_checkpoint_is_refused(make_buffer: Factory, tmp_path: Any, value: Any) -> None:
    torch.save({"buffer_size": 10, "data_size": 10, "pointer": 5, "phantom": value}, str(tmp_path / "bad.metadata"))
    rb = make_buffer(10)
    with pytest.raises(CheckpointError, match="phantom"):
        rb.load(tmp_path / "bad")
    assert (len(rb), rb.pointer) == (0, 0)
