"""AReaL's buffer names and call shapes over :mod:`objectrl_buffer.async_buffer` (``realhf/system/buffer.py``).

AReaL code that did ``from realhf.system.buffer import AsyncIOSequenceBuffer`` and
``from realhf.api.core.data_api import SequenceSample`` imports them from here instead and runs unchanged:
``put_batch`` of one-id :class:`SequenceSample` s (metadata only, ``data=None``, as AReaL's master puts, or
with data), ``amend_batch`` by slot, ``get_batch_for_rpc`` returning ``(indices, SequenceSample)``,
``BufferFull``, and the same sample ids put again every epoch. Everything is translated to the native buffer
(str ids, :class:`~objectrl_buffer.async_buffer.Sequences` for several sequences per key); nothing is
tracked here. ``on_free`` tells the caller which ids were freed (AReaL's master cleans its tables with it).

Not carried: ``SequenceSample.metadata`` (the buffer holds tensors and lengths; a sample's metadata is
dropped at put and comes back empty).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from objectrl_buffer.async_buffer import AsyncSequenceBuffer, Sequences
from objectrl_buffer.async_buffer.sequences import SEQLENS
from objectrl_buffer.errors import BufferFull, InvalidArgumentError

__all__ = ["AsyncIOSequenceBuffer", "BufferFull", "SequenceSample"]


@dataclass
class SequenceSample:
    """AReaL's packed batch: ``ids[i]`` holds, per key, ``len(seqlens[key][i])`` sequences packed in ``data[key]``.

    ``data`` is ``None`` (or maps a key to ``None``) for metadata only. ``trailing_shapes`` / ``dtypes`` are
    derived from ``data`` when not given.
    """

    keys: set[str]
    ids: list[Hashable]
    seqlens: dict[str, list[list[int]]]
    trailing_shapes: dict[str, tuple[int, ...] | None] = field(default_factory=dict)
    dtypes: dict[str, torch.dtype | None] = field(default_factory=dict)
    data: dict[str, torch.Tensor | None] | None = None
    metadata: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.keys = set(self.keys)
        if set(self.seqlens) != self.keys:
            raise InvalidArgumentError(
                f"SequenceSample: seqlens keys {sorted(self.seqlens)} differ from keys {sorted(self.keys)}"
            )
        for key in self.keys:
            value = (self.data or {}).get(key)
            self.trailing_shapes.setdefault(key, tuple(value.shape[1:]) if value is not None else None)
            self.dtypes.setdefault(key, value.dtype if value is not None else None)

    @property
    def bs(self) -> int:
        return len(self.ids)

    @classmethod
    def from_default(
        cls,
        ids: list[Hashable],
        seqlens: list[int],
        data: dict[str, torch.Tensor | None] | None = None,
        metadata: dict[str, list[Any]] | None = None,
    ) -> SequenceSample:
        """One sequence per id, every key of ``data`` with the same ``seqlens``."""
        keys = set(data or {})
        return cls(keys, list(ids), {k: [[n] for n in seqlens] for k in keys}, data=data, metadata=metadata or {})

    def update_(self, other: SequenceSample) -> None:
        """Merge ``other``'s keys (same ids) into this sample."""
        if other.ids != self.ids:
            raise InvalidArgumentError(f"SequenceSample.update_: ids {other.ids} differ from {self.ids}")
        self.keys |= other.keys
        self.seqlens.update(other.seqlens)
        self.trailing_shapes.update(other.trailing_shapes)
        self.dtypes.update(other.dtypes)
        if other.data is not None:
            self.data = {**(self.data or {}), **other.data}

    def unpack(self) -> list[SequenceSample]:
        """One sample per id."""
        out = []
        for i, sample_id in enumerate(self.ids):
            data = None
            if self.data is not None:
                data = {}
                for key, value in self.data.items():
                    starts = [sum(sum(x) for x in self.seqlens[key][:j]) for j in (i, i + 1)]
                    data[key] = None if value is None else value[starts[0] : starts[1]]
            seqlens = {k: [list(v[i])] for k, v in self.seqlens.items()}
            out.append(
                SequenceSample(
                    set(self.keys), [sample_id], seqlens, dict(self.trailing_shapes), dict(self.dtypes), data
                )
            )
        return out

    @staticmethod
    def gather(samples: Sequence[SequenceSample], keys: Sequence[str] | None = None) -> SequenceSample:
        """Concatenate ``samples`` (their ``keys``, default all) into one."""
        chosen = set(keys) if keys is not None else set().union(*(s.keys for s in samples))
        ids = [i for s in samples for i in s.ids]
        seqlens = {k: [x for s in samples for x in s.seqlens[k]] for k in chosen}
        data: dict[str, torch.Tensor | None] | None = None
        if all(s.data is not None for s in samples):
            data = {}
            for k in chosen:
                parts = [s.data[k] for s in samples]  # type: ignore[index]
                data[k] = None if any(p is None for p in parts) else torch.cat(parts)  # type: ignore[arg-type]
        return SequenceSample(chosen, ids, seqlens, data=data)


