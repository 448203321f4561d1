"""``seed=None``: the buffer's generator follows the global torch seed, as upstream's global sampling does.

ObjectRL seeds torch globally (``torch.manual_seed``) and never passes a seed to its buffer; two runs with
the same seed must sample the same rows, and building or sampling a buffer must not move any global RNG.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
    torch.manual_seed(int(sys.argv[1]))
    torch.rand(3)  # the agent's networks draw from the global generator before the buffer is built
    out = []
    for cls in (ReplayBuffer, ReplayBuffer, PrioritizedReplayBuffer):
        rb = cls("cpu", "cpu", 50, storage_dir=sys.argv[2])
        rb.add_batch({"x": torch.arange(50.0)})
        out.append(rb.sample_batch(32)["index"].tolist())
        out.append([b["index"].tolist() for b in rb.create_epoch_iterator(25, shuffle=True)])
        rb.close()
    print(out)
    """
)


def run_seeded(seed: int, tmp_path: Any) -> str:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(seed), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    return result.stdout


def test_same_global_seed_gives_the_same_samples_in_two_processes(tmp_path: Any) -> None:
    first, second = run_seeded(7, tmp_path), run_seeded(7, tmp_path)
    assert first == second
    assert run_seeded(8, tmp_path) != first


def draws(rb: ReplayBuffer) -> list[int]:
    rb.add_batch({"x": torch.arange(50.0)})
    return rb.sample_batch(32)["index"].tolist()


def test_buffers_built_one_after_another_differ(tmp_path: Any) -> None:
    torch.manual_seed(3)
    a = ReplayBuffer("cpu", "cpu", 50, storage_dir=tmp_path)
    b = ReplayBuffer("cpu", "cpu", 50, storage_dir=tmp_path)
    assert draws(a) != draws(b)


def test_a_new_global_seed_restarts_the_sequence(tmp_path: Any) -> None:
    """Seeding with another value and then the first one again rebuilds the same streams in one process."""
    torch.manual_seed(11)
    first = [draws(ReplayBuffer("cpu", "cpu", 50, storage_dir=tmp_path)) for _ in range(2)]
    torch.manual_seed(12)
    other = draws(ReplayBuffer("cpu", "cpu", 50, storage_dir=tmp_path))
    torch.manual_seed(11)
    again = [draws(ReplayBuffer("cpu", "cpu", 50, storage_dir=tmp_path)) for _ in range(2)]
    assert again == first
    assert other not in first


def test_an_explicit_seed_still_wins(tmp_path: Any) -> None:
    torch.manual_seed(1)
    a = draws(ReplayBuffer("cpu", "cpu", 50, seed=5, storage_dir=tmp_path))
    torch.manual_seed(2)
    b = draws(ReplayBuffer("cpu", "cpu", 50, seed=5, storage_dir=tmp_path))
    assert a == b


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_global_rng_states_are_untouched(cls: type[ReplayBuffer], tmp_path: Any) -> None:
    torch.manual_seed(4)
    np.random.seed(4)
    random.seed(4)
    before = (torch.get_rng_state(), np.random.get_state(), random.getstate(), torch.initial_seed())
    rb = cls("cpu", "cpu", 20, storage_dir=tmp_path)
    rb.add_batch({"x": torch.arange(30.0)})
    rb.sample_batch(8)
    list(rb.create_epoch_iterator(4, shuffle=True))
    after = (torch.get_rng_state(), np.random.get_state(), random.getstate(), torch.initial_seed())
    assert torch.equal(before[0], after[0])
    assert before[1][0] == after[1][0] and np.array_equal(before[1][1], after[1][1]) and before[1][2:] == after[1][2:]
    assert before[2:] == after[2:]
