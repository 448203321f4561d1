"""Vector environments (``num_envs``): every env keeps its own stream, checked against per-env Python lists."""

from __future__ import annotations

import itertools
import logging
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.errors import CheckpointError, EmptyBufferError, InvalidArgumentError, SchemaError
from objectrl_buffer.sampling.slices import StoredRows, _all_valid_starts
from tests.support import edit_manifest

logging.getLogger("torchrl").setLevel(logging.WARNING)


# ---------------------------------------------------------------------------------------------- reference model
def env_steps(steps: int, num_envs: int, seed: int, p_end: float) -> dict[str, torch.Tensor]:
    """``[steps, num_envs]`` transitions; ``step``/``env`` identify a row, ``state`` = (step, env)."""
    gen = torch.Generator().manual_seed(seed)
    step = torch.arange(steps).unsqueeze(1).expand(steps, num_envs)
    env = torch.arange(num_envs).unsqueeze(0).expand(steps, num_envs)
    end = torch.rand(steps, num_envs, generator=gen) < p_end
    kind = torch.rand(steps, num_envs, generator=gen) < 0.5
    return {
        "state": torch.stack([step, env], -1).float(),
        "reward": torch.randn(steps, num_envs, generator=gen),
        "next_state": torch.stack([step + 1, env], -1).float(),
        "terminated": (end & kind).float(),
        "truncated": (end & ~kind).float(),
        "step": step.contiguous(),
        "env": env.contiguous(),
    }


def streams(rows: dict[str, torch.Tensor], steps_kept: int) -> list[list[dict[str, float]]]:
    """Per env, the stored transitions oldest first (the newest ``steps_kept`` steps): the reference."""
    total, num_envs = rows["step"].shape
    out = []
    for e in range(num_envs):
        out.append(
            [
                {k: rows[k][t, e].tolist() for k in ("reward", "terminated", "truncated", "step")}
                for t in range(max(0, total - steps_kept), total)
            ]
        )
    return out


def n_step_reference(stream: list[dict[str, Any]], n_step: int, gamma: float) -> dict[int, dict[str, float]]:
    """Expected n-step values of every row of one env's stream, keyed by step."""
    out = {}
    for position, row in enumerate(stream):
        acc, used = 0.0, 0
        for j in range(n_step):
            if position + j >= len(stream):  # the write head of this env
                break
            later = stream[position + j]
            acc += gamma**j * later["reward"]
            used = j + 1
            if later["terminated"] or later["truncated"]:
                break
        last = stream[position + used - 1]
        out[row["step"]] = {
            "reward": acc,
            "discount": gamma**used,
            "next_step": last["step"] + 1,
            "terminated": last["terminated"],
            "truncated": last["truncated"],
        }
    return out


def add_in_chunks(rb: ReplayBuffer, rows: dict[str, torch.Tensor], cuts: list[int]) -> None:
    """Write ``rows`` ([T, E]) as add_batch chunks split at ``cuts``; chunks of one step through ``add``."""
    total = rows["step"].shape[0]
    bounds = sorted({0, total, *(c for c in cuts if 0 < c < total)})
    for start, stop in itertools.pairwise(bounds):
        if stop - start == 1:  # one step: [num_envs] rows, or one transition without envs
            rb.add({k: v[start] if rb.num_envs > 1 else v[start, 0] for k, v in rows.items()})
        else:
            rb.add_batch(as_batch({k: v[start:stop] for k, v in rows.items()}, rb.num_envs))


def as_batch(rows: dict[str, torch.Tensor], num_envs: int) -> dict[str, torch.Tensor]:
    """What add_batch takes: ``[T, num_envs, ...]`` values, or ``[T, ...]`` without envs."""
    return rows if num_envs > 1 else {k: v[:, 0] for k, v in rows.items()}


