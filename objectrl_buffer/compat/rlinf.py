"""RLinf's ``TrajectoryReplayBuffer`` names and call shapes over :mod:`objectrl_buffer.trajectory`.

Move RLinf code by changing its import only::

    # from rlinf.data.replay_buffer import TrajectoryReplayBuffer
    from objectrl_buffer.compat.rlinf import TrajectoryReplayBuffer

What this module translates, and nothing more (the buffer itself is
:class:`objectrl_buffer.trajectory.TrajectoryReplayBuffer`):

* the constructor takes rlinf 0.3.0's arguments in its positional order (``seed, enable_cache, cache_size,
  sample_window_size, auto_save, auto_save_path, trajectory_format``); the seed-era names (``storage_dir``,
  ``storage_format``, ``save_trajectories``) and the room's keyword-only ones (``capacity``, ``device``...)
  are accepted as keywords;
* :meth:`TrajectoryReplayBuffer.sample` returns RLinf's nested ``dict`` (tensor fields ``[k, ...]`` at the top,
  ``curr_obs`` / ``next_obs`` / ``forward_inputs`` as dicts of ``[k, ...]`` tensors), not a TensorDict;
* ``len``, ``size``, ``total_samples`` and :meth:`~TrajectoryReplayBuffer.get_stats` count as RLinf does:
  everything added since construction, ``clear()`` or a load, also what the buffer no longer keeps;
* :attr:`~TrajectoryReplayBuffer.trajectory_index` and :meth:`~TrajectoryReplayBuffer.load_trajectory` are
  the public form of RLinf's private ``_trajectory_index`` and ``_load_trajectory``.

Trajectories are any objects with RLinf's fields: RLinf's own ``Trajectory`` (from
``rlinf.data.embodied_io_struct``, with its ``extract_intervene_traj()``), this module's :class:`Trajectory`,
or a TensorDict of batch size ``[T, B]``. A trajectory that lacks a tensor field the buffer holds (the
demonstrations ``extract_intervene_traj()`` returns have no ``versions``) is stored with 0 there, and every
later sample carries ``batch["present"]["versions"]``, a bool ``[k]`` that is ``False`` on such rows (see
:attr:`objectrl_buffer.trajectory.TrajectoryReplayBuffer.optional_keys`); RLinf returns whatever its cache
slot held there.
"""

from __future__ import annotations

import os
from typing import Any, TypeAlias

import torch
from tensordict import TensorDictBase

from objectrl_buffer.trajectory import Trajectory
from objectrl_buffer.trajectory import TrajectoryReplayBuffer as _TrajectoryBuffer

__all__ = ["Batch", "Trajectory", "TrajectoryReplayBuffer"]

#: What :meth:`TrajectoryReplayBuffer.sample` returns: tensors ``[k, ...]``, and dicts of them.
Batch: TypeAlias = dict[str, "torch.Tensor | Batch"]


def _as_dict(data: TensorDictBase) -> Batch:
    """A TensorDict as nested plain dicts of its own tensors (no copy)."""
    out: Batch = {}
    for key, value in data.items():
        out[key] = _as_dict(value) if isinstance(value, TensorDictBase) else value
    return out


