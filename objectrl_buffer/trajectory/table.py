"""The stored trajectories of a :class:`~objectrl_buffer.trajectory.buffer.TrajectoryReplayBuffer`.

A :class:`Table` keeps the index entries and first row addresses of the trajectories, oldest first, over one
:class:`~objectrl_buffer.trajectory.rows.RowStore`, and evicts whole oldest trajectories when full: when the
rows reach ``capacity`` (transitions), or the trajectories reach ``keep``.
"""

from __future__ import annotations

from typing import Any

import torch

from objectrl_buffer.core.schema import Schema
from objectrl_buffer.trajectory.files import Entry
from objectrl_buffer.trajectory.rows import CHUNK_BYTES, Pairs, RowStore
from objectrl_buffer.trajectory.trajectory import to_payload
from objectrl_buffer.trajectory.writer import TrajectoryWriter

__all__ = ["Table", "shutdown"]


class Table:
    """The stored trajectories, oldest first: their index entries and first row addresses, over one RowStore.

    Args:
        capacity: transitions kept at most (a ring of rows), or ``None``.
        device: the storing device.
        keep: trajectories kept at most (``None``: no limit). Without ``capacity`` the rows are then kept in
            process memory, in chunks that are reused as the oldest rows go: an eighth of ``keep`` times the
            first trajectory's rows, at least that trajectory and 64 rows, at most
            :data:`~objectrl_buffer.trajectory.rows.CHUNK_BYTES` (or one row). Memory is then the kept rows
            plus at most two chunks (one being filled, one spare): at most ~3x the kept rows for small windows.
    """

    def __init__(self, capacity: int | None, device: torch.device, keep: int | None = None) -> None:
        self.keep = keep
        bounded = keep is not None and capacity is None
        self.rows = RowStore(capacity, device, in_memory=bounded)
        self.entries: list[Entry] = []
        self.firsts: list[int] = []
        self.total = 0

    def append(self, schema: Schema, pairs: Pairs, n: int, entry: Entry) -> tuple[int, list[Entry]]:
        """Store one trajectory's rows, evicting whole oldest ones first until it fits (``capacity``) and one
        more is allowed (``keep``); return (first row, evicted)."""
        evicted: list[Entry] = []
        rows = self.rows
        keep = self.keep
        if keep is not None and rows.chunk_rows is None and rows.capacity is None:  # the first trajectory
            wanted = max(keep * n // 8, n, 64)
            rows.chunk_rows = max(1, min(CHUNK_BYTES // max(schema.row_bytes, 1), wanted))
        while rows.free < n or (keep is not None and len(self.entries) >= keep):
            old = self.entries.pop(0)
            self.firsts.pop(0)
            rows.drop_oldest(old.num_samples)
            self.total -= old.num_samples
            evicted.append(old)
        first = rows.append(schema, pairs, n)
        self.entries.append(entry)
        self.firsts.append(first)
        self.total += n
        return first, evicted

    def payload(self, i: int) -> dict[str, Any]:
        """The file payload of the ``i``-th stored trajectory, from storage (CPU tensors).

        Copies, never views: ``torch.save`` writes a view's whole storage (a 256 MB chunk per file), and a
        ring may rewrite the rows before the writer thread gets to them."""
        entry = self.entries[i]
        rows = {k: v.cpu() for k, v in self.rows.read(self.firsts[i], entry.num_samples).items()}
        return to_payload(entry.shape, entry.max_episode_length, entry.model_weights_id, rows, entry.heads)


def shutdown(writer: TrajectoryWriter | None, table: list[Table]) -> None:
    """At close (or exit, or garbage collection): stop the writer after its queued work; free the rows."""
    if writer is not None:
        writer.close(wait=True)
    table[0].rows.close()
