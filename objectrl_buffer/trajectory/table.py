"""The stored trajectories of a :class:`~objectrl_buffer.trajectory.buffer.TrajectoryReplayBuffer`.

A :class:`Table` keeps the index entries and first row addresses of the trajectories, oldest first, over one
:class:`~objectrl_buffer.trajectory.rows.RowStore`, and evicts whole oldest trajectories when full: when the
rows reach ``capacity`` (transitions), or the trajectories reach ``keep``.

A trajectory may lack stored keys (RLinf's ``extract_intervene_traj()`` drops ``versions``): :func:`complete`
fills their rows with :data:`FILL_VALUE` (zeros, ``False``), never left uninitialised, and the table records
which keys each trajectory lacked, so samples carry a presence mask and files and read-backs leave them out.
"""

from __future__ import annotations

from typing import Any

import torch

from objectrl_buffer.core.keys import PRESENT_KEY
from objectrl_buffer.core.schema import Key, Schema, format_key
from objectrl_buffer.errors import InvalidArgumentError, SchemaError
from objectrl_buffer.trajectory.files import Entry
from objectrl_buffer.trajectory.rows import CHUNK_BYTES, Pairs, RowStore
from objectrl_buffer.trajectory.trajectory import OPTIONAL_FIELDS, to_payload
from objectrl_buffer.trajectory.writer import TrajectoryWriter

__all__ = ["Table", "shutdown", "complete", "FILL_VALUE"]

#: What the rows of a key a trajectory lacks hold: zeros of the column's dtype (``False`` for bool).
FILL_VALUE = 0
_NONE: frozenset[Key] = frozenset()
_OPTIONAL: frozenset[Key] = frozenset(OPTIONAL_FIELDS)


def complete(
    rows: dict[Key, torch.Tensor], schema: Schema | None, where: str
) -> tuple[dict[Key, torch.Tensor], frozenset[Key]]:
    """``rows`` with every stored key of ``schema`` it lacks added as :data:`FILL_VALUE` rows, and those keys,
    when each is one of RLinf's tensor fields (:data:`~objectrl_buffer.trajectory.trajectory.OPTIONAL_FIELDS`,
    such as ``versions``); ``rows`` unchanged otherwise (a missing key of a dict field such as
    ``curr_obs.state``, or an extra key, is left for the schema check to refuse). A key the presence mask
    would be stored under (:data:`~objectrl_buffer.core.keys.PRESENT_KEY`) cannot be both: :class:`SchemaError`.
    """
    if schema is None or not rows:
        return rows, _NONE
    missing = frozenset(f.key for f in schema.fields if f.key not in rows)
    if not missing or not missing <= _OPTIONAL:  # a key of a dict field (an observation...): the check refuses
        return rows, _NONE
    clash = [f.key for f in schema.fields if (f.key if isinstance(f.key, str) else f.key[0]) == PRESENT_KEY]
    if clash:
        raise SchemaError(
            f"{where} lacks key(s) {sorted(format_key(k) for k in missing)}, whose presence mask samples carry "
            f"under '{PRESENT_KEY}', but the stored key '{format_key(clash[0])}' is named so: rename it"
        )
    sample = next(iter(rows.values()))
    n = sample.shape[0]
    filled = dict(rows)
    for f in schema.fields:
        if f.key in missing:
            filled[f.key] = torch.full((n, *f.shape), FILL_VALUE, dtype=f.dtype, device=sample.device)
    return filled, missing


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
        self.missing: list[frozenset[Key]] = []  # per trajectory: the stored keys it lacked (see complete)
        self.total = 0

    def append(
        self, schema: Schema, pairs: Pairs, n: int, entry: Entry, missing: frozenset[Key] = _NONE
    ) -> tuple[int, list[Entry]]:
        """Store one trajectory's rows, evicting whole oldest ones first until it fits (``capacity``) and one
        more is allowed (``keep``); return (first row, evicted). ``missing``: the keys it lacked (filled)."""
        evicted: list[Entry] = []
        rows = self.rows
        keep = self.keep
        if keep is not None and rows.chunk_rows is None and rows.capacity is None:  # the first trajectory
            wanted = max(keep * n // 8, n, 64)
            rows.chunk_rows = max(1, min(CHUNK_BYTES // max(schema.row_bytes, 1), wanted))
        while rows.free < n or (keep is not None and len(self.entries) >= keep):
            old = self.entries.pop(0)
            self.firsts.pop(0)
            self.missing.pop(0)
            rows.drop_oldest(old.num_samples)
            self.total -= old.num_samples
            evicted.append(old)
        first = rows.append(schema, pairs, n)
        self.entries.append(entry)
        self.firsts.append(first)
        self.missing.append(missing)
        self.total += n
        return first, evicted

    def position(self, trajectory_id: int) -> int:
        """Where the trajectory ``trajectory_id`` is in :attr:`entries`, or :class:`InvalidArgumentError`."""
        if isinstance(trajectory_id, bool) or not isinstance(trajectory_id, int):
            raise InvalidArgumentError(f"trajectory_id must be an int, got {trajectory_id!r}")
        for i, entry in enumerate(self.entries):
            if entry.trajectory_id == trajectory_id:
                return i
        raise InvalidArgumentError(
            f"trajectory_id={trajectory_id} is not stored ({len(self.entries)} are: see trajectory_ids)"
        )

    def info(self, i: int) -> dict[str, Any]:
        """RLinf's index entry of the ``i``-th trajectory, plus ``missing``: the keys it lacked (dotted names)."""
        info = {k: v for k, v in self.entries[i].info().items() if k not in ("bytes", "crc32")}
        info["missing"] = sorted(format_key(k) for k in self.missing[i])
        return info

    def read(self, i: int) -> dict[Key, torch.Tensor]:
        """Copies of the ``i``-th stored trajectory's rows ``[T*B, ...]`` (storing device), less the keys it lacked."""
        entry = self.entries[i]
        rows = self.rows.read(self.firsts[i], entry.num_samples)
        missing = self.missing[i]
        return {k: v for k, v in rows.items() if k not in missing} if missing else rows

    def payload(self, i: int) -> dict[str, Any]:
        """The file payload of the ``i``-th stored trajectory, from storage (CPU tensors); a key it lacked is
        left out, as RLinf writes only the fields a trajectory has.

        Copies, never views: ``torch.save`` writes a view's whole storage (a 256 MB chunk per file), and a
        ring may rewrite the rows before the writer thread gets to them."""
        entry = self.entries[i]
        rows = {k: v.cpu() for k, v in self.read(i).items()}
        return to_payload(entry.shape, entry.max_episode_length, entry.model_weights_id, rows, entry.heads)


def shutdown(writer: TrajectoryWriter | None, table: list[Table]) -> None:
    """At close (or exit, or garbage collection): stop the writer after its queued work; free the rows."""
    if writer is not None:
        writer.close(wait=True)
    table[0].rows.close()
