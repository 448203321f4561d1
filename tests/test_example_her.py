"""examples/her_bit_flipping.py: DQN with hindsight experience replay on bit flipping.

The quick tests run a few cycles on 4 bits (the plumbing: env, buffer with num_envs, relabeled batches, the
success rate printed) and ``--help`` (argparse before torch). The paper's claim, 15 bits solved with HER
(success >= 0.9) and not without (Andrychowicz et al. 2017, Fig. 1), takes a few CPU-minutes and runs only
with ``RUN_SLOW=1``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.support import loaded_script

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "her_bit_flipping.py"
TINY = ["--bits", "4", "--cycles", "3", "--envs", "4", "--steps-per-cycle", "6", "--updates", "3",
        "--batch-size", "16", "--hidden", "16", "--eval-episodes", "32", "--eval-every", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    threads = torch.get_num_threads()  # main() sets its own (--threads)
    with loaded_script(EXAMPLE, "her_bit_flipping") as module:
        yield module
    torch.set_num_threads(threads)


@pytest.mark.parametrize("her", [True, False], ids=["her", "no-her"])
def test_short_run_prints_its_success_rate(example: ModuleType, her: bool, capsys: pytest.CaptureFixture[str]) -> None:
    rate = example.main([*TINY, *([] if her else ["--no-her"])])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == ("bits=4 her=future, n_sampled_goal=4" if her else "bits=4 her=off")
    assert out[-1] == f"final success rate: {rate:.2f}" and 0.0 <= rate <= 1.0
    assert "3 cycles, 72 rows" in out[-2]


def test_four_bits_are_learned_with_her(example: ModuleType) -> None:
    """A run of ~2 s: 1,000 gradient steps; the seeded run reaches 0.91 (plain DQN 0.75, seeds 0-2 of HER 0.91-1.00)."""
    args = ["--bits", "4", "--cycles", "40", "--envs", "8", "--steps-per-cycle", "4", "--updates", "25",
            "--batch-size", "64", "--hidden", "64", "--eval-every", "0", "--seed", "0"]  # fmt: skip
    assert example.main(args) >= 0.8


def test_env_rewards_and_relabeled_rewards_agree(example: ModuleType) -> None:
    """The env's reward is the one compute_reward gives its (next achieved, desired) goals."""
    env = example.BitFlipping(64, 3, torch.Generator().manual_seed(0))
    for _ in range(6):
        step = env.step(torch.randint(0, 3, (64,)))
        expected = example.compute_reward(step["next_achieved_goal"], step["desired_goal"], [{}] * 64)
        assert torch.equal(step["reward"], expected)
        assert torch.equal(step["terminated"], step["reward"] == 0)


def test_help_is_fast_and_lists_the_options() -> None:
    code = (
        "import runpy, sys\nsys.argv = ['her_bit_flipping.py', '--help']\n"
        f"try:\n    runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported before the arguments are parsed'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    for option in ("--bits", "--no-her", "--n-sampled-goal", "--strategy", "--seed"):
        assert option in done.stdout


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="a few CPU-minutes: set RUN_SLOW=1")
def test_fifteen_bits_are_solved_with_her_and_not_without(example: ModuleType) -> None:
    assert example.main(["--bits", "15", "--eval-every", "0"]) >= 0.9
    assert example.main(["--bits", "15", "--eval-every", "0", "--no-her"]) < 0.5
