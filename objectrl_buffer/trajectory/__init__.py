"""RLinf's trajectory buffer (``TrajectoryReplayBuffer``) on this library's storage.

Whole batched trajectories ``[T, B, ...]`` in, transitions drawn from the newest ones out; an optional
background writer keeps an RLinf-format folder that survives kills; checkpoints load sharded across ranks;
:mod:`~objectrl_buffer.trajectory.tools` merges per-rank folders and splits one.
"""

from objectrl_buffer.trajectory.buffer import TrajectoryReplayBuffer
from objectrl_buffer.trajectory.tools import merge_rank_folders, split_folder
from objectrl_buffer.trajectory.trajectory import Trajectory

__all__ = ["Trajectory", "TrajectoryReplayBuffer", "merge_rank_folders", "split_folder"]
