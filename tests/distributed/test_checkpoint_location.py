"""Checkpoints on shared storage (issue 23): ``checkpoint_path`` is a local path or a URI fsspec opens, and
``launch`` refuses a location that not every shard and the coordinator can write and read.

One small simulated cluster (``ray.cluster_utils.Cluster``: a head and two worker nodes offering the custom
resource ``w``; the shards ask for a little of it, so they run on the worker nodes, never on the head).

The simulated nodes share this machine's file system, so a disk that only one node sees is simulated by the
``objectrl-node://`` protocol registered below: each Ray node has a folder of its own under :data:`DISKS`, and a
process reads and writes only its own node's folder (processes on one node share files, on two nodes they do
not), as with a node's local disk."""

from __future__ import annotations

import os
import shutil
import tempfile
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
NODE = "objectrl-node"  # a protocol registered below: a folder of each Ray node's own (a node-local disk)
#: where the simulated nodes' disks are: one folder per node id (the workers read it from $OBJECTRL_TEST_DISKS,
#: set by the cluster fixture: each worker process evaluates this module's globals anew)
DISKS = os.path.join(tempfile.gettempdir(), f"objectrl-node-disks-{uuid.uuid4().hex[:12]}")


def register_far() -> None:
    """Register ``objectrl-far://``: fsspec's local file system under another class, so the buffer treats it as
    a non-local store (a shard's save is uploaded with ``fs.put``, a restart downloads it with ``fs.get``).
    Runs in the driver and, as Ray's ``worker_process_setup_hook``, in every worker."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    class FarFileSystem(LocalFileSystem):
        protocol = (FAR,)

    fsspec.register_implementation(FAR, FarFileSystem, clobber=True)


def register_node_local() -> None:
    """Register ``objectrl-node://``: ``objectrl-node://a/b`` is ``DISKS/<node id>/a/b``, where the node id is the
    Ray node of the calling process (in the driver: the head's), so that only processes of one node see the
    same files. An absolute path is left as it is: a path already mapped (fsspec strips a path more than once)
    or the local side of ``put``/``get`` (a shard's temp folder). Runs in the driver and in every worker (see
    :func:`register_all`)."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    class NodeLocalFileSystem(LocalFileSystem):
        protocol = (NODE,)

        @classmethod
        def _strip_protocol(cls, path: Any) -> Any:
            path = str(path)
            for prefix in (f"{NODE}://", f"{NODE}:"):
                if path.startswith(prefix):
                    path = path[len(prefix) :]
                    break
            if not os.path.isabs(path):  # a location's name; absolute: mapped already, or a local temp folder
                node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "no-ray"
                path = os.path.join(os.environ.get("OBJECTRL_TEST_DISKS", DISKS), node, path)
            return super()._strip_protocol(path)

    fsspec.register_implementation(NODE, NodeLocalFileSystem, clobber=True)


def register_all() -> None:
    """The protocols of this module (Ray's ``worker_process_setup_hook``: one function)."""
    register_far()
    register_node_local()


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
        register_all()
        hook = {"worker_process_setup_hook": register_all, "env_vars": {"OBJECTRL_TEST_DISKS": DISKS}}
        ray.init(address=c.address, log_to_driver=False, runtime_env=hook)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        shutil.rmtree(DISKS, ignore_errors=True)


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


def buffer_actors() -> set[str]:
    """Ids of the shard and coordinator actors not dead (Ray's actor table in the GCS; ``ray.util.state`` needs
    the dashboard, which a minimal Ray does not run)."""
    from ray._private import state

    actors = state.actors().values()
    return {a["ActorID"] for a in actors if a["State"] != "DEAD" and a["ActorClassName"] in ("Shard", "Coordinator")}


def on_node(node_id: str) -> dict[str, Any]:
    """Ray actor options that pin an actor to the node ``node_id``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}


def worker_node_ids(cluster: Any) -> list[str]:
    return sorted(node.node_id for node in cluster.worker_nodes)


def test_a_location_only_one_node_sees_is_refused_and_nothing_stays_started(cluster: Any, tmp_path: Any) -> None:
    """A node-local disk (``objectrl-node://``), with the coordinator and shard 0 on one worker node and shard 1
    on the other: shard 0 sees the coordinator's probe, shard 1 does not (nor the coordinator shard 1's), so
    ``launch`` raises CheckpointError naming the location, shard 1 and its node (and not shard 0), and every
    actor it started is dead afterwards. (Without the check: accepted, and shard 1 restarted on another node
    would come back empty.)"""
    first, second = worker_node_ids(cluster)
    uri = f"{NODE}://ckpt-{uuid.uuid4().hex[:8]}"
    before = buffer_actors()
    with pytest.raises(CheckpointError) as refused:
        launch(tmp_path, uri, num_shards=2, placement=[first, second], coordinator_options=on_node(first))
    message = str(refused.value)
    assert repr(uri) in message
    assert f"shard 1 (node {second}) does not see" in message
    assert "shard 0" not in message  # on the coordinator's node: it saw the probe
    eventually(lambda: buffer_actors() <= before, "the refused launch left a shard or the coordinator alive")


def test_a_refused_launch_removes_the_placement_group_it_made(cluster: Any, tmp_path: Any) -> None:
    """``placement="strict_spread"`` makes a placement group; a launch the location check refuses removes it
    with the actors (else its bundles' resources stay held). (Before: the group stayed ``CREATED``.)"""
    from ray.util.placement_group import placement_group_table

    def live_groups() -> set[str]:
        return {key for key, group in placement_group_table().items() if group["state"] != "REMOVED"}

    before = live_groups()
    with pytest.raises(CheckpointError):
        launch(tmp_path, f"{NODE}://ckpt-{uuid.uuid4().hex[:8]}", num_shards=2, placement="strict_spread")
    eventually(lambda: live_groups() <= before, "the refused launch left its placement group")


def test_a_node_local_location_is_accepted_when_every_actor_is_on_that_node(cluster: Any, tmp_path: Any) -> None:
    """The same node-local disk with both shards and the coordinator on one node passes the launch check (one
    node sees one location), and a cut lands on that node's disk only."""
    first, second = worker_node_ids(cluster)
    name = f"ckpt-{uuid.uuid4().hex[:8]}"
    remote = launch(
        tmp_path, f"{NODE}://{name}", num_shards=2, placement=[first, first], coordinator_options=on_node(first)
    )
    try:
        remote.add_batch(rows(0, 10))
        assert remote.checkpoint() == 1
        assert os.path.isfile(os.path.join(DISKS, first, name, MANIFEST))
        assert not os.path.exists(os.path.join(DISKS, second, name))
    finally:
        remote.kill()


# last: it removes a worker node of the module's cluster
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
