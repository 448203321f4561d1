"""objectrl_buffer: a TorchRL-based replay buffer for GPU and CPU, a drop-in for ObjectRL's.

The classes are imported on first use (``from objectrl_buffer import ReplayBuffer`` works as usual), so
``import objectrl_buffer`` and the ``objectrl-buffer`` command start without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from objectrl_buffer import errors
from objectrl_buffer.core.keys import DISCOUNT_KEY, INDEX_KEY, MASK_KEY, RESERVED_KEYS, WEIGHT_KEY

if TYPE_CHECKING:
    from objectrl_buffer.core.schema import Field, Schema
    from objectrl_buffer.engine import Engine
    from objectrl_buffer.her.buffer import HerReplayBuffer
    from objectrl_buffer.prioritized.buffer import PrioritizedReplayBuffer
    from objectrl_buffer.prioritized.index import torchrl_per_available
    from objectrl_buffer.replay_buffer import ReplayBuffer
    from objectrl_buffer.sampling.her import GoalSelectionStrategy
    from objectrl_buffer.sampling.slices import TransitionKeys
    from objectrl_buffer.sampling.sum_tree import SumTree

__all__ = [
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "HerReplayBuffer",
    "GoalSelectionStrategy",
    "TransitionKeys",
    "SumTree",
    "torchrl_per_available",
    "Schema",
    "Field",
    "errors",
    "Engine",
    "INDEX_KEY",
    "WEIGHT_KEY",
    "MASK_KEY",
    "DISCOUNT_KEY",
    "RESERVED_KEYS",
    "__version__",
]

__version__ = "0.2.0"

#: Where each public name lives: imported by :func:`__getattr__` when first asked for.
_HOMES = {
    "ReplayBuffer": "objectrl_buffer.replay_buffer",
    "PrioritizedReplayBuffer": "objectrl_buffer.prioritized.buffer",
    "HerReplayBuffer": "objectrl_buffer.her.buffer",
    "GoalSelectionStrategy": "objectrl_buffer.sampling.her",
    "torchrl_per_available": "objectrl_buffer.prioritized.index",
    "TransitionKeys": "objectrl_buffer.sampling.slices",
    "SumTree": "objectrl_buffer.sampling.sum_tree",
    "Schema": "objectrl_buffer.core.schema",
    "Field": "objectrl_buffer.core.schema",
    "Engine": "objectrl_buffer.engine",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'objectrl_buffer' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
