"""objectrl_buffer: a TorchRL-based replay buffer for GPU and CPU, a drop-in for ObjectRL's."""

from objectrl_buffer import errors
from objectrl_buffer.replay_buffer import ReplayBuffer
from objectrl_buffer.schema import Field, Schema

__all__ = ["ReplayBuffer", "Schema", "Field", "errors", "__version__"]

__version__ = "0.1.0"
