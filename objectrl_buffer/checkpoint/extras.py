"""The extra-state contract: how a room or a buffer subclass adds its own state to full checkpoints.

A buffer keeps a list of :class:`ExtraState` objects (``ReplayBuffer.checkpoint_extras``). A full save
asks each for its :meth:`~ExtraState.state`: arrays (saved as raw files with a crc32, like the columns)
and small JSON values, stored under ``"<name>.<key>"`` in the data folder's manifest (``extras``, see
:mod:`~objectrl_buffer.checkpoint.manifest`). A load reads and verifies everything first, then asks each
extra to :meth:`~ExtraState.check` what was saved under its name (refusing changes nothing), and only
after the buffer has adopted the rows calls :meth:`~ExtraState.restore`. A checkpoint without an
extra's entries (saved by a plain buffer, or an old metadata-only save) hands it empty mappings.

Metadata-only saves (ObjectRL's ``save(path)``) carry no arrays and no values, except the int values an
extra names in an optional class attribute ``metadata_keys`` (a tuple of keys of its :meth:`~ExtraState.state`
values: a rate limiter's counters), which go into the metadata file (see :func:`in_metadata` and
:mod:`~objectrl_buffer.checkpoint.metadata`); a metadata-only load hands those back as its values.

Prioritized replay's priorities are the first user (``prioritized/checkpoint.py``); nothing here knows
about them. The on-disk names are the same as before this contract existed (``prioritized.priority``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeAlias, runtime_checkable

import torch

from objectrl_buffer.checkpoint.generations import Checkpoint
from objectrl_buffer.checkpoint.manifest import ExtraValue
from objectrl_buffer.errors import CheckpointError

__all__ = ["ExtraState", "Arrays", "Values", "collect", "in_metadata", "own", "saved_kwargs"]

#: An extra state's arrays and JSON values, keyed without its name prefix.
Arrays: TypeAlias = Mapping[str, torch.Tensor]
Values: TypeAlias = Mapping[str, ExtraValue]


@runtime_checkable
class ExtraState(Protocol):
    """Part of a buffer's state that its full checkpoints carry beside the rows.

    Attributes:
        name: the owner prefix of its entries (``"prioritized"``): dotted names, owner first.
    """

    name: str

    def state(self) -> tuple[Arrays, Values]:
        """Arrays (any shape, dtype and device; not copied) and JSON scalars to save, keyed without the prefix."""
        ...

    def check(self, arrays: Arrays, values: Values, rows: int, source: str) -> None:
        """Refuse (raise :class:`~objectrl_buffer.errors.CheckpointError` naming ``source``) a saved state
        that cannot be adopted by a buffer of ``rows`` restored rows; must change nothing."""
        ...

    def restore(self, arrays: Arrays, values: Values) -> None:
        """Adopt a checked state after the rows were restored (empty mappings: the checkpoint has none);
        must not fail."""
        ...


def collect(extras: Iterable[ExtraState]) -> tuple[dict[str, torch.Tensor], dict[str, ExtraValue]]:
    """Every extra's :meth:`~ExtraState.state`, under ``"<name>.<key>"``."""
    arrays: dict[str, torch.Tensor] = {}
    values: dict[str, ExtraValue] = {}
    for extra in extras:
        own_arrays, own_values = extra.state()
        arrays.update({f"{extra.name}.{key}": array for key, array in own_arrays.items()})
        values.update({f"{extra.name}.{key}": value for key, value in own_values.items()})
    return arrays, values


def in_metadata(extras: Iterable[ExtraState], values: Mapping[str, ExtraValue]) -> dict[str, int]:
    """Of the :func:`collect`-ed ``values``, the ints each extra names in its ``metadata_keys`` (if any)."""
    chosen: dict[str, int] = {}
    for extra in extras:
        for key in getattr(extra, "metadata_keys", ()):
            value = values.get(f"{extra.name}.{key}")
            if type(value) is int:
                chosen[f"{extra.name}.{key}"] = value
    return chosen


def own(name: str, entries: Mapping[str, Any]) -> dict[str, Any]:
    """The entries saved under ``name`` (``"<name>.<key>"``), keyed without the prefix."""
    prefix = f"{name}."
    return {key.removeprefix(prefix): value for key, value in entries.items() if key.startswith(prefix)}


def saved_kwargs(ckpt: Checkpoint, given: Mapping[str, Any], extra_types: Iterable[Any]) -> dict[str, Any]:
    """The constructor arguments of ``from_checkpoint``: those ``given``, plus what a full checkpoint
    saved and they leave out: ``num_envs``, and the settings each extra-state type reads back from its
    values (its ``settings(values, folder)``, e.g. PER's ``alpha``/``beta``/``eps``).

    Raises:
        CheckpointError: ``num_envs`` is given and differs from the saved one, or a saved setting is bad.
    """
    kwargs = dict(given)
    if ckpt.manifest is None:  # a metadata-only checkpoint keeps the buffer's num_envs
        return kwargs
    saved = ckpt.manifest.num_envs
    if kwargs.setdefault("num_envs", saved) != saved:
        raise CheckpointError(f"'{ckpt.data_folder}' was saved with num_envs={saved}, not {given['num_envs']}")
    for extra in extra_types:  # only the settings not given are read (and checked)
        values = {k: v for k, v in own(extra.name, ckpt.manifest.extra_values).items() if k not in given}
        for name, value in extra.settings(values, ckpt.data_folder).items():
            kwargs.setdefault(name, value)
    return kwargs
