"""Where prioritized replay looks up its priorities: torchrl's ``PrioritizedSampler`` or our sum tree.

Both index the same thing: slot ``i`` of the ``size`` live rows is drawn with probability
``(p_i + eps)^alpha / sum_j (p_j + eps)^alpha``, where ``p`` are the raw priorities the buffer keeps.
Slots that hold no row have weight zero and are never drawn.

* :class:`TorchRLIndex` wraps torchrl's ``PrioritizedSampler`` (its C++/CUDA segment trees). It is
  used when torchrl's compiled extension loads, which :func:`torchrl_per_available` probes once per
  device type, catching the failure.
* :class:`TreeIndex` is our :class:`~objectrl_buffer.sampling.sum_tree.SumTree` in plain torch: the fallback,
  with the same distribution (``tests/test_prioritized.py`` checks the two agree where torchrl loads).

The buffer keeps the raw priorities itself (for importance weights and checkpoints); an index only
draws slots. Draws restricted to a window of slots (the newest rows) use our tree's covering nodes in
``O(k log N)``; torchrl's sampler cannot restrict its draws, so there they are made from the window's
raw priorities in ``O(window)`` (:meth:`PriorityIndex.draw_window`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import torch

from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.sampling.sum_tree import SumTree
from objectrl_buffer.storage import torchrl_compat

__all__ = [
    "Backend",
    "PriorityIndex",
    "TreeIndex",
    "TorchRLIndex",
    "torchrl_per_available",
    "forget_probes",
    "check_backend",
    "make_priority_index",
]

Backend: TypeAlias = Literal["auto", "torchrl", "torch"]

_PROBED: dict[str, bool] = {}


def forget_probes() -> None:
    """Forget what :func:`torchrl_per_available` found (it probes again on the next call)."""
    _PROBED.clear()


def torchrl_per_available(device: torch.device | str = "cpu") -> bool:
    """Whether torchrl's ``PrioritizedSampler`` can build its segment trees for ``device``.

    Probed once per device type (``"cpu"``, ``"cuda"``, ...) by building a tiny sampler; any failure
    (the extension does not import, was built without CUDA, ...) means ``False``.
    """
    kind = torch.device(device).type
    if kind not in _PROBED:
        try:
            from torchrl.data import PrioritizedSampler

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                PrioritizedSampler(2, 1.0, 1.0, dtype=torch.float64, device=device if kind == "cuda" else None)
            _PROBED[kind] = True
        except Exception:  # ImportError, RuntimeError, OSError: any failure means "not available"
            _PROBED[kind] = False
    return _PROBED[kind]


class PriorityIndex:
    """Interface: proportional draws over ``capacity`` slots given raw priorities."""

    name: str
    alpha: float
    eps: float

    def set(self, slots: torch.Tensor, priority: torch.Tensor) -> None:
        """Set raw ``priority`` (float64, 1-D) at distinct live ``slots`` (int64, 1-D)."""
        raise NotImplementedError

    def set_one(self, slot: int, priority: torch.Tensor) -> None:
        """Set the raw priority (0-d float64) of one live slot."""
        self.set(torch.tensor([slot], device=priority.device), priority.reshape(1))

    def rebuild(self, priority: torch.Tensor, size: int) -> None:
        """Forget everything; slots ``0 .. size-1`` get ``priority[:size]`` (raw, ``[capacity]``)."""
        raise NotImplementedError

    def total(self) -> float:
        """Sum of the weights of the live slots (0 when nothing can be drawn)."""
        raise NotImplementedError

    def draw(self, k: int, size: int, generator: torch.Generator) -> torch.Tensor:
        """``k`` live slots (int64 on the storing device), drawn with replacement. Needs ``total() > 0``."""
        raise NotImplementedError

    def _window_weights(self, ranges: Sequence[tuple[int, int]], priority: torch.Tensor) -> torch.Tensor:
        slots = torch.cat([torch.arange(lo, hi, device=priority.device) for lo, hi in ranges])
        return (priority.index_select(0, slots) + self.eps).pow_(self.alpha)

    def window_total(self, ranges: Sequence[tuple[int, int]], priority: torch.Tensor) -> float:
        """Sum of the weights of the slots in ``ranges`` (live, disjoint ``[start, stop)``).

        This default reads the raw ``priority`` (``[capacity]``, on the storing device): ``O(window)``.
        """
        return float(self._window_weights(ranges, priority).sum())

    def draw_window(
        self, k: int, ranges: Sequence[tuple[int, int]], priority: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """``k`` slots of ``ranges`` drawn with replacement, in proportion to their weights renormalised
        over the ranges. Needs ``window_total(...) > 0``.

        This default works for any index (torchrl's sampler cannot restrict its draws): an inverse-CDF
        draw over the window's weights from the raw ``priority``, ``O(window + k log window)``.
        """
        slots = torch.cat([torch.arange(lo, hi, device=priority.device) for lo, hi in ranges])
        cumulative = self._window_weights(ranges, priority).cumsum(0)
        total = cumulative[-1]
        u = torch.rand(k, dtype=cumulative.dtype, device=cumulative.device, generator=generator) * total
        # Strictly below the total, so the first cumulative sum above u belongs to a slot of positive weight.
        u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
        return slots.index_select(0, torch.searchsorted(cumulative, u, right=True))


class TreeIndex(PriorityIndex):
    """Our vectorised torch sum tree, on the storing device."""

    name = "torch"

    def __init__(self, capacity: int, device: torch.device, alpha: float, eps: float) -> None:
        self.alpha, self.eps = alpha, eps
        self.tree = SumTree(capacity, device)

    def _weight(self, priority: torch.Tensor) -> torch.Tensor:
        return (priority + self.eps).pow_(self.alpha)

    def set(self, slots: torch.Tensor, priority: torch.Tensor) -> None:
        self.tree.update(slots, self._weight(priority))

    def set_one(self, slot: int, priority: torch.Tensor) -> None:
        self.tree.update_one(slot, self._weight(priority))

    def rebuild(self, priority: torch.Tensor, size: int) -> None:
        weights = self._weight(priority.clone())
        weights[size:] = 0
        self.tree.rebuild(weights)

    def total(self) -> float:
        return float(self.tree.total())

    def draw(self, k: int, size: int, generator: torch.Generator) -> torch.Tensor:
        return self.tree.sample(k, generator)

    def window_total(self, ranges: Sequence[tuple[int, int]], priority: torch.Tensor) -> float:
        return float(self.tree.total_in(ranges))

    def draw_window(
        self, k: int, ranges: Sequence[tuple[int, int]], priority: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        return self.tree.sample_in(k, ranges, generator)


class _LiveRows:
    """The two things ``PrioritizedSampler.sample`` asks of a storage: its length and device."""

    ndim = 1

    def __init__(self, size: int, device: torch.device) -> None:
        self._size, self.device = size, device

    def __len__(self) -> int:
        return self._size


class TorchRLIndex(PriorityIndex):
    """torchrl's ``PrioritizedSampler`` (compiled segment trees), fed our raw priorities.

    Its own importance weights (normalised by the buffer-wide minimum) and its max-priority tracking
    are not used: the buffer computes weights and new-row priorities itself, identically for both
    indexes. Its draws use a generator on the tree's device: the buffer's own generator when the
    tree sits on the storing device, otherwise a CPU generator seeded from it.
    """

    name = "torchrl"

    def __init__(self, capacity: int, device: torch.device, alpha: float, eps: float) -> None:
        self.capacity, self.device, self.alpha, self.eps = capacity, device, alpha, eps
        self.sampler: Any = self._new_sampler()
        self._own_generator: torch.Generator | None = None

    def _new_sampler(self) -> Any:
        from torchrl.data import PrioritizedSampler

        tree_device = self.device if self.device.type == "cuda" else None
        return PrioritizedSampler(self.capacity, self.alpha, 1.0, eps=self.eps, dtype=torch.float64, device=tree_device)

    def set(self, slots: torch.Tensor, priority: torch.Tensor) -> None:
        self.sampler.update_priority(slots, priority)

    def rebuild(self, priority: torch.Tensor, size: int) -> None:
        self.sampler = self._new_sampler()
        if size:
            self.set(torch.arange(size, device=priority.device), priority[:size])

    def total(self) -> float:
        return torchrl_compat.sampler_total(self.sampler, self.capacity)

    def draw(self, k: int, size: int, generator: torch.Generator) -> torch.Tensor:
        sampler = self.sampler
        tree_device = sampler.device
        if tree_device == generator.device:
            torchrl_compat.set_sampler_generator(sampler, generator)
        else:
            if self._own_generator is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
                self._own_generator = torch.Generator(device=tree_device).manual_seed(seed)
            torchrl_compat.set_sampler_generator(sampler, self._own_generator)
        slots, _ = sampler.sample(_LiveRows(size, tree_device), k)
        return torch.as_tensor(slots, dtype=torch.int64).to(self.device)


def check_backend(backend: object, device: torch.device) -> None:
    """Raise :class:`InvalidArgumentError` if ``backend`` is unknown, or ``"torchrl"`` where it does not load."""
    if backend not in ("auto", "torchrl", "torch"):
        raise InvalidArgumentError(f"backend must be 'auto', 'torchrl' or 'torch', got {backend!r}")
    if backend == "torchrl" and not torchrl_per_available(device):
        raise InvalidArgumentError(
            f"backend='torchrl': torchrl's PrioritizedSampler is not available for {device.type} here "
            "(its compiled extension does not load with this torch build): use backend='auto' or 'torch'"
        )


def make_priority_index(
    backend: Backend, capacity: int, device: torch.device, alpha: float, eps: float
) -> PriorityIndex:
    """The index ``backend`` names: ``"torchrl"``, ``"torch"``, or ``"auto"`` (torchrl when it loads).

    ``"auto"`` also picks ours when ``eps == 0``: torchrl's sampler refuses to sample once any live
    slot has weight zero, where ours simply never draws that slot.

    Raises:
        InvalidArgumentError: as :func:`check_backend`.
    """
    check_backend(backend, device)
    if backend == "torch" or (backend == "auto" and (eps == 0 or not torchrl_per_available(device))):
        return TreeIndex(capacity, device, alpha, eps)
    return TorchRLIndex(capacity, device, alpha, eps)
