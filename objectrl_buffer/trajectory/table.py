"""The stored trajectories of a :class:`~objectrl_buffer.trajectory.buffer.TrajectoryReplayBuffer`.

A :class:`Table` keeps the index entries and first row addresses of the trajectories, oldest first, over one
:class:`~objectrl_buffer.trajectory.rows.RowStore`, and evicts whole oldest trajectories when full.
"""

from __future__ import annotations

from typing import Any

import torch

from objectrl_buffer.core.schema import Schema
from objectrl_buffer.trajectory.files import Entry
from objectrl_buffer.trajectory.rows import Pairs, RowStore
from objectrl_buffer.trajectory.trajectory import to_payload
from objectrl_buffer.trajectory.writer import TrajectoryWriter

__all__ = ["Table", "shutdown"]


class Table:
    """The stored trajectories, oldest first: their index entries and first row addresses, over one RowStore."""

    def __init__(self, capacity: int | None, device: torch.device) -> None:
        self.rows = RowStore(capacity, device)
        self.entries: list[Entry] = []
        self.firsts: list[int] = []
        self.total = 0

    def append(self, schema: Schema, pairs: Pairs, n: int, entry: Entry) -> tuple[int, list[Entry]]:
        """Store one trajectory's rows, evicting whole oldest ones until it fits; return (first row, evicted)."""
        evicted: list[Entry] = []
        rows = self.rows
        while rows.free < n:
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
        """The file payload of the ``i``-th stored trajectory, from storage (CPU tensors)."""
        entry = self.entries[i]
        rows = {k: v.cpu() for k, v in self.rows.read(self.firsts[i], entry.num_samples).items()}
        return to_payload(entry.shape, entry.max_episode_length, entry.model_weights_id, rows)


def shutdown(writer: TrajectoryWriter | None, table: list[Table]) -> None:
    """At close (or exit, or garbage collection): stop the writer after its queued work; free the rows."""
    if writer is not None:
        writer.close(wait=True)
    table[0].rows.close()
