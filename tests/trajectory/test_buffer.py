"""TrajectoryReplayBuffer in memory: arguments, adds, the sampling window, capacity, lifecycle."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer.errors import (
    ClosedBufferError,
    EmptyBufferError,
    InvalidArgumentError,
    PartialCheckpointWarning,
    SchemaError,
)
from objectrl_buffer.trajectory import Trajectory
from objectrl_buffer.trajectory.rows import RowStore
from tests.trajectory.common import marked


def markers(batch: TensorDict) -> list[int]:
    return batch["rewards"].long().tolist()


# ---------------------------------------------------------------------- constructor
def test_positional_order_is_the_seed_docs(make: Any, tmp_path: Any) -> None:
    rb = make(7, False, 3, str(tmp_path / "d"), "pkl", 9, True)
    assert (rb.seed, rb.enable_cache, rb.cache_size, rb.storage_dir) == (7, False, 3, str(tmp_path / "d"))
    assert (rb.storage_format, rb.sample_window_size, rb.save_trajectories) == ("pkl", 9, True)


def test_rlinf_03_names_are_keyword_aliases(make: Any, tmp_path: Any) -> None:
    rb = make(auto_save=True, auto_save_path=str(tmp_path), trajectory_format="pkl")
    assert (rb.save_trajectories, rb.storage_dir, rb.storage_format) == (True, str(tmp_path), "pkl")
    with pytest.raises(ValueError, match="storage_format='pt' and its alias trajectory_format='pkl'"):
        make(storage_format="pt", trajectory_format="pkl")


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"save_trajectories": True}, "storage_dir"),
        ({"storage_format": "json"}, "storage_format"),
        ({"sample_window_size": -1}, "sample_window_size"),
        ({"cache_size": 1.5}, "cache_size"),
        ({"capacity": 0}, "capacity"),
        ({"seed": "1"}, "seed"),
    ],
)
def test_bad_arguments_are_value_errors_naming_them(make: Any, kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        make(**kwargs)


def test_global_rng_is_never_touched(make: Any) -> None:
    np.random.seed(5)
    torch.manual_seed(5)
    random.seed(5)
    expected = (np.random.get_state()[1].copy(), torch.get_rng_state(), random.getstate())
    rb = make(seed=1)
    rb.add_trajectories([marked(0)])
    rb.sample(8)
    assert np.array_equal(np.random.get_state()[1], expected[0])
    assert torch.equal(torch.get_rng_state(), expected[1]) and random.getstate() == expected[2]


# ---------------------------------------------------------------------- adding
def test_rows_are_time_major_and_dict_fields_nested(make: Any) -> None:
    rb = make(seed=0)
    rb.add_trajectories([marked(3, T=2, B=3)])
    batch = rb.sample(10_000)
    assert batch.batch_size == torch.Size([6])  # clipped to the window's transitions
    assert batch["curr_obs", "state"].shape == (6, 3) and batch["next_obs", "state"].shape == (6, 3)
    assert set(batch["actions"].squeeze(-1).long().tolist()) <= {3000 + r for r in range(6)}
    assert (rb.total_samples, len(rb), rb.trajectory_ids) == (6, 1, [0])


def test_done_like_fields_drop_the_first_row_of_each_epoch(make: Any) -> None:
    T, B, E = 6, 2, 3
    traj = marked(1, T=T, B=B, epochs=E)
    traj.dones = torch.arange((T + E) * B).reshape(T + E, B)  # values tell rows apart
    rb = make(seed=0)
    rb.add_trajectories([traj])
    pairs: dict[int, int] = {}
    for _ in range(60):  # 12 draws each (clipped to T*B), 720 in all: every row is seen
        batch = rb.sample(12)
        pairs.update(zip(batch["actions"].squeeze(-1).long().tolist(), batch["dones"].tolist(), strict=True))
    kept = [row for e in range(E) for row in range(e * (T // E + 1) + 1, (e + 1) * (T // E + 1))]  # plain model
    expected = {1000 + t * B + b: kept[t] * B + b for t in range(T) for b in range(B)}
    assert pairs == expected  # every row, each with its aligned done


def test_tensordict_trajectories_are_accepted(make: Any) -> None:
    rb = make(seed=0)
    td = TensorDict({"rewards": torch.ones(4, 2), "obs": {"x": torch.zeros(4, 2, 5)}}, batch_size=[4, 2])
    rb.add_trajectories(td)
    assert rb.sample(3)["obs", "x"].shape == (3, 5) and rb.total_samples == 8


@pytest.mark.parametrize(
    "bad, word",
    [
        (Trajectory(actions=torch.zeros(4, 2)), "no samples"),
        (Trajectory(rewards=torch.zeros(0, 2)), "no samples"),
        (Trajectory(rewards=torch.zeros(4, 2), actions=torch.zeros(3, 2)), "actions"),
        (Trajectory(rewards=torch.zeros(4, 2), dones=torch.zeros(7, 2)), "dones"),
        (Trajectory(rewards=torch.zeros(4, 2), model_weights_id="../x"), "model_weights_id"),
        (TensorDict({"r": torch.zeros(4)}, batch_size=[4]), r"\[T, B\]"),
    ],
)
def test_bad_trajectories_raise_and_store_nothing(make: Any, bad: Any, word: str) -> None:
    rb = make(seed=0)
    rb.add_trajectories([marked(0)])
    before = (rb.trajectory_ids, rb.total_samples, rb.generator.get_state())
    with pytest.raises(ValueError, match=word):
        rb.add_trajectories([marked(1), bad])  # the good one before it is not stored either
    assert (rb.trajectory_ids, rb.total_samples) == before[:2] and torch.equal(rb.generator.get_state(), before[2])


def test_a_different_schema_is_a_schema_error(make: Any) -> None:
    rb = make(seed=0)
    rb.add_trajectories([marked(0)])
    with pytest.raises(SchemaError, match=r"curr_obs\.state"):
        rb.add_trajectories([Trajectory(rewards=torch.zeros(2, 2), prev_logprobs=torch.zeros(2, 2))])


# ---------------------------------------------------------------------- sampling
def test_window_one_samples_only_the_newest(make: Any) -> None:
    rb = make(seed=0, sample_window_size=1)
    for m in range(5):
        rb.add_trajectories([marked(m)])
        assert set(markers(rb.sample(64))) == {m}


def test_window_zero_samples_from_all(make: Any) -> None:
    rb = make(seed=0, sample_window_size=0)
    rb.add_trajectories([marked(m) for m in range(5)])
    assert set(markers(rb.sample(2000))) == set(range(5))


def test_shares_are_proportional_to_samples_chi_square(make: Any) -> None:
    sizes = [(2, 2), (4, 4), (8, 2), (3, 5), (6, 6)]  # T*B: 4, 16, 16, 15, 36
    rb = make(seed=123, sample_window_size=4)
    rb.add_trajectories([marked(m, T=T, B=B) for m, (T, B) in enumerate(sizes)])
    counts = np.bincount(markers(rb.sample(20_000)), minlength=5)
    assert counts[0] == 0  # outside the window of 4
    expected = np.array([T * B for T, B in sizes[1:]], dtype=float)
    expected = expected / expected.sum() * counts[1:].sum()
    chi2 = float(((counts[1:] - expected) ** 2 / expected).sum())
    assert chi2 < 16.27  # the 0.999 quantile of chi-square with 3 degrees of freedom


def test_same_seed_and_adds_give_identical_samples(make: Any) -> None:
    def draws(seed: int) -> list[torch.Tensor]:
        rb = make(seed=seed, sample_window_size=3)
        out = []
        for m in range(5):
            rb.add_trajectories([marked(m, T=3 + m, B=2)])
            out.append(rb.sample(50)["actions"])
        return out

    a, b, c = draws(9), draws(9), draws(10)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_empty_buffer_and_bad_num_chunks(make: Any) -> None:
    rb = make(seed=0)
    with pytest.raises(RuntimeError, match=r"^Cannot sample from an empty buffer\.$") as info:
        rb.sample(4)
    assert isinstance(info.value, EmptyBufferError)
    rb.add_trajectories([marked(0)])
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="num_chunks"):
            rb.sample(bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- capacity
def test_capacity_evicts_whole_oldest_trajectories_like_a_list_model(make: Any) -> None:
    rng = random.Random(0)
    rb = make(seed=0, sample_window_size=0, capacity=40)
    model: list[tuple[int, int]] = []  # (id, n): a plain list of what must be stored
    for m in range(30):
        T, B = rng.randint(1, 5), rng.randint(1, 4)
        rb.add_trajectories([marked(m, T=T, B=B)])
        model.append((m, T * B))
        while sum(n for _, n in model) > 40:
            model.pop(0)
        assert rb.trajectory_ids == [i for i, _ in model]
        assert rb.total_samples == sum(n for _, n in model)
        batch = rb.sample(500)
        assert set(markers(batch)) <= {i for i, _ in model}
        rows = batch["actions"].squeeze(-1).long()
        assert bool(((rows % 1000) < torch.tensor([dict(model)[int(r)] for r in rows // 1000])).all())


def test_a_trajectory_larger_than_capacity_is_refused(make: Any) -> None:
    rb = make(seed=0, capacity=10)
    with pytest.raises(ValueError, match="capacity=10"):
        rb.add_trajectories([marked(0, T=6, B=2)])
    assert len(rb) == 0


def test_unbounded_chunks_hold_trajectories_that_straddle_them() -> None:
    store = RowStore(None, torch.device("cpu"), chunk_rows=7)
    schema = None
    firsts = []
    for m in range(6):
        rows = {"x": torch.arange(5, dtype=torch.float32) + 100 * m}
        schema, pairs, n = store.prepare(rows, schema)
        firsts.append(store.append(schema, pairs, n))
    assert len(store.chunks) == 5 and firsts == [0, 5, 10, 15, 20, 25]
    addresses = torch.tensor([0, 6, 7, 13, 14, 29, 22])
    expected = torch.tensor([100 * (a // 5) + a % 5 for a in addresses.tolist()], dtype=torch.float32)
    assert torch.equal(store.gather(addresses)["x"], expected)
    store.close()


# ---------------------------------------------------------------------- what is kept without saving
def test_without_saving_only_the_window_is_kept_and_samples_match_a_buffer_keeping_all(
    make: Any, tmp_path: Any
) -> None:
    """rlinf forces its cache to the window without saving, so a long run's memory stays bounded: so do we.
    Samples are those of a buffer that keeps every trajectory (saving), draw for draw; the chunks of rows
    the kept trajectories no longer use are reused, not piled up."""
    windowed = make(seed=4, sample_window_size=3)
    keeping = make(seed=4, sample_window_size=3, save_trajectories=True, storage_dir=str(tmp_path / "all"))
    assert (windowed.keep, keeping.keep) == (3, None)
    seen_chunks: set[int] = set()
    for m in range(40):
        trajectory = marked(m, T=64, B=8)  # 512 rows
        windowed.add_trajectories([trajectory])
        keeping.add_trajectories([trajectory])
        assert windowed.trajectory_ids == list(range(max(0, m - 2), m + 1))
        assert windowed.total_samples == 512 * min(m + 1, 3) and len(keeping) == m + 1
        a, b = windowed.sample(300), keeping.sample(300)
        assert all(torch.equal(a[k], b[k]) for k in b.keys(include_nested=True, leaves_only=True))
        rows = windowed.rows
        assert rows.chunk_rows == 512  # the first trajectory (more than 3 * 512 // 8 and 64 rows)
        assert len(rows.chunks) <= 4  # 3 * 512 kept rows span at most 4 chunks of 512
        seen_chunks.update(id(c) for c in rows.chunks)
    assert len(seen_chunks) <= 5, "a chunk left with no kept row is reused as the next one"
    keeping.flush()


@pytest.mark.parametrize("kwargs", [{"sample_window_size": 0}, {"capacity": 10_000}, {"save_trajectories": True}])
def test_window_zero_capacity_or_saving_keep_every_trajectory(make: Any, tmp_path: Any, kwargs: dict) -> None:
    if kwargs.get("save_trajectories"):
        kwargs = {**kwargs, "storage_dir": str(tmp_path / "d")}
    rb = make(seed=0, **{"sample_window_size": 2, **kwargs})
    rb.add_trajectories([marked(m) for m in range(6)])
    assert rb.keep is None and rb.trajectory_ids == list(range(6))


def test_is_ready_counts_what_was_added_as_rlinf_does(make: Any) -> None:
    """rlinf's size counts every added trajectory, so a config whose min_buffer_size is larger than the
    window still becomes ready: a windowed buffer counts the same way (num_added), never hanging."""
    rb = make(seed=0, sample_window_size=3)
    rb.add_trajectories([marked(m) for m in range(3)])
    assert not rb.is_ready(4) and not asyncio.run(rb.is_ready_async(np.int64(4)))
    rb.add_trajectories([marked(m) for m in range(3, 5)])
    assert (len(rb), rb.num_added) == (3, 5)
    assert rb.is_ready(4) and rb.is_ready(np.int64(5)) and not rb.is_ready(6)
    with pytest.raises(InvalidArgumentError, match="min_size"):
        rb.is_ready(4.5)  # type: ignore[arg-type]
    rb.clear()
    assert rb.num_added == 0 and not rb.is_ready(1)


def test_a_windowed_buffer_refuses_to_widen_its_window(make: Any) -> None:
    rb = make(seed=0, sample_window_size=3)
    rb.add_trajectories([marked(m) for m in range(6)])
    for wider in (0, 4):
        with pytest.raises(InvalidArgumentError, match="keeps only its newest 3"):
            rb.sample_window_size = wider
    assert rb.sample_window_size == 3
    rb.sample_window_size = 1
    assert set(markers(rb.sample(50))) == {5}
    full = make(seed=0, sample_window_size=3, capacity=1000)
    full.add_trajectories([marked(m) for m in range(6)])
    full.sample_window_size = 0  # keeps everything: any window goes
    assert set(markers(full.sample(2000))) == set(range(6))


def test_checkpoints_of_a_windowed_buffer_hold_the_window_and_loads_keep_the_newest(make: Any, tmp_path: Any) -> None:
    full = make(seed=2, sample_window_size=0)
    full.add_trajectories([marked(m) for m in range(10)])
    full.save_checkpoint(str(tmp_path / "ten"))
    windowed = make(seed=2, sample_window_size=3)
    windowed.load_checkpoint(str(tmp_path / "ten"))
    assert windowed.trajectory_ids == [7, 8, 9]
    windowed.add_trajectories([marked(10)])
    assert windowed.trajectory_ids == [8, 9, 10]  # the id counter goes on from the folder's
    with pytest.warns(PartialCheckpointWarning, match="newest 3 of the 11"):
        windowed.save_checkpoint(str(tmp_path / "window"))
    again = make(seed=0, sample_window_size=0)
    again.load_checkpoint(str(tmp_path / "window"))
    assert again.trajectory_ids == [8, 9, 10]
    assert torch.equal(again.sample(500)["rewards"], windowed.sample(500)["rewards"])  # same seed, same rows


# ---------------------------------------------------------------------- lifecycle
def test_stats_readiness_clear_and_close(make: Any) -> None:
    rb = make(seed=0, cache_size=2)
    rb.add_trajectories([marked(m) for m in range(3)])
    assert rb.get_stats() == {"num_trajectories": 3, "total_samples": 24, "cache_size": 2}
    assert rb.is_ready(3) and not rb.is_ready(4) and asyncio.run(rb.is_ready_async(3))
    rb.clear()
    assert (len(rb), rb.total_samples) == (0, 0)
    rb.add_trajectories([marked(7)])
    assert rb.trajectory_ids == [0] and markers(rb.sample(4)) == [7] * 4
    rb.clear_cache()
    rb.close()
    rb.close()  # idempotent
    # clear() and clear_cache() stay allowed: RLinf's tutorial cleans up with close(); clear(); clear_cache()
    for use in (lambda: rb.sample(1), lambda: rb.add_trajectories([marked(0)]), rb.flush):
        with pytest.raises(ClosedBufferError):
            use()


def test_invalid_argument_errors_subclass_value_error() -> None:
    assert issubclass(InvalidArgumentError, ValueError)
