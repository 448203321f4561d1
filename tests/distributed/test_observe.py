"""``RemoteBuffer.stats()`` and the Ray gauges (issue 23, "Observability")."""

from __future__ import annotations

import os
import time
import urllib.request

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.remote import RemoteBuffer
from objectrl_buffer.errors import RateLimitTimeout
from objectrl_buffer.flow import MinSize
from tests.support import rows

ray = pytest.importorskip("ray")


def test_stats_after_a_shard_restart_show_the_restart_the_lost_rows_and_the_cut_age(
    local_ray: None, tmp_path: os.PathLike[str]
) -> None:
    """After a cut and 7 more rows, shard 1's process dies and Ray restarts it from the cut: ``stats()`` counts
    the restart, the 7 rows lost (per shard and in all), and the last cut's age; the limiter still agrees
    with the data (no pending rows)."""
    remote = RemoteBuffer.launch(
        ReplayBuffer, "cpu", "cpu", 1000, num_shards=2, seed=0, rate_limiter=MinSize(1),
        checkpoint_path=os.path.join(tmp_path, "ckpt"), storage_dir=str(tmp_path),
    )  # fmt: skip
    try:
        remote.add_batch(rows(0, 10))
        remote.add_batch(rows(10, 10))
        remote.checkpoint()
        remote.add_batch(rows(20, 5))  # shard 0
        remote.add_batch(rows(25, 7))  # shard 1: after the cut, lost with its process
        pid = ray.get(remote.shards[1].__ray_call__.remote(lambda self: os.getpid()))
        ray.kill(remote.shards[1], no_restart=False)
        deadline = time.monotonic() + 60
        while remote.retry("pid", lambda: remote.shards[1].__ray_call__.remote(lambda self: os.getpid())) == pid:
            assert time.monotonic() < deadline, "shard 1 did not restart"
            time.sleep(0.05)
        stats = remote.stats()
        assert stats["restarted_shards"] == 1 and [s["restarted"] for s in stats["shards"]] == [False, True]
        assert stats["lost_rows"] == 7 and [s["lost_rows"] for s in stats["shards"]] == [0, 7]
        assert stats["rows"] == 25 and stats["pending_rows"] == 0
        assert stats["last_cut_age_s"] is not None and 0 <= stats["last_cut_age_s"] < 120
    finally:
        remote.kill()


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


def ray_exports_metrics() -> bool:
    """Whether Ray's metrics agent runs (and so exports for Prometheus): only with ray[default]'s packages, as
    Ray itself decides (``ray.dashboard.optional_deps``: aiohttp, aiohttp_cors, grpcio, opencensus,
    opentelemetry-sdk/-proto/-exporter-prometheus, prometheus_client, pydantic); with the minimal ``ray`` the
    agent starts ``--minimal`` and no node listens on its metrics export port."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="Ray exports every ~10 s: ~20 s: set RUN_SLOW=1")
@pytest.mark.skipif(
    not ray_exports_metrics(),
    reason="Ray exports metrics for Prometheus only with ray[default]'s packages (pip install 'ray[default]'; "
    "not in the `ray` extra, nor in CI)",
)
def test_prometheus_scrapes_the_buffers_gauges_with_the_values_the_buffer_holds(local_ray: None) -> None:
    """Ray's Prometheus endpoint of this node (``MetricsExportPort`` of ``ray.nodes()``), scraped over HTTP as
    Prometheus does, has the buffer's gauges (``ray_`` + the gauge's name), tagged with the buffer's id and the
    shard, holding what the buffer holds: each shard's rows and inserts, the limiter's inserts and samples."""
    from prometheus_client.parser import text_string_to_metric_families

    here = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == here)
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    remote = RemoteBuffer.launch(ReplayBuffer, "cpu", "cpu", 1000, num_shards=2, seed=0, rate_limiter=MinSize(1))
    try:
        remote.add_batch(rows(0, 12))
        remote.add_batch(rows(12, 5))
        remote.sample_batch(4)
        shards = remote.stats()["shards"]
        assert sorted(s["rows"] for s in shards) == [5, 12]  # a batch goes to one shard, the next to the other
        expected: dict[tuple[str, str | None], float] = {
            ("ray_objectrl_buffer_limiter_inserts", None): 17,
            ("ray_objectrl_buffer_limiter_samples", None): 4,
        }
        for s in shards:
            expected[("ray_objectrl_buffer_shard_rows", str(s["shard"]))] = s["rows"]
            expected[("ray_objectrl_buffer_shard_inserts", str(s["shard"]))] = s["inserts"]

        def scraped() -> dict[tuple[str, str | None], float]:
            text = urllib.request.urlopen(url, timeout=10).read().decode()
            return {
                (sample.name, sample.labels.get("shard")): sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.labels.get("buffer") == remote.buffer_id
            }

        deadline = time.monotonic() + 30  # the gauges are set once a second, Ray exports every few seconds
        got = scraped()
        while not expected.items() <= got.items() and time.monotonic() < deadline:
            time.sleep(1)
            got = scraped()
        assert expected.items() <= got.items(), f"{url}: {got}"
    finally:
        remote.kill()
