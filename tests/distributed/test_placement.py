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
    [({"shard_loss": "ignore"}, "shard_loss must be one of"), ({"shard_timeout_s": 0}, "shard_timeout_s")],
)
def test_a_bad_shard_loss_or_shard_timeout_is_refused(local_ray: None, tmp_path: Path, kwargs: Any, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        launch(tmp_path, **kwargs)