def check_n_step(batch: TensorDict, refs: list[dict[int, dict[str, float]]], gamma: float, num_envs: int) -> None:
    for i in range(batch.shape[0]):
        env, step = int(batch["env"][i]), int(batch["step"][i])
        assert int(batch["index"][i]) % num_envs == env  # slot t * num_envs + e
        expected = refs[env][step]
        assert float(batch["reward"][i]) == pytest.approx(expected["reward"], abs=1e-5)
        assert float(batch["discount"][i]) == pytest.approx(expected["discount"], rel=1e-6)
        assert batch["next_state"][i].tolist() == [expected["next_step"], env]
        assert float(batch["terminated"][i]) == expected["terminated"]
        assert float(batch["truncated"][i]) == expected["truncated"]


# ---------------------------------------------------------------------------------------------- the example
def test_two_envs_n_step_return_never_mixes_envs(tmp_path: Any) -> None:
    """Rewards 1 (env 0) and 100 (env 1), gamma 1: 2-step returns are 2 and 200 (1 and 100 at the head), never 101."""
    rb = ReplayBuffer("cpu", "cpu", 10, seed=0, storage_dir=tmp_path, num_envs=2)
    for t in range(3):
        rb.add(
            {
                "state": torch.tensor([[t, 0], [t, 1]], dtype=torch.float32),
                "reward": torch.tensor([1.0, 100.0]),
                "next_state": torch.tensor([[t + 1, 0], [t + 1, 1]], dtype=torch.float32),
                "terminated": torch.zeros(2),
                "truncated": torch.zeros(2),
            }
        )
    assert len(rb) == 6 and rb.pointer == 6
    batch = rb.sample_batch(200, n_step=2, gamma=1.0)
    env = batch["index"] % 2
    step = batch["index"] // 2
    expected = torch.where(env == 0, 1.0, 100.0) * torch.where(step < 2, 2.0, 1.0)
    assert torch.equal(batch["reward"], expected)
    assert torch.equal(batch["next_state"][:, 1], env.float())  # bootstraps from the same env
    assert set(batch["index"].tolist()) == set(range(6))


