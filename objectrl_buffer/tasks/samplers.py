"""Samplers (which tasks) and converters (what a task becomes), with AWorld's class and method names so
custom ones port unchanged; ``RandomTaskSample`` draws from its own seeded ``torch.Generator``."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from objectrl_buffer.core import validate
from objectrl_buffer.core.seeding import derived_seed
from objectrl_buffer.core.validate import positive_int

from .query_filter import QueryCondition
from .rows import META_STRINGS, DataRow
from .storage.base import Storage

__all__ = ["Sampler", "TaskSampler", "RandomTaskSample", "Converter", "DefaultConverter", "TensorDictConverter"]


class Sampler(ABC):
    """Picks rows from a storage."""

    @abstractmethod
    def sample(self, storage: Storage, batch_size: int, query_condition: QueryCondition | None = None) -> Any:
        """Up to ``batch_size`` items from ``storage`` matching the query."""


def _order(value: Any) -> float:
    return -math.inf if value is None else float(value)


class TaskSampler(Sampler):
    """Picks whole tasks: :meth:`sample_task_ids` chooses, the rest fetches (AWorld's ``TaskSampler``)."""

    def sorted_by_step(self, task_experience: list[DataRow]) -> list[DataRow]:
        """The rows sorted by ``(step, execute_time)`` (a missing value first)."""
        return sorted(task_experience, key=lambda r: (_order(r.exp_meta.step), _order(r.exp_meta.execute_time)))

    def sample(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition | None = None
    ) -> dict[str, list[DataRow]]:
        """``{task_id: rows}`` (insertion order) of the sampled tasks."""
        return storage.get_bacth_by_task_ids(self.sample_task_ids(storage, batch_size, query_condition))

    def sample_tasks(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition | None = None
    ) -> dict[str, list[DataRow]]:
        """``{task_id: rows sorted by step}`` of the sampled tasks."""
        tasks = self.sample(storage, batch_size, query_condition)
        return {task_id: self.sorted_by_step(rows) for task_id, rows in tasks.items()}

    @abstractmethod
    def sample_task_ids(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition | None = None
    ) -> list[str]:
        """Up to ``batch_size`` distinct task_ids having a row that matches the query."""


class RandomTaskSample(TaskSampler):
    """Uniformly random distinct tasks among those with a matching row (all of them, shuffled, when there are
    fewer than ``batch_size``). ``seed``: the seed of its generator (``None``: derived, see core/seeding.py)."""

    def __init__(self, seed: int | None = None) -> None:
        self.generator = torch.Generator().manual_seed(derived_seed() if seed is None else validate.seed(seed))

    def __getstate__(self) -> dict[str, Any]:
        # the generator's state as plain bytes: a tensor would travel to a spawned child through shared memory
        return {"state": bytes(self.generator.get_state().numpy().tobytes())}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.generator = torch.Generator()
        self.generator.set_state(torch.frombuffer(bytearray(state["state"]), dtype=torch.uint8))

    def sample_task_ids(
        self, storage: Storage, batch_size: int, query_condition: QueryCondition | None = None
    ) -> list[str]:
        batch_size = positive_int(batch_size, "batch_size")
        fast = getattr(storage, "matching_task_ids", None)
        if callable(fast):
            task_ids = list(fast(query_condition))
        else:  # a custom storage: the task ids of its matching rows, first seen first
            task_ids = list(dict.fromkeys(r.exp_meta.task_id for r in storage.get_all(query_condition)))
        order = torch.randperm(len(task_ids), generator=self.generator)[:batch_size]
        return [task_ids[i] for i in order.tolist()]


class Converter(ABC):
    """Turns one task's rows into a dataset item."""

    @abstractmethod
    def to_dataset_row(self, task_experience: list[DataRow]) -> Any:
        """The item made of ``task_experience``."""


class DefaultConverter(Converter):
    """Returns the rows unchanged."""

    def to_dataset_row(self, task_experience: Any) -> Any:
        return task_experience


def _column(values: list[Any]) -> Any:
    """Stacked tensors when every value is a tensor of one shape and dtype, else a ``NonTensorStack``."""
    first = values[0] if values else None
    if isinstance(first, torch.Tensor) and all(
        isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype for v in values
    ):
        return torch.stack(values)
    return _non_tensor(values)


def _non_tensor(values: list[Any]) -> NonTensorStack:
    """One entry per row, whatever each holds (``from_list`` would split a list value into a new dimension)."""
    return NonTensorStack(*(NonTensorData(v) for v in values), batch_size=[len(values)])


class TensorDictConverter(Converter):
    """One task's rows (in the order given) -> a ``TensorDict`` of batch size ``[n_rows]`` on ``device``:

    * ``step`` int64 (-1 when missing), ``execute_time`` float64, ``reward_t``/``adv_t``/``v_t`` float32
      (NaN when missing or not a scalar);
    * ``task_id``, ``task_name``, ``agent_id``, ``pre_agent`` as non-tensor stacks of str/None;
    * ``state``, ``actions``, ``messages``: a stacked tensor ``[n_rows, *shape]`` when every row holds a
      tensor of one shape and dtype, else a non-tensor stack of their JSON forms.
    """

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)

    def to_dataset_row(self, task_experience: list[DataRow]) -> TensorDict:
        rows = list(task_experience)
        metas = [r.exp_meta for r in rows]
        data = [r.exp_data for r in rows]

        def real(v: Any) -> float:
            if isinstance(v, torch.Tensor) and v.numel() == 1:
                return float(v.item())
            return float(v) if isinstance(v, (int, float)) else math.nan

        out: dict[str, Any] = {
            "step": torch.tensor([-1 if m.step is None else int(m.step) for m in metas], dtype=torch.int64),
            "execute_time": torch.tensor([real(m.execute_time) for m in metas], dtype=torch.float64),
        }
        for name in ("reward_t", "adv_t", "v_t"):
            out[name] = torch.tensor([real(getattr(d, name)) for d in data], dtype=torch.float32)
        for name in META_STRINGS:
            out[name] = _non_tensor([getattr(m, name) for m in metas])
        for name in ("state", "actions", "messages"):
            out[name] = _column([getattr(d, name) for d in data])
        return TensorDict(out, batch_size=[len(rows)]).to(self.device)
