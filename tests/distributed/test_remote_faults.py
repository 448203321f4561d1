"""RemoteBuffer's faults of issue 23: ``kill()`` leaves no storage behind, failing automatic cuts are seen,
a Writer never forgets a row it accepted, and the coordinator's restarts (retries, the limiter, its counters)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.remote import RemoteBuffer
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
