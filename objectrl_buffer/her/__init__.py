"""Hindsight experience replay: :class:`HerReplayBuffer`, a :class:`~objectrl_buffer.ReplayBuffer` that
relabels goals at sample time (Stable-Baselines3's semantics; see ``docs/her.md``)."""

from objectrl_buffer.her.buffer import ComputeReward, HerReplayBuffer
from objectrl_buffer.sampling.her import GoalSelectionStrategy

__all__ = ["HerReplayBuffer", "GoalSelectionStrategy", "ComputeReward"]
