"""A compact (``next_of``/``frame_stack``) buffer in shared memory: many writer processes, one frame a row.

:class:`SharedCompactBuffer` is a :class:`~objectrl_buffer.distributed.shared.SharedBuffer` whose observed
keys are kept as in :mod:`~objectrl_buffer.storage.compact`, on the shared ring's own machinery (slots by
atomic ticket, per-slot generations, writes in flight and taints). Every writing handle (a process, one per
env with ``num_envs > 1``) is its own env stream; the streams of several processes interleave on the ring,
so a row's predecessor is not at ``slot - 1``: each row records its predecessors' tickets.

Per row (ticket ``r``, physical slot ``r % P``), per observed key:

* ``frame``: the newest frame of the row's next value (with ``next_of``), or of its own value (without);
* ``start`` (only where written): the row's whole observed value, where it begins its episode or cannot
  borrow (below); ``end`` (only where written): its whole next value where it ends an episode with a next
  stack that does not shift its own (``next_state[:-1] != state[1:]``);
* links (shared by the keys): the tickets of its ``D`` stream predecessors (``D = k`` with ``next_of``,
  ``k - 1`` without), the ticket of the row whose ``start`` holds its older frames and its distance from it.

Frame ``i`` of a row's ``k``-stack, ``b`` steps back, is the row's own frame (``b = 0``), predecessor ``b``'s
frame, or frame ``i + distance`` of its anchor's ``start``; the next stack is ``state[1:]`` plus the own frame.

Readers copy a row and every row it borrows from, then keep it only if the row and each of those still hold
the tickets recorded (per-slot generations before and after, writes in flight, taints): a row whose
predecessor was rewritten, lapped or never finished is redrawn, never served mixed. To make that rare, the
ring has ``P = capacity + margin`` physical slots while only the newest ``capacity`` tickets are drawn, and a
writer whose oldest borrowed ticket is more than ``margin`` tickets back (a slow stream among fast ones)
stores the row's whole value in ``start`` instead: every row borrows only from slots that outlive it.

Memory: the ``start``/``end`` columns are files with one page-aligned entry per slot (entries of half a page
or more), written only where used and hole-punched (``fallocate(PUNCH_HOLE)``) when the slot is rewritten
without one, so the shared files hold about one frame a row plus ``2 k`` frames per episode (smaller
entries are not punched: their pages fill as episodes land on them).

Checks: each handle compares every row's overlap with its stream's previous row before reserving a slot
(``SchemaError`` naming the key, nothing stored). A handle forked or pickled into another process starts
new streams there (each process its own envs).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from objectrl_buffer.checkpoint.io import atomic_write, read_small_file
from objectrl_buffer.core.keys import INDEX_KEY
from objectrl_buffer.core.schema import Field, Key, Schema
from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.distributed.compact_links import (
    DIST,
    ENDS,
    TAG,
    Observed,
    Stream,
    check_overlaps,
    link_rows,
    plan_frames,
)
from objectrl_buffer.distributed.shared import _MAX_TRIES, SharedBuffer
from objectrl_buffer.errors import EmptyBufferError
from objectrl_buffer.storage.compact_step import nonzero
from objectrl_buffer.storage.fast_write import FastWriter
from objectrl_buffer.storage.table import make_tensordict

__all__ = ["SharedCompactBuffer", "Observed"]

_PAGE = 4096
_TAG = TAG
COMPACT_FILE = "compact.json"  # the claims, beside the shared ring's layout
_LINKS: Key = (_TAG, "links")  # int64 [3 + D]: anchor ticket, distance, end bits, predecessor tickets 1..D
#: Every live handle of this process: a fork child starts new streams.
_LIVE: weakref.WeakSet[SharedCompactBuffer] = weakref.WeakSet()


def _stride(nbytes: int) -> int:
    """Bytes a side entry takes per slot: page-aligned (punchable) from half a page on."""
    return -(-nbytes // _PAGE) * _PAGE if nbytes >= _PAGE // 2 else nbytes


_libc: Any = None


def _punch(fd: int, offset: int, length: int) -> None:
    """Free the pages of ``offset .. offset + length`` of file ``fd`` (a no-op where the system cannot)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    with contextlib.suppress(AttributeError):  # no fallocate: the pages stay
        _libc.fallocate(fd, 3, ctypes.c_int64(offset), ctypes.c_int64(length))  # PUNCH_HOLE | KEEP_SIZE