@settings(max_examples=40, deadline=None)
@given(
    num_envs=st.sampled_from([1, 2, 3]),
    steps_capacity=st.integers(1, 12),
    steps=st.integers(1, 30),
    n_step=st.integers(2, 5),  # n_step=1 samples carry no "discount" (a separate contract item)
    gamma=st.sampled_from([1.0, 0.9, 0.5]),
    p_end=st.sampled_from([0.0, 0.2, 0.5]),
    cuts=st.lists(st.integers(0, 30), max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_n_step_matches_per_env_reference_also_at_each_write_head(
    tmp_path_factory: Any,
    num_envs: int,
    steps_capacity: int,
    steps: int,
    n_step: int,
    gamma: float,
    p_end: float,
    cuts: list[int],
    seed: int,
) -> None:
    rows = env_steps(steps, num_envs, seed, p_end)
    with ReplayBuffer(
        "cpu", "cpu", steps_capacity * num_envs, seed=seed, storage_dir=tmp_path_factory.mktemp("b"), num_envs=num_envs
    ) as rb:
        add_in_chunks(rb, rows, cuts)
        assert len(rb) == min(steps, steps_capacity) * num_envs
        refs = [n_step_reference(s, n_step, gamma) for s in streams(rows, steps_capacity)]
        batch = rb.sample_batch(4 * len(rb), n_step=n_step, gamma=gamma)
        check_n_step(batch, refs, gamma, num_envs)
        # every env's newest row (its write head) sums only its own reward
        newest = rb.sample_batch(64, n_step=n_step, gamma=gamma, recent=num_envs)
        assert sorted(set(newest["env"].tolist())) == list(range(num_envs))
        assert set(newest["step"].tolist()) == {steps - 1}
        check_n_step(newest, refs, gamma, num_envs)


# ---------------------------------------------------------------------------------------------- writes
def test_add_stores_one_row_per_env_in_time_major_slots(tmp_path: Any) -> None:
    rows = env_steps(4, 3, seed=1, p_end=0.3)
    by_add = ReplayBuffer("cpu", "cpu", 12, storage_dir=tmp_path, num_envs=3)
    for t in range(4):
        by_add.add(TensorDict({k: v[t] for k, v in rows.items()}, batch_size=[3]))
    by_batch = ReplayBuffer("cpu", "cpu", 12, storage_dir=tmp_path, num_envs=3)
    by_batch.add_batch(TensorDict(rows, batch_size=[4, 3]))
    for rb in (by_add, by_batch):
        assert len(rb) == 12 and rb.pointer == 0
        stored = rb.sample_by_index(range(12))
        assert stored["step"].tolist() == [t for t in range(4) for _ in range(3)]
        assert stored["env"].tolist() == [0, 1, 2] * 4


def test_add_batch_bigger_than_capacity_keeps_newest_whole_steps(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 6, storage_dir=tmp_path, num_envs=2)
    rb.add_batch(env_steps(5, 2, seed=0, p_end=0.0))
    assert len(rb) == 6 and rb.pointer == 4  # 10 rows into 6: as upstream, the pointer moved 10 slots
    everything = rb.sample_all()
    assert everything["step"].tolist() == [[2, 2], [3, 3], [4, 4]]
    assert everything["env"].tolist() == [[0, 1]] * 3


@pytest.mark.parametrize(
    "write",
    [
        lambda rb: rb.add({"reward": torch.zeros(3), "obs": torch.zeros(3, 2)}),  # 3 envs, buffer has 2
        lambda rb: rb.add({"reward": torch.zeros(2), "obs": torch.zeros(3, 2)}),  # one key disagrees
        lambda rb: rb.add({"reward": 0.0, "obs": np.zeros((2, 2))}),  # a scalar for all envs
        lambda rb: rb.add(TensorDict(reward=torch.zeros(()), obs=torch.zeros(2))),  # one transition
        lambda rb: rb.add(TensorDict(reward=torch.zeros(3), obs=torch.zeros(3, 2), batch_size=[3])),
        lambda rb: rb.add_batch({"reward": torch.zeros(4, 3), "obs": torch.zeros(4, 3, 2)}),
        lambda rb: rb.add_batch({"reward": torch.zeros(4), "obs": torch.zeros(4, 2)}),
        lambda rb: rb.add_batch({"reward": torch.zeros(4, 2), "obs": torch.zeros(5, 2, 2)}),
        lambda rb: rb.add_batch(TensorDict(reward=torch.zeros(4, 3), obs=torch.zeros(4, 3, 2), batch_size=[4, 3])),
    ],
)
def test_a_write_of_the_wrong_num_envs_raises_schema_error_and_changes_nothing(tmp_path: Any, write: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path, num_envs=2)
    rb.add({"reward": torch.tensor([1.0, 2.0]), "obs": torch.ones(2, 2)})
    before = rb.sample_all().to_dict()
    with pytest.raises(SchemaError, match="num_envs"):
        write(rb)
    assert len(rb) == 2 and rb.pointer == 2
    after = rb.sample_all().to_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_first_write_of_the_wrong_num_envs_raises_too(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path, num_envs=2)
    with pytest.raises(SchemaError, match="num_envs"):
        rb.add({"reward": torch.zeros(3)})
    assert len(rb) == 0 and rb.schema is None


@pytest.mark.parametrize("kwargs", [{"num_envs": 0}, {"num_envs": 2.0}, {"num_envs": True}])
def test_num_envs_must_be_a_positive_int(tmp_path: Any, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError, match="num_envs"):
        ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path, **kwargs)


def test_buffer_size_must_be_a_multiple_of_num_envs(tmp_path: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"buffer_size 10 .*num_envs 4"):
        ReplayBuffer("cpu", "cpu", 10, storage_dir=tmp_path, num_envs=4)
    rb = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path, num_envs=4)
    with pytest.raises(InvalidArgumentError, match="num_envs"):
        rb.reset(6)
    assert rb.buffer_size == 8


