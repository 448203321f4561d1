"""Checkpoints of a trajectory buffer: its :class:`~objectrl_buffer.trajectory.table.Table` to and from an
RLinf folder (:mod:`~objectrl_buffer.trajectory.files`), whole or one rank's share.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.errors import CheckpointError, InvalidArgumentError
from objectrl_buffer.trajectory import files
from objectrl_buffer.trajectory.files import Entry
from objectrl_buffer.trajectory.table import Table
from objectrl_buffer.trajectory.trajectory import from_payload

__all__ = ["write_folder", "check_rank", "rank_share", "read_table"]


def write_folder(path: str, table: Table, fmt: str, seed: Any) -> None:
    """Write every trajectory of ``table`` to the folder ``path``: files first, then index and metadata."""
    os.makedirs(path, exist_ok=True)
    written = []
    for i, entry in enumerate(table.entries):
        name = os.path.join(path, files.file_name(entry.trajectory_id, entry.model_weights_id, fmt))
        files.write_payload(name, table.payload(i), fmt, durable=False)
        written.append(name)
    files.sync_files(path, written)  # all durable (the kernel wrote most back meanwhile), then the index
    files.write_index(path, list(table.entries), fmt, seed)


def check_rank(local_rank: Any, world_size: Any) -> int:
    """Check a sharded load's ``local_rank`` and ``world_size``; return ``world_size``.

    Raises:
        InvalidArgumentError: ``world_size`` < 1, ``local_rank`` outside ``[0, world_size)``.
    """
    world_size = positive_int(world_size, "world_size")
    if isinstance(local_rank, bool) or not isinstance(local_rank, int) or not 0 <= local_rank < world_size:
        raise InvalidArgumentError(f"local_rank ({local_rank!r}) must be in range [0, {world_size})")
    return world_size


def rank_share(entries: list[Entry], local_rank: int, world_size: int) -> list[Entry]:
    """Rank ``local_rank``'s contiguous share of ``entries``, the remainder going to the low ranks
    (10 entries over 3 ranks: 4, 3, 3)."""
    per, extra = divmod(len(entries), world_size)
    start = local_rank * per + min(local_rank, extra)
    return entries[start : start + per + (1 if local_rank < extra else 0)]


def read_table(
    folder: files.Folder,
    entries: list[Entry],
    capacity: int | None,
    device: torch.device,
    allow_pickle: bool,
    keep: int | None = None,
) -> Table:
    """A new table (``capacity``, ``keep``: see :class:`Table`) holding ``entries``' trajectory files of
    ``folder`` (rows on ``device``).

    Raises:
        CheckpointNotFoundError: files missing. CheckpointError: a file that does not match its entry or is
            damaged. InvalidArgumentError: a trajectory longer than ``capacity``. Nothing is left allocated.
    """
    paths = files.find_files(files.Folder(folder.path, folder.metadata, entries, folder.fmt))
    table = Table(capacity, device, keep)
    try:
        schema = None
        for entry, file in zip(entries, paths, strict=True):
            flat = from_payload(files.load_payload(file, allow_pickle), f"'{file}'")
            schema, pairs, n = table.rows.prepare(flat.rows, schema)
            if n != entry.num_samples:
                raise CheckpointError(f"'{file}' holds {n} transitions, its index entry says {entry.num_samples}")
            if capacity is not None and n > capacity:
                raise InvalidArgumentError(f"'{file}' has {n} transitions, more than capacity={capacity}")
            table.append(schema, pairs, n, entry)
    except BaseException:
        table.rows.close()
        raise
    return table