def _native(sample: SequenceSample, where: str) -> dict[str, Any]:
    if not isinstance(sample, SequenceSample) or sample.bs != 1:
        raise InvalidArgumentError(f"{where} must be a SequenceSample of one id (use .unpack()), got {sample!r}")
    out: dict[str, Any] = {"ids": sample.ids[0]}
    for key in sample.keys:
        value = (sample.data or {}).get(key)
        out[key] = Sequences(sample.seqlens[key][0], value)
    return out


def _rows(value: torch.Tensor) -> list[list[int]]:
    """Per entry, the list of ints of an int64 ``[n, k]`` or jagged ``[n, j]`` tensor."""
    return [t.tolist() for t in value.unbind()]


def _from_batch(batch: TensorDict, keys: Sequence[str]) -> SequenceSample:
    raw_ids = batch.get("ids")
    ids = raw_ids.tolist() if isinstance(raw_ids, torch.Tensor) else list(raw_ids.tolist())
    lengths = batch.get(SEQLENS) if SEQLENS in batch.keys() else None  # noqa: SIM118
    seqlens: dict[str, list[list[int]]] = {}
    data: dict[str, torch.Tensor | None] = {}
    for key in keys:
        if key == "ids":
            continue
        seqlens[key] = _rows(lengths.get(key))  # type: ignore[union-attr]
        if key in batch.keys():  # noqa: SIM118
            value = batch.get(key)
            data[key] = value.values() if value.is_nested else value.reshape(-1, *value.shape[2:])
        else:
            data[key] = None
    has_data = any(v is not None for v in data.values())
    return SequenceSample(set(seqlens), ids, seqlens, data=data if has_data else None)


class AsyncIOSequenceBuffer:
    """AReaL's ``AsyncIOSequenceBuffer(rpcs, max_size)`` over
    :class:`~objectrl_buffer.async_buffer.AsyncSequenceBuffer`.

    ``rpcs``: AReaL's ``MFCDef`` s (``name``, ``input_keys``, ``n_seqs``). ``on_free`` (ours): called with the
    ids of the entries a read freed. ``native`` is the buffer underneath.
    """

    def __init__(
        self, rpcs: Sequence[Any], max_size: int, on_free: Callable[[list[Hashable]], object] | None = None
    ) -> None:
        self._rpcs = list(rpcs)
        self.native = AsyncSequenceBuffer(self._rpcs, max_size, on_free=on_free)

    @property
    def size(self) -> int:
        return self.native.size

    @property
    def max_size(self) -> int:
        return self.native.max_size

    @property
    def n_rpcs(self) -> int:
        return self.native.n_consumers

    async def put_batch(self, samples: list[SequenceSample], birth_times: Any = None) -> np.ndarray:
        """Store one-id samples; return their slots (int64). Raises ``BufferFull`` (nothing stored)."""
        native = [_native(s, f"samples[{i}]") for i, s in enumerate(samples)]
        return (await self.native.put_batch(native, birth_times)).numpy()

    def put_batch_synced(self, samples: list[SequenceSample]) -> np.ndarray:
        native = [_native(s, f"samples[{i}]") for i, s in enumerate(samples)]
        return self.native.put_batch_nowait(native).numpy()

    async def amend_batch(self, indices: Any, samples: list[SequenceSample]) -> None:
        native = [_native(s, f"samples[{i}]") for i, s in enumerate(samples)]
        await self.native.amend_batch(torch.as_tensor(np.asarray(indices, dtype=np.int64)), native)

    async def get_batch_for_rpc(self, rpc: Any) -> tuple[np.ndarray, SequenceSample]:
        """The ``rpc.n_seqs`` oldest entries ready for ``rpc``: their slots and a sample of its ``input_keys``."""
        slots, batch = await self.native.get_batch(rpc)
        return slots.numpy(), _from_batch(batch, tuple(rpc.input_keys))
