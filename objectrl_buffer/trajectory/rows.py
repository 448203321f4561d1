"""Where trajectory rows live: the library's storage, addressed by a global row number that only grows.

Every row ever written gets an address ``0, 1, 2, ...``; a trajectory is the contiguous addresses
``first .. first + n - 1``.

* With a ``capacity`` (rows): one :class:`~objectrl_buffer.storage.table.TransitionStorage` of that many
  slots and a :class:`~objectrl_buffer.core.ring.Ring` over it; address ``a`` sits in slot ``a % capacity``.
  The caller evicts whole oldest trajectories (:meth:`RowStore.drop_oldest`) until a new one fits.
* Chunked (``capacity=None``): storages of ``chunk_rows`` slots each, appended as rows arrive; address ``a``
  sits in chunk ``a // chunk_rows`` at slot ``a % chunk_rows``. A trajectory may straddle two chunks.
  Unbounded unless the caller drops oldest rows (a buffer that keeps only its sampling window does): a
  chunk whose rows are all dropped is kept as the spare and becomes the next chunk, so its pages, already
  allocated and mapped, are written again instead of fresh ones (filling a fresh RAM page costs 2-3x a
  store into one in use; rlinf's fixed-size cache reuses its pages the same way).

CPU storage is memory-mapped (RAM-backed by default, see :mod:`~objectrl_buffer.storage.placement`), or
process memory for a store kept bounded (``in_memory``); sampling reads the storage only, never a file some
writer thread may still be producing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from objectrl_buffer.core.ring import Ring
from objectrl_buffer.core.schema import Field, Key, Schema
from objectrl_buffer.errors import ClosedBufferError
from objectrl_buffer.storage.table import TransitionStorage

__all__ = ["RowStore", "CHUNK_BYTES", "SCRATCH_BYTES"]

#: Target size of one chunk of an unbounded store (all columns together).
CHUNK_BYTES = 256 << 20
#: Largest scratch array (per key) a multi-chunk gather keeps between calls.
SCRATCH_BYTES = 32 << 20

Pairs = list[tuple[Field, Any]]


class RowStore:
    """Rows of one schema, written in order and read by address.

    Args:
        capacity: rows kept at most (ring), or ``None`` for unbounded (chunks).
        device: the storing device.
        chunk_rows: rows per chunk when unbounded (``None``: about :data:`CHUNK_BYTES` per chunk, >= 4096).
        in_memory: CPU chunks in process memory instead of RAM-backed files (see
            :class:`~objectrl_buffer.storage.table.TransitionStorage`), for a store its caller keeps bounded
            by dropping its oldest rows: its chunks are rewritten over and over.
    """

    def __init__(
        self, capacity: int | None, device: torch.device, chunk_rows: int | None = None, in_memory: bool = False
    ) -> None:
        self.capacity = capacity
        self.device = device
        self.in_memory = in_memory
        self.ring = Ring(capacity) if capacity is not None else None
        self.chunk_rows = capacity if capacity is not None else chunk_rows
        self.schema: Schema | None = None
        self.chunks: list[TransitionStorage] = []  # chunked: chunks[i] is chunk number base + i
        self.base = 0
        self.spare: TransitionStorage | None = None  # chunked: a chunk whose rows were all dropped
        self.next_row = 0  # address of the next row written
        self.oldest = 0  # address of the oldest row kept
        self.warned: set[Key] = set()
        self.scratch: dict[Key, np.ndarray] = {}  # per key, for _gather_cpu
        self.closed = False

    # ------------------------------------------------------------------ writing
    def prepare(self, rows: dict[Key, torch.Tensor], schema: Schema | None) -> tuple[Schema, Pairs, int]:
        """Check ``rows`` against ``schema`` (the stored one, or one inferred from an earlier trajectory of
        the same add) and convert them; nothing is written. Raises :class:`SchemaError`."""
        if schema is None:
            schema, values = Schema.infer(rows, 1)
            pairs: Pairs = [(f, values[f.key]) for f in schema.fields]
            n = next(iter(values.values())).shape[0]
            return schema, pairs, n
        pairs, n = schema.check(rows, 1, self.warned)
        return schema, pairs, n

    def _new_chunk(self, schema: Schema, pairs: Pairs) -> TransitionStorage:
        assert self.chunk_rows is not None
        spare, self.spare = self.spare, None
        if spare is not None:  # same schema and size: a store only ever holds one schema
            self.chunks.append(spare)
            return spare
        # write_fresh: a trajectory's rows are one large block per key, and a block written to fresh RAM-backed
        # slots goes through pwrite, which spares their pages' reservation and write faults
        # (TransitionStorage._write_fresh): every write of an unbounded chunk, a ring's first pass. A ring's
        # next passes map those slots (one populate per column) and store through the mapping.
        storage = TransitionStorage(self.chunk_rows, self.device, write_fresh=True, in_memory=self.in_memory)
        storage.initialize(schema, {f.key: torch.as_tensor(v)[0] for f, v in pairs})
        self.chunks.append(storage)
        return storage

    def append(self, schema: Schema, pairs: Pairs, n: int) -> int:
        """Write ``n`` rows after the newest; return the address of the first. A ring must have room
        (``ring.size + n <= capacity``: the caller evicted first)."""
        if self.closed:
            raise ClosedBufferError("this trajectory buffer was closed: its storage is freed")
        if self.schema is None:
            self.schema = schema
            if self.chunk_rows is None:
                self.chunk_rows = max(4096, CHUNK_BYTES // max(schema.row_bytes, 1))
        start = self.next_row
        ring = self.ring
        if ring is not None:
            assert ring.size + n <= ring.capacity
            storage = self.chunks[0] if self.chunks else self._new_chunk(schema, pairs)
            storage.write_rows(ring.pointer, pairs, 0, n)
            ring.advance(n)
        else:
            done = 0
            size = self.chunk_rows
            assert size is not None
            while done < n:
                index, offset = divmod(start + done, size)
                index -= self.base
                storage = self.chunks[index] if index < len(self.chunks) else self._new_chunk(schema, pairs)
                m = min(n - done, size - offset)
                storage.write_rows(offset, pairs, done, m)
                done += m
        self.next_row = start + n
        return start

    def drop_oldest(self, n: int) -> None:
        """Forget the ``n`` oldest rows: their slots are free for the next writes (a ring's), or (chunked)
        a chunk left with no row kept becomes the spare for the next new chunk (one is kept, others freed)."""
        assert n <= self.next_row - self.oldest
        self.oldest += n
        if self.ring is not None:
            self.ring.size -= n
            return
        size = self.chunk_rows
        assert size is not None
        while self.chunks and (self.base + 1) * size <= self.oldest:
            dead = self.chunks.pop(0)
            self.base += 1
            if self.spare is None:
                self.spare = dead
            else:
                dead.close()

    @property
    def free(self) -> int:
        """Rows a ring can take without evicting (unbounded: no limit)."""
        return self.ring.capacity - self.ring.size if self.ring is not None else 1 << 62

    # ------------------------------------------------------------------ reading
    def gather(self, addresses: torch.Tensor) -> dict[Key, torch.Tensor]:
        """New tensors ``[len(addresses), ...]`` of the rows at ``addresses`` (int64, CPU), on the storing device."""
        if self.closed:
            raise ClosedBufferError("this trajectory buffer was closed: its storage is freed")
        size = self.chunk_rows
        assert size is not None and self.chunks
        if len(self.chunks) == 1:
            return self.chunks[0].gather(addresses.remainder(size) if addresses.numel() else addresses)
        chunk = addresses.div(size, rounding_mode="floor")
        first, last = int(chunk.min()), int(chunk.max())
        if first == last:
            return self.chunks[first - self.base].gather(addresses - first * size)
        if all(storage.arrays is not None for storage in self.chunks[first - self.base : last + 1 - self.base]):
            return self._gather_cpu(addresses, chunk, first)
        out: dict[Key, torch.Tensor] = {}
        for index in torch.unique(chunk).tolist():
            positions = (chunk == index).nonzero().squeeze(1)
            part = self.chunks[index - self.base].gather(addresses[positions] - index * size)
            for key, value in part.items():
                target = out.get(key)
                if target is None:
                    target = out[key] = value.new_empty((addresses.numel(), *value.shape[1:]))
                target.index_copy_(0, positions, value)
        return out

    def _gather_cpu(self, addresses: torch.Tensor, chunk: torch.Tensor, first: int) -> dict[Key, torch.Tensor]:
        """:meth:`gather` over several CPU chunks, straight into the returned arrays (the only allocation).

        The addresses are visited grouped by chunk (a stable sort); each chunk's rows are taken with one
        ``ndarray.take`` into :meth:`_scratch` (kept between calls) and scattered
        at once to their places in the output. Why not a fresh scratch per call, taken back in order:
        two transient arrays the size of the output made glibc return and re-fault their pages on
        every call (~2,200 page faults, 4 ms per ``sample(256)`` of 12 KB rows, against 0.7 ms now).
        ``mode="clip"``: with the default ``"raise"``, NumPy buffers ``out`` (one more copy); the
        addresses are valid, so clipping never changes one.
        """
        size = self.chunk_rows
        assert size is not None
        order = torch.argsort(chunk, stable=True)
        by_chunk = chunk[order]
        local = (addresses[order] - by_chunk * size).numpy()
        places = order.numpy()
        counts = torch.bincount(by_chunk - first).tolist()
        segments = []
        start = 0
        for offset, count in enumerate(counts):
            if count:
                arrays = self.chunks[first + offset - self.base].arrays
                assert arrays is not None
                segments.append((arrays, start, start + count))
                start += count
        rows = addresses.numel()
        out: dict[Key, torch.Tensor] = {}
        for key, column in segments[0][0].items():
            result = np.empty((rows, *column.shape[1:]), dtype=column.dtype)
            scratch = self._scratch(key, column, max(counts))
            for arrays, lo, hi in segments:
                part = scratch[: hi - lo]
                np.take(arrays[key], local[lo:hi], axis=0, out=part, mode="clip")
                result[places[lo:hi]] = part
            out[key] = torch.from_numpy(result)
        return out

    def _scratch(self, key: Key, column: np.ndarray, rows: int) -> np.ndarray:
        """An array of ``rows`` rows shaped like ``column``'s, kept for the next call when it is at most
        :data:`SCRATCH_BYTES` (a huge one-off batch does not pin its size in memory). Callers serialize
        (the buffer's lock), as for every other method."""
        kept = self.scratch.get(key)
        if kept is not None and kept.shape[0] >= rows:
            return kept[:rows]
        fresh = np.empty((rows, *column.shape[1:]), dtype=column.dtype)
        if fresh.nbytes <= SCRATCH_BYTES:
            self.scratch[key] = fresh
        return fresh

    def read(self, first: int, n: int) -> dict[Key, torch.Tensor]:
        """Copies of the ``n`` rows from address ``first`` on (one trajectory), on the storing device: one
        slice copy per chunk (or per piece of a wrapped ring) straight into the returned tensors."""
        if self.closed:
            raise ClosedBufferError("this trajectory buffer was closed: its storage is freed")
        size = self.chunk_rows
        assert size is not None and self.chunks
        pieces = []  # (storage, first slot, last slot + 1, first row of the output)
        done = 0
        while done < n:
            index, slot = divmod(first + done, size)
            storage = self.chunks[0 if self.ring is not None else index - self.base]
            m = min(n - done, size - slot)
            pieces.append((storage, slot, slot + m, done))
            done += m
        if len(pieces) == 1:
            storage, lo, hi, _ = pieces[0]
            return storage.gather_range(lo, hi)
        out: dict[Key, torch.Tensor] = {}
        for key, column in pieces[0][0].columns.items():
            target = out[key] = column.new_empty((n, *column.shape[1:]))
            for storage, lo, hi, at in pieces:
                target[at : at + hi - lo] = storage.columns[key][lo:hi]
        return out

    def close(self) -> None:
        """Free every chunk (memory and files). Idempotent."""
        for storage in self.chunks:
            storage.close()
        if self.spare is not None:
            self.spare.close()
        self.chunks, self.spare = [], None
        self.scratch = {}
        self.closed = True
