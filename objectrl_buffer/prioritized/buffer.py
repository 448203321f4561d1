"""PrioritizedReplayBuffer: prioritized experience replay (Schaul et al., 2016) on the ReplayBuffer facade.

Everything of :class:`~objectrl_buffer.ReplayBuffer` (adds, epochs, slices, save/load) works unchanged;
``sample_batch`` (and so ``get_next_batch`` without an epoch iterator) draws in proportion to
priorities and adds importance weights.

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

Checkpoints: ``save(path, data=True)`` keeps the priorities, ``max_priority`` and the settings, and
``load``/``from_checkpoint`` restore them: see :mod:`objectrl_buffer.prioritized.checkpoint`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from objectrl_buffer.checkpoint.data import BufferState
from objectrl_buffer.checkpoint.generations import Checkpoint, Restored
from objectrl_buffer.errors import CheckpointError, EmptyBufferError, InvalidArgumentError
from objectrl_buffer.prioritized.checkpoint import priority_extras, saved_priorities, saved_settings
from objectrl_buffer.prioritized.index import Backend, PriorityIndex, check_backend, make_priority_index
from objectrl_buffer.replay_buffer import ReplayBuffer, Slots, Transition, _positive_int
from objectrl_buffer.sampling.nstep import check_n_step
from objectrl_buffer.sampling.uniform import chronological_slots

__all__ = ["PrioritizedReplayBuffer", "WEIGHT_KEY"]

#: Key of the importance weights in a prioritized sample (float32, ``[batch_size]``).
WEIGHT_KEY = "weight"

_RANGES = {"alpha": (0.0, math.inf), "beta": (0.0, 1.0), "eps": (0.0, math.inf)}  # name: (low, high)


def _real(value: object, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _shape_of(value: Any) -> tuple[int, ...]:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    return tuple(np.shape(value))


class PrioritizedReplayBuffer(ReplayBuffer):
    """A :class:`~objectrl_buffer.ReplayBuffer` whose random batches follow priorities.

    Args:
        device, storing_device, buffer_size, print_gc_warning: as :class:`ReplayBuffer`.
        alpha: how strongly priorities shape sampling (>= 0; 0 is uniform). Settable; a change
            re-weights all rows in ``O(buffer_size)``.
        beta: importance-weight exponent in ``[0, 1]`` (0: all weights 1, 1: full correction).
            Settable, to anneal it towards 1 during training.
        eps: added to every priority (>= 0), so a zero TD error keeps a row drawable.
        backend: ``"auto"`` (torchrl's ``PrioritizedSampler`` when its compiled extension loads
            for the storing device, else ours), ``"torchrl"`` or ``"torch"`` (our sum tree).
        **kwargs: the keyword arguments of :class:`ReplayBuffer` (``seed``, ``shuffle``,
            ``storage_dir``, ``transition_keys``).

    Priorities live on the storing device as float64 ``[buffer_size]``. Sampling costs
    ``O(k log N)``, an update of ``k`` priorities the same.

    Raises:
        InvalidArgumentError: ``alpha < 0``, ``beta`` outside ``[0, 1]``, ``eps < 0`` (or not finite),
            an unknown ``backend``, or ``"torchrl"`` where it does not load.
    """

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
        alpha = _real(alpha, "alpha", *_RANGES["alpha"])
        beta = _real(beta, "beta", *_RANGES["beta"])
        eps = _real(eps, "eps", *_RANGES["eps"])
        if alpha == math.inf or eps == math.inf:
            raise InvalidArgumentError(f"alpha and eps must be finite, got alpha={alpha}, eps={eps}")
        check_backend(backend, torch.device(storing_device))
        self._alpha, self._beta, self._eps, self._backend = alpha, beta, eps, backend
        super().__init__(device, storing_device, buffer_size, print_gc_warning, **kwargs)
        self._index: PriorityIndex
        self._priority: torch.Tensor
        self._max_priority: torch.Tensor
        self._clear_priorities()

    # ------------------------------------------------------------------ settings
    @property
    def alpha(self) -> float:
        """Priority exponent (>= 0). Setting it re-weights every row (``O(buffer_size)``)."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        alpha = _real(value, "alpha", *_RANGES["alpha"])
        if alpha == math.inf:
            raise InvalidArgumentError("alpha must be finite")
        self._alpha = alpha
        self._index = make_priority_index(self._backend, self.buffer_size, self.storing_device, alpha, self._eps)
        self._index.rebuild(self._priority, self.data_size)

    @property
    def beta(self) -> float:
        """Importance-weight exponent in ``[0, 1]``; set it to anneal."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = _real(value, "beta", *_RANGES["beta"])

    @property
    def eps(self) -> float:
        """Added to every priority before the exponent."""
        return self._eps

    @property
    def backend(self) -> str:
        """Which index draws the slots: ``"torchrl"`` or ``"torch"``."""
        return self._index.name

    @property
    def max_priority(self) -> float:
        """The priority new rows get: the largest given since the last reset, 1.0 before any."""
        return float(self._max_priority)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, alpha={self._alpha}, beta={self._beta}, backend={self.backend!r})"

    # ------------------------------------------------------------------ priorities
    def _clear_priorities(self) -> None:
        self._priority = torch.zeros(self.buffer_size, dtype=torch.float64, device=self.storing_device)
        self._max_priority = torch.ones((), dtype=torch.float64, device=self.storing_device)
        self._index = make_priority_index(self._backend, self.buffer_size, self.storing_device, self._alpha, self._eps)

    def update_priority(self, index: Slots, priority: torch.Tensor | Any) -> None:
        """Set the priorities of the rows at slots ``index`` (e.g. a batch's ``"index"``).

        Args:
            index: slots (int, list, range or int tensor), each ``0 <= slot < len(buffer)``.
            priority: one value per slot, of the same shape as ``index`` (size-1 dimensions aside,
                so a ``[k, 1]`` column of TD errors fits a ``[k]`` index); finite and >= 0. A tensor
                on any device, a NumPy array, a list or a number. Not differentiated through.

        A slot given twice takes the last value. Raises before changing anything:

        Raises:
            InvalidArgumentError: shapes differ, or a priority is negative, NaN or infinite.
            SlotIndexError: a slot is out of range.
        """
        slots = self._as_slots(index)
        if isinstance(priority, torch.Tensor):
            values = priority.detach()
        else:
            try:
                values = torch.as_tensor(priority, dtype=torch.float64)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise InvalidArgumentError(f"priority must be numbers or a tensor: {exc}") from None
        index_shape, priority_shape = _shape_of(index), tuple(values.shape)
        if [d for d in index_shape if d != 1] != [d for d in priority_shape if d != 1]:
            raise InvalidArgumentError(
                f"index has shape {list(index_shape)} but priority has shape {list(priority_shape)}: "
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
        if slots.numel() == 0:
            return
        if slots.numel() > 1:  # keep the last value of each repeated slot
            order = torch.sort(slots, stable=True).indices
            ordered = slots[order]
            last = torch.ones_like(ordered, dtype=torch.bool)
            last[:-1] = ordered[1:] != ordered[:-1]
            keep = order[last]
            slots, values = slots[keep], values[keep]
        self._priority[slots] = values
        self._index.set(slots, values)
        self._max_priority = torch.maximum(self._max_priority, values.max())

    def priorities(self) -> torch.Tensor:
        """A copy of the raw priorities of the live slots, ``[len(buffer)]`` float64, slot order."""
        return self._priority[: self.data_size].clone()

    def priority_state(self) -> dict[str, torch.Tensor]:
        """Priority state for a checkpoint, as CPU tensors: ``priority`` (float64 ``[buffer_size]``,
        raw, slot order; 0 on empty slots) and ``max_priority`` (float64, 0-d).
        """
        return {"priority": self._priority.cpu().clone(), "max_priority": self._max_priority.cpu().clone()}

    def load_priority_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`priority_state` output (after the rows and ring state were restored).

        Raises:
            InvalidArgumentError: a key is missing, the shape does not match ``buffer_size``, or a
                value is negative or not finite (nothing is changed).
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
        self._priority = priority.clone()
        self._max_priority = max_priority.reshape(()).clone()
        self._index.rebuild(self._priority, self.data_size)

    def _give_new_rows_max_priority(self, slots: torch.Tensor) -> None:
        values = self._max_priority.expand(slots.shape)
        self._priority[slots] = values
        self._index.set(slots, values)

    # ------------------------------------------------------------------ writes and lifecycle
    def add(self, transition: Transition) -> None:
        """As :meth:`ReplayBuffer.add`; the new row (each env's, with ``num_envs > 1``) gets :attr:`max_priority`."""
        if self.num_envs > 1:
            start, kept = self._add_env_step(transition)
            self._give_new_rows_max_priority(torch.arange(start, start + kept, device=self.storing_device))
            return
        slot = self.pointer
        super().add(transition)
        self._priority[slot] = self._max_priority
        self._index.set_one(slot, self._max_priority)

    def add_batch(self, batch: Transition) -> None:
        """As :meth:`ReplayBuffer.add_batch`; every row written gets :attr:`max_priority`."""
        start, kept = self._add_batch(batch)
        if kept:
            slots = torch.arange(start, start + kept, device=self.storing_device) % self.buffer_size
            self._give_new_rows_max_priority(slots)

    def reset(self, buffer_size: int | None = None) -> None:
        """As :meth:`ReplayBuffer.reset`; priorities are cleared and :attr:`max_priority` is 1.0 again."""
        super().reset(buffer_size)
        self._clear_priorities()

    def close(self) -> None:
        """As :meth:`ReplayBuffer.close`; the priorities and their index are freed too."""
        super().close()
        self._priority = torch.zeros(0, dtype=torch.float64, device=self.storing_device)
        self._index = make_priority_index(self._backend, 1, self.storing_device, self._alpha, self._eps)

    def load(self, path: str | os.PathLike[str], *, verify: bool = True, progress: bool | None = None) -> None:
        """As :meth:`ReplayBuffer.load`, priorities included: a full checkpoint of a prioritized buffer
        restores every row's priority and :attr:`max_priority` (this buffer keeps its ``alpha``, ``beta``
        and ``eps``); a checkpoint without priorities gives every live row priority 1.0.

        Raises:
            CheckpointNotFoundError, CheckpointError: as :meth:`ReplayBuffer.load`, also for saved
                priorities that are damaged (checksum) or invalid (negative, not finite, wrong shape);
                the buffer, priorities included, is then unchanged.
        """
        super().load(path, verify=verify, progress=progress)

    # ------------------------------------------------------------------ copies
    def __getstate__(self) -> dict[str, Any]:
        """As :meth:`ReplayBuffer.__getstate__`, with the raw priorities, :attr:`max_priority`,
        ``alpha``/``beta``/``eps`` and the backend; the index is rebuilt from the priorities."""
        state = super().__getstate__()
        del state["_index"]  # torchrl's compiled trees do not pickle; rebuilt exactly from the priorities
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        capacity = self._priority.numel()  # 0 after close()
        self._index = make_priority_index(self._backend, max(capacity, 1), self.storing_device, self._alpha, self._eps)
        if capacity:
            self._index.rebuild(self._priority, self.data_size)

    # ------------------------------------------------------------------ checkpoint hooks
    @classmethod
    def _checkpoint_kwargs(cls, ckpt: Checkpoint, given: dict[str, Any]) -> dict[str, Any]:
        """``given``, plus the saved ``alpha``/``beta``/``eps`` not in it, for :meth:`from_checkpoint`.

        Raises:
            CheckpointError: a saved setting that is used is out of range (naming the manifest).
        """
        kwargs = super()._checkpoint_kwargs(ckpt, given)
        saved, where = saved_settings(ckpt)
        for name, value in saved.items():
            if name not in given:
                try:
                    kwargs[name] = _real(value, name, *_RANGES[name])
                except InvalidArgumentError as exc:
                    raise CheckpointError(f"'{where}' holds a bad saved setting: {exc}") from None
        return kwargs

    def _checkpoint_state(self) -> BufferState:
        state = super()._checkpoint_state()
        settings = {"alpha": self._alpha, "beta": self._beta, "eps": self._eps}
        arrays, values = priority_extras(self._priority[: self.data_size], self.max_priority, settings)
        return dataclasses.replace(
            state, extra_arrays={**state.extra_arrays, **arrays}, extra_values={**state.extra_values, **values}
        )

    def _check_checkpoint(self, restored: Restored) -> None:
        super()._check_checkpoint(restored)
        saved_priorities(restored)

    def _restore_checkpoint(self, restored: Restored) -> None:
        saved = saved_priorities(restored)  # checked by _check_checkpoint: cannot raise here
        super()._restore_checkpoint(restored)
        self._clear_priorities()  # sized for the restored capacity
        if saved is None:  # no saved priorities: every live row starts at max_priority (1.0)
            if self.data_size:
                self._give_new_rows_max_priority(torch.arange(self.data_size, device=self.storing_device))
            return
        priority, max_priority = saved
        self._priority[: self.data_size] = priority.to(self.storing_device)
        self._max_priority.fill_(max_priority)
        self._index.rebuild(self._priority, self.data_size)

    # ------------------------------------------------------------------ sampling
    def sample_batch(
        self, batch_size: int, *, n_step: int = 1, gamma: float = 0.99, recent: int | None = None
    ) -> TensorDict:
        """``batch_size`` rows drawn with replacement, row ``i`` with probability ``P(i)``.

        Args:
            batch_size: rows to draw (> 0).
            n_step, gamma: n-step targets, as :meth:`ReplayBuffer.sample_batch`.
            recent: not supported with prioritized draws (must be ``None``).

        Returns:
            TensorDict of batch size ``[batch_size]`` on ``device`` with the stored keys, ``"index"``
            (slots, for :meth:`update_priority`) and ``"weight"``: float32 importance weights
            ``(P(i) / min_batch P)^-beta``, at most 1.

        Raises:
            EmptyBufferError: no rows, or every live row has weight 0 (``eps == 0``).
            InvalidArgumentError: a bad ``batch_size``, ``n_step`` or ``gamma``, or ``recent`` given.
        """
        k = _positive_int(batch_size, "batch_size")
        if recent is not None:
            raise InvalidArgumentError(
                "recent= is not supported by PrioritizedReplayBuffer.sample_batch: priorities already decide "
                "which rows are drawn (use a ReplayBuffer for a recency window)"
            )
        n, g = (1, 0.0) if n_step == 1 else check_n_step(n_step, gamma)
        self._require_rows()
        if self._phantom:
            slots = self._draw_held(k)
        else:
            if self._eps == 0 and not self._index.total() > 0:  # total() syncs: only eps == 0 can make it 0
                raise EmptyBufferError("every stored row has priority 0 (with eps=0): no row can be drawn")
            slots = self._index.draw(k, self.data_size, self.generator)
        batch = self._read_transitions(slots, n, g)
        batch.set(WEIGHT_KEY, self._to_device(self.importance_weights(slots)))
        return batch

    def _draw_held(self, k: int) -> torch.Tensor:
        """``k`` slots drawn as :meth:`sample_batch` does, among the rows that hold data only.

        For the time after a metadata-only load, while the counters still count rows that hold no data
        (the index covers every counted slot): an exact draw in ``O(rows held)``, not ``O(k log N)``.
        """
        slots = chronological_slots(self.pointer, self._held, self.buffer_size, self.storing_device)
        weights = (self._priority.index_select(0, slots) + self._eps).pow_(self._alpha)
        if not bool(weights.sum() > 0):
            raise EmptyBufferError("every stored row has priority 0 (with eps=0): no row can be drawn")
        return slots[torch.multinomial(weights, k, replacement=True, generator=self.generator)]

    def importance_weights(self, slots: torch.Tensor) -> torch.Tensor:
        """``(P(i) / min_j P(j))^-beta`` over the given slots (float32, on the storing device)."""
        weight = (self._priority.index_select(0, slots) + self._eps).pow_(self._alpha)
        return (weight / weight.min()).pow_(-self._beta).to(torch.float32)
