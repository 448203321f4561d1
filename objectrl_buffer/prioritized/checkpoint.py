"""What a PrioritizedReplayBuffer keeps in a full checkpoint, and how that is checked on the way back.

``save(path, data=True)`` of a :class:`~objectrl_buffer.PrioritizedReplayBuffer` adds to the data
folder (as the manifest's ``extras``, see :mod:`objectrl_buffer.checkpoint.manifest`):

* the extra array ``prioritized.priority``: the raw priorities of the live slots, float64
  ``[data_size]`` in slot order, a raw file with a crc32 like the columns;
* the extra values ``prioritized.max_priority`` (the priority the next new row gets) and
  ``prioritized.alpha``, ``prioritized.beta``, ``prioritized.eps``: JSON numbers, exact (a float
  is written as the shortest text that reads back as the same float64).

What a load does with them:

* ``load(path)`` into an existing buffer restores the priorities and ``max_priority``; the buffer
  keeps its own ``alpha``/``beta``/``eps`` (those it was built with, or set since): the code that
  builds the buffer decides its hyper-parameters, as it does for every other buffer setting.
* ``PrioritizedReplayBuffer.from_checkpoint(path, ...)`` builds the buffer with the saved
  ``alpha``/``beta``/``eps`` (so an annealed ``beta`` continues where it was), unless they are given
  as keyword arguments.
* A checkpoint without priorities (saved by a plain ``ReplayBuffer``, or metadata-only as ObjectRL
  writes it) gives every live row priority 1.0 and ``max_priority`` 1.0. A plain ``ReplayBuffer``
  loads a prioritized checkpoint's rows and ignores the priorities (as does an objectrl_buffer that
  predates the ``extras``).
"""

from __future__ import annotations

import math
import os

import torch

from objectrl_buffer.checkpoint.generations import Checkpoint, Restored
from objectrl_buffer.checkpoint.manifest import MANIFEST, ExtraValue, extra_file_name
from objectrl_buffer.errors import CheckpointError

__all__ = ["PRIORITY", "MAX_PRIORITY", "SETTINGS", "priority_extras", "saved_priorities", "saved_settings"]

PRIORITY = "prioritized.priority"
MAX_PRIORITY = "prioritized.max_priority"
#: The hyper-parameters saved beside the priorities (as ``prioritized.<name>``).
SETTINGS = ("alpha", "beta", "eps")


def priority_extras(
    priority: torch.Tensor, max_priority: float, settings: dict[str, float]
) -> tuple[dict[str, torch.Tensor], dict[str, ExtraValue]]:
    """The extra arrays and values of a checkpoint: ``priority`` float64 ``[data_size]`` (live slots,
    any device), ``max_priority`` and ``settings`` (``alpha``/``beta``/``eps``)."""
    values: dict[str, ExtraValue] = {MAX_PRIORITY: max_priority}
    values.update({f"prioritized.{name}": settings[name] for name in SETTINGS})
    return {PRIORITY: priority}, values


def saved_priorities(restored: Restored) -> tuple[torch.Tensor, float] | None:
    """The checkpoint's priorities (float64 ``[data_size]``, CPU) and max priority, validated;
    ``None`` when it holds none.

    Raises:
        CheckpointError: naming the file, when they are of the wrong shape or dtype, negative or not
            finite, or the max priority is missing or not a number >= 0.
    """
    priority = restored.extra_arrays.get(PRIORITY)
    if priority is None:
        return None
    where = os.path.join(restored.source, extra_file_name(PRIORITY))
    if priority.dtype != torch.float64 or priority.shape != (restored.data_size,):
        raise CheckpointError(
            f"'{where}' holds {priority.dtype} {list(priority.shape)}, expected float64 [{restored.data_size}]"
        )
    if not bool(((priority >= 0) & (priority < math.inf)).all()):
        raise CheckpointError(f"'{where}' holds negative or non-finite priorities: the checkpoint is damaged")
    max_priority = restored.extra_values.get(MAX_PRIORITY)
    if isinstance(max_priority, bool) or not isinstance(max_priority, (int, float)) or not max_priority >= 0:
        manifest = os.path.join(restored.source, MANIFEST)
        raise CheckpointError(f"'{manifest}' holds a bad {MAX_PRIORITY} {max_priority!r}, expected a number >= 0")
    return priority, float(max_priority)


def saved_settings(ckpt: Checkpoint) -> tuple[dict[str, ExtraValue], str]:
    """The saved ``alpha``/``beta``/``eps`` found in the checkpoint (not range-checked: the buffer does
    that), and the manifest file that holds them (for errors). Empty for a checkpoint without them."""
    if ckpt.manifest is None or ckpt.data_folder is None:
        return {}, ckpt.metadata_file
    values = ckpt.manifest.extra_values
    found = {name: values[f"prioritized.{name}"] for name in SETTINGS if f"prioritized.{name}" in values}
    return found, os.path.join(ckpt.data_folder, MANIFEST)
