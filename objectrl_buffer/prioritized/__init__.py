"""Prioritized experience replay: the buffer (:mod:`.buffer`), where priorities are looked up
(:mod:`.index`: torchrl's segment trees or our sum tree) and what its checkpoints carry (:mod:`.checkpoint`)."""

from objectrl_buffer.prioritized.buffer import PrioritizedReplayBuffer
from objectrl_buffer.prioritized.index import torchrl_per_available

__all__ = ["PrioritizedReplayBuffer", "torchrl_per_available"]
