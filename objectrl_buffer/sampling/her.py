"""Hindsight relabeling over the ring: which rows are finished episodes, and which step's goal replaces a row's.

Pure functions over the episode-end flags and the ring state; the buffer (``her/``) reads the rows and
calls the user's reward. Rows are addressed by *position* (``0`` = the oldest row held; see
:mod:`~objectrl_buffer.sampling.slices`); with a vector environment (``stride = num_envs``) env ``e``'s
stream is the positions ``t * stride + e``, and an episode is a run of one stream's steps that ends
at a row with a non-zero ``terminated`` or ``truncated``.

Which rows can be drawn (Stable-Baselines3's ``HerReplayBuffer`` rules, re-derived from the flags at
sample time instead of stored per row):

* only rows of **finished** episodes: the steps of a stream after its last episode end (the episode
  still being written, up to the write head) are neither sampled nor used as goals until it ends;
* only rows of episodes whose **first step is held**: once the ring has overwritten the beginning of an
  episode, its remaining rows are not drawn (SB3 drops the whole episode when its first row is
  overwritten). After the ring has wrapped (or after a metadata-only load) the oldest steps of each
  stream, up to their first episode end, are treated so; an episode that happened to start exactly at
  the oldest held row is dropped with them (its predecessor's end flag is gone), a few rows at most.

Goals (SB3's definitions; ``t`` is the sampled row's step in its episode of ``T`` steps ``0 .. T-1``):
``future``: a step uniform in ``[t, T-1]`` (inclusive of ``t``, as SB3); ``final``: ``T-1``;
``episode``: a step uniform in ``[0, T-1]``. The goal is that step's *next* achieved goal.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from objectrl_buffer.core.ring import Ring
from objectrl_buffer.errors import InvalidArgumentError

__all__ = [
    "GoalSelectionStrategy",
    "goal_strategy",
    "Episodes",
    "finished_episodes",
    "draw_goal_steps",
    "oldest_row_starts",
]


class GoalSelectionStrategy(str, enum.Enum):
    """Which step of the sampled row's episode gives the new goal (SB3's names)."""

    FUTURE = "future"
    FINAL = "final"
    EPISODE = "episode"


def goal_strategy(value: object) -> GoalSelectionStrategy:
    """``value`` as a :class:`GoalSelectionStrategy`: one, a name in any case (``"future"``, ``"FINAL"``),
    or an enum member of another library with such a name (SB3's ``GoalSelectionStrategy.FUTURE``).

    Raises:
        InvalidArgumentError: naming ``goal_selection_strategy`` and the allowed values.
    """
    if isinstance(value, GoalSelectionStrategy):
        return value
    name = value if isinstance(value, str) else getattr(value, "name", None)
    if isinstance(value, (enum.Enum, str)):
        for member in GoalSelectionStrategy:
            if isinstance(name, str) and name.lower() == member.value:
                return member
    allowed = [m.value for m in GoalSelectionStrategy]
    raise InvalidArgumentError(f"goal_selection_strategy must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class Episodes:
    """The rows HER may draw, and each one's episode, for one ring state.

    Attributes:
        positions: positions of the drawable rows (``[n]`` int64, ascending).
        first: for every position held, the step (``position // stride``) its episode starts at (``[held]``).
        last: for every position held, the step its episode ends at (``[held]``; meaningless where the
            row is not drawable).
        stride: positions between two steps of one env (``num_envs``).
    """

    positions: torch.Tensor
    first: torch.Tensor
    last: torch.Tensor
    stride: int


def finished_episodes(ends: torch.Tensor, stride: int, oldest_starts: bool) -> Episodes:
    """The drawable rows, from the episode-end flag of every row held.

    Args:
        ends: ``[held]`` bool, by position: the row ends an episode (``held`` a multiple of ``stride``).
        stride: ``num_envs``.
        oldest_starts: the oldest held row of each stream is known to start an episode (nothing was
            ever overwritten, so it is the first row written); else the first segment is dropped.

    ``O(held)``, vectorised over the streams.
    """
    device = ends.device
    per_env = ends.reshape(-1, stride)  # [steps, stride]: column e is env e's stream
    steps = per_env.shape[0]
    time = torch.arange(steps, device=device).unsqueeze(1).expand(steps, stride)
    # The step after the previous end (exclusive scan): where each row's episode starts, -1 if unknown.
    end_at = torch.where(per_env, time, -1)
    previous_end = torch.cat([end_at.new_full((1, stride), -1), end_at[:-1]]).cummax(0).values
    first = previous_end + 1
    # The next end at or after each row: where its episode ends, ``steps`` if it has not ended yet.
    next_end = torch.where(per_env, time, steps).flip(0).cummin(0).values.flip(0)
    drawable = next_end < steps
    if not oldest_starts:
        drawable &= previous_end >= 0
    return Episodes(drawable.reshape(-1).nonzero().squeeze(1), first.reshape(-1), next_end.reshape(-1), stride)


def draw_goal_steps(
    episodes: Episodes, positions: torch.Tensor, strategy: GoalSelectionStrategy, generator: torch.Generator
) -> torch.Tensor:
    """The position of the goal step for each drawable row at ``positions`` (``[k]`` int64), by ``strategy``:
    the same env's stream and episode, never past its last step (so never the write head)."""
    stride = episodes.stride
    step, env = positions // stride, positions % stride
    first, last = episodes.first[positions], episodes.last[positions]
    if strategy is GoalSelectionStrategy.FINAL:
        goal = last
    else:
        low = step if strategy is GoalSelectionStrategy.FUTURE else first
        # uniform in [low, last]: floor(u * count) with a float64 u (bias below count * 2**-53)
        u = torch.rand(positions.shape, generator=generator, dtype=torch.float64, device=positions.device)
        goal = low + (u * (last - low + 1)).long().clamp_max_(last - low)
    return goal * stride + env


def oldest_row_starts(ring: Ring) -> bool:
    """Whether the oldest held row is the first row written since the buffer was empty (nothing overwritten)."""
    return ring.phantom == 0 and ring.size < ring.capacity
