"""Where a RemoteBuffer's actors run (issue 23, "Placement"): ``launch(placement=..., coordinator_options=...)``
with Ray's placement groups and node affinity (see objectrl_buffer/distributed/placement.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.remote import RemoteBuffer
from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.flow import MinSize
from tests.support import rows

ray = pytest.importorskip("ray")


def launch(tmp: Any, shards: int = 2, **kwargs: Any) -> RemoteBuffer:
    return RemoteBuffer.launch(
        ReplayBuffer, "cpu", "cpu", 100, num_shards=shards, seed=0, storage_dir=str(tmp), retry_timeout_s=5, **kwargs
    )


def test_a_spread_placement_group_is_made_and_removed_by_kill(local_ray: None, tmp_path: Path) -> None:
    from ray.util.placement_group import placement_group_table

    remote = launch(tmp_path, placement="spread")
    group = remote.placement_group
    assert group is not None and placement_group_table(group)["strategy"] == "SPREAD"
    remote.add_batch(rows(0, 4))
    assert len(remote) == 4
    remote.kill()
    assert placement_group_table(group)["state"] == "REMOVED"


def test_node_ids_and_a_group_of_the_callers(local_ray: None, tmp_path: Path) -> None:
    from ray.util.placement_group import placement_group, remove_placement_group

    here = ray.get_runtime_context().get_node_id()
    remote = launch(tmp_path, placement=[here, here], rate_limiter=MinSize(1))
    assert remote.node_ids() == [here, here]
    assert ray.get(remote.coordinator.node_id.remote()) == here  # by default on the launching driver's node
    remote.kill()
    group = placement_group([{"CPU": 0.01}, {"CPU": 0.01}], strategy="PACK")
    remote = launch(tmp_path, placement=group)
    remote.add_batch(rows(0, 3))
    remote.kill()  # a group of the caller's is left to the caller
    assert ray.util.placement_group_table(group)["state"] == "CREATED"
    remove_placement_group(group)


@pytest.mark.parametrize(
    ("placement", "match"),
    [("wide", "placement"), (["not-a-node", "x"], "node"), (["a"], "one per shard"), (3, "placement")],
)
def test_a_bad_placement_is_refused(local_ray: None, tmp_path: Path, placement: Any, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        launch(tmp_path, placement=placement)


def test_bad_coordinator_options_are_refused(local_ray: None, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="coordinator_options"):
        launch(tmp_path, coordinator_options=["num_cpus"], rate_limiter=MinSize(1))
    with pytest.raises(InvalidArgumentError, match="coordinator_options"):
        launch(tmp_path, coordinator_options={"name": "c"}, rate_limiter=MinSize(1))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shard_loss": "ignore"}, "shard_loss must be one of"),
        ({"shard_timeout_s": 0}, "shard_timeout_s"),
        ({"detached": True}, "detached=True needs a name"),
        ({"coordinator_options": {"num_cpus": 0}}, "has no coordinator"),
        ({"metrics": "yes"}, "metrics must be True or False"),
        ({"max_restarts": -2, "checkpoint_path": "ckpt"}, "max_restarts must be an int >= -1"),
        ({"max_restarts": 1}, "without a checkpoint_path"),
    ],
)
def test_a_bad_launch_argument_is_refused_before_anything_starts(
    local_ray: None, tmp_path: Path, kwargs: Any, match: str
) -> None:
    """Each is refused with InvalidArgumentError naming it, and no actor is left (nothing was started)."""
    from ray._private import state

    def alive() -> int:
        return sum(1 for a in state.actors().values() if a["State"] != "DEAD")

    before = alive()
    with pytest.raises(InvalidArgumentError, match=match):
        launch(tmp_path, **kwargs)
    assert alive() == before


class _Busy:
    def ping(self) -> int:
        return 1


def test_a_launch_on_a_cluster_whose_cpus_are_all_taken_starts_its_coordinator(local_ray: None, tmp_path: Path) -> None:
    """Review of issue 23: env actors holding every CPU of the cluster (a full RL cluster) must not keep the
    coordinator from starting. (Failed with the coordinator's 0.001 CPU: ``launch`` waited forever; it asks for
    one byte of Ray's ``memory`` resource now. A restarted coordinator on a full cluster would likewise never
    have been scheduled.)"""
    import threading

    cpus = ray.available_resources().get("CPU", 0.0)
    busy = [ray.remote(_Busy).options(num_cpus=cpus).remote()]
    ray.get(busy[0].ping.remote())
    launched: list[Any] = []
    thread = threading.Thread(target=lambda: launched.append(launch(tmp_path, rate_limiter=MinSize(1))), daemon=True)
    try:
        thread.start()
        thread.join(30)
        started = not thread.is_alive()
    finally:
        for actor in busy:
            ray.kill(actor)
        thread.join(60)  # the CPUs are free: the launch completes
        for remote in launched:
            remote.kill()
    assert started, "launch waited 30 s for a CPU for its coordinator"
