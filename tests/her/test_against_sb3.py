"""The rows HerReplayBuffer draws against Stable-Baselines3's own HerReplayBuffer fed the same episodes.

SB3 marks the rows of finished, never overwritten episodes as valid (``ep_length > 0``). Ours draw the same
rows, but for one case: after the ring wraps, an episode that starts exactly at the oldest row held is left out
(the end flag before it is gone), so ours are SB3's minus at most that episode.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.her.episodes import her, row

sb3_her = pytest.importorskip("stable_baselines3.her.her_replay_buffer")
spaces = pytest.importorskip("gymnasium.spaces")


class NoEnv:
    """SB3's buffer only calls ``env_method("compute_reward", ...)`` when it samples relabeled rows."""

    num_envs = 1

    def env_method(self, name: str, achieved: np.ndarray, desired: np.ndarray, infos: object, indices: object) -> list:
        return [np.zeros(len(achieved), dtype=np.float32)]


def random_ends(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.random(int(rng.integers(5, 60))) < 0.25


#: 48 rows in 24 slots, episodes of 4: the oldest row held (row 24) starts an episode
ALIGNED = np.arange(48) % 4 == 3


@pytest.mark.parametrize("ends", [*map(random_ends, range(6)), ALIGNED], ids=[*map(str, range(6)), "aligned"])
def test_the_same_rows_as_sb3_are_drawn(ends: np.ndarray) -> None:
    capacity, seed = 24, 0
    box = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    space = spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})
    sb3 = sb3_her.HerReplayBuffer(capacity, space, spaces.Discrete(2), env=NoEnv(), device="cpu")
    ours = her(capacity, seed=seed)
    for row_id, end in enumerate(ends):
        ours.add(row(row_id, 0, 0, bool(end)))
        obs = {key: np.array([[float(row_id)]], dtype=np.float32) for key in space.spaces}
        sb3.add(obs, obs, np.array([[0]]), np.array([-1.0]), np.array([bool(end)]), [{}])
    sb3_rows = set(np.flatnonzero(sb3.ep_length[:, 0] > 0).tolist())  # slots: both write row i to slot i % capacity
    if not sb3_rows:
        assert ours.sampleable_rows == 0
        return
    drawn = set(torch.cat([ours.sample(256)["index"] for _ in range(8)]).tolist()) if ours.sampleable_rows else set()
    assert ours.sampleable_rows == len(drawn) and drawn <= sb3_rows
    left_out = sb3_rows - drawn
    if left_out:  # only the episode starting at the oldest row of a wrapped ring
        oldest = len(ends) % capacity
        assert len(ends) >= capacity and oldest in left_out
        assert left_out == {(oldest + i) % capacity for i in range(len(left_out))}
    if ends is ALIGNED:
        assert left_out == {0, 1, 2, 3}
