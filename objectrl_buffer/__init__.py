"""objectrl_buffer: a TorchRL-based replay buffer for GPU and CPU, a drop-in for ObjectRL's."""

from objectrl_buffer import errors
from objectrl_buffer.core.keys import DISCOUNT_KEY, INDEX_KEY, MASK_KEY, RESERVED_KEYS, WEIGHT_KEY
from objectrl_buffer.core.schema import Field, Schema
from objectrl_buffer.engine import Engine
from objectrl_buffer.prioritized.buffer import PrioritizedReplayBuffer
from objectrl_buffer.prioritized.index import torchrl_per_available
from objectrl_buffer.replay_buffer import ReplayBuffer
from objectrl_buffer.sampling.slices import TransitionKeys
from objectrl_buffer.sampling.sum_tree import SumTree

__all__ = [
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
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

__version__ = "0.1.0"
