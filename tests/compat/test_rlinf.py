"""RLinf code on our trajectory buffer with import changes only (issue 26): RLinf's own ``Trajectory`` objects
(any object with its fields), RLinf's nested dict samples and counts, demonstrations without ``versions``, a
public per-trajectory index and read-back, and RLinf's ``close(); clear(); clear_cache()``."""

from __future__ import annotations

import asyncio
import dataclasses
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer.compat import rlinf as compat
from objectrl_buffer.errors import InvalidArgumentError, SchemaError
from objectrl_buffer.trajectory import Trajectory, TrajectoryReplayBuffer
from tests.compat import rlinf_wheel


@dataclasses.dataclass
class UserTrajectory:
    """A user's own dataclass with RLinf's fields (not ours, not RLinf's): accepted by duck typing."""

    max_episode_length: int = 0
    model_weights_id: str = ""
    actions: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    dones: torch.Tensor | None = None
    prev_logprobs: torch.Tensor | None = None
    versions: torch.Tensor | None = None
    forward_inputs: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    curr_obs: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


def fields_of(m: int, T: int = 4, B: int = 2, versions: bool = True, epochs: int = 0) -> dict[str, Any]:
    """Trajectory ``m``'s fields: every value ``m`` (actions ``m*1000 + row``); ``dones`` ``T + epochs`` rows,
    the first of each epoch ``True``."""
    rows = torch.arange(T * B, dtype=torch.float32).reshape(T, B)
    dones = torch.zeros(T + epochs, B, dtype=torch.bool)
    if epochs:
        dones.reshape(epochs, T // epochs + 1, B)[:, 0] = True  # the rows RLinf's alignment drops
    return {
        "max_episode_length": T,
        "model_weights_id": f"w{m}",
        "actions": (m * 1000 + rows).unsqueeze(-1),
        "rewards": torch.full((T, B), float(m)),
        "dones": dones,
        "prev_logprobs": torch.full((T, B), float(m)),
        "versions": torch.full((T, B, 1), float(m + 1)) if versions else None,
        "forward_inputs": {"action": (m * 1000 + rows).unsqueeze(-1)},
        "curr_obs": {"states": torch.full((T, B, 3), float(m))},
    }


@pytest.fixture
def make() -> Iterator[Callable[..., Any]]:
    """Builds buffers (``make(cls, ...)``), each closed after the test."""
    made: list[Any] = []

    def build(cls: Any = compat.TrajectoryReplayBuffer, *args: Any, **kwargs: Any) -> Any:
        made.append(cls(*args, **kwargs))
        return made[-1]

    yield build
    for buffer in made:
        buffer.close()


# ---------------------------------------------------------------------- any object with RLinf's fields
@pytest.mark.parametrize("kind", ["dataclass", "namespace"])
def test_any_object_with_rlinfs_trajectory_fields_is_added(make: Any, kind: str) -> None:
    build = UserTrajectory if kind == "dataclass" else types.SimpleNamespace
    rb = make(TrajectoryReplayBuffer, seed=0, sample_window_size=0)
    rb.add_trajectories([build(**fields_of(0)), build(**fields_of(1))])
    rb.add_trajectories(build(**fields_of(2)))  # one, not in a list, as for our Trajectory
    assert rb.trajectory_ids == [0, 1, 2]
    batch = rb.sample(200)
    assert torch.equal(batch["actions"].squeeze(-1) // 1000, batch["rewards"])  # rows kept together
    assert set(batch["rewards"].tolist()) == {0.0, 1.0, 2.0}


def test_something_without_trajectory_fields_is_still_refused_naming_its_type(make: Any) -> None:
    rb = make(TrajectoryReplayBuffer, seed=0)
    with pytest.raises(InvalidArgumentError, match="got int"):
        rb.add_trajectories([3])
    assert len(rb) == 0


def test_rlinfs_own_trajectory_from_its_rollout_is_added_as_rlinf_flattens_it(make: Any) -> None:
    io = rlinf_wheel.io()
    trajectory = rlinf_wheel.rollout(io, B=3, steps=4, epochs=2)  # dones [T + 2, B, 1]
    rb = make(TrajectoryReplayBuffer, seed=0, sample_window_size=0)
    rb.add_trajectories([trajectory])
    back = rb.get_trajectory(0)
    assert back.batch_size == (8, 3)
    assert torch.equal(back["versions"], trajectory.versions)
    assert torch.equal(back["curr_obs", "main_images"], trajectory.curr_obs["main_images"])
    # the first row of each epoch dropped, as RLinf's _flatten_trajectory does
    assert torch.equal(back["dones"], trajectory.dones.reshape(2, 5, 3, 1)[:, 1:].reshape(8, 3, 1))
    assert rb.trajectory_info(0)["model_weights_id"] == trajectory.model_weights_id


# ---------------------------------------------------------------------- RLinf's dict samples
def test_compat_sample_is_rlinfs_nested_dict(make: Any) -> None:
    rb = make(seed=0, sample_window_size=0)
    rb.add_trajectories([Trajectory(**fields_of(0)), Trajectory(**fields_of(1))])
    batch = rb.sample(num_chunks=5)
    assert type(batch) is dict and set(batch["forward_inputs"]) == {"action"}  # a TypeError on a TensorDict
    assert set(batch) == {"actions", "rewards", "dones", "prev_logprobs", "versions", "forward_inputs", "curr_obs"}
    assert batch["actions"].shape == (5, 1) and batch["curr_obs"]["states"].shape == (5, 3)
    assert batch["rewards"].shape == (5,) and batch["dones"].dtype == torch.bool
    assert torch.equal(batch["forward_inputs"]["action"], batch["actions"])
    assert rb.sample_chunks(100)["rewards"].shape == (16,)  # clipped to the window's transitions, as RLinf
    with pytest.raises(ValueError):
        rb.sample()  # RLinf's default num_chunks=0: refused (upstream asserts)


# ---------------------------------------------------------------------- a field a trajectory lacks
def test_a_trajectory_without_versions_is_stored_with_zeros_and_a_presence_mask(make: Any, tmp_path: Path) -> None:
    rb = make(TrajectoryReplayBuffer, seed=0, sample_window_size=0)
    rb.add_trajectories([Trajectory(**fields_of(0))])
    assert rb.optional_keys == [] and "present" not in rb.sample(4)
    rb.add_trajectories([Trajectory(**fields_of(1, versions=False)), Trajectory(**fields_of(2))])
    assert rb.optional_keys == ["versions"]
    batch = rb.sample(24)
    present = batch["present", "versions"]
    assert present.dtype == torch.bool and present.shape == (24,)
    assert torch.equal(present, batch["rewards"] != 1.0)  # False exactly on trajectory 1's rows
    assert torch.equal(batch["versions"].squeeze(-1), torch.where(present, batch["rewards"] + 1, 0.0))  # fill: 0
    assert rb.trajectory_info(1)["missing"] == ["versions"] and rb.trajectory_info(0)["missing"] == []
    assert "versions" not in rb.get_trajectory(1) and "versions" in rb.get_trajectory(2)

    rb.save_checkpoint(tmp_path / "ck")  # the file leaves the field out, as RLinf writes only what it has
    assert "versions" not in torch.load(next((tmp_path / "ck").glob("trajectory_1_*.pt")), weights_only=True)
    again = make(TrajectoryReplayBuffer, seed=0, sample_window_size=0)
    again.load_checkpoint(tmp_path / "ck")
    assert again.optional_keys == ["versions"] and again.trajectory_info(1)["missing"] == ["versions"]
    loaded = again.sample(24)
    assert torch.equal(loaded["present", "versions"], loaded["rewards"] != 1.0)


def test_a_missing_observation_key_is_still_refused_and_stores_nothing(make: Any) -> None:
    rb = make(TrajectoryReplayBuffer, seed=0)
    rb.add_trajectories([Trajectory(**fields_of(0))])
    lacking = Trajectory(**fields_of(1))
    lacking.curr_obs = {}
    with pytest.raises(SchemaError, match=r"curr_obs\.states"):
        rb.add_trajectories([Trajectory(**fields_of(2, versions=False)), lacking])
    assert rb.trajectory_ids == [0] and rb.optional_keys == []


def test_rlpd_demo_buffer_takes_rlinfs_intervention_trajectories(make: Any, tmp_path: Path) -> None:
    """RLinf's SAC worker: a demo buffer loaded from demonstrations (with ``versions``) gets the trajectories
    ``extract_intervene_traj()`` cuts out of each rollout (without ``versions``), then is sampled half and
    half with the replay buffer and joined with RLinf's ``concat_batch``."""
    io = rlinf_wheel.io()
    demos = make(seed=0, auto_save=True, auto_save_path=str(tmp_path / "demos"))
    demos.add_trajectories([rlinf_wheel.rollout(io, seed=s) for s in range(2)])
    demos.close()
    replay = make(seed=1, sample_window_size=10)
    demo = make(seed=2, sample_window_size=10)
    demo.load_checkpoint(str(tmp_path / "demos"), is_distributed=True, local_rank=0, world_size=1)
    recv_list = [rlinf_wheel.rollout(io, seed=5, intervene=frozenset({(1, 0), (2, 0), (3, 2)}))]
    replay.add_trajectories(recv_list)
    cut = [part for traj in recv_list for part in (traj.extract_intervene_traj() or [])]
    assert len(cut) == 2 and all(part.versions is None for part in cut)
    demo.add_trajectories(cut)  # SchemaError before
    assert replay.is_ready(1) and demo.is_ready(3)
    batch = io.concat_batch(replay.sample(8), demo.sample(8))
    assert batch["actions"].shape == (16, 2) and set(batch["curr_obs"]) == {"states", "main_images"}
    half = demo.sample(300)  # clipped to its 24 + 3 transitions
    present = half["present"]["versions"]
    assert bool(present.any()) and not bool(present.all())
    assert torch.equal(half["versions"][~present], torch.zeros_like(half["versions"][~present]))  # never garbage
    assert torch.equal(half["intervene_flags"][~present], torch.ones_like(half["intervene_flags"][~present]))


# ---------------------------------------------------------------------- the per-trajectory index
def test_a_public_index_and_read_back_by_id(make: Any) -> None:
    rb = make(seed=0, sample_window_size=0)
    rb.add_trajectories([Trajectory(**fields_of(m, versions=m != 1, epochs=2)) for m in range(3)])
    assert rb.trajectory_ids == [0, 1, 2]
    assert rb.trajectory_index[2] == {
        "num_samples": 8,
        "trajectory_id": 2,
        "max_episode_length": 4,
        "shape": [4, 2],
        "model_weights_id": "w2",
        "missing": [],
    }
    one = rb.load_trajectory(1)
    assert isinstance(one, Trajectory) and one.versions is None and one.model_weights_id == "w1"
    assert torch.equal(one.actions, fields_of(1)["actions"])
    assert torch.equal(one.curr_obs["states"], fields_of(1)["curr_obs"]["states"])
    assert torch.equal(one.dones, fields_of(1, epochs=2)["dones"])  # T + E rows, as added and as its file holds
    assert one.max_episode_length == 4 and rb.trajectory_payload(1)["model_weights_id"] == "w1"
    assert rb.get_trajectory(2)["versions"].shape == (4, 2, 1) and rb.get_trajectory(2)["dones"].shape == (4, 2)
    with pytest.raises(InvalidArgumentError, match="trajectory_id=7"):
        rb.trajectory_info(7)
    with pytest.raises(InvalidArgumentError, match="trajectory_id=7"):
        rb.load_trajectory(7)


# ---------------------------------------------------------------------- RLinf's counts and cleanup
def test_counts_are_rlinfs_all_added(make: Any) -> None:
    rb = make(seed=0, sample_window_size=2)  # without saving only the window is kept, as RLinf's forced cache
    for m in range(5):
        rb.add_trajectories([Trajectory(**fields_of(m))])
    assert rb.trajectory_ids == [3, 4]  # what is stored
    assert (len(rb), rb.size, rb.total_samples) == (5, 5, 40)  # what RLinf counts
    assert rb.get_stats() == {"num_trajectories": 5, "total_samples": 40, "cache_size": 2}
    assert rb.is_ready(5) and not rb.is_ready(6)
    room = make(TrajectoryReplayBuffer, seed=0, sample_window_size=2)
    room.add_trajectories([Trajectory(**fields_of(m)) for m in range(5)])
    assert (len(room), room.num_added, room.num_added_samples) == (2, 5, 40)


@pytest.mark.parametrize("cls", [TrajectoryReplayBuffer, compat.TrajectoryReplayBuffer], ids=["room", "compat"])
def test_rlinfs_cleanup_sequence_works(make: Any, cls: Any, tmp_path: Path) -> None:
    rb = make(cls, seed=0, save_trajectories=True, storage_dir=str(tmp_path / "run"))
    rb.add_trajectories([Trajectory(**fields_of(m)) for m in range(3)])
    rb.close()  # close async save thread
    rb.clear()  # clear index and counters
    rb.clear_cache()  # clear cache and close thread
    assert len(rb) == 0 and rb.get_stats() == {"num_trajectories": 0, "total_samples": 0, "cache_size": 0}
    fresh = make(cls, seed=0, sample_window_size=0)
    fresh.load_checkpoint(str(tmp_path / "run"))  # what was added before the close is on disk
    assert len(fresh) == 3


def test_the_tutorial_runs_with_only_the_import_changed(tmp_path: Path) -> None:
    """RLinf's replay buffer tutorial, step by step (seed-era names), with ``from rlinf.data.replay_buffer``
    replaced by ``from objectrl_buffer.compat.rlinf``."""
    from objectrl_buffer.compat.rlinf import TrajectoryReplayBuffer

    buffer = TrajectoryReplayBuffer(
        seed=1234,
        storage_dir=str(tmp_path / "buffer"),
        enable_cache=True,
        cache_size=5,
        storage_format="pt",
        sample_window_size=100,
        save_trajectories=True,
    )
    trajectories = [Trajectory(**fields_of(m)) for m in range(4)]
    buffer.add_trajectories(trajectories)
    batch = buffer.sample(num_chunks=256)
    assert all(value.shape[0] == 32 for value in batch.values() if isinstance(value, torch.Tensor))
    buffer.save_checkpoint(str(tmp_path / "ckpt"))
    buffer.load_checkpoint(str(tmp_path / "ckpt"), is_distributed=True, local_rank=0, world_size=4)
    assert len(buffer) == 1 and asyncio.run(buffer.is_ready_async(1))
    buffer.close()
    buffer.clear()
    buffer.clear_cache()
    assert len(buffer) == 0
