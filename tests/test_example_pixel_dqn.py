"""End-to-end checks of examples/pixel_dqn.py (DQN from rendered CartPole frames, compact replay storage).

The short runs (a few hundred env steps, seconds) check what a user of the example relies on: it trains from
stacked 84x84 frames, and the buffer it reports takes about one frame a row with the compact storage (the
plain storage takes both stacks: 8 frames a row), and ``--help`` answers without importing torch or gymnasium.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("pygame")  # CartPole's rgb_array rendering
pytest.importorskip("PIL")

from tests.support import loaded_script

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pixel_dqn.py"
FRAME = 84 * 84  # bytes of one grayscale frame


@pytest.fixture(scope="module")
def pixel_dqn() -> Iterator[ModuleType]:
    with loaded_script(EXAMPLE, "pixel_dqn") as module:
        yield module


def tiny(tmp_path: Path, *extra: str) -> list[str]:
    """A run of seconds: random actions (~22-step episodes), a gradient step every 10 env steps, a ring of
    250 rows that wraps (``nbytes`` counts the frame ring the capacity needs: per row it is meaningful full)."""
    return [
        "--total-steps", "300", "--buffer-size", "250", "--learning-starts", "100", "--train-frequency", "10",
        "--batch-size", "16", "--start-e", "1", "--end-e", "1", "--storage-dir", str(tmp_path), *extra,
    ]  # fmt: skip


def test_trains_from_frames_in_about_one_frame_a_row(
    pixel_dqn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = pixel_dqn.main(tiny(tmp_path))
    out = capsys.readouterr().out

    assert "env steps: 300, gradient steps: 20" in out  # steps 100, 110, ..., 290
    assert result["episodes"] >= 5 and math.isfinite(result["mean_return"])
    # Each row adds one new 84x84 frame; each episode keeps its first stack and its last next_state aside
    # (8 frames, in a pool that grows by doubling: ~0.5 frame a row at these ~30-step episodes, ~0.01 at
    # Atari's ~1000), the ring's wrap margin 3 frames in all, scalars and bookkeeping a few bytes a row.
    # A plain buffer takes 8 frames a row, one stack stored once (SB3's optimize_memory_usage) 4.
    assert result["plain_bytes_per_row"] > 8 * FRAME  # what the same rows take stored in full
    assert FRAME <= result["bytes_per_row"] <= 2 * FRAME, result
    assert f"{result['bytes_per_row']:,.0f} bytes per row" in out


def test_plain_storage_reports_both_stacks(
    pixel_dqn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--storage", "plain", "--total-steps", "60", "--buffer-size", "50", "--learning-starts", "1000")
    result = pixel_dqn.main(tiny(tmp_path, *args))

    assert result["bytes_per_row"] == result["plain_bytes_per_row"] > 8 * FRAME
    assert "buffer (plain): 50 rows" in capsys.readouterr().out


def test_help_is_fast_and_imports_neither_torch_nor_gymnasium() -> None:
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['pixel_dqn.py', '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('loaded:', 'torch' in sys.modules, 'gymnasium' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--total-steps" in out and "--buffer-size" in out and "--storage" in out
    assert out.strip().splitlines()[-1] == "loaded: False False"
