"""Keeps benchmarks/distributed_bench.py --cluster from rotting: a simulated 3-node Ray cluster, beside torchrl's
RayReplayBuffer (no timing assertions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "distributed_bench.py"


def run(tmp_path: Path, *flags: str) -> dict[str, list[str]]:
    """The bench's table rows by their first cell."""
    env = dict(os.environ, PYTHONPATH=str(BENCH.parents[1]))
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--cluster", "--quick", *flags],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    return {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]] for line in lines}


def test_two_shard_samples_on_a_simulated_cluster_beside_torchrl(tmp_path: Path) -> None:
    rows = run(tmp_path, "--sections", "samples", "--kinds", "small", "--shards", "2", "--samples", "5")
    for measure in ("sample_batch(256) p50, ms", "sample_batch(256) p99, ms", "MB shipped a sample(256)"):
        ours, theirs, ratio = rows[f"small rows, 2 shards: {measure}"]
        assert float(ours) > 0 and float(theirs) > 0 and ratio.endswith("x")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="three simulated clusters, ~90 s: set RUN_SLOW=1")
def test_quick_mode_runs_every_section(tmp_path: Path) -> None:
    rows = run(tmp_path)
    for kind in ("small", "atari"):
        for shards in ("1 shard", "2 shards"):
            assert f"{kind} rows, {shards}: add_batch" in " ".join(rows), kind
            assert float(rows[f"{kind} rows, {shards}: sample_batch(256) p50, ms"][0]) > 0
        assert "every shard ships 256 rows (before)" in rows and "two calls: masses, then the rows kept" in rows
    mode, writes, _, samples, _, after = rows["tuned"]  # the stall after a node loss, and the calls after it
    assert mode in ("wait", "degrade") and float(writes) > 0 and float(samples) > 0
    assert all(int(n) > 0 for n in after.split(";")), after  # writes and samples flowed again