class TrajectoryReplayBuffer(_TrajectoryBuffer):
    """rlinf 0.3.0's ``TrajectoryReplayBuffer``: its arguments, results and counts, on this library's buffer.

    Args:
        seed, enable_cache, cache_size, sample_window_size, auto_save, auto_save_path, trajectory_format:
            rlinf 0.3.0's, in its positional order (see
            :class:`objectrl_buffer.trajectory.TrajectoryReplayBuffer` for each; ``auto_save_path`` is used
            only with ``auto_save``, as upstream).
        **options: keyword arguments of :class:`objectrl_buffer.trajectory.TrajectoryReplayBuffer`
            (``capacity``, ``device``, ``storing_device``, ``allow_pickle``, and the seed-era names
            ``storage_dir``, ``storage_format``, ``save_trajectories``).

    Raises:
        InvalidArgumentError (a ValueError): as the room's constructor.
    """

    def __init__(
        self,
        seed: int | None = 1234,
        enable_cache: bool = True,
        cache_size: int = 5,
        sample_window_size: int = 100,
        auto_save: bool = False,
        auto_save_path: str | os.PathLike[str] = "",
        trajectory_format: str = "pt",
        **options: Any,
    ) -> None:
        # a seed-era keyword given (save_trajectories=...) wins over the 0.3 argument's default
        options.setdefault("save_trajectories", auto_save)
        options.setdefault("storage_dir", auto_save_path)
        options.setdefault("storage_format", trajectory_format)
        super().__init__(seed, enable_cache, cache_size, sample_window_size=sample_window_size, **options)
        # RLinf's cache: cache_size slots when saving (none without enable_cache), else sample_window_size
        slots = self.cache_size if self.enable_cache else 0
        self._cache_slots = slots if self.save_trajectories else sample_window_size
        self._cached = 0  # trajectories put in RLinf's cache since the last clear, clear_cache or load

    # ------------------------------------------------------------------ RLinf's names for the room's settings
    @property
    def auto_save(self) -> bool:
        """rlinf 0.3.0's name of ``save_trajectories``."""
        return self.save_trajectories

    @property
    def auto_save_path(self) -> str | None:
        """rlinf 0.3.0's name of ``storage_dir`` (``None`` without ``auto_save``, as upstream)."""
        return self.storage_dir if self.save_trajectories else None

    @property
    def trajectory_format(self) -> str:
        """rlinf 0.3.0's name of ``storage_format``."""
        return self.storage_format

    # ------------------------------------------------------------------ RLinf's counts
    def __len__(self) -> int:
        """Trajectories added since construction, :meth:`clear` or a load (RLinf's ``size``), also those the
        buffer no longer keeps (:attr:`trajectory_ids` lists the stored ones)."""
        return self.num_added

    @property
    def size(self) -> int:
        """RLinf's ``size``: the same as ``len``."""
        return self.num_added

    @property
    def total_samples(self) -> int:
        """Transitions of the trajectories ``len`` counts (RLinf's ``total_samples``)."""
        return self.num_added_samples

    def get_stats(self) -> dict[str, int]:
        """RLinf's ``{num_trajectories, total_samples, cache_size}``: ``len``, :attr:`total_samples`, and the
        trajectories RLinf's cache would hold (the newest added since the last clear, ``clear_cache`` or load,
        at most ``cache_size`` with ``auto_save``, else ``sample_window_size``)."""
        return {
            "num_trajectories": len(self),
            "total_samples": self.total_samples,
            "cache_size": min(self._cached, self._cache_slots),
        }

    # ------------------------------------------------------------------ RLinf's results
    def add_trajectories(self, trajectories: Any) -> None:
        """Store each trajectory (RLinf's ``Trajectory``, this module's, any object with their fields, or a
        TensorDict ``[T, B]``); see :meth:`objectrl_buffer.trajectory.TrajectoryReplayBuffer.add_trajectories`."""
        before = self.num_added
        super().add_trajectories(trajectories)
        self._cached += self.num_added - before

    def sample(self, num_chunks: int = 0) -> Batch:
        """``num_chunks`` transitions as RLinf's nested dict ``[num_chunks, ...]`` (clipped to the window's
        transitions, as upstream); ``batch["present"]`` holds the presence masks of
        :attr:`~objectrl_buffer.trajectory.TrajectoryReplayBuffer.optional_keys`, when there are any.

        Raises:
            InvalidArgumentError (a ValueError): ``num_chunks`` is not a positive int (upstream asserts).
            EmptyBufferError (a RuntimeError): "Cannot sample from an empty buffer."
        """
        return _as_dict(super().sample(num_chunks))

    def sample_chunks(self, num_chunks: int) -> Batch:
        """RLinf's other name of :meth:`sample`."""
        return self.sample(num_chunks)

    @property
    def trajectory_index(self) -> dict[int, dict[str, Any]]:
        """RLinf's index of the stored trajectories, oldest first: id -> ``{num_samples, trajectory_id,
        max_episode_length, shape, model_weights_id}`` plus ``missing`` (the fields it lacked); see
        :meth:`~objectrl_buffer.trajectory.TrajectoryReplayBuffer.trajectory_info`."""
        return {i: self.trajectory_info(i) for i in self.trajectory_ids}

    def load_trajectory(self, trajectory_id: int) -> Trajectory:
        """One stored trajectory as a :class:`Trajectory` with RLinf's fields ``[T, B, ...]`` as its file holds
        them (``None`` for a field it lacked; done-like fields with their ``T + E`` rows, as added), read from
        the buffer's storage, never from a file.

        Raises:
            InvalidArgumentError: ``trajectory_id`` is not stored (:attr:`trajectory_ids`).
        """
        trajectory = Trajectory()
        for name, value in self.trajectory_payload(trajectory_id).items():
            setattr(trajectory, name, value)  # as RLinf's _load_trajectory sets every field of the file
        return trajectory

    # ------------------------------------------------------------------ lifecycle
    def clear(self) -> None:
        """Forget every trajectory and reset the counts (also after :meth:`close`, as RLinf's cleanup runs)."""
        super().clear()
        self._cached = 0

    def clear_cache(self) -> None:
        """Wait for pending writes; RLinf's cache count (:meth:`get_stats`) restarts from 0. The buffer stays
        usable (upstream shuts its writer down)."""
        super().clear_cache()
        self._cached = 0

    def load_checkpoint(
        self,
        load_path: str | os.PathLike[str],
        is_distributed: bool = False,
        local_rank: int = 0,
        world_size: int = 1,
    ) -> None:
        """The room's :meth:`~objectrl_buffer.trajectory.TrajectoryReplayBuffer.load_checkpoint`; RLinf's
        cache then holds the newest loaded trajectories."""
        super().load_checkpoint(load_path, is_distributed, local_rank, world_size)
        self._cached = len(self.trajectory_ids)