def test_num_envs_1_is_the_default_and_add_takes_one_transition(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 5, storage_dir=tmp_path)
    assert rb.num_envs == 1
    rb.add({"reward": 1.0, "obs": torch.zeros(2)})
    rb.add_batch({"reward": torch.zeros(3), "obs": torch.zeros(3, 2)})
    assert rb.sample_all().batch_size == torch.Size([4])


# ---------------------------------------------------------------------------------------------- sample_all
@pytest.mark.parametrize("steps", [3, 4, 9])
def test_sample_all_is_steps_by_envs_in_time_order_after_the_ring_wraps(tmp_path: Any, steps: int) -> None:
    rb = ReplayBuffer("cpu", "cpu", 12, storage_dir=tmp_path, num_envs=3)
    rows = env_steps(steps, 3, seed=0, p_end=0.2)
    add_in_chunks(rb, rows, [1, 2, 5])
    everything = rb.sample_all()
    kept = min(steps, 4)
    assert everything.batch_size == torch.Size([kept, 3])
    assert torch.equal(everything["step"], rows["step"][steps - kept :])
    assert torch.equal(everything["env"], rows["env"][steps - kept :])
    assert torch.equal(everything["reward"], rows["reward"][steps - kept :])
    assert torch.equal(everything["index"] % 3, rows["env"][steps - kept :])


# ---------------------------------------------------------------------------------------------- slices
@settings(max_examples=40, deadline=None)
@given(
    num_envs=st.sampled_from([1, 2, 3]),
    steps_capacity=st.integers(1, 12),
    steps=st.integers(1, 30),
    slice_len=st.integers(1, 5),
    pad=st.booleans(),
    p_end=st.sampled_from([0.0, 0.2, 0.5]),
    seed=st.integers(0, 2**31 - 1),
)
def test_slices_never_cross_envs_and_match_per_env_reference(
    tmp_path_factory: Any,
    num_envs: int,
    steps_capacity: int,
    steps: int,
    slice_len: int,
    pad: bool,
    p_end: float,
    seed: int,
) -> None:
    rows = env_steps(steps, num_envs, seed, p_end)
    per_env = streams(rows, steps_capacity)
    # reference: every valid (env, first step, real length) from the per-env lists
    valid: set[tuple[int, int, int]] = set()
    for e, stream in enumerate(per_env):
        ends = [bool(r["terminated"] or r["truncated"]) for r in stream]
        for p in range(len(stream)):
            length = 0
            while p + length < len(stream) and length < slice_len:
                length += 1
                if ends[p + length - 1]:
                    break
            starts_segment = p == 0 or ends[p - 1]
            if length == slice_len or (pad and starts_segment):
                valid.add((e, stream[p]["step"], length))
    with ReplayBuffer(
        "cpu", "cpu", steps_capacity * num_envs, seed=seed, storage_dir=tmp_path_factory.mktemp("b"), num_envs=num_envs
    ) as rb:
        rb.add_batch(as_batch(rows, num_envs))
        if slice_len > steps_capacity:
            with pytest.raises(InvalidArgumentError, match="slice_len"):
                rb.sample_slices(4, slice_len, pad=pad)
            return
        if not valid:
            with pytest.raises(EmptyBufferError):
                rb.sample_slices(4, slice_len, pad=pad)
            return
        batch = rb.sample_slices(64, slice_len, pad=pad)
        assert batch.batch_size == torch.Size([64, slice_len])
        mask = batch["mask"] if pad else torch.ones(64, slice_len, dtype=torch.bool)
        for i in range(64):
            real = int(mask[i].sum())
            assert mask[i, :real].all()  # real rows first, then padding
            env, first = int(batch["env"][i, 0]), int(batch["step"][i, 0])
            assert (env, first, real) in valid
            assert batch["env"][i, :real].tolist() == [env] * real
            assert batch["step"][i, :real].tolist() == list(range(first, first + real))
        # the exact table of valid starts is the reference's
        ends = ("terminated", "truncated")
        stored = StoredRows(rb.engine.storage.columns, ends, rb.engine.ring, num_envs)
        slots = stored.slots(_all_valid_starts(stored, slice_len, pad, torch.device("cpu")))
        table = rb.sample_by_index(slots)
        assert {(int(e), int(s)) for e, s in zip(table["env"], table["step"], strict=True)} == {
            (e, s) for e, s, _ in valid
        }


