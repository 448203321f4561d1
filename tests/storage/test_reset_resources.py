"""reset() frees its storage deterministically: open files, memmap files and mapped memory stay constant.

Upstream leaks two fds per key per reset until a full cyclic GC (PPO resets twice per learn call). Here
the cyclic GC is disabled while the resets run, so anything that only a GC would free shows up as growth.
"""

from __future__ import annotations

import gc
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.storage.folders import LOCK_NAME
from tests.support import fill, objectrl_batch, objectrl_transition, open_fds

N_RESETS = 10_000
N_RESIZES = 1_000
CHECK_EVERY = 1_000
RSS_SLACK_MB = 32
#: The PPO keys that matter here (a rollout, then the same rows with advantages/returns). The full ObjectRL
#: PPO schema (10 + 2 keys) costs ~2.7 ms of CPU per reset+write, mostly torchrl creating one memmap file per
#: key; a leak would grow per key either way, and these 5 + 2 keys keep 10,000 resets near 20 s of CPU.
ROLLOUT_KEYS = ("state", "action", "reward", "terminated", "action_logprob")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def mapped_files(folder: str) -> int:
    """Memory mappings of this process backed by files in ``folder`` (deleted ones included)."""
    with open("/proc/self/maps") as f:
        return sum(folder in line for line in f)


def storage_files(root: pathlib.Path) -> int:
    """Files under ``root``, but the one owner lock each private folder holds for its life."""
    return sum(len([f for f in files if f != LOCK_NAME]) for _, _, files in os.walk(root))


@pytest.fixture
def storage_root(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """Parent folder for the memmaps: tmpfs when there is one.

    Thousands of create/unlink cycles on a disk filesystem (ext4 mounted with ``discard`` here) cost 2-6x
    more and vary with other processes' I/O; the checks themselves do not depend on the filesystem.
    """
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        root = pathlib.Path(tempfile.mkdtemp(prefix="objectrl_buffer-test-", dir="/dev/shm"))
        try:
            yield root
        finally:
            shutil.rmtree(root, ignore_errors=True)
    else:
        yield tmp_path


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def resources(rb: ReplayBuffer, root: pathlib.Path) -> tuple[int, int, int, int]:
    folder = rb.storage_folder
    assert folder is not None
    return open_fds(), storage_files(root), len(os.listdir(root)), mapped_files(folder)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="10,000 resets take ~30 s: set RUN_SLOW=1")
def test_ten_thousand_ppo_resets(storage_root: pathlib.Path, no_cyclic_gc: None) -> None:
    rb = ReplayBuffer("cpu", "cpu", 64, seed=0, storage_dir=storage_root)
    rollout = objectrl_batch(0, 64, ppo=True).select(*ROLLOUT_KEYS)
    learn = TensorDict({**dict(rollout.items()), "advantages": torch.randn(64), "returns": torch.randn(64)}, [64])

    def ppo_cycle(i: int) -> None:
        """Even i: collect a rollout (single adds then a batch); odd i: re-add it with advantages and returns."""
        rb.reset()
        if i % 2 == 0:
            rb.add(objectrl_transition(i, ppo=True).select(*ROLLOUT_KEYS))
            rb.add(objectrl_transition(i + 1, ppo=True).select(*ROLLOUT_KEYS))
            rb.add_batch(rollout)
            rb.sample_all()
        else:
            rb.add_batch(learn)
            for _ in rb.create_epoch_iterator(32):
                pass

    for i in range(21):  # warm-up (lazy imports, allocator arenas), ending on an even i
        ppo_cycle(i)
    baseline = resources(rb, storage_root)
    rss_before = rss_mb()
    assert baseline[3] == len(ROLLOUT_KEYS)  # one mapping per stored key, nothing left from earlier resets
    for i in range(21, 21 + N_RESETS):
        ppo_cycle(i)
        if i % CHECK_EVERY == 0:  # even i: same schema as the baseline
            assert resources(rb, storage_root) == baseline, f"after {i} resets"
    ppo_cycle(22 + N_RESETS)  # even
    assert resources(rb, storage_root) == baseline
    assert rss_mb() - rss_before < RSS_SLACK_MB
    rb.close()
    assert open_fds() <= baseline[0] and storage_files(storage_root) == 0


def test_resets_that_resize(storage_root: pathlib.Path, no_cyclic_gc: None) -> None:
    rb = ReplayBuffer("cpu", "cpu", 32, seed=0, storage_dir=storage_root)
    sizes = (32, 48, 16)
    singles = [objectrl_transition(step) for step in range(5)]
    batch = objectrl_batch(5, 40)

    def cycle(i: int) -> None:
        rb.reset(sizes[i % 3])
        for row in singles:
            rb.add(row)
        rb.add_batch(batch)
        rb.sample_batch(8)

    for i in range(6):
        cycle(i)
    baseline = resources(rb, storage_root)
    rss_before = rss_mb()
    assert baseline[2] == 1  # one private folder
    for i in range(6, 6 + N_RESIZES):
        cycle(i)
        if i % 3 == 0:
            assert resources(rb, storage_root) == baseline, f"after {i} resizes"
            assert rb.buffer_size == 32 and len(rb) == 32
    assert rss_mb() - rss_before < RSS_SLACK_MB
    rb.close()
    assert os.listdir(storage_root) == []


def test_resets_before_any_write_and_close_twice(tmp_path: pathlib.Path) -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path)
    fds = open_fds()
    for _ in range(100):
        rb.reset()
    assert open_fds() == fds and storage_files(tmp_path) == 0
    rb.close()
    rb.close()
    assert os.listdir(tmp_path) == []


def test_many_buffers_dropped_without_close(tmp_path: pathlib.Path) -> None:
    """A buffer that is garbage-collected removes its folder (weakref finalizer)."""
    make: Callable[[], ReplayBuffer] = lambda: ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path)  # noqa: E731
    for _ in range(20):
        rb = make()
        fill(rb, range(3))
        del rb
    gc.collect()
    assert os.listdir(tmp_path) == []
