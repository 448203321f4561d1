"""Hand-built goal episodes for the HER tests: every row's ``next_achieved_goal`` is its unique row id, so a
relabeled ``desired_goal`` names the row its goal came from."""

from __future__ import annotations

from typing import Any

import torch

from objectrl_buffer import HerReplayBuffer

#: ``desired_goal`` of every stored row: no row id is negative, so a relabeled goal never equals it.
REAL_GOAL = -1


def encoded_reward(achieved: torch.Tensor, desired: torch.Tensor, infos: Any) -> torch.Tensor:
    """A reward that shows which goals it was computed from: ``1000 * achieved + desired``."""
    return (1000 * achieved + desired).squeeze(-1).float()


def her(capacity: int, *, num_envs: int = 1, **kwargs: Any) -> HerReplayBuffer:
    kwargs.setdefault("compute_reward", encoded_reward)
    kwargs.setdefault("seed", 0)
    return HerReplayBuffer("cpu", "cpu", capacity, num_envs=num_envs, **kwargs)


def row(row_id: int, episode: int, step: int, end: bool, *, terminal: bool = False) -> dict[str, torch.Tensor]:
    """One transition of a goal env: ids as int64 ``[1]`` goals; ``end`` cuts the episode (truncated, or
    terminated with ``terminal``)."""
    return {
        "observation": torch.tensor([float(row_id)]),
        "achieved_goal": torch.tensor([row_id - 1]),
        "desired_goal": torch.tensor([REAL_GOAL]),
        "next_achieved_goal": torch.tensor([row_id]),
        "next_desired_goal": torch.tensor([REAL_GOAL]),
        "action": torch.tensor(0),
        "reward": torch.tensor(-1.0),
        "episode": torch.tensor(episode),
        "step": torch.tensor(step),
        "terminated": torch.tensor(end and terminal),
        "truncated": torch.tensor(end and not terminal),
    }


def write_episodes(rb: HerReplayBuffer, lengths: list[int], *, unfinished: int = 0, first_id: int = 0) -> list[int]:
    """Write episodes of ``lengths`` (then ``unfinished`` steps of one more) to a one-env buffer; return each
    row's episode number, by row id."""
    episodes: list[int] = []
    for episode, length in enumerate([*lengths, unfinished]):
        for step in range(length):
            end = step == length - 1 and episode < len(lengths)
            rb.add(row(first_id + len(episodes), episode, step, end, terminal=episode % 2 == 1))
            episodes.append(episode)
    return episodes