# ---------------------------------------------------------------------------------------------- recent windows
def test_recent_windows_cover_whole_steps(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 12, seed=0, storage_dir=tmp_path, num_envs=3)
    rb.add_batch(env_steps(6, 3, seed=0, p_end=0.0))  # steps 2..5 stored
    batch = rb.sample_batch(300, recent=4)  # 4 rows round up to 2 whole steps (6 rows)
    assert set(zip(batch["step"].tolist(), batch["env"].tolist(), strict=True)) == {
        (s, e) for s in (4, 5) for e in range(3)
    }
    epoch = list(rb.create_epoch_iterator(4, recent=4))
    seen = torch.cat([b["step"] for b in epoch]).tolist()
    assert seen == [4, 4, 4, 5, 5, 5]
    assert rb.get_steps_and_iterator(2, 0, 4, recent=4) == 2 * 2  # ceil(6 / 4) batches per epoch


# ---------------------------------------------------------------------------------------------- checkpoints
def test_checkpoint_round_trip_keeps_num_envs(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, seed=3, storage_dir=tmp_path, num_envs=2)
    rb.add_batch(env_steps(5, 2, seed=0, p_end=0.3))
    rb.save(tmp_path / "ckpt", data=True)
    restored = ReplayBuffer.from_checkpoint(tmp_path / "ckpt", storage_dir=tmp_path)
    assert restored.num_envs == 2
    assert restored.sample_all().batch_size == torch.Size([4, 2])
    assert torch.equal(restored.sample_all()["step"], rb.sample_all()["step"])
    assert torch.equal(
        restored.sample_batch(16, n_step=3, gamma=0.9)["reward"], rb.sample_batch(16, n_step=3, gamma=0.9)["reward"]
    )
    empty = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path)  # an empty buffer adopts what was saved
    empty.load(tmp_path / "ckpt")
    assert empty.num_envs == 2


def test_loading_another_num_envs_into_a_buffer_with_rows_is_a_checkpoint_error(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path, num_envs=2)
    rb.add_batch(env_steps(2, 2, seed=0, p_end=0.0))
    rb.save(tmp_path / "ckpt", data=True)
    other = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path, num_envs=4)
    other.add(TensorDict({k: v[0] for k, v in env_steps(1, 4, seed=0, p_end=0.0).items()}, [4]))
    with pytest.raises(CheckpointError, match="num_envs"):
        other.load(tmp_path / "ckpt")
    assert other.num_envs == 4 and len(other) == 4


def test_a_checkpoint_without_num_envs_loads_as_one_env(tmp_path: Any) -> None:
    one = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path)
    one.add_batch({"reward": torch.arange(5.0)})
    one.save(tmp_path / "one", data=True)
    edit_manifest(tmp_path / "one", lambda m: m["ring"].__contains__("num_envs") and m.clear())  # as before: absent
    assert ReplayBuffer.from_checkpoint(tmp_path / "one", storage_dir=tmp_path).num_envs == 1
    two = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path, num_envs=2)
    two.add_batch({"reward": torch.arange(6.0).reshape(3, 2)})
    two.save(tmp_path / "old", data=True)
    edit_manifest(tmp_path / "old", lambda m: m["ring"].pop("num_envs"))  # as a checkpoint from before num_envs
    restored = ReplayBuffer.from_checkpoint(tmp_path / "old", storage_dir=tmp_path)
    assert restored.num_envs == 1
    assert restored.sample_all()["reward"].tolist() == [0, 1, 2, 3, 4, 5]


