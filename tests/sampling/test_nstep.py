"""n-step sampling against a plain Python model of the ring and its episodes."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer, TransitionKeys
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError, SchemaError

logging.getLogger("torchrl").setLevel(logging.WARNING)


def episode_rows(n: int, seed: int, p_term: float, p_trunc: float) -> dict[str, torch.Tensor]:
    """``n`` transitions with random rewards and random episode ends; ``step`` identifies a row."""
    gen = torch.Generator().manual_seed(seed)
    step = torch.arange(n)
    terminated = (torch.rand(n, generator=gen) < p_term).float()
    truncated = ((torch.rand(n, generator=gen) < p_trunc) & (terminated == 0)).float()
    return {
        "state": step.float().unsqueeze(1).repeat(1, 2),
        "reward": torch.randn(n, generator=gen),
        "next_state": (step + 1).float().unsqueeze(1).repeat(1, 2),
        "terminated": terminated,
        "truncated": truncated,
        "step": step,
    }


def reference(rows: dict[str, torch.Tensor], capacity: int, n_step: int, gamma: float) -> dict[int, dict[str, Any]]:
    """Expected n-step values of every stored row, keyed by its step (plain Python, no tensors)."""
    total = len(rows["step"])
    stored = list(range(max(0, total - capacity), total))  # steps still in the ring, oldest first
    reward, term, trunc = rows["reward"].tolist(), rows["terminated"].tolist(), rows["truncated"].tolist()
    out = {}
    for position, step in enumerate(stored):
        acc, used = 0.0, 0
        for j in range(n_step):
            if position + j >= len(stored):  # the write head: no newer row
                break
            s = stored[position + j]
            acc += gamma**j * reward[s]
            used = j + 1
            if term[s] or trunc[s]:
                break
        last = stored[position + used - 1]
        out[step] = {
            "reward": acc,
            "discount": gamma**used,
            "next_step": last + 1,
            "terminated": term[last],
            "truncated": trunc[last],
        }
    return out


def check_against_reference(batch: Any, expected: dict[int, dict[str, Any]]) -> None:
    for i, step in enumerate(batch["step"].tolist()):
        want = expected[step]
        assert math.isclose(float(batch["reward"][i]), want["reward"], rel_tol=1e-5, abs_tol=1e-5), step
        assert math.isclose(float(batch["discount"][i]), want["discount"], rel_tol=1e-6), step
        assert batch["next_state"][i].tolist() == [float(want["next_step"])] * 2, step
        assert float(batch["terminated"][i]) == want["terminated"], step
        assert float(batch["truncated"][i]) == want["truncated"], step
        assert batch["state"][i].tolist() == [float(step)] * 2  # untouched keys come from the sampled row


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 24),
    added=st.integers(1, 70),
    n_step=st.integers(1, 7),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]),
    p_term=st.sampled_from([0.0, 0.1, 0.4]),
    p_trunc=st.sampled_from([0.0, 0.1, 0.4]),
    seed=st.integers(0, 2**31 - 1),
    in_batches=st.booleans(),
)
def test_n_step_matches_reference(
    tmp_path_factory: Any,
    capacity: int,
    added: int,
    n_step: int,
    gamma: float,
    p_term: float,
    p_trunc: float,
    seed: int,
    in_batches: bool,
) -> None:
    """Random episodes with early ends, truncations and ring wrap-around; every sampled row checked."""
    rows = episode_rows(added, seed, p_term, p_trunc)
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=seed, storage_dir=tmp_path_factory.mktemp("s"))
    if in_batches:
        rb.add_batch(rows)
    else:
        for i in range(added):
            rb.add({k: v[i] for k, v in rows.items()})
    expected = reference(rows, capacity, n_step, gamma)
    batch = rb.sample_batch(4 * capacity, n_step=n_step, gamma=gamma)
    check_against_reference(batch, expected)  # n_step=1 included: discount is gamma ** 1
    rb.close()


@pytest.mark.parametrize("n_step", [2**62, 2**40, np.int64(25)])
@pytest.mark.parametrize("prioritized", [False, True])
def test_n_step_beyond_the_buffer_reads_what_it_holds(tmp_path: Any, n_step: Any, prioritized: bool) -> None:
    """n_step=2**62 used to allocate a [k, n] window (RuntimeError "Storage size calculation overflowed"):
    a sum never runs past the newest row, so any n from the rows held on gives the same targets."""
    rows = episode_rows(30, 1, 0.0, 0.0)  # no episode ends: every sum runs to the write head
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    rb = cls("cpu", "cpu", 12, seed=5, storage_dir=tmp_path)
    rb.add_batch(rows)
    batch = rb.sample_batch(40, n_step=n_step, gamma=0.9)
    check_against_reference(batch, reference(rows, 12, 12, 0.9))
    rb.close()


def test_write_head_and_episode_end_stop_the_sum(tmp_path: Any) -> None:
    """Capacity 6 after 9 rows (steps 3..8 stored); step 5 is terminal, step 7 truncated."""
    rows = episode_rows(9, 0, 0.0, 0.0)
    rows["reward"] = torch.arange(9).float() + 1  # reward of step s is s + 1
    rows["terminated"][5] = 1.0
    rows["truncated"][7] = 1.0
    rb = ReplayBuffer("cpu", "cpu", 6, seed=0, storage_dir=tmp_path)
    rb.add_batch(rows)
    steps = {int(s): slot for slot, s in enumerate(rb.sample_by_index(range(6))["step"].tolist())}
    out = {}
    for _ in range(20):
        batch = rb.sample_batch(64, n_step=3, gamma=0.5)
        for i, s in enumerate(batch["step"].tolist()):
            out[s] = (float(batch["reward"][i]), float(batch["discount"][i]), int(batch["next_state"][i, 0]))
            out[s] += (float(batch["terminated"][i]), float(batch["truncated"][i]))
            assert int(batch["index"][i]) == steps[s]
    assert out == {
        3: (4 + 0.5 * 5 + 0.25 * 6, 0.125, 6, 1.0, 0.0),  # stops at the terminal step 5 (3 rewards)
        4: (5 + 0.5 * 6, 0.25, 6, 1.0, 0.0),  # two steps: ends at step 5
        5: (6.0, 0.5, 6, 1.0, 0.0),
        6: (7 + 0.5 * 8, 0.25, 8, 0.0, 1.0),  # a truncation stops the sum but is not terminal
        7: (8.0, 0.5, 8, 0.0, 1.0),
        8: (9.0, 0.5, 9, 0.0, 0.0),  # the newest row: the write head stops it after one step
    }


@pytest.mark.parametrize("prioritized", [False, True])
def test_n_step_one_given_returns_discount_and_plain_sampling_is_unchanged(tmp_path: Any, prioritized: bool) -> None:
    """A trainer reading batch["discount"] works at n = 1 too; a plain sample_batch(k) is as before."""
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    rows = episode_rows(12, 4, 0.3, 0.2)
    assert rows["terminated"].any() and rows["truncated"].any()
    buffers = [cls("cpu", "cpu", 16, seed=5, storage_dir=tmp_path / str(i)) for i in range(2)]
    for rb in buffers:
        rb.add_batch(rows)
    plain, one = buffers[0].sample_batch(64), buffers[1].sample_batch(64, n_step=1, gamma=0.7)
    assert "discount" not in plain
    assert set(one.keys()) == set(plain.keys()) | {"discount"}
    for key in sorted(plain.keys()):  # same draws, same rows: n = 1 changes nothing but the added discount
        assert torch.equal(one[key], plain[key]), key
    # gamma ** 1 on every row, terminal and truncated ones too (the trainer masks with terminated)
    assert one["discount"].dtype == torch.float32 and one["discount"].shape == (64,)
    assert torch.equal(one["discount"], torch.full((64,), 0.7, dtype=torch.float32))
    assert torch.equal(buffers[0].generator.get_state(), buffers[1].generator.get_state())
    assert "discount" in buffers[0].sample_batch(8, n_step=1, recent=3)
    assert "discount" not in buffers[0].sample_batch(8, recent=3)


def test_configurable_keys_and_nested_rewards(tmp_path: Any) -> None:
    keys = TransitionKeys(reward="r", next_state=("next", "obs"), terminated="done", truncated=None, discount="g")
    rb = ReplayBuffer("cpu", "cpu", 10, seed=0, storage_dir=tmp_path, transition_keys=keys)
    done = torch.tensor([0, 0, 1, 0, 0], dtype=torch.bool)
    rb.add_batch({"r": torch.ones(5, 2), "next": {"obs": torch.arange(5.0).unsqueeze(1)}, "done": done})
    batch = rb.sample_batch(50, n_step=2, gamma=1.0)
    for i, slot in enumerate(batch["index"].tolist()):
        steps = 1 if slot in (2, 4) else 2
        assert batch["r"][i].tolist() == [float(steps)] * 2  # per-row reward vectors are summed element-wise
        assert float(batch["g"][i]) == 1.0
        assert float(batch["next", "obs"][i]) == slot + steps - 1
        assert bool(batch["done"][i]) == (slot + steps - 1 == 2)


def test_missing_keys_raise_schema_error(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 10, seed=0, storage_dir=tmp_path)
    rb.add_batch({"reward": torch.ones(3), "terminated": torch.zeros(3)})
    with pytest.raises(SchemaError, match="next_state"):
        rb.sample_batch(4, n_step=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_step": 0}, "n_step"),
        ({"n_step": -2}, "n_step"),
        ({"n_step": 2.5}, "n_step"),
        ({"n_step": 3, "gamma": -0.1}, "gamma"),
        ({"n_step": 3, "gamma": 1.01}, "gamma"),
        ({"n_step": 3, "gamma": float("nan")}, "gamma"),
        ({"n_step": 3, "gamma": "0.9"}, "gamma"),
        ({"n_step": 2**64}, "n_step"),  # was an OverflowError from torch
        ({"n_step": 2**62 + 1}, "n_step"),
        ({"n_step": torch.tensor([2, 3])}, "n_step"),
    ],
)
@pytest.mark.parametrize("prioritized", [False, True])
def test_bad_arguments_raise_and_change_nothing(
    tmp_path: Any, kwargs: dict[str, Any], match: str, prioritized: bool
) -> None:
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    rb = cls("cpu", "cpu", 10, seed=0, storage_dir=tmp_path)
    rb.add_batch(episode_rows(6, 0, 0.2, 0.2))
    state = rb.generator.get_state()
    with pytest.raises(InvalidArgumentError, match=match):
        rb.sample_batch(4, **kwargs)
    assert torch.equal(rb.generator.get_state(), state)
    assert (len(rb), rb.pointer) == (6, 6)


def test_n_step_on_an_empty_buffer_raises(tmp_path: Any) -> None:
    with pytest.raises(EmptyBufferError):
        ReplayBuffer("cpu", "cpu", 10, storage_dir=tmp_path).sample_batch(4, n_step=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_n_step_on_cuda_storage_matches_reference(tmp_path: Any) -> None:
    rows = episode_rows(40, 3, 0.2, 0.1)
    rb = ReplayBuffer("cuda", "cuda", 16, seed=0)
    rb.add_batch({k: v.cuda() for k, v in rows.items()})
    batch = rb.sample_batch(64, n_step=4, gamma=0.9)
    assert batch["reward"].device.type == "cuda"
    check_against_reference(batch.cpu(), reference(rows, 16, 4, 0.9))
