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
    import logging

    import torch
    from torch.fx import _symbolic_trace

    from objectrl_buffer.async_buffer import samples

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(_symbolic_trace.__name__)
    logger.addHandler(handler)
    try:
        _symbolic_trace.is_fx_tracing_warning.cache_clear()  # as in a fresh process
        samples.quiet_fx_tracing_notice.cache_clear()
        parts = [torch.arange(1.0), torch.arange(2.0)]
        payloads = [{"x": part} for part in parts]
        spec = {"x": samples.KeySpec.of(parts[0])}
        batch = samples.gather(torch.arange(2), payloads, ["x"], spec, torch.device("cpu"))
        assert batch["x"].is_nested  # a jagged batch, the call that printed the notice
        logger.warning("another torch.fx warning")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["another torch.fx warning"]
