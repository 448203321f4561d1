"""RemoteBuffer's faults of issue 23: ``kill()`` leaves no storage behind, failing automatic cuts are seen,
a Writer never forgets a row it accepted, and the coordinator's restarts (retries, the limiter, its counters)."""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any

import pytest

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.distributed.remote import RemoteBuffer
from objectrl_buffer.distributed.shard import Shard
from objectrl_buffer.errors import BufferUnavailable, CheckpointError, InvalidArgumentError, RateLimitTimeout
from objectrl_buffer.flow import MinSize, Queue
from objectrl_buffer.storage.folders import PREFIX
from tests.distributed.waiting import wait_for
from tests.support import rows

ray = pytest.importorskip("ray")


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
    assert remote.checkpoint() >= 1  # a good cut (the automatic ones may take one first): calls go through again
    with warnings.catch_warnings():  # automatic cuts that failed after the warned three are warned about once
        warnings.simplefilter("ignore", RuntimeWarning)
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


def waiting_admissions(remote: RemoteBuffer) -> int:
    """Admissions waiting in the coordinator's limiter (threads of a threaded actor, coroutines of an async one)."""
    ask = remote.coordinator.__ray_call__.remote(lambda self: self.limiter.waiting)
    return int(ray.get(ask, timeout=10))  # a coordinator whose threads are all taken never answers


def in_threads(*targets: Any) -> tuple[list[threading.Thread], list[BaseException]]:
    """Start a thread for each target; the threads and the list their exceptions go to."""
    errors: list[BaseException] = []

    def body(target: Any) -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(target,), daemon=True) for target in targets]
    for thread in threads:
        thread.start()
    return threads, errors


def test_writes_waiting_when_the_coordinator_restarts_are_admitted_by_the_restarted_one(
    local_ray: None, tmp_path: Any
) -> None:
    """Bug 2: an add_batch and a Writer's flush waiting for admission when the coordinator dies ask the restarted
    coordinator again and are stored once it admits them. (Before: every retry sent the dead admission ref
    again, BufferUnavailable after retry_timeout_s, rows lost.)"""
    # retry_timeout_s: a restart on a loaded 2-core machine can take over 10 s (a fresh worker imports torch)
    remote = launch(100, 1, tmp_path / "s", rate_limiter=Queue(10), retry_timeout_s=60)
    remote.add_batch(rows(0, 10))  # the queue is full: later writes wait for samples
    writer = remote.writer(batch_size=5, flush_every_s=100, same_node=False)
    data = rows(20, 5)

    def write() -> None:
        for i in range(5):  # the fifth add sends the batch: it waits for admission
            writer.add({k: v[i] for k, v in data.items()})
        writer.flush()

    threads, errors = in_threads(lambda: remote.add_batch(rows(10, 5)), write)
    wait_for(lambda: waiting_admissions(remote) == 2, "both writes wait in the limiter")
    ray.kill(remote.coordinator, no_restart=False)
    for _ in range(2):  # room for both writes, however the restarted coordinator counts
        assert remote.sample_batch(5, timeout=30).batch_size[0] == 5
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert not any(thread.is_alive() for thread in threads), f"a write still waits: {remote.limiter_counters()}"
    assert stored_ids(remote) == list(range(15)) + list(range(20, 25))
    remote.kill()


def test_samples_are_never_let_through_while_the_limiter_cannot_be_asked(local_ray: None, tmp_path: Any) -> None:
    """Bug 3: with the coordinator down, a sample waits and raises after its timeout (or after retry_timeout_s
    without one); it is never drawn unadmitted. (Before: the draw was retried without admission: 4 rows came
    back under MinSize(1000) with 10 stored.)"""
    remote = launch(100, 1, tmp_path / "s", rate_limiter=MinSize(1000), retry_timeout_s=0.5)
    remote.add_batch(rows(0, 10))
    ray.kill(remote.coordinator, no_restart=True)
    with pytest.raises(RateLimitTimeout, match="coordinator"):
        remote.sample_batch(4, timeout=0.5)
    with pytest.raises(BufferUnavailable, match="coordinator"):
        remote.sample_batch(4)
    stream = remote.prefetch(4, depth=2, timeout=0.3)
    with pytest.raises(RateLimitTimeout):
        next(stream)
    stream.close()
    remote.kill()


def test_a_learner_sample_keeps_its_timeout_with_100_writer_admissions_waiting(local_ray: None, tmp_path: Any) -> None:
    """Bug 1: 100 writers waiting for admission (one row each, a full Queue) leave the coordinator free: the
    learner's ``sample_batch(timeout=2)`` is admitted and returns, and each sample lets writers through.
    (Before: a threaded coordinator of 64 threads, each held by a waiting admission: the learner's admission
    queued behind them and the sample hung.)"""
    remote = launch(1000, 1, tmp_path / "s", rate_limiter=Queue(10))
    remote.add_batch(rows(0, 10))  # full: every later row waits for a sample
    data = rows(100, 100)
    adds = [lambda i=i: remote.add({k: v[i] for k, v in data.items()}) for i in range(100)]
    threads, errors = in_threads(*adds)
    wait_for(lambda: waiting_admissions(remote) == 100, "100 writes wait in the limiter")
    for _ in range(20):  # each sample of 5 admits 5 waiting writes
        assert remote.sample_batch(5, timeout=2).batch_size[0] == 5
    for thread in threads:
        thread.join(60)
    assert errors == [] and not any(thread.is_alive() for thread in threads)
    assert stored_ids(remote) == list(range(10)) + list(range(100, 200))
    remote.kill()


