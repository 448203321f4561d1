"""RemoteBuffer's faults of issue 23: ``kill()`` leaves no storage behind, failing automatic cuts are seen,
a Writer never forgets a row it accepted, and the coordinator's restarts (retries, the limiter, its counters)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.remote import RemoteBuffer
from objectrl_buffer.distributed.shard import Shard
from objectrl_buffer.errors import BufferUnavailable, CheckpointError
from objectrl_buffer.storage.folders import PREFIX
from tests.support import rows

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """The suite's local Ray (see test_remote.py), started here only when no earlier module left one running."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def launch(capacity: int, shards: int, tmp: Any, **kwargs: Any) -> RemoteBuffer:
    return RemoteBuffer.launch(
        ReplayBuffer, "cpu", "cpu", capacity, num_shards=shards, seed=0, storage_dir=str(tmp), **kwargs
    )


def test_kill_removes_the_shards_storage_folders(local_ray: None, tmp_path: Any) -> None:
    """Bug 7: ``kill()`` closes each shard's buffer before it stops the actor, so the shards' storage folders
    (memory-mapped row files) are gone with it. (Before: the folders stayed on disk, 442 MB after one bench.)"""
    storage = tmp_path / "storage"
    storage.mkdir()
    remote = launch(1000, 1, storage)
    remote.add_batch(rows(0, 50))
    assert len([n for n in os.listdir(storage) if n.startswith(PREFIX)]) == 1  # the shard's folder
    remote.kill()
    assert os.listdir(storage) == []


def test_failing_automatic_cuts_are_counted_warned_about_and_then_refuse_calls(local_ray: None, tmp_path: Any) -> None:
    """Bug 6: automatic cuts that fail are counted, their age and error reported, warned about in the driver,
    and after ``max_failed_cuts`` failures in a row every write and sample raises until a cut succeeds.
    (Before: ``except Exception: continue``, nothing seen anywhere.)"""
    root = tmp_path / "ckpt"
    root.mkdir()
    blocker = root / "gen-000000000001"
    blocker.write_text("a file where the first cut's folder goes: every cut fails")
    remote = launch(100, 1, tmp_path / "s", checkpoint_path=str(root), checkpoint_every_s=0.05, max_failed_cuts=3)
    remote.add_batch(rows(0, 5))
    deadline = time.monotonic() + 60
    with pytest.warns(RuntimeWarning, match="checkpoint cut"), pytest.raises(CheckpointError, match="3 checkpoint"):
        while time.monotonic() < deadline:  # the third failure in a row makes checkpoint_status() raise
            status = remote.checkpoint_status()
            assert status["last_cut_age_s"] is None and status["failing"] < 3
            time.sleep(0.05)
    with pytest.raises(CheckpointError, match="cuts failed"):
        remote.add_batch(rows(5, 1))
    with pytest.raises(CheckpointError, match="cuts failed"):
        remote.sample_batch(1)
    status = ray.get(remote.coordinator.cut_status.remote())
    assert status["failed_cuts"] >= 3 and "FileExistsError" in status["last_error"]
    blocker.unlink()
    assert remote.checkpoint() == 1  # a good cut: calls go through again
    status = remote.checkpoint_status()
    assert status["failing"] == 0 and status["last_cut_age_s"] is not None
    remote.add_batch(rows(5, 1))
    assert len(remote) == 6
    remote.kill()


def stored_ids(remote: RemoteBuffer) -> list[int]:
    """The transition ids the shards hold (``rows``'s ``step`` // 1000), sorted, duplicates kept."""
    return sorted(int(s) // 1000 for part in remote.call("sample_all") for s in part["step"].reshape(-1).tolist())


def test_a_writer_keeps_the_rows_it_could_not_deliver_and_sends_them_once(local_ray: None, tmp_path: Any) -> None:
    """Bug 5: a Writer whose shard stays unreachable raises BufferUnavailable naming how many accepted rows it
    holds; flush() and close() raise while any are held; once the shard answers again they are all stored,
    each once, in order. (Before: the batches in flight were dropped and the next flush returned normally.)"""
    remote = launch(1000, 1, tmp_path / "s", retry_timeout_s=0.2)
    live = remote.shards[0]
    dead = ray.remote(Shard).options(num_cpus=0).remote(ReplayBuffer, ("cpu", "cpu", 10), {})
    ray.kill(dead, no_restart=True)
    data = rows(0, 40)
    writer = remote.writer(batch_size=10, flush_every_s=100, max_in_flight=2, same_node=False)
    remote.shards[0] = dead  # unreachable from now on (as a shard that does not come back in time)
    with pytest.raises(BufferUnavailable, match="30 rows") as caught:
        for i in range(30):  # the third batch's send waits for the first: it never comes
            writer.add({k: v[i] for k, v in data.items()})
    assert caught.value.undelivered_rows == writer.undelivered == 30  # 2 batches in flight, 1 full one queued
    for call in (writer.flush, writer.close):
        with pytest.raises(BufferUnavailable):
            call()
        assert writer.undelivered == 30
    remote.shards[0] = live  # back
    for i in range(30, 40):
        writer.add({k: v[i] for k, v in data.items()})
    writer.close()
    assert writer.undelivered == 0
    assert stored_ids(remote) == list(range(40))  # every row once, in the order written
    remote.kill()

