"""Keeps benchmarks/pixel_bench.py from rotting: a small run of three peers (no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "pixel_bench.py"


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="three child processes, ~20 s: set RUN_SLOW=1")
def test_small_run_prints_the_table_with_memory_ratios(tmp_path: Path) -> None:
    out, raw = tmp_path / "pixels.md", tmp_path / "pixels.json"
    cmd = [sys.executable, str(BENCH), "--rows", "600", "--adds", "100", "--samples", "40", "--block", "20"]
    cmd += ["--episode-len", "100", "200", "-p", "compact,plain,floor", "--tmp-dir", str(tmp_path)]
    cmd += ["-o", str(out), "--json", str(raw)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = out.read_text()
    head = "| metric | objectrl_buffer compact | objectrl_buffer plain | NumPy floor (unique frames) |"
    assert head in table, table
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in table.splitlines() if line.startswith("| ")}
    compact, plain, floor = rows["bytes per row, own count (x one frame = 7,056 B)"]
    assert "(8.00x)" in plain and "(1.0" in floor  # both stacks of every row in full; unique frames + a bit
    ratio = float(compact.split("(")[1].split("x")[0])  # one frame a row + episode ends + the wrap margin
    assert 1.0 <= ratio <= 1.3, compact
    results = json.loads(raw.read_text())["results"]
    assert results["compact"]["rows"] == 600 and results["compact"]["unique_frames"] > 600
    for peer in ("compact", "plain", "floor"):  # every peer saved and loaded its full buffer
        assert results[peer]["ckpt_bytes"] > 0 and results[peer]["load_ms"] > 0
    assert results["compact"]["ckpt_bytes"] * 4 < results["plain"]["ckpt_bytes"]  # a checkpoint in compact form
    assert any(label.startswith("sample(32)") for label in rows) and any(label.startswith("add,") for label in rows)