def test_a_writer_goes_on_with_the_live_shard_when_the_other_dies_at_once(local_ray: None, tmp_path: Any) -> None:
    """Degraded mode: a shard whose actor dies, so that its calls fail at once (here for good:
    ``max_restarts=0``), does not hold a Writer: its batches are set aside (counted in ``undelivered``) and the
    later ones go to the live shard. (Before: the Writer waited for the shard's restart, up to
    ``retry_timeout_s``, 120 s here; with Ray's default health checks that was the whole 16-18 s of a node
    loss, measured by ``distributed_bench.py --cluster --sections stall``.)"""
    remote = launch(10_000, 2, tmp_path / "s", max_restarts=0, retry_timeout_s=120)
    writer = remote.writer(batch_size=10, flush_every_s=100, same_node=False)
    data = rows(0, 240)

    def add(first: int, last: int) -> None:
        for i in range(first, last):
            writer.add({k: v[i] for k, v in data.items()})

    add(0, 40)
    writer.flush()  # 2 batches a shard
    ray.kill(remote.shards[1], no_restart=True)
    threads, errors = in_threads(lambda: add(40, 240))
    threads[0].join(60)
    assert not threads[0].is_alive(), "the writer waits for the dead shard"
    assert errors == []
    assert list(remote.health.down) == [1]
    held = ray.get(remote.shards[0].counts.remote())[1]
    steps = ray.get(remote.shards[0].call.remote("sample_all"))["step"].reshape(-1).tolist()
    assert len(steps) == len(set(steps)) == held  # nothing stored twice on the live shard
    assert writer.undelivered <= 70  # set aside (at most max_in_flight a shard) + in flight + the open batch
    assert held + 20 + writer.undelivered >= 240  # nothing accepted is lost: stored, or still held by the writer
    remote.kill(close_timeout_s=5)


def test_without_a_checkpoint_path_a_lost_shard_is_not_restarted_empty(local_ray: None, tmp_path: Any) -> None:
    """Review of issue 23 ("never drops a row silently"): a shard restarts from the last cut, so without
    ``checkpoint_path`` it is not restarted at all (it would come back empty, its rows neither kept nor counted
    in ``lost_rows``): the loss is raised (BufferUnavailable), and restarts asked for without checkpoints are
    refused. (Before: Ray restarted it empty, 10 rows acknowledged, 0 held, ``lost_rows`` 0.)"""
    for bad in ({"max_restarts": 3}, {"actor_options": {"num_cpus": 0, "max_restarts": -1}}):
        with pytest.raises(InvalidArgumentError, match="without a checkpoint_path"):
            launch(100, 1, tmp_path / "s", **bad)
    remote = launch(100, 1, tmp_path / "s", retry_timeout_s=2)
    remote.add_batch(rows(0, 10))
    ray.kill(remote.shards[0], no_restart=False)  # as a lost process: Ray restarts it only if allowed

    def raises() -> bool:  # the kill is asynchronous: a call may still be served just after it
        try:
            len(remote)
        except BufferUnavailable:
            return True
        return False

    wait_for(raises, "len() raises BufferUnavailable for the lost shard", timeout_s=30)
    with pytest.raises(BufferUnavailable):
        _ = remote.lost_rows
    remote.kill(close_timeout_s=5)


@pytest.mark.parametrize("mode", ["degrade", "wait"])
def test_a_lost_shard_is_warned_about_once_and_wait_mode_keeps_all_shards(
    local_ray: None, tmp_path: Any, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A shard lost for good (no checkpoint_path: not restarted): in ``"degrade"`` mode samples go on from the
    other shard, flagged, with one warning for the outage however many samples follow; in ``"wait"`` mode a
    sample needs every shard and raises BufferUnavailable after ``retry_timeout_s``."""
    import logging

    from objectrl_buffer.distributed.health import DEGRADED_KEY

    remote = launch(1000, 2, tmp_path / "s", shard_loss=mode, retry_timeout_s=2)
    remote.add_batch(rows(0, 50))
    remote.add_batch(rows(50, 50))
    ray.kill(remote.shards[1], no_restart=True)
    wait_for(lambda: ray.wait([remote.shards[1].__ray_ready__.remote()], timeout=1)[0], "the kill seen")
    with caplog.at_level(logging.WARNING, logger="objectrl_buffer.distributed.health"):
        if mode == "degrade":
            for _ in range(5):
                batch = remote.sample_batch(16)
                assert bool(batch[DEGRADED_KEY].all()) and (batch["step"] < 50_000).all()  # shard 0's rows only
            downs = [r for r in caplog.records if "shard 1 is down" in r.getMessage()]
            assert len(downs) == 1 and remote.health.snapshot()["degraded_samples"] == 5
        else:
            with pytest.raises(BufferUnavailable):
                remote.sample_batch(16)
            assert remote.health.snapshot()["outages"] == 0  # "wait": no shard is ever left out
    remote.kill(close_timeout_s=5)
