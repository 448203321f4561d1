"""Hindsight relabeling over the ring: which rows are finished episodes, and which step's goal replaces a row's.

Pure functions over the episode-end flags and the ring state; the buffer (``her/``) reads the rows and
calls the user's reward. Rows are addressed by *position* (``0`` = the oldest row held; see
:mod:`~objectrl_buffer.sampling.slices`); with a vector environment (``stride = num_envs``) env ``e``'s
stream is the positions ``t * stride + e``, and an episode is a run of one stream's steps that ends
at a row with a non-zero ``terminated`` or ``truncated``.

Which rows can be drawn (Stable-Baselines3's ``HerReplayBuffer`` rules, re-derived from the flags at
sample time instead of stored per row); in each env's stream they are one run of steps, from the first
step of its oldest whole episode to its newest episode end:

* only rows of **finished** episodes: the steps of a stream after its last episode end (the episode
  still being written, up to the write head) are neither sampled nor used as goals until it ends;
* only rows of episodes whose **first step is held**: once the ring has overwritten the beginning of an
  episode, its remaining rows are not drawn (SB3 drops the whole episode when its first row is
  overwritten). After the ring has wrapped (or after a metadata-only load) the oldest steps of each
  stream, up to their first episode end, are treated so; an episode that happened to start exactly at
  the oldest held row is dropped with them (its predecessor's end flag is gone), a few rows at most.

Nothing scans the whole buffer: the ends of those runs and each sampled row's episode are found by
reading the flags of growing windows around them (``O(episode length)`` rows each, vectorised).

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
from objectrl_buffer.sampling.slices import StoredRows

__all__ = [
    "GoalSelectionStrategy",
    "goal_strategy",
    "Drawable",
    "drawable_steps",
    "draw_rows",
    "draw_goal_steps",
    "oldest_row_starts",
]

#: Steps of each window in the first round of a search for an episode end (doubled each round).
FIRST_WINDOW = 64


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


def _nearest_end(rows: StoredRows, steps: torch.Tensor, envs: torch.Tensor, direction: int) -> torch.Tensor:
    """For each ``(steps[i], envs[i])``, the nearest step of that env's stream at or after (``direction=1``)
    or at or before (``-1``) ``steps[i]`` whose row ends an episode; ``held // stride`` (after) or ``-1``
    (before) where there is none. Reads windows of ``FIRST_WINDOW`` steps, doubled until each one is found."""
    stride = rows.stride
    count = rows.size // stride
    found = torch.full_like(steps, count if direction > 0 else -1)
    pending: torch.Tensor | None = None  # indices still searched after the first round (None: all)
    offset, width = 0, FIRST_WINDOW
    while True:
        start, env = (steps, envs) if pending is None else (steps[pending], envs[pending])
        window = start.unsqueeze(1) + direction * (offset + torch.arange(width, device=steps.device))
        inside = (window >= 0) & (window < count)
        ends = rows.ends(window.clamp(0, count - 1) * stride + env.unsqueeze(1)) & inside
        hit = ends.any(1)
        nearest = window.gather(1, ends.to(torch.uint8).argmax(1, keepdim=True)).squeeze(1)  # at the first True
        if pending is None:
            found = torch.where(hit, nearest, found)
        else:
            found[pending] = torch.where(hit, nearest, found[pending])
        more = ~hit & inside[:, -1]  # the others found one, or left the stream: no end that way
        if not bool(more.any()):
            return found
        pending = more.nonzero().squeeze(1) if pending is None else pending[more]
        offset, width = offset + width, 2 * width


@dataclass(frozen=True)
class Drawable:
    """The steps HER may draw: in env ``e``'s stream, ``count[e]`` steps from ``first[e]`` on (``[num_envs]``
    int64 each; step ``t`` of env ``e`` is position ``t * num_envs + e``)."""

    first: torch.Tensor
    count: torch.Tensor

    @property
    def total(self) -> int:
        """Rows that may be drawn."""
        return int(self.count.sum())


def drawable_steps(rows: StoredRows, oldest_starts: bool, device: torch.device) -> Drawable:
    """Each env's drawable run: from the step after its first episode end (from step 0 when the oldest row
    is known to start an episode, see :func:`oldest_row_starts`) to its last episode end (``device``: the
    columns')."""
    stride = rows.stride
    envs = torch.arange(stride, device=device)
    newest = torch.full((stride,), rows.size // stride - 1, dtype=torch.int64, device=device)
    last = _nearest_end(rows, newest, envs, -1)
    first = torch.zeros_like(last) if oldest_starts else _nearest_end(rows, torch.zeros_like(last), envs, 1) + 1
    return Drawable(first, (last - first + 1).clamp_min(0))


def draw_rows(drawable: Drawable, k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` rows uniform with replacement over the drawable ones (``total > 0``): ``(steps, envs)``, ``[k]`` each."""
    ends = drawable.count.cumsum(0)
    pick = torch.randint(0, int(ends[-1]), (k,), generator=generator, device=ends.device)
    # the env whose run holds each pick: how many runs end at or before it (O(k * num_envs); torch.searchsorted
    # costs milliseconds per call here)
    envs = (pick.unsqueeze(1) >= ends).sum(1) if ends.numel() > 1 else torch.zeros_like(pick)
    return drawable.first[envs] + pick - (ends - drawable.count)[envs], envs


def draw_goal_steps(
    rows: StoredRows,
    steps: torch.Tensor,
    envs: torch.Tensor,
    strategy: GoalSelectionStrategy,
    generator: torch.Generator,
) -> torch.Tensor:
    """The goal step for each drawn row ``(steps[i], envs[i])`` (``[k]`` int64), by ``strategy``: a step of the
    same env and episode, never past the episode's last step (so never the write head)."""
    last = _nearest_end(rows, steps, envs, 1)
    if strategy is GoalSelectionStrategy.FINAL:
        return last
    low = steps if strategy is GoalSelectionStrategy.FUTURE else _nearest_end(rows, steps - 1, envs, -1) + 1
    # uniform in [low, last]: floor(u * count) with a float64 u (bias below count * 2**-53)
    u = torch.rand(steps.shape, generator=generator, dtype=torch.float64, device=steps.device)
    return low + (u * (last - low + 1)).long().clamp_max_(last - low)


def oldest_row_starts(ring: Ring) -> bool:
    """Whether the oldest held row is the first row written since the buffer was empty (nothing overwritten)."""
    return ring.phantom == 0 and ring.size < ring.capacity
