"""Helpers of the trajectory tests: marker trajectories whose every value tells which trajectory it came from."""

from __future__ import annotations

import torch

from objectrl_buffer.trajectory import Trajectory


def marked(m: int, T: int = 4, B: int = 2, *, epochs: int = 0, image: bool = False) -> Trajectory:
    """Trajectory ``m``: rewards/obs hold ``m`` (actions ``m*1000 + row``, so rows are told apart too).

    ``epochs`` > 0 gives the done-like fields ``T + epochs`` rows, the first row of each epoch 1 (dropped)."""
    rows = torch.arange(T * B, dtype=torch.float32).reshape(T, B)
    dones = torch.zeros(T + epochs, B, dtype=torch.bool)
    if epochs:
        dones.reshape(epochs, T // epochs + 1, B)[:, 0] = True
    obs = {"state": torch.full((T, B, 3), float(m))}
    if image:
        obs["image"] = torch.full((T, B, 3, 8, 8), m % 256, dtype=torch.uint8)
    return Trajectory(
        max_episode_length=T,
        model_weights_id=f"w{m}_0",
        actions=(m * 1000 + rows).unsqueeze(-1),
        rewards=torch.full((T, B), float(m)),
        dones=dones,
        prev_logprobs=torch.zeros(T, B),
        curr_obs=obs,
        next_obs={"state": torch.full((T, B, 3), float(m) + 0.5)},
    )
