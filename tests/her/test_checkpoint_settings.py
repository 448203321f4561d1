"""A full HER checkpoint keeps the relabeling settings: from_checkpoint resumes with them (only
compute_reward, which is code, is passed again); arguments given to from_checkpoint win."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from objectrl_buffer import GoalSelectionStrategy, HerReplayBuffer


def reward(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
    return -(np.abs(np.asarray(achieved) - np.asarray(desired)).sum(-1) > 0).astype(np.float32)


def filled(**kwargs: object) -> HerReplayBuffer:
    rb = HerReplayBuffer("cpu", "cpu", 20, compute_reward=reward, seed=0, **kwargs)  # type: ignore[arg-type]
    for t in range(12):
        g = torch.tensor([float(t)])
        rb.add(
            {
                "obs": g, "goal_a": g, "goal_d": torch.tensor([9.0]), "next_obs": g + 1, "next_goal_a": g + 1,
                "next_goal_d": torch.tensor([9.0]), "reward": -1.0, "terminated": False, "truncated": t % 4 == 3,
            }
        )  # fmt: skip
    return rb


def test_from_checkpoint_resumes_with_the_saved_settings(tmp_path: Path) -> None:
    rb = filled(
        goal_selection_strategy="final", n_sampled_goal=1, achieved_goal_key="goal_a", desired_goal_key="goal_d"
    )
    rb.save(str(tmp_path / "h"), data=True)
    back = HerReplayBuffer.from_checkpoint(str(tmp_path / "h"), compute_reward=reward)
    assert back.goal_selection_strategy is GoalSelectionStrategy.FINAL and back.n_sampled_goal == 1
    assert (back.achieved_goal_key, back.desired_goal_key) == ("goal_a", "goal_d")
    assert (back.next_achieved_goal_key, back.next_desired_goal_key) == ("next_goal_a", "next_goal_d")
    assert torch.equal(back.sample_batch(16)["goal_d"], rb.sample_batch(16)["goal_d"])  # same relabeling, same RNG


def test_arguments_given_to_from_checkpoint_win(tmp_path: Path) -> None:
    rb = filled(goal_selection_strategy="final", achieved_goal_key="goal_a", desired_goal_key="goal_d")
    rb.save(str(tmp_path / "h"), data=True)
    back = HerReplayBuffer.from_checkpoint(
        str(tmp_path / "h"), compute_reward=reward, goal_selection_strategy="episode"
    )
    assert back.goal_selection_strategy is GoalSelectionStrategy.EPISODE and back.n_sampled_goal == 4
