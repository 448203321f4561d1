"""Keeps benchmarks/bench.py from rotting: a --quick run of two workloads (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


def test_quick_run_prints_a_table_and_skips_a_missing_peer(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    cmd = [sys.executable, str(BENCH), "--quick", "-w", "1,3", "-p", "floor,limit,objectrl_buffer,objectrl"]
    cmd += ["--no-download", "--objectrl-wheel", str(tmp_path / "missing.whl"), "--cache-dir", str(tmp_path)]
    cmd += ["-o", str(out), "--set", "w1_calls=300", "--set", "w3_calls=40"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = out.read_text()
    assert "| workload | unit | floor (NumPy ring) | torch ring | objectrl_buffer | ObjectRL 0.2.1 |" in table
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    add = next(line for label, line in rows.items() if label.startswith("1 add, dict of NumPy"))
    sample = next(line for label, line in rows.items() if label.startswith("3 sample(256)"))
    assert "(1.00x)" in add and "(1.00x)" in sample  # the floor's own column: every ratio is to it
    assert add.count("x)") == 2 and sample.count("x)") == 3  # floor and ours add NumPy; + the torch ring samples
    assert "| add_np | 1.5x |" in table and "| get_next_batch | 1.0x |" in table  # the targets of issue 12
    assert "- ObjectRL 0.2.1: ObjectRL 0.2.1 wheel not available" in table  # skipped with a note, no crash
