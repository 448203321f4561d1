"""n-step returns over the ring: a pure function of the stored columns and the ring state.

For a transition at slot ``s`` the n-step target sums up to ``n`` rewards of the rows that follow it
in time, ``R = sum_{j < m} gamma^j r_{s+j}``, and bootstraps from the row where the sum stopped:
``next_state`` and ``terminated`` of row ``s + m - 1``, with discount ``gamma^m``. The sum stops
early (``m < n``) at the first row that ends an episode (``terminated`` or ``truncated``; a truncated
row stops the sum but is not terminal, so a trainer still bootstraps from its ``next_state``) and at
the newest stored row (the write head): rows past it belong to another time.

With a vector environment (``stride = num_envs``, see :mod:`~objectrl_buffer.core.envs`) "the rows that
follow" are those of the same env, ``s + stride, s + 2 * stride, ...``, and the write head is that
env's newest row.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from objectrl_buffer.core.ring import Ring
from objectrl_buffer.core.schema import Key
from objectrl_buffer.core.validate import positive_int, real_in
from objectrl_buffer.sampling.slices import TransitionKeys, episode_ends, require_keys

__all__ = ["check_n_step", "n_step_targets"]


def check_n_step(n_step: object, gamma: object) -> tuple[int, float]:
    """Validate ``n_step`` (an int in ``[1, 2**62]``) and ``gamma`` (a real number in ``[0, 1]``).

    Raises:
        InvalidArgumentError: naming the argument and the value.
    """
    return positive_int(n_step, "n_step"), real_in(gamma, "gamma", 0.0, 1.0)


def n_step_targets(
    columns: Mapping[Key, torch.Tensor],
    slots: torch.Tensor,
    ring: Ring,
    n_step: int,
    gamma: float,
    keys: TransitionKeys,
    stride: int = 1,
) -> dict[Key, torch.Tensor]:
    """n-step values for the transitions at ``slots`` (1-D int64, on the columns' device).

    Args:
        columns: the stored columns, each ``[capacity, *row_shape]``.
        slots: the sampled transitions (live slots).
        ring: the ring state; only its rows that hold data (``ring.held``, the newest) are read.
        n_step: the most rewards summed (>= 1). gamma: the discount.
        keys: which keys hold reward, next_state, terminated, truncated; where discount goes.
        stride: slots between two consecutive rows of one env (``num_envs``; divides the ring's
            capacity, pointer and rows held).

    Returns:
        On the columns' device, batch dimension ``k = len(slots)``:
        ``keys.reward``: the discounted sum, dtype and row shape of the stored reward (a float dtype);
        ``keys.next_state``, ``keys.terminated``, ``keys.truncated``: the stored values of the row the
        sum stopped at; ``keys.discount``: ``gamma ** steps`` (float32 ``[k]``).

    Raises:
        SchemaError: a key in ``keys`` is not stored.
    """
    ends_keys = keys.episode_end
    # An env's rows that hold data bound any sum: a larger n reads the same rows, in a [k, n] window.
    n_step = min(n_step, max(1, ring.held // stride))
    require_keys(columns, (keys.reward, keys.next_state, *ends_keys), "n-step sampling")
    device = slots.device
    k = slots.numel()
    offsets = torch.arange(n_step, device=device)
    window = ring.forward(slots.unsqueeze(1), offsets * stride)  # [k, n]
    # Rows of the env from each slot to its newest one (inclusive): the write head is never crossed.
    available = (ring.held - ring.positions(slots) + stride - 1) // stride  # [k], >= 1
    ends = episode_ends(columns, window, ends_keys).long()  # [k, n]
    ended_before = ends.cumsum(1) - ends  # episode ends among the earlier rows of the window
    used = (ended_before == 0) & (offsets < available.unsqueeze(1))  # a prefix of each row, >= 1 long
    steps = used.sum(1)
    last = window.gather(1, (steps - 1).unsqueeze(1)).squeeze(1)

    reward_column = columns[keys.reward]
    rewards = reward_column.index_select(0, window.reshape(-1)).reshape(k, n_step, *reward_column.shape[1:])
    powers = torch.tensor([gamma**j for j in range(n_step)], dtype=torch.float64, device=device)
    coefficient = torch.where(used, powers, 0.0).reshape(k, n_step, *([1] * (reward_column.dim() - 1)))
    out_dtype = reward_column.dtype if reward_column.dtype.is_floating_point else torch.get_default_dtype()
    targets: dict[Key, torch.Tensor] = {
        keys.reward: (rewards.to(torch.float64) * coefficient).sum(1).to(out_dtype),
        keys.discount: torch.pow(gamma, steps.to(torch.float64)).to(torch.float32),
    }
    for key in (keys.next_state, *ends_keys):
        targets[key] = columns[key].index_select(0, last)
    return targets
