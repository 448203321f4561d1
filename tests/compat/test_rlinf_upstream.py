"""The same RLinf calls on rlinf 0.3.0's own buffer (loaded from its wheel, skipped offline) and on
``objectrl_buffer.compat.rlinf`` give the same dict keys, shapes, dtypes and counts (issue 26)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer.compat import rlinf as compat
from tests.compat import rlinf_wheel


def layout(batch: dict[str, Any]) -> dict[str, Any]:
    """Keys, shapes and dtypes of a nested dict sample."""
    return {
        key: layout(value) if isinstance(value, dict) else (tuple(value.shape), value.dtype)
        for key, value in batch.items()
    }


def both(tmp_path: Path, **kwargs: Any) -> tuple[Any, Any]:
    """rlinf 0.3.0's buffer and ours, built with the same (0.3.0) arguments, each in its own folder."""
    upstream = rlinf_wheel.upstream()
    made = []
    for name, cls in (("up", upstream.TrajectoryReplayBuffer), ("ours", compat.TrajectoryReplayBuffer)):
        made.append(cls(seed=3, auto_save_path=str(tmp_path / name), **kwargs))
    return made[0], made[1]


def counts(rb: Any) -> tuple[Any, ...]:
    return len(rb), rb.total_samples, rb.get_stats(), rb.is_ready(3)


@pytest.mark.parametrize("auto_save", [False, True], ids=["cache-only", "auto-save"])
def test_the_sac_workers_calls_give_the_same_dicts_and_counts(tmp_path: Path, auto_save: bool) -> None:
    """RLinf's SAC worker: add the received trajectories, cut the demonstrations out of them
    (``extract_intervene_traj``), wait for ``is_ready``, sample half and half, ``concat_batch``, log
    ``get_stats``; more rollouts than the window; RLinf's cleanup."""
    io = rlinf_wheel.io()
    replays = both(tmp_path / "replay", enable_cache=True, cache_size=2, sample_window_size=3, auto_save=auto_save)
    demos = both(tmp_path / "demo", enable_cache=True, cache_size=2, sample_window_size=3, auto_save=auto_save)
    try:
        for step in range(3):
            recv = [rlinf_wheel.rollout(io, B=2, steps=4, epochs=1, seed=10 + step, intervene=frozenset({(1, 0)}))]
            recv += [rlinf_wheel.rollout(io, B=2, steps=4, epochs=2, seed=s) for s in (step, 100 + step)]
            cut = [part for traj in recv for part in (traj.extract_intervene_traj() or [])]
            for i in range(2):
                replays[i].add_trajectories(recv)
                demos[i].add_trajectories(cut)
            assert counts(replays[0]) == counts(replays[1]) and counts(demos[0]) == counts(demos[1])
            shapes = [
                layout(io.concat_batch(replay.sample(8), demo.sample(8)))
                for replay, demo in zip(replays, demos, strict=True)
            ]
            assert shapes[0] == shapes[1], step
            assert set(shapes[1]["forward_inputs"]) == {"action"} and shapes[1]["actions"][1] == torch.float32
        for buffers in (replays, demos):
            for rb in buffers:
                rb.close()
                rb.clear()
                rb.clear_cache()
            assert (
                counts(buffers[0])
                == counts(buffers[1])
                == (0, 0, {"num_trajectories": 0, "total_samples": 0, "cache_size": 0}, False)
            )
    finally:
        for rb in (*replays, *demos):
            rb.close()


def test_a_checkpoint_loads_into_the_same_counts_and_dicts(tmp_path: Path) -> None:
    """Each buffer saves with ``auto_save`` and loads its own checkpoint back, sharded as RLinf's worker does."""
    io = rlinf_wheel.io()
    buffers = both(tmp_path, cache_size=3, sample_window_size=0, auto_save=True)
    loaded = []
    try:
        for i, rb in enumerate(buffers):
            rb.add_trajectories([rlinf_wheel.rollout(io, seed=s, epochs=2) for s in range(5)])
            rb.sample(4)  # upstream's save copies the files of the window it last sampled
            rb.save_checkpoint(str(tmp_path / f"ck{i}"))
            fresh = type(rb)(seed=0, sample_window_size=10)
            loaded.append(fresh)
            fresh.load_checkpoint(str(tmp_path / f"ck{i}"), is_distributed=True, local_rank=0, world_size=2)
        assert counts(loaded[0]) == counts(loaded[1]) and len(loaded[1]) == 3
        assert layout(loaded[0].sample(8)) == layout(loaded[1].sample(8))
    finally:
        for rb in (*buffers, *loaded):
            rb.close()
