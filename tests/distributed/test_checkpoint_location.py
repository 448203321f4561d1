"""Checkpoints on shared storage (issue 23): ``checkpoint_path`` is a local path or a URI fsspec opens, and
``launch`` refuses a location that not every shard and the coordinator can write and read.

One small simulated cluster (``ray.cluster_utils.Cluster``: a head and two worker nodes offering the custom
resource ``w``; the shards ask for a little of it, so they run on the worker nodes, never on the head)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.cut import MANIFEST
from objectrl_buffer.distributed.remote import RemoteBuffer
from objectrl_buffer.errors import CheckpointError
from tests.support import rows

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

FAR = "objectrl-far"  # a protocol registered below: a local folder, but not a LocalFileSystem to the buffer


def register_far() -> None:
    """Register ``objectrl-far://``: fsspec's local file system under another class, so the buffer treats it as
    a non-local store (a shard's save is uploaded with ``fs.put``, a restart downloads it with ``fs.get``).
    Runs in the driver and, as Ray's ``worker_process_setup_hook``, in every worker."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    class FarFileSystem(LocalFileSystem):
        protocol = (FAR,)

    fsspec.register_implementation(FAR, FarFileSystem, clobber=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A head (1 CPU) and two worker nodes (1 CPU, resource ``w``) on this machine; Ray connected to it."""
    if ray.is_initialized():
        ray.shutdown()
    import cloudpickle

    cloudpickle.register_pickle_by_value(__import__(__name__, fromlist=["*"]))
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for _ in range(2):
            c.add_node(num_cpus=1, resources={"w": 1})
        register_far()
        ray.init(address=c.address, log_to_driver=False, runtime_env={"worker_process_setup_hook": register_far})
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def launch(tmp: Any, path: str, **kwargs: Any) -> RemoteBuffer:
    return RemoteBuffer.launch(
        ReplayBuffer,
        "cpu",
        "cpu",
        100,
        num_shards=kwargs.pop("num_shards", 1),
        seed=0,
        storage_dir=str(tmp),
        checkpoint_path=path,
        actor_options={"num_cpus": 0, "resources": {"w": 0.01}},
        **kwargs,
    )


def eventually(check: Any, what: str, within_s: float = 90.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_location_only_one_process_sees_is_refused_and_nothing_stays_started(cluster: Any, tmp_path: Any) -> None:
    """``memory://`` is a file system each process holds alone: the coordinator's probe is not seen by the
    shards, so ``launch`` raises CheckpointError naming the location and the shards, and kills what it started
    (the shards' share of ``w`` comes back). (Before: accepted; a restarted shard would come back empty.)"""
    before = ray.available_resources().get("w")
    uri = f"memory://objectrl-{uuid.uuid4().hex}"
    with pytest.raises(CheckpointError, match=r"memory://objectrl-.*shard 0 \(node [0-9a-f]+\) does not see"):
        launch(tmp_path, uri, num_shards=2)
    freed = lambda: ray.available_resources().get("w") == pytest.approx(before)  # noqa: E731
    eventually(freed, "the refused launch's shards were not killed")


def test_a_non_local_location_uploads_each_cut_and_a_restart_downloads_it(cluster: Any, tmp_path: Any) -> None:
    """Through a non-local fsspec file system a cut is uploaded (the generation folder and the manifest appear
    at the location), the journal too, and a restarted shard downloads its generation: the cut's rows come back
    and the rows written after it are counted in ``lost_rows``."""
    root = tmp_path / "far"
    remote = launch(tmp_path, f"{FAR}://{root}")
    try:
        remote.add_batch(rows(0, 20))
        assert remote.checkpoint() == 1
        assert os.path.isfile(root / MANIFEST)  # the commit point, one put
        assert os.listdir(root / "gen-000000000001")  # the shard's save, uploaded
        remote.add_batch(rows(20, 3))  # after the cut: journaled, then lost with the actor
        assert (root / "shard-0.journal").read_text().strip()
        ray.kill(remote.shards[0], no_restart=False)
        eventually(lambda: len(remote) == 20, "the restarted shard did not reload the uploaded cut")
        assert remote.lost_rows == 3
    finally:
        remote.kill()


def test_a_shared_file_location_brings_a_shard_back_on_another_node(cluster: Any, tmp_path: Any) -> None:
    """A ``file://`` folder every (simulated) node sees passes the launch check; when the node of a shard is
    removed, the shard restarts on the other worker node with the rows of the last cut, and the rows written
    after it are counted as lost."""
    remote = launch(tmp_path, f"file://{tmp_path / 'shared'}")
    try:
        remote.add_batch(rows(0, 30))
        assert remote.checkpoint() == 1
        remote.add_batch(rows(30, 5))
        first = ray.get(remote.shards[0].node_id.remote())
        node = next(n for n in cluster.worker_nodes if n.node_id == first)
        cluster.remove_node(node)
        eventually(lambda: len(remote) == 30, "the shard did not come back with the cut's rows")
        assert ray.get(remote.shards[0].node_id.remote()) != first
        assert remote.lost_rows == 5
    finally:
        remote.kill()
