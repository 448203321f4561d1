"""The per-step write of a one-env CPU compact storage (:mod:`~objectrl_buffer.storage.compact`).

Two entry points share one check and one store: :meth:`StepWriter.write_row`, the engine's ``add`` fast
path (``storage.fast``), and :meth:`StepWriter.write_checked`, a row that went through ``Schema.check``.

Why raw pointers: an Atari row is ``uint8[4,84,84]`` ``state`` and ``next_state`` (28 KB each); the plain
buffer copies both in ~2 us, and the rest of its ``add`` is fixed Python cost. The compact write must
compare 49 KB (``state`` against the previous row's ``next_state``, ``next_state[:-1]`` against
``state[1:]``) and copy one 7 KB frame. ``tobytes()`` pairs copy before they compare (2x the bytes) and
NumPy's ``==`` allocates a bool array; ``memcmp`` on the values' memory (``Tensor.data_ptr``, ~0.1 us)
compares in place at ~0.4 us per call plus memory speed. The constants each row needs (offsets, frame
sizes, NumPy views of the links, the table's compiled row writer) are bound once per schema.

Every overlap is verified on every write, before anything is stored. A mismatch on the fast path declines
(nothing written) and the engine's checked path raises the precise ``SchemaError`` (or, where the row
ended an episode and the mismatch is allowed, stores it).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Container, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from objectrl_buffer.core.schema import Key, Schema, format_key
from objectrl_buffer.errors import SchemaError
from objectrl_buffer.storage.frame_stream import SUCCESSOR, FrameStream
from objectrl_buffer.storage.row_writer import RowWriter, compile_row_writer

if TYPE_CHECKING:
    from objectrl_buffer.storage.compact import CompactStorage
    from objectrl_buffer.storage.fast_write import FastWriter

__all__ = ["PREVIOUS_ROW", "SAME_ROW", "StepWriter", "differ", "nonzero", "overlap_error"]

#: Where the value a claimed overlap compares with lies: the env's previous row, or (a next stack's older
#: frames against its own stack) the same row.
PREVIOUS_ROW = "the env's previous row, which did not end an episode"
SAME_ROW = "the same row, which does not end an episode"

_Tensor = torch.Tensor
_ndarray = np.ndarray
_memmove = ctypes.memmove
_addressof, _byte = ctypes.addressof, ctypes.c_char


def _load_memcmp() -> Callable[[int, int, int], int]:
    """C's ``memcmp`` (non-zero: the bytes differ); a copying stand-in where no C library is found."""
    try:
        memcmp = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):  # no process-wide symbols (Windows)
        return lambda a, b, n: ctypes.string_at(a, n) != ctypes.string_at(b, n)
    memcmp.restype = ctypes.c_int
    memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    return memcmp


#: ``differ(a, b, n)``: whether the ``n`` bytes at addresses ``a`` and ``b`` differ (truthy) or not (0).
differ: Callable[[int, int, int], int] = _load_memcmp()


def overlap_error(key: Key, ours: str, theirs: str, *, row: int, env: int, where: str = PREVIOUS_ROW) -> SchemaError:
    """The error of a write whose ``ours`` (of ``key``, in ``row`` of the write, env ``env``) differ from
    ``theirs`` of ``where`` (:data:`PREVIOUS_ROW` or :data:`SAME_ROW`)."""
    return SchemaError(
        f"key '{format_key(key)}': {ours} row {row} of this write (env {env}) differ from {theirs} {where}; "
        "next_of/frame_stack promise they are equal. Nothing was stored"
    )


def nonzero(value: Any) -> bool:
    """Whether a row's value of an episode-end key (a tensor, array or number) ends the episode."""
    if isinstance(value, torch.Tensor):
        return bool(value) if value.numel() == 1 else bool(value.any())
    return bool(np.any(value))