class SharedCompactBuffer(SharedBuffer):
    """A shared ring whose ``next_of``/``frame_stack`` keys are stored compactly (see the module docs).

    ``capacity`` rows are served (as a plain :class:`SharedBuffer` of that capacity serves them, bit for
    bit); ``"index"`` of a sample is the ticket modulo ``capacity``, the slot a plain shared buffer would use.
    """

    def __init__(self, folder: str, *, seed: int | None = None, owner: bool = False) -> None:
        super().__init__(folder, seed=seed, owner=owner)
        compact = json.loads(read_small_file(os.path.join(folder, COMPACT_FILE), 1 << 20))
        self.physical = self.capacity
        self.capacity = positive_int(compact["rows"], "rows")
        self.margin = self.physical - self.capacity
        self.num_envs = int(compact["num_envs"])
        self.stored = self.schema
        self.schema = Schema(
            [Field(_key(k), torch.Size(shape), getattr(torch, t)) for k, shape, t in compact["fields"]]
        )
        self.end_keys: tuple[Key, ...] = tuple(_key(k) for k in compact["end_keys"])
        nexts = {_key(o): _key(n) for n, o in compact["next_of"]}
        stacks = {_key(s): int(k) for s, k in compact["frame_stack"]}
        observed = [f for f in self.schema.fields if f.key in stacks or f.key in nexts]
        self.observed = [
            Observed(f, stacks.get(f.key, 1), f.key in stacks, nexts.get(f.key), i) for i, f in enumerate(observed)
        ]
        self.compact_keys = {o.field.key for o in self.observed} | {o.next for o in self.observed if o.next}
        self.depth = max(1, *(o.depth for o in self.observed))
        self.fast = None  # the ring's own per-step path does not know the compact keys: see _add_fast
        others = Schema([f for f in self.schema.fields if f.key not in self.compact_keys])
        self.plain_writer = FastWriter.build(others, {f.key: self.columns[f.key] for f in others.fields})
        try:
            self.fast_keys = {
                key: (f.dtype, tuple(f.shape), np.dtype(str(f.dtype).removeprefix("torch.")))
                for key in self.compact_keys
                for f in [self.schema.by_key[key]]
            }
        except TypeError:  # a dtype without a NumPy twin (bfloat16): the checked path only
            self.plain_writer = None
        self.chunk_rows, self.mapped_chunks = 0, bytearray()
        self.np = {key: col.numpy() if col.dtype != torch.bfloat16 else None for key, col in self.columns.items()}
        self.link_column = self._np(_LINKS)
        self.frame_columns = {o.index: self._np(o.column("frame")) for o in self.observed}
        self._fds: dict[Key, int] = {}
        for i, f in enumerate(self.stored.fields):
            if f.key[0] == _TAG and f.key[-1] in ("start", "end") and f.shape[0] % _PAGE == 0:
                self._fds[f.key] = os.open(os.path.join(folder, f"col{i}.bin"), os.O_RDWR | os.O_CLOEXEC)
        self.forget_streams()
        _LIVE.add(self)

    @classmethod
    def create_compact(
        cls,
        schema: Schema,
        capacity: int,
        *,
        next_of: Mapping[str, str] | tuple[tuple[str, str], ...],
        frame_stack: Mapping[str, int] | tuple[tuple[str, int], ...],
        end_keys: tuple[Key, ...],
        num_envs: int = 1,
        margin: int | None = None,
        start: int = 0,
        seed: int | None = None,
    ) -> SharedCompactBuffer:
        """A new, empty shared compact buffer of ``capacity`` served rows (this process owns its files).

        ``margin``: extra physical slots (default ``capacity // 16 + 16 * k * num_envs``); ``start``: the first
        ticket (its row goes to slot ``start % capacity``). The claims must already hold for ``schema`` (as a
        compact ``ReplayBuffer`` checks them at its first write).
        """
        capacity = positive_int(capacity, "capacity")
        pairs = tuple(next_of.items()) if isinstance(next_of, Mapping) else tuple(next_of)
        stacks = tuple(frame_stack.items()) if isinstance(frame_stack, Mapping) else tuple(frame_stack)
        k = max([1, *(s for _, s in stacks)])
        if margin is None:
            margin = capacity // 16 + 16 * k * num_envs
        physical = capacity + margin
        physical -= physical % num_envs  # env steps stay whole
        nexts = {n for n, _ in pairs}
        obs_of = {o for _, o in pairs} | {s for s, _ in stacks}
        stored: list[Field] = [f for f in schema.fields if f.key not in nexts and f.key not in obs_of]
        depth = 1
        for i, f in enumerate(x for x in schema.fields if x.key in obs_of):
            sk = dict(stacks).get(str(f.key), 1)
            has_next = any(o == f.key for _, o in pairs)
            depth = max(depth, sk if has_next else sk - 1)
            frame = f.row_bytes // sk
            stored.append(Field((_TAG, str(i), "frame"), torch.Size([frame]), torch.uint8))
            stored.append(Field((_TAG, str(i), "start"), torch.Size([_stride(f.row_bytes)]), torch.uint8))
            if has_next and sk > 1:
                stored.append(Field((_TAG, str(i), "end"), torch.Size([_stride(f.row_bytes)]), torch.uint8))
        stored.append(Field(_LINKS, torch.Size([3 + depth]), torch.int64))
        folder = cls.make_folder(Schema(stored), physical, start=start)
        claims = {
            "rows": capacity,
            "num_envs": num_envs,
            "fields": [[_plain(f.key), list(f.shape), str(f.dtype).removeprefix("torch.")] for f in schema.fields],
            "end_keys": [_plain(k) for k in end_keys],
            "next_of": [[n, o] for n, o in pairs],
            "frame_stack": [[s, k] for s, k in stacks],
        }

        def write(f: BinaryIO) -> None:
            f.write(json.dumps(claims).encode())

        atomic_write(os.path.join(folder, COMPACT_FILE), write)
        return cls(folder, seed=seed, owner=True)

    def forget_streams(self) -> None:
        """Start new env streams (a new process: its rows continue none of another's)."""
        self.streams = [Stream() for _ in range(self.num_envs)]
        self.stream_lock = threading.Lock()  # threads of one handle write its streams one at a time

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        super().close()

    # ------------------------------------------------------------------ counters
    def __len__(self) -> int:
        return min(self.slots.reserved, self.capacity)

    @property
    def pointer(self) -> int:
        return self.slots.reserved % self.capacity

    def committed(self) -> int:
        seqs = self._window()
        return int(self._holds(seqs).sum())

    def _window(self, step: int = 1) -> torch.Tensor:
        reserved = self.slots.reserved
        first = -(-max(0, reserved - self.capacity) // step) * step
        return torch.arange(first, reserved - reserved % step, dtype=torch.int64)

    def _holds(self, seqs: torch.Tensor) -> torch.Tensor:
        slots = seqs % self.physical
        gens = self.slots.generations(slots)
        return (gens == seqs + 1) & (gens > self.writers.taints.index_select(0, slots))

    # ------------------------------------------------------------------ writes
    def add(self, transition: TensorDictBase | Mapping[str, Any]) -> int:
        """Store one transition (env 0's stream with ``num_envs > 1``: use :meth:`add_batch`); return its ticket.

        Raises:
            SchemaError: it does not fit the schema, or breaks a claimed overlap with this handle's previous
                row of the stream (nothing is stored, no slot is spent).
        """
        if self.plain_writer is not None and self.num_envs == 1 and type(transition) is dict:
            seq = self._add_fast(transition)
            if seq >= 0:
                return seq
        pairs, _ = self.schema.check(transition, batch_dims=0, warned=self._warned)
        return self._store({f.key: torch.as_tensor(v, dtype=f.dtype).reshape(1, *f.shape) for f, v in pairs}, 1)

    def _add_fast(self, row: dict[Any, Any]) -> int:
        """The per-step path of a plain ``dict`` whose observed and next values are CPU tensors or arrays of
        the stored dtype and shape: NumPy throughout, the other keys through a
        :class:`~objectrl_buffer.storage.fast_write.FastWriter`. ``-1`` (nothing done) for other inputs."""
        raw: dict[Key, np.ndarray] = {}
        for key, (dtype, shape, np_dtype) in self.fast_keys.items():
            value = row.get(key)
            if type(value) is torch.Tensor:
                if value.dtype != dtype or value.shape != shape or value.device.type != "cpu":
                    return -1
                value = value.detach().numpy()
            elif type(value) is not np.ndarray or value.dtype != np_dtype or value.shape != shape:
                return -1
            raw[key] = np.ascontiguousarray(value).reshape(1, -1).view(np.uint8)
        others = {key: value for key, value in row.items() if key not in self.compact_keys}
        ended = np.array([any(nonzero(others[key]) for key in self.end_keys if key in others)])
        raw_next = {o.next: raw[o.next] for o in self.observed if o.next is not None}
        writer = self.plain_writer

        def plain(at: np.ndarray, lo: int) -> None:
            assert writer is not None
            slot = int(at[0])
            if not writer.write_row(others, slot, self._warned):  # declined before writing anything
                pairs, _ = self.schema.check(row, batch_dims=0, warned=self._warned)  # raises, or the same bytes
                for f, v in pairs:
                    if f.key not in self.compact_keys:
                        self.columns[f.key][slot] = torch.as_tensor(v, dtype=f.dtype).reshape(f.shape)

        with self.stream_lock:
            return self._store_locked(raw, raw_next, ended, 1, plain)

    def add_batch(self, batch: TensorDictBase | Mapping[str, Any]) -> tuple[int, int]:
        """Store ``N`` rows (row ``i`` continues env ``i % num_envs``'s stream); return ``(first ticket, N)``.

        Raises:
            SchemaError: as :meth:`add` (a batch is refused whole).
        """
        pairs, n = self.schema.check(batch, batch_dims=1, warned=self._warned)
        if not n:
            return self.slots.reserved, 0
        return self._store({f.key: torch.as_tensor(v, dtype=f.dtype) for f, v in pairs}, n), n

    def _store(self, values: dict[Key, torch.Tensor], n: int) -> int:
        """Store ``n`` checked rows (each key's values ``[n, *shape]`` of its stored dtype)."""
        raw = {o.field.key: _raw(values[o.field.key], n) for o in self.observed}
        raw_next = {o.next: _raw(values[o.next], n) for o in self.observed if o.next is not None}
        ended = np.zeros(n, dtype=bool)
        for key in self.end_keys:
            if key in values:
                ended |= values[key].reshape(n, -1).ne(0).any(1).numpy()

        def plain(at: np.ndarray, lo: int) -> None:
            slots = torch.from_numpy(at)
            for key, value in values.items():
                if key not in self.compact_keys:
                    self.columns[key].index_copy_(0, slots, value[lo:])

        with self.stream_lock:  # a row checked against its stream's previous row must link to that row
            return self._store_locked(raw, raw_next, ended, n, plain)

    def _store_locked(
        self,
        raw: dict[Key, np.ndarray],
        raw_next: dict[Key, np.ndarray],
        ended: np.ndarray,
        n: int,
        plain: Callable[[np.ndarray, int], None],
    ) -> int:
        """Check, reserve, write (the other keys through ``plain(slots, first row kept)``) and publish."""
        shifts, last = check_overlaps(
            self.streams, self.observed, raw, raw_next, ended, n
        )  # raises before anything is reserved
        keep = min(n, self.capacity)
        seq = self.slots.reserve(n)
        first = seq + n - keep
        seqs = np.arange(first, seq + n, dtype=np.int64)
        at = seqs % self.physical
        saved = [(s.preds, s.anchor, s.dist, s.ended) for s in self.streams]  # _link replaces, never mutates
        links, side = link_rows(self.streams, seq, n, keep, ended, shifts, self.depth, self.margin)
        entry = self.writers.enter(first, keep)
        gens = self._gens
        gens[1 + at] = 0  # begin: readers skip the slots from now on (NumPy stores: ~0.3 us, torch's ~3 us)
        try:
            lo = n - keep
            plain(at, lo)
            link_column = self.link_column
            before = link_column[at]  # the rows overwritten: which side entries they had (to free)
            link_column[at] = links[lo:]
            for o in self.observed:
                x = raw[o.field.key]
                newest = raw_next[o.next] if o.next is not None else x
                own = newest.reshape(n, o.k, -1)[:, -1]
                self.frame_columns[o.index][at] = own[lo:]
                self._side(o.column("start"), at, x[lo:], side[lo:], before[:, DIST] == 0)
                if o.next is not None and o.k > 1:
                    ends = (links[lo:, ENDS] >> o.index) & 1 == 1
                    self._side(o.column("end"), at, raw_next[o.next][lo:], ends, (before[:, ENDS] >> o.index) & 1 == 1)
        except BaseException:
            for stream, (preds, anchor, dist, was_ended) in zip(self.streams, saved, strict=True):
                stream.preds, stream.anchor, stream.dist, stream.ended = preds, anchor, dist, was_ended  # not stored
            self._abort(entry, seq, n)
            raise
        for stream, values_e in zip(self.streams, last, strict=True):  # copies: the caller may reuse its arrays
            stream.last = {key: value.copy() for key, value in values_e.items()}
        lapped = self.writers.settle(first, keep)
        gens[1 + at[lapped:]] = seqs[lapped:] + 1  # commit
        self.writers.leave(entry)
        return seq

    def _np(self, key: Key) -> np.ndarray:
        array = self.np[key]
        assert array is not None
        return array

    def _side(self, key: Key, at: np.ndarray, rows: np.ndarray, used: np.ndarray, had: np.ndarray) -> None:
        """Write side entries ``rows[used]`` at slots ``at[used]``; free the pages of the entries the rows
        overwritten ``had`` there and these rows do not use (punchable files only)."""
        column = self._np(key)
        if used.any():
            column[at[used], : rows.shape[1]] = rows[used]
        fd = self._fds.get(key)
        if fd is not None:
            stride = column.shape[1]
            for slot in at[had & ~used].tolist():
                _punch(fd, slot * stride, stride)

    # ------------------------------------------------------------------ reads
    def _read(self, seqs: torch.Tensor) -> tuple[dict[Key, torch.Tensor], torch.Tensor]:
        """Rows of tickets ``seqs`` (int64 ``[B]``) and which of them were whole (the row and every row it
        borrows from held the recorded tickets throughout the copy, no write in flight over them)."""
        P = self.physical
        slots = seqs % P
        before = self.slots.generations(slots)
        links = np.concatenate([self._np(_LINKS)[slots.numpy()], seqs.numpy()[:, None]], axis=1)
        plans = {o.index: plan_frames(o, links) for o in self.observed}
        refs = np.unique(np.concatenate([t for plan in plans.values() for t, _, _ in plan] + [seqs.numpy()]))
        ref_slots = torch.from_numpy(refs % P)
        ref_before = self.slots.generations(ref_slots)
        out: dict[Key, torch.Tensor] = {}
        for f in self.schema.fields:
            if f.key not in self.compact_keys:
                out[f.key] = self.columns[f.key].index_select(0, slots)
        at = slots.numpy()
        for o in self.observed:
            frames = self._np(o.column("frame"))
            fb = o.frame_bytes
            state = np.empty((len(at), o.k, fb), dtype=np.uint8)
            for i, (ticket, from_anchor, j) in enumerate(plans[o.index]):
                state[:, i] = frames[ticket % P]
                rows = from_anchor.nonzero()[0]
                if rows.size:
                    start = self._np(o.column("start"))[ticket[rows] % P, : o.field.row_bytes]
                    state[rows, i] = start.reshape(-1, o.k, fb)[np.arange(rows.size), j[rows]]
            out[o.field.key] = _typed(state, o.field, len(at))
            if o.next is not None:
                nxt = np.concatenate([state[:, 1:], frames[at][:, None]], axis=1)
                if o.k > 1:
                    ends = ((links[:, ENDS] >> o.index) & 1 == 1).nonzero()[0]
                    if ends.size:
                        whole = self._np(o.column("end"))[at[ends], : o.field.row_bytes]
                        nxt[ends] = whole.reshape(-1, o.k, fb)
                out[o.next] = _typed(nxt, o.field, len(at))
        expected = torch.from_numpy(refs + 1)
        bad_refs = (
            torch.from_numpy(refs < 0) | (ref_before != expected) | (self.slots.generations(ref_slots) != expected)
        )
        unsafe = self.writers.unsafe(ref_slots, expected)
        if unsafe is not None:
            bad_refs |= unsafe
        bad = np.zeros(len(at), dtype=bool)
        if bool(bad_refs.any()):
            broken = refs[bad_refs.numpy()]
            for plan in plans.values():
                for ticket, _, _ in plan:
                    bad |= np.isin(ticket, broken)
            bad |= np.isin(seqs.numpy(), broken)
        ok = (before == seqs + 1) & ~torch.from_numpy(bad)
        return out, ok

    def sample_batch(self, batch_size: int, *, generations: bool = False) -> TensorDict:
        """``batch_size`` whole rows drawn uniformly with replacement among the newest ``capacity`` tickets
        (rows that cannot be served are redrawn, as :meth:`SharedBuffer.sample_batch` does).

        Raises:
            EmptyBufferError: no finished row.
        """
        k = positive_int(batch_size, "batch_size")
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self.generator.seed()
        parts: list[tuple[dict[Key, torch.Tensor], torch.Tensor]] = []
        need = k
        for _ in range(_MAX_TRIES):
            held = len(self)
            if not held:
                break
            seqs = self.slots.reserved - held + torch.randint(0, held, (need,), generator=self.generator)
            rows, ok = self._read(seqs)
            good = ok.nonzero().squeeze(1)
            if good.numel() == seqs.numel():
                parts.append((rows, seqs))
                need -= good.numel()
            elif good.numel():
                rows = {key: value.index_select(0, good) for key, value in rows.items()}
                parts.append((rows, seqs.index_select(0, good)))
                need -= good.numel()
            if not need:
                if len(parts) == 1:  # every row drawn first was whole: no copy
                    out, drawn = parts[0]
                else:
                    out = {f.key: torch.cat([p[0][f.key] for p in parts]) for f in self.schema.fields}
                    drawn = torch.cat([p[1] for p in parts])
                out[INDEX_KEY] = drawn % self.capacity
                if generations:
                    out["generation"] = drawn + 1
                return make_tensordict(out, torch.Size([k]), None)
        raise EmptyBufferError(f"no finished row to sample (reserved {self.reserved}, committed {self.committed()})")

    def rows(self, step: int = 1) -> TensorDict:
        """Every whole row among the newest ``capacity`` tickets, oldest to newest, with ``"index"`` (the
        ticket modulo ``capacity``); ``step``: whole groups of ``step`` rows only (see :meth:`SharedBuffer.rows`)."""
        seqs = self._window(step)
        chunks = [self._read(part) for part in seqs.split(4096)] if seqs.numel() else []
        out = {
            f.key: torch.cat([c[0][f.key] for c in chunks]) if chunks else torch.empty(0, *f.shape, dtype=f.dtype)
            for f in self.schema.fields
        }
        ok = torch.cat([c[1] for c in chunks]) if chunks else torch.zeros(0, dtype=torch.bool)
        if step > 1:
            ok = ok.view(-1, step).all(1).repeat_interleave(step)
        kept = ok.nonzero().squeeze(1)
        out = {key: value.index_select(0, kept) for key, value in out.items()}
        out[INDEX_KEY] = seqs.index_select(0, kept) % self.capacity
        return make_tensordict(out, torch.Size([kept.numel()]), None)

    def draw(self, n: int) -> torch.Tensor | None:
        held = len(self)
        if not held:
            return None
        return (self.slots.reserved - held + torch.randint(0, held, (n,), generator=self.generator)) % self.physical


def _typed(raw: np.ndarray, f: Field, n: int) -> torch.Tensor:
    """Bytes ``[n, ...]`` as ``n`` rows of field ``f``."""
    return torch.from_numpy(np.ascontiguousarray(raw).reshape(n, -1)).view(f.dtype).reshape(n, *f.shape)


def _raw(value: torch.Tensor, n: int) -> np.ndarray:
    """``[n, bytes]`` uint8 view of ``n`` rows (bit-exact for every dtype)."""
    return value.contiguous().reshape(n, -1).view(torch.uint8).numpy()


def _key(k: Any) -> Key:
    return tuple(k) if isinstance(k, list) else k


def _plain(k: Key) -> Any:
    return list(k) if isinstance(k, tuple) else k


def _forget_streams() -> None:
    for handle in list(_LIVE):
        handle.forget_streams()


os.register_at_fork(after_in_child=_forget_streams)
