"""Episodes inside the ring: which keys mark their ends, and contiguous slices of them.

Pure functions over tensors and ring state (``pointer``, ``size``, ``capacity``); the buffer owns the
state and reads the rows. Rows are addressed by *position*: ``0`` is the oldest stored row,
``size - 1`` the newest, whatever slot each one sits in after the ring wraps. Working in positions
makes "never cross the write head" automatic: the seam between the newest and the oldest row is the
end of the position range.

With a vector environment (``stride = num_envs``; see :mod:`~objectrl_buffer.core.envs`) positions are
time-major, ``t * stride + e``, and the next row of env ``e`` after position ``p`` is ``p + stride``:
a slice is ``p, p + stride, ...``, inside one env's stream, and ends before that env's newest row.

Why not torchrl's ``SliceSampler``: it finds the write head through the storage's own cursor, which
our column writes (see ``storage.py``) bypass; it reads every key of the whole storage
(``storage[:]``) to find episode ends; and it draws an episode first and a start inside it second,
returning a flat ``[B * T]`` batch (padded by repeating the last step). Here slices are drawn
uniformly over all valid start rows, reading only the done flags of the candidate windows (no scan
of the whole buffer in the common case), and returned as ``[B, T]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from objectrl_buffer.core.keys import DISCOUNT_KEY, MASK_KEY
from objectrl_buffer.core.ring import Ring
from objectrl_buffer.core.schema import Key, format_key
from objectrl_buffer.errors import EmptyBufferError, SchemaError

__all__ = ["TransitionKeys", "StoredRows", "episode_ends", "slice_positions", "pad_slices", "MASK_KEY"]


@dataclass(frozen=True)
class TransitionKeys:
    """Names of the keys n-step returns and episode boundaries read (ObjectRL's by default).

    Attributes:
        reward: the per-step reward.
        next_state: the observation after the step.
        terminated: the episode ended in a terminal state (no bootstrapping past it).
        truncated: the episode was cut (time limit); ``None`` if the data has no such key.
        discount: where n-step sampling writes ``gamma ** steps``.
    """

    reward: Key = "reward"
    next_state: Key = "next_state"
    terminated: Key = "terminated"
    truncated: Key | None = "truncated"
    discount: Key = DISCOUNT_KEY

    @property
    def episode_end(self) -> tuple[Key, ...]:
        """The keys whose non-zero value ends an episode: ``terminated`` and ``truncated``."""
        return (self.terminated,) if self.truncated is None else (self.terminated, self.truncated)


def require_keys(columns: Mapping[Key, torch.Tensor], keys: tuple[Key, ...], purpose: str) -> None:
    """Raise :class:`SchemaError` if a key ``purpose`` needs is not stored."""
    for key in keys:
        if key not in columns:
            stored = [format_key(k) for k in columns]
            raise SchemaError(
                f"{purpose} needs the key '{format_key(key)}', which is not stored; stored keys: {stored}"
            )


def flag(column: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Whether each row at ``slots`` has a non-zero value in ``column`` (any element of a row): bool."""
    values = column.index_select(0, slots.reshape(-1)).ne(0)
    if values.dim() > 1:
        values = values.flatten(1).any(1)
    return values.reshape(slots.shape)


def episode_ends(columns: Mapping[Key, torch.Tensor], slots: torch.Tensor, keys: tuple[Key, ...]) -> torch.Tensor:
    """Bool tensor shaped like ``slots``: the row ends an episode (a non-zero flag under any of ``keys``)."""
    ends = flag(columns[keys[0]], slots)
    for key in keys[1:]:
        ends |= flag(columns[key], slots)
    return ends


@dataclass(frozen=True)
class StoredRows:
    """The stored rows in time order: position ``0`` is the oldest row, ``size - 1`` the newest.

    Attributes:
        columns: the stored columns (``[capacity, *row_shape]`` each).
        end_keys: the keys whose non-zero value ends an episode.
        ring: the ring state; its rows that hold data (``ring.held``, the newest) are the stored rows.
        stride: positions between two consecutive rows of one env (``num_envs``; divides the ring's
            capacity, pointer and rows held).
    """

    columns: Mapping[Key, torch.Tensor]
    end_keys: tuple[Key, ...]
    ring: Ring
    stride: int = 1

    @property
    def size(self) -> int:
        """Rows stored (that hold data)."""
        return self.ring.held

    def slots(self, positions: torch.Tensor) -> torch.Tensor:
        """The slot of each position (any shape, int64)."""
        return self.ring.slots(positions)

    def ends(self, positions: torch.Tensor) -> torch.Tensor:
        """Whether the row at each position (any shape, each ``< size``) ends an episode: bool."""
        return episode_ends(self.columns, self.slots(positions), self.end_keys)


def slice_positions(
    rows: StoredRows, num_slices: int, slice_len: int, pad: bool, generator: torch.Generator, *, tries: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``num_slices`` slices of ``slice_len`` consecutive rows that stay inside one episode.

    Args:
        rows: the stored rows and where their episodes end.
        num_slices, slice_len: the batch shape ``[num_slices, slice_len]``.
        pad: ``False``: only windows of ``slice_len`` rows with no episode end before their last row
            (an end on the last row is fine). ``True``: also every episode segment shorter than
            ``slice_len``, from its first row; its missing rows are padding.
        generator: randomness, on the columns' device.
        tries: rounds of rejection sampling before the exact table (see below).

    Starts are drawn uniformly with replacement among the valid ones. The oldest stored row starts a
    segment (its episode may have begun in rows already overwritten) and the newest row ends one.
    Each round draws candidate starts uniformly and keeps the valid ones (``O(k * slice_len)``, and
    still exactly uniform over the valid starts); only starts still missing after ``tries`` rounds
    come from a table of every valid start (``O(size)``), which also proves that none exists.

    Returns:
        ``(positions, mask)``, both ``[num_slices, slice_len]``: int64 positions (padding repeats the
        slice's first position) and bool ``mask`` (``False`` on padding; all ``True`` without ``pad``).

    Raises:
        EmptyBufferError: no valid start exists (every segment is shorter than ``slice_len``, or
            fewer than ``slice_len`` rows are stored), naming the longest segment.
    """
    size, device = rows.size, generator.device
    offsets = torch.arange(slice_len, device=device) * rows.stride
    high = size if pad else size - (slice_len - 1) * rows.stride  # every valid start is below this
    chosen: list[torch.Tensor] = []
    missing = num_slices
    state = generator.get_state()  # restored if no slice fits: a failed call changes nothing
    for _ in range(tries if high > 0 else 0):
        candidates = torch.randint(0, high, (2 * missing,), generator=generator, device=device)
        accepted = candidates[_valid_starts(rows, candidates, offsets, pad)][:missing]
        chosen.append(accepted)
        missing -= accepted.numel()
        if missing == 0:
            break
    if missing:
        try:
            starts = _all_valid_starts(rows, slice_len, pad, device)
        except EmptyBufferError:
            generator.set_state(state)
            raise
        chosen.append(starts[torch.randint(0, starts.numel(), (missing,), generator=generator, device=device)])
    positions = torch.cat(chosen).unsqueeze(1) + offsets
    if not pad:
        return positions, torch.ones(positions.shape, dtype=torch.bool, device=device)
    inside = positions < size
    positions = torch.where(inside, positions, positions[:, :1])
    window_ends = rows.ends(positions) & inside
    # A row is real while no earlier row of its window ended the episode.
    mask = inside & ((window_ends.cumsum(1) - window_ends.long()) == 0)
    return torch.where(mask, positions, positions[:, :1]), mask


def _valid_starts(rows: StoredRows, starts: torch.Tensor, offsets: torch.Tensor, pad: bool) -> torch.Tensor:
    """Which ``starts`` (1-D positions ``< size``) begin a valid slice of ``len(offsets)`` rows."""
    last = rows.size - 1
    whole = starts + (offsets.numel() - 1) * rows.stride <= last  # the window ends at or before its env's newest row
    # No episode end on the rows before the window's last one (positions clamped: only whole windows count).
    early = rows.ends((starts.unsqueeze(1) + offsets[:-1]).clamp_max(last)).any(1)
    valid = whole & ~early
    if pad:  # the first row of a segment: the env's oldest row, or the row after an episode end
        stride = rows.stride
        valid |= (starts < stride) | rows.ends((starts - stride).clamp_min(0))
    return valid


def _all_valid_starts(rows: StoredRows, slice_len: int, pad: bool, device: torch.device) -> torch.Tensor:
    """Every valid start, from the episode ends of all stored rows (``O(size)``); raises if none."""
    size, stride = rows.size, rows.stride
    # [steps, stride]: column e is env e's stream (positions are time-major); one column without envs
    ends = rows.ends(torch.arange(size, device=device)).reshape(-1, stride)
    steps = ends.shape[0]
    # before[t] = episode ends among the env's steps [0, t): a window [t, t+L) is inside one episode
    # when no step before its last one ends an episode.
    before = torch.zeros(steps + 1, stride, dtype=torch.int64, device=device)
    torch.cumsum(ends, 0, out=before[1:])
    valid = torch.zeros(steps, stride, dtype=torch.bool, device=device)
    if slice_len <= steps:
        valid[: steps - slice_len + 1] = before[slice_len - 1 : steps] == before[: steps - slice_len + 1]
    if pad:
        valid[0] = True  # segment starts: the oldest row, and every row after an end
        valid[1:] |= ends[:-1]
    starts = valid.reshape(-1).nonzero().squeeze(1)
    if starts.numel() == 0:
        longest = max(_longest_segment(ends[:, e]) for e in range(stride))
        raise EmptyBufferError(
            f"no slice of {slice_len} consecutive transitions fits inside one episode: the longest stored "
            f"episode segment has {longest} rows ({size} rows stored); "
            "use a shorter slice_len or pad=True"
        )
    return starts


def _longest_segment(ends: torch.Tensor) -> int:
    """Length of the longest run of rows inside one episode (for error messages)."""
    size = ends.numel()
    if size == 0:
        return 0
    last_rows = ends.nonzero().squeeze(1)
    bounds = torch.cat([last_rows.new_tensor([-1]), last_rows, last_rows.new_tensor([size - 1])])
    return int(bounds.diff().max())


def pad_slices(batch: TensorDict, mask: torch.Tensor, index_key: str) -> TensorDict:
    """Zero every value at padded rows (``mask`` False), set their ``index_key`` to -1, add ``mask``.

    ``batch`` has batch size ``mask.shape`` and lives on ``mask``'s device. Changed in place; returned.
    """
    for key in list(batch.keys(include_nested=True, leaves_only=True)):
        value = batch.get(key)
        keep = mask.view(*mask.shape, *([1] * (value.dim() - mask.dim())))
        fill = -1 if key == index_key else 0
        batch.set(key, torch.where(keep, value, torch.full((), fill, dtype=value.dtype, device=value.device)))
    batch.set(MASK_KEY, mask)
    return batch