class _Stream:
    """What the step path needs of one :class:`FrameStream`, bound once."""

    __slots__ = (
        "anchor", "base", "carry_id", "carry_step", "conj", "distance", "dtype", "frame", "k", "key", "next",
        "next_link", "np_dtype", "pool", "shape", "span", "stacked", "stream", "value",
    )  # fmt: skip

    def __init__(self, s: FrameStream) -> None:
        self.stream = s
        self.key, self.next, self.k, self.span, self.stacked, self.pool = s.key, s.next, s.k, s.span, s.stacked, s.pool
        self.dtype = s.field.dtype
        self.np_dtype = s.np_flat.dtype
        self.shape = tuple(s.field.shape)
        self.conj = s.field.dtype.is_complex  # a conjugate-bit view's memory is not its value
        self.frame = s.np_flat.shape[1] * s.np_flat.itemsize  # bytes of one frame
        self.value = self.frame * (s.k if s.stacked else 1)  # bytes of one row's value
        self.base = s.np_flat.ctypes.data  # the frames ring, rows of `frame` bytes
        np_ = s.np
        self.anchor, self.distance, self.next_link = np_["anchor"], np_["distance"], np_["next_link"]
        self.carry_id, self.carry_step = np_["carry_id"], np_["carry_step"]

    def pointer(self, value: Any) -> int:
        """The address of ``value``'s bytes if it is a C-contiguous CPU value of the stored dtype and shape
        (a tensor, or an array of the twin dtype), else 0."""
        if type(value) is _Tensor:
            if (
                value.dtype is not self.dtype
                or value.shape != self.shape
                or not value.is_cpu
                or not value.is_contiguous()
                or (self.conj and (value.is_conj() or value.is_neg()))
            ):
                return 0
            return value.data_ptr()
        if type(value) is _ndarray and value.dtype == self.np_dtype and value.shape == self.shape:
            flags = value.flags
            if not flags.c_contiguous:
                return 0
            if flags.writeable and self.value:  # 3x cheaper than .ctypes (a read-only buffer cannot give it)
                return _addressof(_byte.from_buffer(value))  # type: ignore[arg-type]  # ndarray is a buffer
            return value.ctypes.data
        return 0

    def head(self, step: int) -> tuple[int, int, int, Any]:
        """``(anchor, distance, address, keep)`` of the env's newest row's episode at env step ``step``: its
        start's pool id (-1: more than ``k - 2`` steps back) and distance, and where its stored value at
        ``step`` (the newest row's next value) lies; ``keep``: a copy to hold while that address is read."""
        k, span = self.k, self.span
        distance = step - int(self.carry_step[0])
        anchor = int(self.carry_id[0]) if distance <= k - 2 else -1
        low = (step - k + 1) % span
        if anchor < 0 and low + k <= span:  # the frames lie in one piece
            return anchor, distance, self.base + low * self.frame, None
        copy = self.stream.stack_np(np.array([step]), np.zeros(1, np.int64), np.array([anchor]), np.array([distance]))
        return anchor, distance, copy.ctypes.data, copy


