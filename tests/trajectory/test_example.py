"""examples/trajectory_ppo.py runs end to end with short settings, and its saved rollouts load."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from objectrl_buffer.trajectory import TrajectoryReplayBuffer

pytest.importorskip("gymnasium")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trajectory_ppo.py"


def test_short_run_adds_rollouts_samples_and_persists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("trajectory_ppo", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path / "rollouts"
    argv = ["--iterations", "3", "--T", "16", "--B", "2", "--updates", "2", "--chunks", "32", "--window", "2"]
    score = module.main([*argv, "--storage-dir", str(folder), "--capacity", "64"])
    assert score >= 0.0
    out = capsys.readouterr().out
    assert "done: 2 rollouts / 64 transitions stored" in out  # capacity 64: the newest two
    progress = [line for line in out.splitlines() if line.startswith("iteration ")]
    assert [line.split(":")[0] for line in progress] == ["iteration 1/3", "iteration 2/3", "iteration 3/3"]
    rb = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    rb.load_checkpoint(str(folder))
    assert rb.trajectory_ids == [1, 2]
    batch = rb.sample(64)
    assert batch["curr_obs", "state"].shape == (64, 4) and batch["forward_inputs", "advantages"].shape == (64,)
    rb.close()
