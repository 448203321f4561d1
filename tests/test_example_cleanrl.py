"""examples/cleanrl_dqn_vec.py: a gymnasium.make_vec rollout of several envs goes into a num_envs= buffer as
one stream per env, with each episode's real last observation (SAME_STEP autoreset) and no row from one
episode into the next, and DQN trains on it. Its short settings run here in a few seconds (issue 26)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.support import loaded_script

pytest.importorskip("gymnasium")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cleanrl_dqn_vec.py"
# CartPole-v1 ends an episode (terminated) once |x| > 2.4 or |angle| > 12 degrees
X_LIMIT, ANGLE_LIMIT = 2.4, 12 * 2 * math.pi / 360


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    with loaded_script(EXAMPLE, "cleanrl_dqn_vec") as module:
        yield module


def short(*extra: str) -> list[str]:
    """1,600 env steps of 4 envs: the ring of 800 rows wraps, 150 gradient steps."""
    return [
        "--total-timesteps", "1600", "--num-envs", "4", "--buffer-size", "800", "--learning-starts", "400",
        "--batch-size", "32", "--target-network-frequency", "100", "--hidden", "32", "--log-every", "800", *extra,
    ]  # fmt: skip


def outside(state: torch.Tensor) -> torch.Tensor:
    """Whether each CartPole observation ``[..., 4]`` is past the limits that end an episode."""
    return (state[..., 0].abs() > X_LIMIT) | (state[..., 2].abs() > ANGLE_LIMIT)


def test_a_vector_rollout_is_stored_as_one_stream_per_env_and_trains(
    example: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    result = example.main(short())
    out = capsys.readouterr().out
    memory = result.memory
    assert (memory.num_envs, len(memory), memory.buffer_size) == (4, 800, 800)
    rows = memory.sample_all()  # [T, E], oldest first: env e's rows in time order in column e
    assert rows.batch_size == (200, 4)
    ended = rows["terminated"] | rows["truncated"]
    # each env's stream is continuous: a row's next_state is the same env's next row's state, except at ends
    follows = (rows["next_state"][:-1] == rows["state"][1:]).all(-1)
    assert bool(follows[~ended[:-1]].all())
    assert int((~follows).sum()) == int(ended[:-1].sum()) > 0  # where an episode ended, a fresh one starts
    # the real last observation is stored (SAME_STEP's final_obs), and no row starts from one
    assert bool(outside(rows["next_state"][rows["terminated"]]).all()) and int(rows["terminated"].sum()) > 0
    assert not bool(outside(rows["state"]).any())
    assert not bool(outside(rows["next_state"][~rows["terminated"]]).any())
    # trained: a gradient step every 2nd vector step from env step 400 on (vector steps 100, 102, ..., 398)
    assert result.gradient_steps == len(range(100, 400, 2))
    assert result.episodes > 20 and math.isfinite(result.mean_return)
    assert out.strip().splitlines()[-1] == f"mean return over last 20 episodes: {result.mean_return:.1f}"
    assert "step 800/1600" in out and "step 1600/1600" in out


def test_the_buffer_size_must_hold_whole_vector_steps(example: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        example.main(short("--buffer-size", "801"))
    assert usage.value.code == 2
    assert "--buffer-size (801) must be a multiple of --num-envs (4)" in capsys.readouterr().err
