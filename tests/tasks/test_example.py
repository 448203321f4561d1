"""examples/agent_tasks.py runs as a script: writer processes, a query by agent and task name, TensorDicts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_tasks.py"


def test_agent_tasks_example_runs() -> None:
    cmd = [sys.executable, str(EXAMPLE), "--workers", "2", "--tasks", "4", "--steps", "5"]
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parents[1])}  # this checkout's package, not an installed one
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=EXAMPLE.parents[1], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "stored 40 steps of 8 tasks" in out
    assert "executor steps in math tasks: 16" in out  # 2 workers x 2 math tasks x 4 executor steps
    assert "steps [0, 1, 2, 3, 4]" in out and "TensorDict(" in out
