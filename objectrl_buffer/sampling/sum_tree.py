"""A sum tree in plain torch: draw slots in proportion to non-negative weights in O(k log N).

Why our own: torchrl's ``PrioritizedSampler`` keeps its segment trees in a compiled extension that does
not load with every torch build (it fails to import with torch 2.13), and then prioritized replay is
simply unavailable. This tree is a handful of vectorised tensor operations, so it runs wherever torch
runs, on the storing device (CPU or CUDA) with no host round trip.

Layout: a ``B``-ary tree (``B = 32``) stored level by level. ``levels[0]`` holds the ``capacity`` leaf
weights, zero-padded to a multiple of ``B``; viewed as ``[rows, B]``, row ``i`` of level ``j`` sums
into entry ``i`` of level ``j + 1``. The top level holds at most ``B`` entries (padded to ``B``) and the
total is their sum. A wide tree needs ``log_B N`` levels (4 for a million slots) instead of
``log_2 N`` (20): each level is one gather of ``[k, B]`` children, so a batch costs a few dozen small
kernels whatever ``N`` is, and the work stays ``O(k B log_B N)``.

Sampling walks from the top: at each level it takes the cumulative sums of the current node's
children and descends into the first child whose cumulative sum exceeds the remaining mass. The mass
is clamped below each node's own total, so rounding can never send it into a child of weight zero:
a slot of weight 0 is never drawn.
"""

from __future__ import annotations

import torch

__all__ = ["SumTree", "BRANCHING"]

#: Default children per node. A power of two, so ``slot // B`` is a shift.
BRANCHING = 32


class SumTree:
    """Non-negative weights of ``capacity`` slots, with proportional sampling.

    Args:
        capacity: number of slots (> 0).
        device: where the tree lives (the buffer's storing device).
        dtype: float dtype of the sums. float64 by default, so a million small weights still sum
            exactly enough that every slot keeps its share.
        branching: children per node, a power of two >= 2.

    All tensors passed in and returned live on ``device``. Slots are int64.
    """

    def __init__(
        self,
        capacity: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float64,
        branching: int = BRANCHING,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if branching < 2 or branching & (branching - 1):
            raise ValueError(f"branching must be a power of two >= 2, got {branching}")
        self.branching = branching
        self._shift = branching.bit_length() - 1
        self.capacity = capacity
        self.device = torch.device(device)
        self.dtype = dtype
        self.levels: list[torch.Tensor] = []
        size = capacity
        while True:
            rows = -(-size // branching)
            self.levels.append(torch.zeros(rows * branching, dtype=dtype, device=self.device))
            if size <= branching:
                break
            size = rows

    @property
    def leaves(self) -> torch.Tensor:
        """The ``capacity`` leaf weights, shape ``[capacity]`` (a view: read, do not write)."""
        return self.levels[0][: self.capacity]

    def total(self) -> torch.Tensor:
        """Sum of all weights, a 0-d tensor on ``device``."""
        return self.levels[-1].sum()

    def clear(self) -> None:
        """Set every weight to zero."""
        for level in self.levels:
            level.zero_()

    def rebuild(self, weights: torch.Tensor) -> None:
        """Set all ``capacity`` weights at once (shape ``[capacity]``) and recompute every sum: O(N)."""
        self.levels[0][: self.capacity] = weights
        self._sum_from(0)

    def _sum_from(self, level: int) -> None:
        levels = self.levels
        for j in range(level, len(levels) - 1):
            sums = levels[j].view(-1, self.branching).sum(1)
            levels[j + 1][: sums.numel()] = sums

    def update(self, slots: torch.Tensor, weights: torch.Tensor) -> None:
        """Set ``weights[i]`` at ``slots[i]`` (1-D, same length) and fix the sums above them.

        ``slots`` must not repeat (which of two writes to one slot wins is undefined). Cost
        ``O(k B log_B N)``; an update touching a large share of the slots rebuilds the sums in ``O(N)``.
        """
        levels, b, shift = self.levels, self.branching, self._shift
        levels[0][slots] = weights.to(self.dtype)
        if slots.numel() * b >= levels[0].numel():
            self._sum_from(0)
            return
        node = slots
        for j in range(len(levels) - 1):
            node = node >> shift
            # Siblings share a parent: repeated parents receive the same recomputed sum.
            levels[j + 1][node] = levels[j].view(-1, b).index_select(0, node).sum(1)

    def update_one(self, slot: int, weight: torch.Tensor | float) -> None:
        """Set one slot's weight (the per-``add`` path: plain slicing, no index tensors)."""
        levels, b, shift = self.levels, self.branching, self._shift
        levels[0][slot] = weight
        node = slot
        for j in range(len(levels) - 1):
            node >>= shift
            start = node << shift
            levels[j + 1][node] = levels[j][start : start + b].sum()

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """Slot of each prefix-sum ``mass`` (1-D, float, in ``[0, total)``): the first slot whose
        cumulative weight exceeds it. Masses at or beyond the total land on the last slot of
        positive weight. Needs ``total() > 0``.
        """
        remaining = mass.to(self.dtype).unsqueeze(1)  # [k, 1]
        node = torch.zeros(mass.shape, dtype=torch.int64, device=self.device)
        b, shift = self.branching, self._shift
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        for level in reversed(self.levels):
            # index_select, not ``view[node]``: advanced indexing of a 2-D view is ~1000x slower on CPU.
            cumulative = level.view(-1, b).index_select(0, node).cumsum(1)  # [k, B]
            # Stay strictly below this node's total, so the chosen child has positive weight.
            remaining = torch.minimum(remaining, torch.nextafter(cumulative[:, -1:], zero))
            # First child whose cumulative sum passes the mass. (Not torch.searchsorted: on CPU it runs a
            # parallel loop even for 256 rows, which stalls for milliseconds when the cores are busy.)
            choice = (cumulative <= remaining).sum(1, keepdim=True)
            # Subtract the cumulative sum before that child as stored (not re-summed): exact, >= 0.
            remaining = remaining - torch.nn.functional.pad(cumulative, (1, 0)).gather(1, choice)
            node = (node << shift) + choice.squeeze(1)
        return node

    def sample(self, k: int, generator: torch.Generator) -> torch.Tensor:
        """``k`` slots drawn with replacement, slot ``i`` with probability ``w_i / sum(w)``.

        ``generator`` must live on ``device``. Needs ``total() > 0`` (not checked here: the caller
        knows whether a weight can be zero, and checking costs a device sync).
        """
        u = torch.rand(k, dtype=self.dtype, device=self.device, generator=generator)
        return self.find(u * self.total())
