"""What a PrioritizedReplayBuffer keeps in a full checkpoint, and how that is checked on the way back.

``save(path, data=True)`` of a :class:`~objectrl_buffer.PrioritizedReplayBuffer` adds to the data
folder (as the manifest's ``extras``, through the extra-state contract of
:mod:`objectrl_buffer.checkpoint.extras`; :class:`~objectrl_buffer.prioritized.priorities.Priorities`
is the buffer's extra state named ``prioritized``):

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
from collections.abc import Mapping
from typing import Any

import torch

from objectrl_buffer.checkpoint.manifest import MANIFEST, ExtraValue, extra_file_name
from objectrl_buffer.core.validate import real_in
from objectrl_buffer.errors import CheckpointError, InvalidArgumentError

__all__ = ["NAME", "SETTINGS", "RANGES", "priority_extras", "saved_priorities", "saved_settings"]

#: The extra state's name: its entries are ``prioritized.<key>``.
NAME = "prioritized"
#: The hyper-parameters saved beside the priorities (as ``prioritized.<name>``).
SETTINGS = ("alpha", "beta", "eps")
#: Allowed range of each setting: ``(low, high)``.
RANGES = {"alpha": (0.0, math.inf), "beta": (0.0, 1.0), "eps": (0.0, math.inf)}


def priority_extras(
    priority: torch.Tensor, max_priority: float, settings: Mapping[str, float]
) -> tuple[dict[str, torch.Tensor], dict[str, ExtraValue]]:
    """The extra arrays and values (keys without the ``prioritized.`` prefix): ``priority`` float64
    ``[data_size]`` (live slots, any device), ``max_priority`` and ``settings`` (``alpha``/``beta``/``eps``)."""
    values: dict[str, ExtraValue] = {"max_priority": max_priority}
    values.update({name: settings[name] for name in SETTINGS})
    return {"priority": priority}, values


def saved_priorities(
    arrays: Mapping[str, torch.Tensor], values: Mapping[str, ExtraValue], rows: int, source: str
) -> tuple[torch.Tensor, float] | None:
    """The saved priorities (float64 ``[rows]``, CPU) and max priority, validated; ``None`` when there are none.

    Raises:
        CheckpointError: naming the file, when they are of the wrong shape or dtype, negative or not
            finite, or the max priority is missing or not a number >= 0.
    """
    priority = arrays.get("priority")
    if priority is None:
        return None
    where = os.path.join(source, extra_file_name(f"{NAME}.priority"))
    if priority.dtype != torch.float64 or priority.shape != (rows,):
        raise CheckpointError(f"'{where}' holds {priority.dtype} {list(priority.shape)}, expected float64 [{rows}]")
    if not bool(((priority >= 0) & (priority < math.inf)).all()):
        raise CheckpointError(f"'{where}' holds negative or non-finite priorities: the checkpoint is damaged")
    max_priority = values.get("max_priority")
    if isinstance(max_priority, bool) or not isinstance(max_priority, (int, float)) or not 0 <= max_priority < math.inf:
        manifest = os.path.join(source, MANIFEST)
        raise CheckpointError(f"'{manifest}' holds a bad {NAME}.max_priority {max_priority!r}, expected a number >= 0")
    return priority, float(max_priority)


def saved_settings(values: Mapping[str, ExtraValue], folder: str | None) -> dict[str, Any]:
    """The saved ``alpha``/``beta``/``eps`` found among ``values`` (checked against :data:`RANGES`).

    Raises:
        CheckpointError: a saved setting is out of range (naming the manifest).
    """
    found = {}
    for name in SETTINGS:
        if name in values:
            try:
                found[name] = real_in(values[name], name, *RANGES[name], finite=name != "beta")
            except InvalidArgumentError as exc:
                where = os.path.join(folder or "", MANIFEST)
                raise CheckpointError(f"'{where}' holds a bad saved setting: {exc}") from None
    return found