def test_a_manifest_with_a_num_envs_that_does_not_divide_the_ring_is_refused(tmp_path: Any) -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path, num_envs=2)
    rb.add_batch(env_steps(1, 2, seed=0, p_end=0.0))
    rb.save(tmp_path / "ckpt", data=True)
    edit_manifest(tmp_path / "ckpt", lambda m: m["ring"].update(num_envs=3))
    with pytest.raises(CheckpointError, match="num_envs"):
        ReplayBuffer.from_checkpoint(tmp_path / "ckpt", storage_dir=tmp_path)


# ---------------------------------------------------------------------------------------------- prioritized
def test_prioritized_buffer_with_num_envs(tmp_path: Any) -> None:
    rb = PrioritizedReplayBuffer("cpu", "cpu", 8, seed=0, storage_dir=tmp_path, num_envs=2, alpha=1.0)
    rows = env_steps(3, 2, seed=0, p_end=0.0)
    rb.add({k: v[0] for k, v in rows.items()})
    assert rb.priorities().tolist() == [1.0, 1.0]
    rb.update_priority([0, 1], [5.0, 0.5])
    rb.add({k: v[1] for k, v in rows.items()})  # both envs' rows get the running maximum
    rb.add_batch({k: v[2:] for k, v in rows.items()})
    assert rb.priorities().tolist() == [5.0, 0.5, 5.0, 5.0, 5.0, 5.0]
    refs = [n_step_reference(s, 2, 0.5) for s in streams(rows, 4)]
    batch = rb.sample_batch(100, n_step=2, gamma=0.5)
    check_n_step(batch, refs, 0.5, 2)
    assert (batch["weight"] <= 1).all()


# ---------------------------------------------------------------------------------------------- gymnasium
def test_gymnasium_make_vec_loop_keeps_each_env_stream(tmp_path: Any) -> None:
    gym = pytest.importorskip("gymnasium")
    num_envs, steps = 4, 60
    envs = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")
    rb = ReplayBuffer("cpu", "cpu", 40 * num_envs, seed=0, storage_dir=tmp_path, num_envs=num_envs)
    per_env: list[list[dict[str, Any]]] = [[] for _ in range(num_envs)]
    obs, _ = envs.reset(seed=0)
    envs.action_space.seed(0)
    for t in range(steps):
        action = envs.action_space.sample()
        next_obs, reward, terminated, truncated, _ = envs.step(action)
        rb.add(
            {
                "state": obs,
                "action": action,
                "reward": reward,
                "next_state": next_obs,
                "terminated": terminated,
                "truncated": truncated,
                "step": np.full(num_envs, t),
            }
        )
        for e in range(num_envs):
            per_env[e].append(
                {
                    "reward": float(reward[e]),
                    "terminated": bool(terminated[e]),
                    "truncated": bool(truncated[e]),
                    "step": t,
                }
            )
        obs = next_obs
    envs.close()
    everything = rb.sample_all()
    assert everything.batch_size == torch.Size([40, num_envs])
    # each env's rows chain: next_state of step t is the state of step t + 1 (gymnasium's next-step autoreset)
    assert torch.equal(everything["next_state"][:-1], everything["state"][1:])
    refs = [n_step_reference(s[-40:], 5, 0.9) for s in per_env]
    batch = rb.sample_batch(512, n_step=5, gamma=0.9)
    for i in range(512):
        env, step = int(batch["index"][i]) % num_envs, int(batch["step"][i])
        expected = refs[env][step]
        assert float(batch["reward"][i]) == pytest.approx(expected["reward"], abs=1e-5)
        assert float(batch["discount"][i]) == pytest.approx(expected["discount"], rel=1e-6)
        assert bool(batch["terminated"][i]) == expected["terminated"]


