"""PrioritizedReplayBuffer: prioritized experience replay (Schaul et al., 2016) on the ReplayBuffer facade.

Everything of :class:`~objectrl_buffer.ReplayBuffer` (adds, epochs, slices, save/load) works unchanged;
``sample_batch`` (and so ``get_next_batch`` without an epoch iterator) draws in proportion to
priorities and adds importance weights, also over a recency window (``recent=m``: the newest ``m``
rows, probabilities renormalised over them).

Conventions (each one a choice among the published ones, stated here once):

* Probability: ``P(i) = (p_i + eps)^alpha / sum_j (p_j + eps)^alpha`` over the live rows, ``p`` the
  raw priorities given to :meth:`~PrioritizedReplayBuffer.update_priority` (torchrl's convention;
  ``eps`` keeps a zero TD error from starving a row).
* Importance weights are normalised over the *batch*: ``w_i = (N P(i))^-beta / max_j (N P(j))^-beta``
  over the sampled ``j``, i.e. ``(P(i) / min_j P(j))^-beta``, so the largest weight in every batch is
  exactly 1. This is the issue's "normalised by their max" and Dopamine's choice. torchrl and OpenAI
  baselines divide by the weight of the smallest probability in the whole buffer instead, which needs
  a second (min) tree and makes every batch's scale depend on the worst row anywhere. The batch
  form needs no extra structure and is exactly checkable from the batch alone.
* New rows (``add``/``add_batch``, also when the ring overwrites an old slot) get the largest
  priority given since construction or the last ``reset`` (1.0 before any update), so each new row
  is likely to be replayed soon (baselines' convention).

The priorities live in a :class:`~objectrl_buffer.prioritized.priorities.Priorities` beside the rows,
which is also the buffer's extra checkpoint state: ``save(path, data=True)`` keeps the priorities,
``max_priority`` and the settings, ``load``/``from_checkpoint`` restore them (a checkpoint without them
gives every live row priority 1.0): see :mod:`objectrl_buffer.prioritized.checkpoint`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from objectrl_buffer import reads
from objectrl_buffer.core.keys import WEIGHT_KEY
from objectrl_buffer.core.ring import Ring
from objectrl_buffer.core.validate import buffer_devices, positive_int, real_in, slot_indices
from objectrl_buffer.engine import Slots, Transition
from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.prioritized.checkpoint import RANGES
from objectrl_buffer.prioritized.index import Backend, check_backend
from objectrl_buffer.prioritized.priorities import Priorities, last_per_slot
from objectrl_buffer.replay_buffer import ReplayBuffer
from objectrl_buffer.sampling.nstep import check_n_step

__all__ = ["PrioritizedReplayBuffer", "WEIGHT_KEY"]


class PrioritizedReplayBuffer(ReplayBuffer):
    """A :class:`~objectrl_buffer.ReplayBuffer` whose random batches follow priorities.

    Args:
        device, storing_device, buffer_size, print_gc_warning: as :class:`ReplayBuffer`.
        alpha: how strongly priorities shape sampling (>= 0, finite; 0 is uniform). Settable; a change
            re-weights all rows in ``O(buffer_size)``.
        beta: importance-weight exponent in ``[0, 1]`` (0: all weights 1, 1: full correction).
            Settable, to anneal it towards 1 during training.
        eps: added to every priority (>= 0, finite), so a zero TD error keeps a row drawable.
        backend: ``"auto"`` (torchrl's ``PrioritizedSampler`` when its compiled extension loads for the
            storing device, else ours), ``"torchrl"`` or ``"torch"`` (our sum tree).
        **kwargs: the keyword arguments of :class:`ReplayBuffer`.

    Priorities live on the storing device as float64 ``[buffer_size]``. Sampling costs ``O(k log N)``,
    an update of ``k`` priorities the same.

    Raises:
        InvalidArgumentError: a setting out of range, an unknown ``backend``, or ``"torchrl"`` where it
            does not load.
    """

    extra_state_types = (*ReplayBuffer.extra_state_types, Priorities)

    def __init__(
        self,
        device: torch.device | str,
        storing_device: torch.device | str,
        buffer_size: int,
        print_gc_warning: bool = False,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        backend: Backend = "auto",
        **kwargs: Any,
    ) -> None:
        alpha = real_in(alpha, "alpha", *RANGES["alpha"], finite=True)
        beta = real_in(beta, "beta", *RANGES["beta"])
        eps = real_in(eps, "eps", *RANGES["eps"], finite=True)
        check_backend(backend, buffer_devices(device, storing_device, buffer_size)[1])
        super().__init__(device, storing_device, buffer_size, print_gc_warning, **kwargs)
        self._priorities = Priorities(self._engine, alpha, beta, eps, backend)
        self.checkpoint_extras.append(self._priorities)

    # ------------------------------------------------------------------ settings
    @property
    def alpha(self) -> float:
        """Priority exponent (>= 0). Setting it re-weights every row (``O(buffer_size)``); refused, changing
        nothing, when the largest priority given cannot take it."""
        return self._priorities.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._priorities.set_alpha(real_in(value, "alpha", *RANGES["alpha"], finite=True))

    @property
    def beta(self) -> float:
        """Importance-weight exponent in ``[0, 1]``; set it to anneal."""
        return self._priorities.beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._priorities.beta = real_in(value, "beta", *RANGES["beta"])

    @property
    def eps(self) -> float:
        """Added to every priority before the exponent."""
        return self._priorities.eps

    @property
    def backend(self) -> str:
        """Which index draws the slots: ``"torchrl"`` or ``"torch"``."""
        return self._priorities.index.name

    @property
    def max_priority(self) -> float:
        """The priority new rows get: the largest given since the last reset, 1.0 before any."""
        return float(self._priorities.max_priority)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, alpha={self.alpha}, beta={self.beta}, backend={self.backend!r})"

    # ------------------------------------------------------------------ priorities
    def update_priority(self, index: Slots, priority: torch.Tensor | Any) -> None:
        """Set the priorities of the rows at slots ``index`` (e.g. a batch's ``"index"``).

        Args:
            index: slots (int, list, range or int tensor), each ``0 <= slot < len(buffer)``; integers only.
            priority: one value per slot, of the same shape as ``index`` (size-1 dimensions aside, so a
                ``[k, 1]`` column of TD errors fits a ``[k]`` index); finite and >= 0. A tensor on any
                device, a NumPy array, a list or a number. Not differentiated through.

        A slot given twice takes the last value. Raises before changing anything:

        Raises:
            InvalidArgumentError: shapes differ, ``index`` is not integers, or a priority is negative, NaN,
                infinite, or so large that ``(p + eps) ** alpha * buffer_size`` is not finite.
            SlotIndexError: a slot is out of range.
        """
        self._priorities.update(*self.checked_priorities(index, priority))

    def checked_priorities(
        self, index: Slots, priority: torch.Tensor | Any, ring: Ring | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`update_priority`'s arguments checked (against ``ring``, the buffer's own by default), as
        distinct int64 slots and their float64 priorities (the last value of a slot given twice).

        Raises:
            as :meth:`update_priority`.
        """
        return last_per_slot(*self.checked_rows(index, priority, ring))

    def checked_rows(
        self, index: Slots, priority: torch.Tensor | Any, ring: Ring | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`checked_priorities`, one int64 slot and float64 priority per given row (``[k]`` each,
        repeated slots kept in order). Raises as :meth:`update_priority`."""
        slots = slot_indices(index, self._engine.ring if ring is None else ring, self.storing_device, "index")
        if isinstance(priority, torch.Tensor):
            values = priority.detach()
        else:
            try:
                values = torch.as_tensor(priority, dtype=torch.float64)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise InvalidArgumentError(f"priority must be numbers or a tensor: {exc}") from None
        index_shape = tuple(index.shape) if isinstance(index, torch.Tensor) else tuple(np.shape(index))
        if [d for d in index_shape if d != 1] != [d for d in values.shape if d != 1]:
            raise InvalidArgumentError(
                f"index has shape {list(index_shape)} but priority has shape {list(values.shape)}: "
                "give one priority per index"
            )
        if values.is_complex():
            raise InvalidArgumentError(f"priority must be real, got dtype {values.dtype}")
        values = values.to(device=self.storing_device, dtype=torch.float64).reshape(-1)
        bad = ~((values >= 0) & (values < math.inf))  # NaN fails both comparisons
        if bool(bad.any()):
            at = int(bad.nonzero()[0, 0])
            raise InvalidArgumentError(
                f"priorities must be finite and >= 0, got {float(values[at])} for slot {int(slots[at])}"
            )
        if slots.numel():
            self._priorities.check_fits(values.max(), "priority")
        return slots, values

    def priorities(self) -> torch.Tensor:
        """A copy of the raw priorities of the live slots, ``[len(buffer)]`` float64, slot order."""
        return self._priorities.priority[: self.data_size].clone()

    def priority_state(self) -> dict[str, torch.Tensor]:
        """Priority state as CPU tensors: ``priority`` (float64 ``[buffer_size]``, raw, slot order; 0 on
        empty slots) and ``max_priority`` (float64, 0-d)."""
        own = self._priorities
        return {"priority": own.priority.cpu().clone(), "max_priority": own.max_priority.cpu().clone()}

    def load_priority_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`priority_state` output (after the rows and ring state were restored).

        Raises:
            InvalidArgumentError: a key is missing, the shape does not match ``buffer_size``, or a value is
                negative, not finite or too large for ``alpha`` (nothing is changed).
        """
        try:
            priority = torch.as_tensor(state["priority"]).to(self.storing_device, torch.float64)
            max_priority = torch.as_tensor(state["max_priority"]).to(self.storing_device, torch.float64)
        except KeyError as exc:
            raise InvalidArgumentError(f"priority state lacks the key {exc.args[0]!r}") from None
        if priority.shape != (self.buffer_size,) or max_priority.numel() != 1:
            raise InvalidArgumentError(
                f"priority state has shapes {list(priority.shape)} / {list(max_priority.shape)}, "
                f"expected [{self.buffer_size}] / []"
            )
        both = torch.cat([priority, max_priority.reshape(1)])
        if not bool(((both >= 0) & (both < math.inf)).all()):
            raise InvalidArgumentError("priority state holds negative or non-finite values")
        own = self._priorities
        own.check_fits(both.max(), "priority state's largest priority")
        own.priority = priority.clone()
        own.max_priority = max_priority.reshape(()).clone()
        own.rebuild()

    # ------------------------------------------------------------------ writes and lifecycle
    def add(self, transition: Transition) -> None:
        """As :meth:`ReplayBuffer.add`; the new row (each env's, with ``num_envs > 1``) gets :attr:`max_priority`."""
        start = self.pointer
        self._engine.add(transition)
        self._priorities.new_rows(start, self.num_envs)

    def add_batch(self, batch: Transition) -> None:
        """As :meth:`ReplayBuffer.add_batch`; every row written gets :attr:`max_priority`."""
        start, kept = self._engine.add_batch(batch)
        self._priorities.new_rows(start, kept)

    def reset(self, buffer_size: int | None = None) -> None:
        """As :meth:`ReplayBuffer.reset`; priorities are cleared and :attr:`max_priority` is 1.0 again."""
        super().reset(buffer_size)
        self._priorities.clear()

    def close(self) -> None:
        """As :meth:`ReplayBuffer.close`; the priorities and their index are freed too."""
        super().close()
        self._priorities.free()

    # ------------------------------------------------------------------ sampling
    def sample_batch(
        self, batch_size: int, *, n_step: int | None = None, gamma: float = 0.99, recent: int | None = None
    ) -> TensorDict:
        """``batch_size`` rows drawn with replacement, row ``i`` with probability ``P(i)``.

        Args:
            batch_size: rows to draw (> 0).
            n_step, gamma: n-step targets, as :meth:`ReplayBuffer.sample_batch`.
            recent: draw only from the newest ``N = min(recent, len)`` rows, ``P(i)`` (and so the weights)
                renormalised over them. ``O(k log N)`` with our tree; ``O(N)`` per call with torchrl's
                sampler, which cannot restrict its draws.

        Returns:
            TensorDict of batch size ``[batch_size]`` on ``device`` with the stored keys, ``"index"`` (slots,
            for :meth:`update_priority`) and ``"weight"``: float32 importance weights
            ``(P(i) / min_batch P)^-beta``, at most 1.

        Raises:
            EmptyBufferError: no rows, or every row that may be drawn has weight 0.
            InvalidArgumentError: a bad ``batch_size``, ``n_step``, ``gamma`` or ``recent``.
        """
        k = positive_int(batch_size, "batch_size")
        window = reads.window(self, recent)
        n, g = (None, 0.0) if n_step is None else check_n_step(n_step, gamma)
        engine = self._engine
        engine.require_rows()
        slots = self._priorities.draw(k, window, self.generator)
        batch = engine.read_transitions(slots, n, g, self.transition_keys)
        batch.set(WEIGHT_KEY, engine.to_device(self._priorities.weights(slots)))
        return batch

    def importance_weights(self, slots: torch.Tensor) -> torch.Tensor:
        """``(P(i) / min_j P(j))^-beta`` over the given slots (float32, on the storing device)."""
        return self._priorities.weights(slots)
