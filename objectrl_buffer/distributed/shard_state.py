"""A shard's own state in its checkpoints: the extra state ``"remote_shard"`` (see :mod:`.shard`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from objectrl_buffer.checkpoint.extras import Arrays, Values
from objectrl_buffer.checkpoint.manifest import ExtraValue
from objectrl_buffer.errors import CheckpointError

__all__ = ["ShardState"]


class ShardState:
    """The extra state ``"remote_shard"``: slot generations (array ``[capacity]`` int64), rows ever written,
    the last ``seq`` applied per writer (a JSON object in one string value), and the restarts' accounts:
    ``lost`` (rows acknowledged and dropped by restarts, not stored again since), ``pending`` (the writes
    among them a writer may still send again: ``{writer: {seq: rows}}``, a JSON string) and ``epoch`` (the
    lifetime of the shard that saved it, see :mod:`.cut`), and ``sampled`` (admitted samples this shard was
    told to count, see :meth:`.shard.Shard.sample`). A checkpoint without the last four (an older version's) reads as
    none lost, epoch 0, none sampled."""

    name = "remote_shard"

    def __init__(self, capacity: int) -> None:
        self.generation = np.full(capacity, -1, dtype=np.int64)
        self.written = 0
        self.seqs: dict[str, int] = {}
        self.lost = 0
        self.pending: dict[str, dict[int, int]] = {}
        self.epoch = 0
        self.sampled = 0

    def state(self) -> tuple[Arrays, dict[str, ExtraValue]]:
        pending = {w: [[seq, rows] for seq, rows in p.items()] for w, p in self.pending.items()}
        return {"generation": torch.from_numpy(self.generation.copy())}, {
            "written": self.written,
            "writers": json.dumps(self.seqs),
            "lost": self.lost,
            "pending": json.dumps(pending),
            "epoch": self.epoch,
            "sampled": self.sampled,
        }

    @staticmethod
    def _pending(values: Values) -> dict[str, dict[int, int]]:
        """The ``pending`` value as ``{writer: {seq: rows}}``.

        Raises:
            ValueError: not of that form.
        """
        got = json.loads(str(values.get("pending", "{}")))
        if not isinstance(got, dict):
            raise ValueError("not an object")
        out = {}
        for writer, pairs in got.items():
            if not (isinstance(pairs, list) and all(_ints(pair, 2) for pair in pairs)):
                raise ValueError(f"writer {writer!r}")
            out[writer] = {int(seq): int(rows) for seq, rows in pairs}
        return out

    def check(self, arrays: Arrays, values: Values, rows: int, source: str) -> None:
        gen = arrays.get("generation")
        if gen is None or tuple(gen.shape) != self.generation.shape or not isinstance(values.get("written"), int):
            raise CheckpointError(f"'{source}': no remote_shard state of a shard of {len(self.generation)} slots")
        try:
            seqs = json.loads(str(values["writers"]))
        except (KeyError, ValueError):
            raise CheckpointError(f"'{source}': bad remote_shard writers") from None
        if not (isinstance(seqs, dict) and all(isinstance(v, int) for v in seqs.values())):
            raise CheckpointError(f"'{source}': bad remote_shard writers")
        for key in ("lost", "epoch", "sampled"):
            value = values.get(key, 0)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                raise CheckpointError(f"'{source}': bad remote_shard {key}")
        try:
            self._pending(values)
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"'{source}': bad remote_shard pending ({exc})") from None

    def restore(self, arrays: Arrays, values: Values) -> None:
        self.generation = arrays["generation"].numpy().astype(np.int64, copy=True)
        self.written = int(values["written"])
        self.seqs = dict(json.loads(str(values["writers"])))
        self.lost = int(values.get("lost", 0))
        self.pending = self._pending(values)
        self.epoch = int(values.get("epoch", 0))
        self.sampled = int(values.get("sampled", 0))


def _ints(value: Any, n: int) -> bool:
    """``value`` is a list of ``n`` ints (JSON)."""
    return isinstance(value, list) and len(value) == n and all(type(v) is int for v in value)