def test_from_checkpoint_refuses_another_num_envs_and_builds_the_saved_one(tmp_path: Any) -> None:
    rb = PrioritizedReplayBuffer("cpu", "cpu", 6, storage_dir=tmp_path, num_envs=3)
    rb.add_batch(env_steps(1, 3, seed=0, p_end=0.0))
    rb.save(tmp_path / "ckpt", data=True)
    with pytest.raises(CheckpointError, match="num_envs"):
        ReplayBuffer.from_checkpoint(tmp_path / "ckpt", storage_dir=tmp_path, num_envs=2)
    restored = PrioritizedReplayBuffer.from_checkpoint(tmp_path / "ckpt", storage_dir=tmp_path, num_envs=3)
    assert restored.num_envs == 3 and restored.priorities().tolist() == [1.0] * 3
    restored.add({k: v[0] for k, v in env_steps(1, 3, seed=1, p_end=0.0).items()})
    assert restored.sample_all().batch_size == torch.Size([2, 3])


def test_a_metadata_only_load_needs_counters_of_whole_env_steps(tmp_path: Any) -> None:
    one = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path)
    one.add_batch({"reward": torch.arange(3.0)})
    one.save(tmp_path / "odd")  # ObjectRL's save: counters only, pointer 3
    one.add({"reward": 3.0})
    one.save(tmp_path / "even")
    rb = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path, num_envs=2)
    with pytest.raises(CheckpointError, match="num_envs=2"):
        rb.load(tmp_path / "odd")
    assert (len(rb), rb.pointer, rb.num_envs) == (0, 0, 2)
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):
        rb.load(tmp_path / "even")
    assert (len(rb), rb.pointer, rb.num_envs) == (4, 4, 2)


# ---------------------------------------------------------------------------------------------- the num_envs trap
def gym_vector_step(num_envs: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One step of gymnasium's vector CartPole as its arrays come (float32 obs, int64 actions, float64 rewards)."""
    return {
        "state": rng.standard_normal((num_envs, 4)).astype(np.float32),
        "action": rng.integers(0, 2, num_envs),
        "reward": np.ones(num_envs),
        "next_state": rng.standard_normal((num_envs, 4)).astype(np.float32),
        "terminated": np.zeros(num_envs, dtype=bool),
        "truncated": np.zeros(num_envs, dtype=bool),
    }


def test_first_write_of_a_vector_step_without_num_envs_warns_once_naming_num_envs() -> None:
    from objectrl_buffer.errors import VectorStepWarning

    rng = np.random.default_rng(0)
    rb = ReplayBuffer("cpu", "cpu", 100)
    with pytest.warns(VectorStepWarning, match=r"num_envs=4") as caught:
        rb.add(gym_vector_step(4, rng))
    assert caught[0].filename == __file__  # points at the user's add()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):  # once: later writes are silent
            rb.add(gym_vector_step(4, rng))
    assert len(rb) == 4  # still stored as asked (a warning, not a refusal)


@pytest.mark.parametrize(
    "row",
    [
        {"state": np.zeros((4, 4)), "action": np.zeros(4), "reward": 1.0, "terminated": False},  # vector state
        {"state": np.zeros(4), "action": np.zeros(4), "reward": np.zeros(1), "terminated": np.zeros(1)},
        {"tokens": np.zeros(128, dtype=np.int64), "mask": np.ones(128, dtype=bool)},  # sequence rows
        {"state": np.zeros((3, 4)), "reward": np.zeros(4)},  # leading sizes differ
    ],
)
def test_rows_that_are_one_transition_do_not_warn(row: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ReplayBuffer("cpu", "cpu", 100).add(row)


def test_a_vector_step_into_a_num_envs_buffer_does_not_warn() -> None:
    rb = ReplayBuffer("cpu", "cpu", 100, num_envs=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.add(gym_vector_step(4, np.random.default_rng(0)))
        ReplayBuffer("cpu", "cpu", 100).add_batch(gym_vector_step(4, np.random.default_rng(0)))  # 4 rows
    assert len(rb) == 4
