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

A window (one or two slot ranges, e.g. the newest rows of a ring) is sampled the same way from the
few nodes that exactly cover it (:meth:`SumTree.sample_in`): ``O(k B log_B N)``, no rebuild.
"""

from __future__ import annotations

from collections.abc import Sequence

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

    def cover(self, ranges: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fewest nodes whose leaves are exactly the slots of ``ranges``, in slot order within each
        range and the ranges in the order given: ``(level, node, cumulative mass)``, each ``[c]``.

        At most ``2 (B - 1)`` nodes per level and range, so ``c`` stays in the hundreds for any capacity.
        """
        shift, top = self._shift, len(self.levels) - 1
        spans: list[tuple[int, int, int, int]] = []  # (range number, first slot, level, node)
        for number, (lo, hi) in enumerate(ranges):
            for level in range(top + 1):
                if lo >= hi:
                    break
                if level == top or lo >> shift == (hi - 1) >> shift:  # one parent: take the nodes themselves
                    spans += [(number, node << (shift * level), level, node) for node in range(lo, hi)]
                    break
                up_lo, up_hi = -(-lo >> shift), hi >> shift  # the parents whose children all lie inside
                spans += [(number, node << (shift * level), level, node) for node in range(lo, up_lo << shift)]
                spans += [(number, node << (shift * level), level, node) for node in range(up_hi << shift, hi)]
                lo, hi = up_lo, up_hi
        spans.sort()
        levels = torch.tensor([s[2] for s in spans], dtype=torch.int64, device=self.device)
        nodes = torch.tensor([s[3] for s in spans], dtype=torch.int64, device=self.device)
        mass = torch.zeros(len(spans), dtype=self.dtype, device=self.device)
        for j in sorted({s[2] for s in spans}):
            at = levels == j
            mass[at] = self.levels[j].index_select(0, nodes[at])
        return levels, nodes, mass.cumsum(0)

    def total_in(self, ranges: Sequence[tuple[int, int]]) -> torch.Tensor:
        """Sum of the weights of the slots in ``ranges`` (disjoint ``[start, stop)``), a 0-d tensor."""
        return self.cover(ranges)[2][-1]

    def find_in(self, mass: torch.Tensor, ranges: Sequence[tuple[int, int]]) -> torch.Tensor:
        """As :meth:`find`, over the slots of ``ranges`` only (disjoint, non-empty ``[start, stop)``),
        taken in the order given: ``mass`` in ``[0, total_in(ranges))``. Needs ``total_in(ranges) > 0``.

        Why not ``find(prefix(start) + mass)``: a light window after heavy slots would lose its mass
        to rounding of the large offset. Here the masses are those of the window's own nodes.
        """
        return self._find_in(mass, *self.cover(ranges))

    def _find_in(
        self, mass: torch.Tensor, level: torch.Tensor, node: torch.Tensor, cumulative: torch.Tensor
    ) -> torch.Tensor:
        b, shift = self.branching, self._shift
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        # Which covering node: the first whose cumulative mass passes the mass, with the same strict clamp
        # as find(), so a node of mass 0 is never chosen. In two steps of at most B columns (a group of B
        # nodes, then the node in it): one [k, c] comparison of a few hundred nodes would cross torch's
        # parallel grain and stall for milliseconds when the cores are busy.
        remaining = torch.minimum(mass.to(self.dtype), torch.nextafter(cumulative[-1], zero))
        groups = -(-cumulative.numel() // b)
        fill = cumulative[-1:].expand(groups * b - cumulative.numel())  # mass-0 padding (no host sync)
        padded = torch.cat([cumulative, fill]).view(groups, b)
        group = (padded[:, -1].unsqueeze(0) <= remaining.unsqueeze(1)).sum(1)
        within = (padded.index_select(0, group) <= remaining.unsqueeze(1)).sum(1)
        choice = group * b + within
        remaining = remaining - torch.nn.functional.pad(cumulative, (1, 0)).index_select(0, choice)
        start_level, node = level.index_select(0, choice), node.index_select(0, choice)
        for j in range(len(self.levels) - 2, -1, -1):  # step from level j + 1 into level j
            down = start_level > j  # nodes that started at or below level j are already there
            parent = torch.where(down, node, 0)
            cumulative_j = self.levels[j].view(-1, b).index_select(0, parent).cumsum(1)  # [k, B]
            below = torch.minimum(remaining.unsqueeze(1), torch.nextafter(cumulative_j[:, -1:], zero))
            child = (cumulative_j <= below).sum(1, keepdim=True)
            below = below - torch.nn.functional.pad(cumulative_j, (1, 0)).gather(1, child)
            node = torch.where(down, (parent << shift) + child.squeeze(1), node)
            remaining = torch.where(down, below.squeeze(1), remaining)
        return node

    def sample_in(self, k: int, ranges: Sequence[tuple[int, int]], generator: torch.Generator) -> torch.Tensor:
        """``k`` slots of ``ranges`` drawn with replacement, slot ``i`` with probability
        ``w_i / total_in(ranges)``, in ``O(k B log_B N)``. Needs ``total_in(ranges) > 0``.
        """
        level, node, cumulative = self.cover(ranges)
        u = torch.rand(k, dtype=self.dtype, device=self.device, generator=generator)
        return self._find_in(u * cumulative[-1], level, node, cumulative)

    def sample(self, k: int, generator: torch.Generator) -> torch.Tensor:
        """``k`` slots drawn with replacement, slot ``i`` with probability ``w_i / sum(w)``.

        ``generator`` must live on ``device``. Needs ``total() > 0`` (not checked here: the caller
        knows whether a weight can be zero, and checking costs a device sync).
        """
        u = torch.rand(k, dtype=self.dtype, device=self.device, generator=generator)
        return self.find(u * self.total())
