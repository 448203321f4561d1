"""The priorities of prioritized replay: one raw value per slot, the index that draws by them, and the
state full checkpoints carry (this object is the buffer's extra state named ``prioritized``).

Slot ``i`` of the rows that hold data is drawn with probability ``P(i) = (p_i + eps)^alpha / sum_j (p_j +
eps)^alpha`` (over a window of the newest rows when one is asked for); importance weights are
``(P(i) / min_batch P)^-beta``, the largest in each batch exactly 1 (see :mod:`.buffer`).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from objectrl_buffer.checkpoint.extras import Arrays, Values
from objectrl_buffer.checkpoint.manifest import ExtraValue
from objectrl_buffer.core.validate import last_per_slot
from objectrl_buffer.engine import Engine
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError
from objectrl_buffer.prioritized.checkpoint import NAME, priority_extras, saved_priorities, saved_settings
from objectrl_buffer.prioritized.index import Backend, PriorityIndex, make_priority_index

__all__ = ["Priorities", "last_per_slot"]


class Priorities:
    """Raw priorities (float64 ``[capacity]`` on the storing device) of an engine's slots.

    Args:
        engine: the rows the priorities belong to (its ring says which slots hold data).
        alpha, beta, eps, backend: as :class:`~objectrl_buffer.PrioritizedReplayBuffer` (checked there).

    Raises:
        InvalidArgumentError: ``(1 + eps) ** alpha * capacity`` is not finite (new rows could not be weighed).
    """

    name = NAME

    def __init__(self, engine: Engine, alpha: float, beta: float, eps: float, backend: Backend) -> None:
        self.engine = engine
        self.alpha, self.beta, self.eps, self.backend = alpha, beta, eps, backend
        self.priority: torch.Tensor
        self.max_priority: torch.Tensor
        self.index: PriorityIndex
        try:  # new rows start at priority 1.0: their weights must fit before any update does
            self.check_fits(torch.ones((), dtype=torch.float64), "the first rows' priority")
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"eps={eps} with alpha={alpha} is too large: {exc}") from None
        self.clear()

    # ------------------------------------------------------------------ state
    def clear(self) -> None:
        """Every slot 0, :attr:`max_priority` 1.0, sized for the engine's capacity."""
        capacity, device = self.engine.ring.capacity, self.engine.storing_device
        self.priority = torch.zeros(capacity, dtype=torch.float64, device=device)
        self.max_priority = torch.ones((), dtype=torch.float64, device=device)
        self.index = make_priority_index(self.backend, capacity, device, self.alpha, self.eps)

    def free(self) -> None:
        """Drop the priorities and their index (the buffer was closed)."""
        device = self.engine.storing_device
        self.priority = torch.zeros(0, dtype=torch.float64, device=device)
        self.index = make_priority_index(self.backend, 1, device, self.alpha, self.eps)

    def set_alpha(self, alpha: float) -> None:
        """Re-weigh every row for a new ``alpha`` (``O(capacity)``); refused, changing nothing, when the
        largest priority given cannot take it."""
        self.check_fits(self.max_priority, "max_priority", alpha)
        self.alpha = alpha
        self.rebuild()

    def rebuild(self) -> None:
        """Rebuild the index from the raw priorities of the rows held."""
        self.index = make_priority_index(
            self.backend, max(self.priority.numel(), 1), self.engine.storing_device, self.alpha, self.eps
        )
        if self.priority.numel():
            self.index.rebuild(self.priority, self.engine.ring.size)

    def check_fits(self, priority: torch.Tensor, name: str, alpha: float | None = None) -> None:
        """Raise if ``capacity`` rows of raw ``priority`` (0-d) would weigh an infinite total.

        Every live weight is at most that of :attr:`max_priority` (new rows take it), so when this holds
        for each priority ever accepted, no weight, tree sum or importance weight overflows.

        Raises:
            InvalidArgumentError: naming ``name``, the value and ``alpha``.
        """
        alpha = self.alpha if alpha is None else alpha
        capacity = self.engine.ring.capacity
        total = (priority.to(torch.float64) + self.eps).pow(alpha) * capacity
        if not bool(total.isfinite()):
            raise InvalidArgumentError(
                f"{name} {float(priority)} is too large for alpha={alpha}, eps={self.eps}: "
                f"(p + eps) ** alpha * buffer_size ({capacity}) must be finite, so that the sum of "
                "the sampling weights cannot overflow"
            )

    def may_weigh_zero(self) -> bool:
        """Whether a live row can have sampling weight 0: ``eps == 0``, or ``eps ** alpha`` underflows."""
        return self.eps**self.alpha < sys.float_info.min

    # ------------------------------------------------------------------ updates
    def update(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """Set ``values`` (float64, finite, >= 0, fitting :meth:`check_fits`, one per slot of ``slots``;
        checked by the caller) at distinct valid ``slots`` (see :func:`last_per_slot`)."""
        if slots.numel() == 0:
            return
        self.priority[slots] = values
        self.index.set(slots, values)
        self.max_priority = torch.maximum(self.max_priority, values.max())

    def new_rows(self, start: int, n: int) -> None:
        """Give the ``n`` rows just written at slots ``start, start + 1, ...`` :attr:`max_priority`."""
        if n == 1:
            self.priority[start] = self.max_priority
            self.index.set_one(start, self.max_priority)
        elif n:
            slots = self.engine.ring.span_slots(start, n, self.engine.storing_device)
            values = self.max_priority.expand(slots.shape)
            self.priority[slots] = values
            self.index.set(slots, values)

    # ------------------------------------------------------------------ draws
    def draw(self, k: int, window: int | None, generator: torch.Generator) -> torch.Tensor:
        """``k`` slots drawn with replacement by priority among the newest ``window`` rows held (all by default).

        Raises:
            EmptyBufferError: every row that may be drawn has weight 0.
        """
        ring = self.engine.ring
        if (window is None or window >= ring.held) and not ring.phantom:
            if self.may_weigh_zero() and not self.index.total() > 0:  # total() syncs: check only if needed
                raise EmptyBufferError(
                    "every stored row has priority 0 (sampling weight (p + eps) ** alpha == 0): no row can be drawn"
                )
            return self.index.draw(k, ring.size, generator)
        # the newest rows: a window, or those that hold data after a metadata-only load
        ranges = list(ring.window_spans(window))
        if self.may_weigh_zero() and not self.index.window_total(ranges, self.priority) > 0:
            raise EmptyBufferError(
                f"every one of the newest {min(window or ring.held, ring.held)} rows has priority 0 "
                "(sampling weight (p + eps) ** alpha == 0): no row can be drawn"
            )
        return self.index.draw_window(k, ranges, self.priority, generator)

    def weights(self, slots: torch.Tensor) -> torch.Tensor:
        """``(P(i) / min_j P(j))^-beta`` over the given slots (float32, on the storing device).

        Computed in logs, so a ratio of weights beyond float64's range still gives the right value
        (not 0 or NaN). Slots must be drawable (weight > 0) unless ``alpha`` or ``beta`` is 0.
        """
        if self.alpha == 0 or self.beta == 0:
            return torch.ones(slots.shape, dtype=torch.float32, device=slots.device)
        log_weight = (self.priority.index_select(0, slots) + self.eps).log_().mul_(self.alpha)
        return (log_weight - log_weight.min()).mul_(-self.beta).exp_().to(torch.float32)

    # ------------------------------------------------------------------ checkpoints (the extra-state contract)
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, ExtraValue]]:
        """Raw priorities of the live slots, :attr:`max_priority` and ``alpha``/``beta``/``eps``."""
        settings = {"alpha": self.alpha, "beta": self.beta, "eps": self.eps}
        return priority_extras(self.priority[: self.engine.ring.size], float(self.max_priority), settings)

    def check(self, arrays: Arrays, values: Values, rows: int, source: str) -> None:
        """Refuse damaged or invalid saved priorities (``CheckpointError``)."""
        saved_priorities(arrays, values, rows, source)

    def restore(self, arrays: Arrays, values: Values) -> None:
        """Adopt saved priorities (this buffer keeps its ``alpha``/``beta``/``eps``); without any, every
        live row gets priority 1.0."""
        ring = self.engine.ring
        saved = saved_priorities(arrays, values, ring.size, "")  # checked by check(): cannot raise here
        self.clear()  # sized for the restored capacity
        if saved is None:
            self.new_rows(0, ring.size)
            return
        priority, max_priority = saved
        self.priority[: ring.size] = priority.to(self.priority.device)
        self.max_priority.fill_(max_priority)
        self.index.rebuild(self.priority, ring.size)

    @staticmethod
    def settings(values: Values, folder: str | None) -> dict[str, Any]:
        """Constructor arguments ``from_checkpoint`` takes from saved values: ``alpha``/``beta``/``eps``."""
        return saved_settings(values, folder)

    # ------------------------------------------------------------------ copies
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["index"]  # torchrl's compiled trees do not pickle; rebuilt exactly from the priorities
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # cloned: multiprocessing's pickler hands tensors over in shared memory, tying the copy to the original
        self.__dict__.update({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()})
        self.rebuild()