class StepWriter:
    """The engine's per-step fast path (``storage.fast``) and the checked single row of a one-env CPU
    compact storage (see the module docs).

    :meth:`write_row` takes a plain ``dict`` whose observed and next values are C-contiguous CPU tensors or
    arrays of exactly the stored dtype and shape (read in place: no copy), checks the overlaps, writes the
    other keys with the table's compiled row writer (which checks and converts them, or declines before
    writing), then stores the frames. Anything else declines (``False``, nothing written) and the engine
    takes the checked path.
    """

    def __init__(self, storage: CompactStorage, schema: Schema) -> None:
        self.storage = storage
        self.streams = tuple(_Stream(s) for s in storage.streams.values())
        self.n_compact = sum(1 for f in schema.fields if f.key in storage.virtual)
        self._table_fast: FastWriter | None = None  # what _write_table and _ends were bound to
        self._write_table: RowWriter | None = None
        self._ends: tuple[tuple[np.ndarray, bool], ...] = ()

    def _bind(self) -> bool:
        """(Re)bind the table's row writer and its episode-end columns; ``False``: the table has none."""
        table = self.storage.table
        fast = None if table is None else table.fast
        if table is None or fast is None or table.arrays is None:
            return False
        self._table_fast = fast
        self._write_table = compile_row_writer(fast, extra_keys=self.n_compact)
        ends = []
        for key in self.storage.end_keys:
            array = table.arrays.get(key)
            if array is not None:
                flat = array.reshape(array.shape[0], -1)
                single = flat.shape[1] == 1 and np.may_share_memory(flat, array)  # a view, not a copy
                ends.append((flat[:, 0] if single else array, single))
        self._ends = tuple(ends)
        return True

    # ------------------------------------------------------------------ the engine's fast path
    def write_row(self, data: Any, slot: int, cast_ok: Container[Key]) -> bool:
        """Write one plain row to ``slot`` if it fits the rules above and every overlap holds; ``False``:
        nothing written."""
        storage = self.storage
        step = storage.steps
        table = storage.table
        if type(data) is not dict or not step or table is None:
            return False
        if slot >= table.reserved:
            table.reserve_rows(slot + 1)
        if (table.fast is not self._table_fast or self._write_table is None) and not self._bind():
            return False
        linked = not storage.last_ended_np[0]
        found = []
        for s in self.streams:
            x = s.pointer(data.get(s.key))
            if not x:
                return False
            nx = 0
            if s.next is not None:
                nx = s.pointer(data.get(s.next))
                if not nx:
                    return False
            head = s.head(step) if linked else None
            if self._mismatch(s, x, nx, head, False) is not None:
                return False  # the checked path raises the precise error, or stores an allowed episode end
            found.append((s, x, nx, head))
        write_table = self._write_table
        assert write_table is not None
        if not write_table(data, slot, cast_ok):
            return False
        ended = False
        for view, single in self._ends:
            if view[slot] if single else view[slot].any():
                ended = True
                break
        self._store(slot, step, found, ended, data)
        return True

    def write_batch(self, data: Any, ring: Any) -> int:
        """Batches take the checked path (:meth:`CompactStorage.write_rows` checks them as a whole): ``-1``."""
        return -1

    # ------------------------------------------------------------------ the checked path
    def write_checked(self, slot: int, values: Mapping[Key, np.ndarray]) -> None:
        """Write one row that ``Schema.check`` accepted (each key's value of its stored dtype and shape).

        Raises:
            SchemaError: naming the key, a claimed overlap does not hold (nothing is stored).
        """
        storage = self.storage
        step = storage.steps
        assert step > 0
        ended = any(nonzero(values[key]) for key in storage.end_keys if key in values)
        linked = not storage.last_ended_np[0]
        held = {key: np.ascontiguousarray(value) for key, value in values.items() if key in storage.virtual}
        found = []
        for s in self.streams:
            x = held[s.key].ctypes.data
            nx = 0 if s.next is None else held[s.next].ctypes.data
            head = s.head(step) if linked else None
            bad = self._mismatch(s, x, nx, head, ended)
            if bad is not None:
                key, ours, theirs, where = bad
                raise overlap_error(key, ours, theirs, row=0, env=0, where=where)
            found.append((s, x, nx, head))
        table = storage.table
        assert table is not None and table.schema is not None
        if table.arrays is None:
            table.write(slot, [(f, torch.from_numpy(np.ascontiguousarray(values[f.key]))) for f in table.schema.fields])
        else:
            if slot >= table.reserved:
                table.reserve_rows(slot + 1)
            for key, array in table.arrays.items():
                array[slot] = values[key]
        self._store(slot, step, found, ended, held)

    # ------------------------------------------------------------------ shared
    @staticmethod
    def _mismatch(
        s: _Stream, x: int, nx: int, head: tuple[int, int, int, Any] | None, ended: bool
    ) -> tuple[Key, str, str, str] | None:
        """``(key, ours, theirs, where)`` of the first overlap of one stream's row that does not hold, else ``None``.
        ``x``, ``nx``: addresses of the observed and next values; ``head``: :meth:`_Stream.head` when the
        previous row did not end an episode (else ``None``)."""
        if head is not None:  # the previous row's next value (or stack) is stored: compare with it
            if nx:
                if differ(x, head[2], s.value):
                    assert s.next is not None
                    return s.key, f"'{format_key(s.key)}' of", f"'{format_key(s.next)}' of", PREVIOUS_ROW
            elif s.stacked and s.k > 1 and differ(x, head[2], s.value - s.frame):
                return s.key, "frames 0..k-2 of", "1..k-1 of", PREVIOUS_ROW
        if nx and s.stacked and s.k > 1 and not ended and differ(nx, x + s.frame, s.value - s.frame):
            assert s.next is not None
            return s.next, "frames 0..k-2 of", f"frames 1..k-1 of '{format_key(s.key)}' in", SAME_ROW
        return None

    def _store(
        self,
        slot: int,
        step: int,
        found: list[tuple[_Stream, int, int, tuple[int, int, int, Any] | None]],
        ended: bool,
        values: Mapping[Key, Any],
    ) -> None:
        """Store the frames and links of one checked row (the table's keys are written); cannot fail."""
        storage = self.storage
        seen = storage.changes_seen + 1
        storage.changes[0] = seen  # before and after the write: a fork child's read meanwhile sees a change
        oldest = step + 1 - storage.capacity
        for s, x, nx, head in found:
            pool = s.pool
            if pool.expiry and pool.expiry[0] < oldest:
                pool.expire(oldest)
            frame, last = s.frame, s.value - s.frame  # bytes of a frame; offset of the newest one in a value
            if head is None or not nx:  # else the newest frame was stored with the previous row, and matched
                _memmove(s.base + (step % s.span) * frame, x + last, frame)
            if s.stacked and s.k > 1:
                if head is not None:
                    anchor, distance = head[0], head[1]
                else:  # an episode start: its whole stack goes to the pool
                    anchor = int(pool.push(_row(values[s.key]), torch.tensor([step + s.k - 2]))[0])
                    distance = 0
                    s.carry_id[0], s.carry_step[0] = anchor, step
                s.anchor[slot], s.distance[slot] = anchor, distance
            if nx:
                if ended:
                    assert s.next is not None
                    s.next_link[slot] = int(pool.push(_row(values[s.next]), torch.tensor([step]))[0])
                else:
                    s.next_link[slot] = SUCCESSOR
                    _memmove(s.base + ((step + 1) % s.span) * frame, nx + last, frame)
        storage.step_np[slot] = step
        storage.last_ended_np[0] = ended
        storage.steps = step + 1
        storage.changes[0] = storage.changes_seen = seen + 1


def _row(value: Any) -> torch.Tensor:
    """``value`` (a tensor or array) as a one-row tensor for :meth:`FramePool.push` (which copies it)."""
    if isinstance(value, torch.Tensor):
        return value.detach().unsqueeze(0)
    return torch.from_numpy(np.array(value)).unsqueeze(0)
