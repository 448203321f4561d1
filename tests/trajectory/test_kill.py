"""kill -9 of a process adding with ``save_trajectories=True``: the folder always loads and holds a prefix.

Each child adds marker trajectories as fast as it can (the writer thread falls behind, so kills land in
trajectory files, in index rewrites and between them) and is killed at a random moment.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from objectrl_buffer.trajectory import TrajectoryReplayBuffer
from tests.support import forkserver
from tests.trajectory.common import marked


def add_forever(folder: str, ready: str) -> None:
    """Child: add trajectory after trajectory (ids 0, 1, 2, ...) until killed."""
    rb = TrajectoryReplayBuffer(seed=0, storage_dir=folder, save_trajectories=True)
    m = 0
    while True:
        rb.add_trajectories([marked(m, T=8, B=4, image=True)])
        m += 1
        if m == 3:
            Path(ready).touch()


def kill_and_check(tmp_path: Path, rng: random.Random, ctx: object, round_: int) -> int:
    folder, ready = str(tmp_path / f"buf{round_}"), str(tmp_path / f"ready{round_}")
    child = ctx.Process(target=add_forever, args=(folder, ready))  # type: ignore[attr-defined]
    child.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(ready) and child.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert child.is_alive(), "the child died before it was killed"
    time.sleep(rng.uniform(0, 0.6))
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    rb = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    try:
        rb.load_checkpoint(folder)
        ids = rb.trajectory_ids
        assert ids == list(range(len(ids)))  # a prefix of what was added
        if ids:
            batch = rb.sample(4096)
            assert torch.equal(batch["curr_obs", "image"][:, 0, 0, 0].long(), batch["rewards"].long() % 256)
            assert torch.equal(batch["actions"].squeeze(-1).long() // 1000, batch["rewards"].long())
        return len(ids)
    finally:
        rb.close()


def test_a_few_kills_always_leave_a_loadable_prefix(tmp_path: Path) -> None:
    rng = random.Random(1)
    ctx = forkserver()
    for round_ in range(3):
        kill_and_check(tmp_path, rng, ctx, round_)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="20 kills take a while: set RUN_SLOW=1")
def test_twenty_kills_always_leave_a_loadable_prefix(tmp_path: Path) -> None:
    rng = random.Random(2)
    ctx = forkserver()
    counts = [kill_and_check(tmp_path, rng, ctx, round_) for round_ in range(20)]
    assert max(counts) > 0  # some kills landed after files were indexed
