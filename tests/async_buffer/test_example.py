"""examples/async_pipeline.py runs end to end: every sequence read once per trainer, the buffer drained."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_async_pipeline_example_runs(tmp_path: Path) -> None:
    ckpt = tmp_path / "pipeline.ckpt"
    cmd = [sys.executable, str(ROOT / "examples" / "async_pipeline.py"), "--batches", "3", "--size", "8"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([*cmd, "--save", str(ckpt)], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "72 sequences through put -> amend -> 2 trainers" in out.stdout
    assert "left in the buffer: 0; freed: 72" in out.stdout
    assert ckpt.exists()
    assert "is_fx_tracing" not in out.stderr  # torch's notice, printed by jagged batches before (issue 24)


def test_only_torchs_fx_tracing_notice_is_kept_quiet() -> None:
    script = (
        "import logging, torch\n"
        "from objectrl_buffer.async_buffer.samples import quiet_fx_tracing_notice\n"
        "quiet_fx_tracing_notice()\n"
        "v = torch.nested.nested_tensor_from_jagged(torch.arange(3.0), torch.tensor([0, 1, 3]))\n"
        "logging.getLogger('torch.fx._symbolic_trace').warning('another torch.fx warning')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "is_fx_tracing" not in out.stderr
    assert "another torch.fx warning" in out.stderr
