"""A RemoteBuffer on a simulated multi-node Ray cluster (``ray.cluster_utils.Cluster``), nodes hard-killed
mid-run (issue 23): no row a writer accepted is lost without being counted, none is stored twice, the
limiter's counters match the data after recovery, the learner's ``timeout=`` holds throughout, and samples
drawn without a lost shard are flagged ``"degraded"``. And placement across nodes: a spread group puts each
shard on a node of its own, node ids are honoured, the coordinator runs on the driver's node by default.

Layout: the head runs the driver (two writer threads and a learner thread); each shard has a worker node of
its own (one ``shard_slot`` a node), the coordinator another (``coord_slot``); a killed node is replaced by a
fresh one with the same slot, where Ray restarts its actor. Ray's health checks are tuned (``HEALTH``) so a
hard kill is seen in ~1.5 s instead of ~15 s. The longer run (several kills) is slow-marked.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.health import DEGRADED_KEY
from objectrl_buffer.distributed.remote import RemoteBuffer
from objectrl_buffer.errors import BufferUnavailable, RateLimitTimeout
from objectrl_buffer.flow import MinSize

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

#: Ray's node health checks, tuned: a node that stops answering is declared dead after ~1.5 s.
HEALTH = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_initial_delay_ms": 0,
}
TIMEOUT_S = 2.0  # the learner's sample_batch(timeout=...)
SLACK_S = 10.0  # what a loaded 2-core machine may add to it (never a speed assertion)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    tmp = tempfile.mkdtemp(prefix="ray-cluster-")  # short: Ray's socket paths live under it
    if ray.is_initialized():  # an earlier module's local Ray
        ray.shutdown()
    # a temp dir of its own: in Ray's default one this cluster would be "the current one", and a plain
    # ray.init() of a test running beside this one (pytest -n 2) would join it instead of starting its own
    head = {"num_cpus": 2, "include_dashboard": False, "_system_config": HEALTH, "temp_dir": str(tmp)}
    c = cluster_utils.Cluster(initialize_head=True, head_node_args=head)
    try:
        for slot in ("shard_slot", "shard_slot", "coord_slot"):
            c.add_node(num_cpus=1, resources={slot: 1})  # a CPU: room for a placement group's bundle
        ray.init(address=c.address, log_to_driver=False)
        c.wait_for_nodes()
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def launch(tmp: Path) -> RemoteBuffer:
    return RemoteBuffer.launch(
        ReplayBuffer,
        "cpu",
        "cpu",
        100_000,
        num_shards=2,
        seed=0,
        actor_options={"num_cpus": 0, "resources": {"shard_slot": 1}},
        coordinator_options={"resources": {"coord_slot": 1}},
        rate_limiter=MinSize(1),
        checkpoint_path=str(tmp / "ckpt"),
        checkpoint_every_s=1.0,
        max_restarts=-1,
        retry_timeout_s=60.0,
        shard_timeout_s=1.0,
    )


@dataclass
class Run:
    """Two writer threads of unique ids and a learner thread, until ``stop``; what each saw."""

    remote: RemoteBuffer
    stop: threading.Event = field(default_factory=threading.Event)
    accepted: list[list[int]] = field(default_factory=lambda: [[], []])
    undelivered: list[int] = field(default_factory=lambda: [0, 0])
    errors: list[BaseException] = field(default_factory=list)
    #: the learner's calls: (seconds, degraded or None, error name or None)
    calls: list[tuple[float, bool | None, str | None]] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for w in range(2):
            self.threads.append(threading.Thread(target=self._write, args=(w,), daemon=True))
        self.threads.append(threading.Thread(target=self._learn, daemon=True))
        for thread in self.threads:
            thread.start()

    def _write(self, w: int) -> None:
        writer = self.remote.writer(batch_size=50, flush_every_s=0.05, same_node=False)
        next_id = w * 10_000_000
        try:
            while not self.stop.is_set():
                for _ in range(10):
                    writer.add({"id": np.array(next_id, dtype=np.int64), "obs": np.full(4, next_id, np.float32)})
                    self.accepted[w].append(next_id)
                    next_id += 1
                time.sleep(0.002)
            writer.close()
        except BufferUnavailable:
            self.undelivered[w] = writer.undelivered
        except BaseException as exc:  # pragma: no cover - reported by the test
            import traceback

            self.errors.append(RuntimeError("".join(traceback.format_exception(exc))))

    def _learn(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                batch = self.remote.sample_batch(64, timeout=TIMEOUT_S)
            except (RateLimitTimeout, BufferUnavailable) as exc:
                self.calls.append((time.monotonic() - start, None, type(exc).__name__))
            except BaseException as exc:  # pragma: no cover - reported by the test
                import traceback

                self.errors.append(RuntimeError("".join(traceback.format_exception(exc))))
                return
            else:
                self.calls.append((time.monotonic() - start, bool(batch[DEGRADED_KEY].any()), None))
            time.sleep(0.01)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in self.threads)
        assert not self.errors, "\n\n".join(str(error) for error in self.errors)  # whole tracebacks


def node_of(c: Any, node_id: str) -> Any:
    return next(node for node in c.worker_nodes if node.node_id == node_id)


def stored_ids(remote: RemoteBuffer) -> np.ndarray:
    return np.concatenate([part["id"].reshape(-1).numpy() for part in remote.call("sample_all")])


def wait_until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)


def check_every_row_is_accounted_for(run: Run) -> tuple[np.ndarray, int]:
    """Stored ids are unique and accepted; stored + lost (counted) + undelivered (counted) = accepted."""
    accepted = np.array(run.accepted[0] + run.accepted[1], dtype=np.int64)
    ids = stored_ids(run.remote)
    assert len(np.unique(ids)) == len(ids), "a row is stored twice"
    assert np.isin(ids, accepted).all()
    lost = run.remote.lost_rows
    assert len(ids) + lost + sum(run.undelivered) == len(accepted)
    return ids, lost


def check_the_learners_timeout_held(run: Run) -> None:
    assert run.calls and max(seconds for seconds, _, _ in run.calls) < TIMEOUT_S + SLACK_S


def alive_workers(c: Any) -> list[str]:
    """The ids of the worker nodes alive now (the head's is not among them)."""
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    return [node.node_id for node in c.worker_nodes if node.node_id in alive]


def test_a_strict_spread_puts_each_shard_on_a_node_of_its_own(cluster: Any, tmp_path: Path) -> None:
    """``placement="strict_spread"``: 3 shards asking for a whole CPU each (the head has 2, each worker 1) land
    on 3 different nodes; the group the buffer made is removed by ``kill``."""
    from ray.util.placement_group import placement_group_table

    remote = RemoteBuffer.launch(
        ReplayBuffer, "cpu", "cpu", 16, num_shards=3, placement="strict_spread", actor_options={"num_cpus": 1}
    )
    group = remote.placement_group
    try:
        assert len(set(remote.node_ids())) == 3
        remote.add_batch({"obs": np.zeros((6, 2), np.float32)})
        assert len(remote) == 6
    finally:
        remote.kill()
    assert placement_group_table(group)["state"] == "REMOVED"


def test_node_ids_are_honoured_and_the_coordinator_runs_on_the_drivers_node(cluster: Any, tmp_path: Path) -> None:
    """``placement=[node ids]``: shard ``i`` runs on node ``i`` (in the order given, not the cluster's); the
    coordinator, without ``coordinator_options``, runs on the launching driver's node (the head here)."""
    first, second = alive_workers(cluster)[:2]
    remote = RemoteBuffer.launch(
        ReplayBuffer, "cpu", "cpu", 16, num_shards=2, placement=[second, first], checkpoint_path=str(tmp_path / "c")
    )
    try:
        assert remote.node_ids() == [second, first]
        assert ray.get(remote.coordinator.node_id.remote()) == ray.get_runtime_context().get_node_id()
    finally:
        remote.kill()


def test_a_shard_node_lost_mid_writes(cluster: Any, tmp_path: Path) -> None:
    """A shard's node hard-killed while two writers and a learner run: the learner goes on with the other shard
    (samples flagged, counted), Ray restarts the shard on a fresh node from its last cut, and every accepted
    row is stored once or counted in ``lost_rows``; the limiter counted each stored or lost row once."""
    remote = launch(tmp_path)
    run = Run(remote)
    run.start()
    try:
        wait_until(
            lambda: len(remote) > 2_000 and remote.checkpoint_status().get("last_cut_age_s") is not None,
            60,
            "rows and a first cut",
        )
        victim = node_of(cluster, remote.node_ids()[1])
        cluster.remove_node(victim, allow_graceful=False)
        cluster.add_node(num_cpus=1, resources={"shard_slot": 1})
        wait_until(lambda: remote.health.outages >= 1, 30, "the handle finds shard 1 down")
        accepted = len(run.accepted[0]) + len(run.accepted[1])
        wait_until(lambda: any(degraded for _, degraded, _ in run.calls), 30, "a degraded sample")
        # the writers go on with shard 0 meanwhile (their batches on shard 1 set aside, not waited for)
        wait_until(lambda: len(run.accepted[0]) + len(run.accepted[1]) > accepted + 1_000, 30, "writes while down")
        assert remote.health.down == {1: remote.health.down[1]}
        wait_until(lambda: not remote.health.down, 60, "shard 1 back")
        before = len(remote)
        wait_until(lambda: len(remote) > before + 500, 30, "writes flowing again")
    finally:
        run.finish()
    ids, lost = check_every_row_is_accounted_for(run)
    check_the_learners_timeout_held(run)
    assert remote.health.snapshot()["degraded_samples"] >= 1
    assert sum(1 for _, _, error in run.calls if error is None) > 10
    counters = remote.limiter_counters()
    assert counters["inserts"] == len(ids) + lost and counters["deletes"] == 0
    done = sum(1 for _, _, error in run.calls if error is None)
    assert 64 * done <= counters["samples"] <= 64 * len(run.calls)
    remote.kill()


def test_the_coordinators_node_lost_mid_writes(cluster: Any, tmp_path: Path) -> None:
    """The coordinator's node hard-killed: while it is down nothing is admitted (the learner's calls end by
    their timeout, writers wait), Ray restarts it on a fresh node, it rebuilds the limiter from the shards'
    counts, and writes and samples go on: no row lost or doubled, counters equal to what the shards hold."""
    remote = launch(tmp_path)
    run = Run(remote)
    run.start()
    try:
        wait_until(lambda: len(remote) > 2_000, 60, "rows")
        coordinator_node = ray.get(remote.coordinator.node_id.remote())
        cluster.remove_node(node_of(cluster, coordinator_node), allow_graceful=False)
        cluster.add_node(num_cpus=1, resources={"coord_slot": 1})
        killed = len(run.calls)
        wait_until(lambda: any(error for _, _, error in run.calls[killed:]), 60, "a sample refused while it is down")
        before = len(remote)
        wait_until(lambda: len(remote) > before + 500, 60, "writes admitted again")
        wait_until(lambda: run.calls[-1][2] is None, 30, "samples admitted again")
    finally:
        run.finish()
    ids, lost = check_every_row_is_accounted_for(run)
    assert lost == 0 and sum(run.undelivered) == 0
    check_the_learners_timeout_held(run)
    counters = remote.limiter_counters()
    assert counters["inserts"] == len(ids)  # rebuilt from the shards' counts, then counted on
    remote.kill()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="three node losses, ~30 s more: set RUN_SLOW=1")
def test_several_node_losses_in_one_run(cluster: Any, tmp_path: Path) -> None:
    """Both shards' nodes and the coordinator's, one after the other, in one run of writers and a learner."""
    remote = launch(tmp_path)
    run = Run(remote)
    run.start()
    try:
        for victim in ("shard 0", "coordinator", "shard 1"):
            before = len(remote)
            wait_until(lambda b=before: len(remote) > b + 2_000, 60, f"rows before losing {victim}")
            if victim == "coordinator":
                node_id = ray.get(remote.coordinator.node_id.remote())
                slot = "coord_slot"
            else:
                node_id = ray.get(remote.shards[int(victim[-1])].node_id.remote())  # it moves: asked anew
                slot = "shard_slot"
            cluster.remove_node(node_of(cluster, node_id), allow_graceful=False)
            cluster.add_node(num_cpus=1, resources={slot: 1})
            wait_until(lambda: not remote.health.down and len(remote) > 0, 90, f"{victim} back")
        before = len(remote)
        wait_until(lambda: len(remote) > before + 1_000, 60, "writes flowing at the end")
    finally:
        run.finish()
    check_every_row_is_accounted_for(run)
    check_the_learners_timeout_held(run)
    remote.kill()
