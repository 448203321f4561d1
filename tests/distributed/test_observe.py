"""``RemoteBuffer.stats()`` and the Ray gauges (issue 23, "Observability")."""

from __future__ import annotations

import time

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.remote import RemoteBuffer
from objectrl_buffer.errors import RateLimitTimeout
from objectrl_buffer.flow import MinSize
from tests.support import rows

ray = pytest.importorskip("ray")


def test_stats_per_shard_and_in_all_match_what_was_written_and_sampled(local_ray: None) -> None:
    remote = RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", 1000, num_shards=2, seed=0, rate_limiter=MinSize(31))
    try:
        first = remote.stats()
        assert first["rows"] == 0 and first["inserts"] == 0 and first["pending_rows"] == 0
        remote.add_batch(rows(0, 20))
        remote.add_batch(rows(20, 10))
        with pytest.raises(RateLimitTimeout):  # 30 rows held: MinSize(31) admits no sample yet
            remote.sample_batch(8, timeout=0.3)
        remote.add_batch(rows(30, 1))
        for _ in range(5):
            remote.sample_batch(8)
        time.sleep(0.01)
        stats = remote.stats()
        assert [(s["shard"], s["rows"], s["inserts"]) for s in stats["shards"]] == [(0, 21, 21), (1, 10, 10)]
        assert stats["rows"] == stats["inserts"] == 31
        assert stats["inserts_per_s"] > 0 and stats["samples_per_s"] > 0
        assert stats["samples"] >= 40  # rows the shards drew for 5 samples of 8 (margins included)
        assert stats["traffic"]["rows_kept"] == 40 and stats["traffic"]["samples"] == 5
        limiter = stats["limiter"]
        assert limiter is not None
        assert (limiter["inserts"], limiter["samples"], limiter["deletes"]) == (31, 40, 0)
        assert limiter["sample_blocked_s"] >= 0.25 and limiter["insert_blocked_s"] < 5
        assert stats["pending_rows"] == 0 and stats["lost_rows"] == 0 and stats["restarted_shards"] == 0
        assert stats["health"]["mode"] == "degrade" and stats["health"]["down"] == []
        assert all(s["node_id"] for s in stats["shards"])
        again = remote.stats()  # rates over the time since the previous call: nothing happened since
        assert again["inserts_per_s"] == 0 and again["samples_per_s"] == 0
    finally:
        remote.kill()


def test_the_shards_and_the_limiter_export_ray_gauges(local_ray: None) -> None:
    remote = RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", 1000, num_shards=2, seed=0, rate_limiter=MinSize(1))
    try:
        remote.add_batch(rows(0, 12))
        remote.sample_batch(4)

        def shard_gauges() -> dict[str, float]:
            return ray.get(remote.shards[0].start_metrics.remote())  # started at launch: what it set last

        deadline = time.monotonic() + 30
        while shard_gauges().get("objectrl_buffer_shard_rows") != 12:  # set once a second
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert shard_gauges()["objectrl_buffer_shard_inserts"] == 12
        while ray.get(remote.coordinator.metric_values.remote()).get("objectrl_buffer_limiter_samples") != 4:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert set(ray.get(remote.coordinator.metric_values.remote())) == {
            "objectrl_buffer_limiter_inserts",
            "objectrl_buffer_limiter_samples",
            "objectrl_buffer_limiter_insert_blocked_seconds",
            "objectrl_buffer_limiter_sample_blocked_seconds",
        }
    finally:
        remote.kill()
