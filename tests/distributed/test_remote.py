"""RemoteBuffer over a local Ray: sharded sampling with one buffer's distribution, priorities across shards,
stale priority updates ignored, batched writers, prefetch, and the handle inside a Ray task."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.distributed.remote import GENERATION_KEY, RemoteBuffer
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError
from tests.support import rows

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def launch(cls: type, capacity: int, shards: int, tmp: Any, **kwargs: Any) -> RemoteBuffer:
    return RemoteBuffer.launch(cls, "cpu", "cpu", capacity, num_shards=shards, seed=0, storage_dir=str(tmp), **kwargs)


def test_sharded_sampling_matches_one_buffer(local_ray: None, tmp_path: Any) -> None:
    remote = launch(ReplayBuffer, 1000, 2, tmp_path)
    remote.add_batch(rows(0, 300))  # shard 0
    remote.add_batch(rows(300, 100))  # shard 1: shards of unequal sizes
    assert len(remote) == 400
    steps = (
        torch.cat([remote.sample_batch(1000)["step"] for _ in range(8)]) // 1000
    )  # rows(...)'s step = id * 1000 + ...
    counts = torch.bincount(steps, minlength=400).to(torch.float64)
    expected = 8000 / 400
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 399 + 6 * (2 * 399) ** 0.5  # df 399: far beyond it only if the shards were not proportional
    batch = remote.sample_batch(16)
    assert set(batch.keys()) >= {"state", "index", GENERATION_KEY}
    assert bool(((batch["index"] < 300) | ((batch["index"] >= 1000) & (batch["index"] < 1100))).all())
    remote.kill()


def test_priorities_across_shards(local_ray: None, tmp_path: Any) -> None:
    remote = launch(PrioritizedReplayBuffer, 100, 2, tmp_path, alpha=1.0, beta=0.5, eps=0.0)
    remote.add_batch(rows(0, 10))
    remote.add_batch(rows(10, 10))
    batch = remote.sample_batch(64)
    # row 0 (shard 0, slot 0) gets priority 38, the others keep 1: total mass 57, P(row 0) = 38 / 57
    assert remote.update_priority(torch.tensor([0, 100 + 5]), torch.tensor([38.0, 1.0])) == 2
    stats = remote.stats()
    assert [mass for _, mass in stats] == [47.0, 10.0]
    hits = sum(int((remote.sample_batch(500)["index"] == 0).sum()) for _ in range(4))
    assert abs(hits / 2000 - 38 / 57) < 0.05
    batch = remote.sample_batch(256)
    assert set(batch["index"].tolist()) & set(range(100, 110))  # both shards drawn
    weight = batch["weight"]
    expect = torch.where(batch["index"] == 0, (1 / 38) ** 0.5, 1.0).to(torch.float32)  # (P / min P) ** -beta
    if bool((batch["index"] != 0).all()):
        expect = torch.ones_like(weight)
    assert torch.allclose(weight, expect)
    remote.kill()


def test_stale_priority_updates_are_ignored(local_ray: None, tmp_path: Any) -> None:
    remote = launch(PrioritizedReplayBuffer, 10, 1, tmp_path)
    remote.add_batch(rows(0, 10))
    batch = remote.sample_batch(32)
    remote.add_batch(rows(10, 4))  # slots 0..3 rewritten since the sample
    rewritten = int((batch["index"] < 4).sum())
    applied = remote.update_priority(batch["index"], torch.full((32,), 2.0), batch[GENERATION_KEY])
    assert applied == 32 - rewritten
    with pytest.raises(InvalidArgumentError, match="one value per row"):
        remote.update_priority(batch["index"], torch.ones(3))
    remote.kill()


def test_writer_prefetch_and_a_handle_in_a_task(local_ray: None, tmp_path: Any) -> None:
    remote = launch(ReplayBuffer, 5000, 2, tmp_path)
    with pytest.raises(EmptyBufferError):
        remote.sample_batch(4)
    data = rows(0, 300)
    with remote.writer(batch_size=64, flush_every_s=10) as writer:
        for i in range(300):
            writer.add({k: v[i] for k, v in data.items()})
    assert len(remote) == 300

    @ray.remote
    def actor_task(handle: RemoteBuffer) -> int:
        handle.add_batch(rows(1000, 50))
        return int(handle.sample_batch(8).batch_size[0])

    assert ray.get(actor_task.remote(remote)) == 8
    assert len(remote) == 350
    stream = remote.prefetch(32, depth=2)
    batches = [next(stream) for _ in range(3)]
    stream.close()
    assert all(b.batch_size == torch.Size([32]) for b in batches)
    assert remote.call("__len__") == [64 + 64 + 44 + 50, 64 + 64]  # batches go to the shards in turn
    remote.kill()


def test_checkpointing_is_refused_until_built(local_ray: None, tmp_path: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="not built yet"):
        launch(ReplayBuffer, 10, 1, tmp_path, checkpoint_path=str(tmp_path / "c"))
