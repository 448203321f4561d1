"""What a user's type checker sees: mypy run on a small user script (the README's calls) against this
checkout, and the annotations of the rooms' public sample/get methods.

tensordict ships no ``py.typed`` marker, so a user's mypy shows ``TensorDict`` itself as ``Any``; that our
methods declare ``TensorDict`` (not ``Any``) is checked on the annotations at run time instead.

mypy runs from the repository root with the project's configuration and cache (``.mypy_cache``, which
``make test``'s mypy step fills first): about 1 s warm, ~25 s on a cold cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.async_buffer import AsyncSequenceBuffer
from objectrl_buffer.flow import LimitedBuffer
from objectrl_buffer.trajectory import TrajectoryReplayBuffer

ROOT = Path(__file__).resolve().parents[1]

USER_SCRIPT = """
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.flow import SampleToInsertRatio, limited

limiter = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=10, error_buffer=5.0)
rb = ReplayBuffer("cpu", "cpu", 1000, rate_limiter=limiter)
rb.add({"state": torch.zeros(3), "reward": 1.0}, timeout=30)
rb.add_batch({"state": torch.zeros(2, 3), "reward": torch.zeros(2)}, timeout=30)
rb.extend({"state": torch.zeros(2, 3), "reward": torch.zeros(2)}, timeout=30)
batch = rb.sample_batch(2, timeout=30)
batch = rb.sample(2, n_step=3, timeout=30)
per = PrioritizedReplayBuffer("cpu", "cpu", 1000)
per.add({"state": torch.zeros(3)}, timeout=1.0)
batch = per.sample_batch(2, n_step=3, timeout=1.0)
wrapped = limited(ReplayBuffer("cpu", "cpu", 10), SampleToInsertRatio(1.0, 10, 5.0))
wrapped.add({"state": torch.zeros(3)}, timeout=1.0)
reveal_type(rb.pointer)
reveal_type(rb.data_size)
reveal_type(rb.buffer_size)
reveal_type(rb.num_envs)
reveal_type(len(rb))
reveal_type(per.pointer)
reveal_type(rb.device)
wrong: str = rb.pointer
"""


def run_mypy(tmp_path: Path, script: str) -> str:
    path = tmp_path / "user_script.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--show-column-numbers", str(path)],
        cwd=ROOT,  # the project's [tool.mypy] and its cache; the checkout's objectrl_buffer
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout + done.stderr


def test_readme_calls_type_check_and_users_read_ints_and_devices(tmp_path: Path) -> None:
    out = run_mypy(tmp_path, USER_SCRIPT)
    lines = [line.split(": ", 1)[1] for line in out.splitlines() if ": " in line]
    errors = [line for line in lines if line.startswith("error")]
    revealed = [line.split('"')[1] for line in lines if line.startswith("note: Revealed type")]
    assert revealed == ["builtins.int"] * 6 + ["torch._C.device"] or revealed == ["int"] * 6 + ["torch._C.device"], out
    # the one error is the deliberate one: an int is not a str (so pointer is not Any)
    assert len(errors) == 1 and "Incompatible types in assignment" in errors[0], out


@pytest.mark.parametrize(
    "method",
    [
        ReplayBuffer.sample_batch,
        ReplayBuffer.sample,
        ReplayBuffer.sample_random,
        ReplayBuffer.sample_by_index,
        ReplayBuffer.sample_by_index_fields,
        ReplayBuffer.sample_slices,
        ReplayBuffer.sample_all,
        ReplayBuffer.get_next_batch,
        PrioritizedReplayBuffer.sample_batch,
        LimitedBuffer.sample_batch,
        TrajectoryReplayBuffer.sample,
    ],
    ids=lambda m: m.__qualname__,
)
def test_sampling_methods_declare_a_tensordict(method: typing.Callable[..., object]) -> None:
    assert typing.get_type_hints(method)["return"] is TensorDict


def test_async_get_batch_declares_indices_and_a_tensordict() -> None:
    hints = typing.get_type_hints(AsyncSequenceBuffer.get_batch)
    assert hints["return"] == tuple[torch.Tensor, TensorDict]


@pytest.mark.parametrize("name", ["pointer", "data_size", "buffer_size", "num_envs"])
def test_counters_are_typed_ints(name: str) -> None:
    prop = getattr(ReplayBuffer, name)
    assert typing.get_type_hints(prop.fget)["return"] is int
