"""One buffer, many processes on one machine: rows in shared memory-mapped files that every process writes and samples.

:func:`share` turns a CPU buffer's schema and rows into a :class:`SharedBuffer`; the handle goes to
``multiprocessing`` children (``spawn``, ``fork``, ``forkserver``) and ``torch.multiprocessing`` workers as a
plain argument: every pickle of a handle attaches to the same files (it is a handle, not a copy). Slots are
reserved through :class:`~objectrl_buffer.core.shared_counter.SharedSlots` (a 64-bit counter bumped by one
atomic fetch-add, or under a kernel-released lock where atomics are missing); samplers read only committed
rows (per-slot generations), so no row is ever seen half-written and a writer killed mid-write blocks
nobody: its slots are skipped until rewritten.

Writers lapping the ring: a writer preempted inside its copy while ``capacity`` more rows are reserved
shares its slot with a newer writer. Every write is listed in a shared table of writes in flight while it
copies, and checks after its copy whether its slot was handed out again (:mod:`objectrl_buffer.core.inflight`):
a lapped row is not published and its slot is *tainted*, so neither a sample, nor :meth:`SharedBuffer.rows`,
nor a prioritized draw ever serves a row mixed from two writes; the slot is served again once a later
ticket rewrites it. Samplers redraw rows they cannot serve (the batch keeps its size; draws stay uniform, or
by priority, over the rows that can be served). No precondition on the rows in flight is left to the user.

Rows of a page or more (Atari frames): a process's first store into each page of the shared files takes a
page fault (a fresh process, or a fork child: the kernel does not copy the page tables of shared mappings),
~14 a 56 KB row, which made a cold writer's first pass ~3x slower than a warm one. Each process maps the
slots it writes ``_MAP_CHUNK_BYTES`` of rows at a time instead, with one ``MADV_POPULATE_WRITE`` per column
(:func:`~objectrl_buffer.storage.prefault.populate_write`), the first time it writes into them.
"""

from __future__ import annotations

import json
import os
import shutil
import weakref
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from objectrl_buffer.checkpoint.io import atomic_write, read_small_file
from objectrl_buffer.core.inflight import Writers
from objectrl_buffer.core.keys import GENERATION_KEY, INDEX_KEY
from objectrl_buffer.core.ring import Ring
from objectrl_buffer.core.schema import Field, Key, Schema
from objectrl_buffer.core.shared_counter import SharedSlots
from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError
from objectrl_buffer.storage import shm_files
from objectrl_buffer.storage.fast_write import FastWriter
from objectrl_buffer.storage.prefault import populate_write
from objectrl_buffer.storage.table import make_tensordict

__all__ = ["SharedBuffer", "share"]

_LAYOUT = "layout.json"
_SLOTS = "slots.bin"
_WRITERS = "writers.bin"  # writes in flight and taints (made on first open where an older folder lacks it)
_MAX_TRIES = 64  # redraws of rows that were being written when read
_MAP_CHUNK_BYTES = 2 << 20  # rows mapped at once by a writer (rows of a page or more: see the module docs)
_PAGE = 4096
#: Every live SharedBuffer of this process: a fork child forgets which chunks its parent had mapped.
_LIVE: weakref.WeakSet[SharedBuffer] = weakref.WeakSet()


def batch_rows(batch: Any) -> int:
    """``N`` of a plain ``[N]`` batch (a dict of tensors/arrays, a TensorDict), 0 when it cannot be told cheaply."""
    if isinstance(batch, TensorDictBase):
        return int(batch.batch_size[0]) if batch.batch_dims == 1 else 0
    if type(batch) is dict and batch:
        shape: tuple[int, ...] = tuple(getattr(next(iter(batch.values())), "shape", ()))
        return int(shape[0]) if shape else 0
    return 0


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise InvalidArgumentError(f"bad dtype {name!r} in a shared buffer layout")
    return dtype


class SharedBuffer:
    """A ring of ``capacity`` rows of ``schema`` in memory-mapped files under ``folder``, shared by processes.

    Build one with :func:`share` (or :meth:`create`); pass it to child processes as an argument.

    Args (of :meth:`create`):
        schema: the stored fields. capacity: slots (> 0). folder: where the files go (``None``: a new
        folder in ``/dev/shm`` when it exists, else the temp folder). seed: of this process's generator.

    Samples are ``TensorDict`` s on CPU with the stored keys and ``"index"`` (each row's slot).
    """

    def __init__(self, folder: str, *, seed: int | None = None, owner: bool = False) -> None:
        layout = json.loads(read_small_file(os.path.join(folder, _LAYOUT), 1 << 20))
        self.folder, self.owner = folder, owner
        # the owner's files go when it closes, is collected or exits (not when a fork child of it does)
        self._remove = weakref.finalize(self, _remove_folder, folder, os.getpid()) if owner else None
        self.capacity = positive_int(layout["capacity"], "capacity")
        self.schema = Schema(
            [
                Field(
                    tuple(f["key"]) if isinstance(f["key"], list) else f["key"],
                    torch.Size(f["shape"]),
                    _dtype(f["dtype"]),
                )
                for f in layout["fields"]
            ]
        )
        self.slots = SharedSlots(os.path.join(folder, _SLOTS), self.capacity)
        self.writers = Writers(os.path.join(folder, _WRITERS), self.capacity, self.slots.words)
        self.columns: dict[Key, torch.Tensor] = {}
        for i, field in enumerate(self.schema.fields):
            numel = self.capacity * field.shape.numel()
            flat = torch.from_file(os.path.join(folder, f"col{i}.bin"), shared=True, size=numel, dtype=field.dtype)
            self.columns[field.key] = flat.view(self.capacity, *field.shape)
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self._pid = os.getpid()  # a forked child reseeds its copy of the generator (see sample_batch)
        self._warned: set[Key] = set()
        # plain inputs are checked and stored through NumPy views (as a buffer's own add): ~0.3 us a key
        self.fast = FastWriter.build(self.schema, self.columns)
        self._gens = self.slots.words  # [0]: the counter, [1 + s]: slot s's generation
        row_bytes = sum(f.shape.numel() * f.dtype.itemsize for f in self.schema.fields)
        #: rows mapped at once by this process's writes (0: rows under a page, whose faults cost little)
        self.chunk_rows = max(1, _MAP_CHUNK_BYTES // row_bytes) if row_bytes >= _PAGE else 0
        self.mapped_chunks = bytearray(-(-self.capacity // self.chunk_rows) if self.chunk_rows else 0)
        _LIVE.add(self)

    @classmethod
    def create(
        cls,
        schema: Schema,
        capacity: int,
        folder: str | os.PathLike[str] | None = None,
        *,
        seed: int | None = None,
        start: int = 0,
    ) -> SharedBuffer:
        """A new, empty shared buffer (this process owns its files: :meth:`close` removes them); the first
        row goes to slot ``start % capacity``."""
        return cls(cls.make_folder(schema, capacity, folder, start=start), seed=seed, owner=True)

    @staticmethod
    def make_folder(
        schema: Schema, capacity: int, folder: str | os.PathLike[str] | None = None, *, start: int = 0
    ) -> str:
        """Lay out the files of a new, empty shared buffer in a new folder (under ``folder``); return its path."""
        capacity = positive_int(capacity, "capacity")
        parent = str(folder) if folder is not None else ("/dev/shm" if os.path.isdir("/dev/shm") else None)
        path = shm_files.new_folder(shm_files.SHARED_PREFIX, parent)  # named after this process: see clean
        fields = [
            {"key": list(f.key) if isinstance(f.key, tuple) else f.key, "shape": list(f.shape), "dtype": str(f.dtype)}
            for f in schema.fields
        ]
        for i, field in enumerate(schema.fields):
            with open(os.path.join(path, f"col{i}.bin"), "xb") as f:
                f.truncate(capacity * field.row_bytes)
        SharedSlots(os.path.join(path, _SLOTS), capacity, create=True, start=start)
        Writers(os.path.join(path, _WRITERS), capacity, np.zeros(1, dtype=np.int64))
        layout = json.dumps({"capacity": capacity, "fields": fields}).encode()

        def write(f: BinaryIO) -> None:
            f.write(layout)

        atomic_write(os.path.join(path, _LAYOUT), write)
        return path

    # ------------------------------------------------------------------ handles
    def __reduce__(self) -> tuple[Any, ...]:
        # every pickle is a handle on the same files (a child's generator is seeded afresh)
        return (type(self), (self.folder,))

    def close(self) -> None:
        """Drop this handle's mappings; the owner also removes the files (children keep theirs until they exit)."""
        self.columns = {}
        self.writers.close()
        if self._remove is not None:
            self._remove()
            self.owner, self._remove = False, None

    def __enter__(self) -> SharedBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ counters
    @property
    def reserved(self) -> int:
        """Rows ever reserved by every process (those of a killed writer included)."""
        return self.slots.reserved

    def __len__(self) -> int:
        """Slots that hold or are getting a row: ``min(reserved, capacity)``."""
        return min(self.slots.reserved, self.capacity)

    def committed(self) -> int:
        """Slots that hold a finished row (what samples are drawn from; a slot tainted by a lapped write is
        not counted until rewritten)."""
        if not self.writers.words.item(1):  # no taint ever raised
            return self.slots.committed()
        return int(self.servable(torch.arange(self.capacity)).sum())

    @property
    def pointer(self) -> int:
        """The next slot reserved (by any process)."""
        return self.slots.reserved % self.capacity

    buffer_size = property(lambda self: self.capacity, doc="Capacity in rows (ObjectRL's name).")
    data_size = property(__len__, doc="``len(self)`` (ObjectRL's name).")

    # ------------------------------------------------------------------ writes
    def add(self, transition: TensorDictBase | Mapping[str, Any]) -> int:
        """Store one transition (checked against the schema as a buffer's ``add``); return its sequence number
        (rows ever reserved before it: its slot is ``seq % capacity``).

        A refused write stores nothing and keeps every row, but its reserved slot is spent (``reserved``
        counts it; the slot keeps its previous row, or stays empty until rewritten).

        Raises:
            SchemaError: it does not fit the schema.
        """
        fast = self.fast
        if fast is not None:  # the per-step path: reserve, mark, write through NumPy, publish
            seq = self.slots.reserve(1)
            word = 1 + seq % self.capacity
            chunk_rows = self.chunk_rows
            if chunk_rows and not self.mapped_chunks[(word - 1) // chunk_rows]:
                self.map_slots(word - 1, word)
            gens, writers = self._gens, self.writers
            entry = writers.enter(seq, 1)
            before = gens[word]
            gens[word] = 0
            try:
                wrote = fast.write_row(transition, word - 1, self._warned)
            except BaseException:
                self._abort(entry, seq, 1)
                raise
            if wrote:
                if not writers.settle(seq, 1):  # lapped: not published, the slot is tainted
                    gens[word] = seq + 1
                writers.leave(entry)
                return seq
            if not writers.settle(seq, 1, taint=False):  # declined before writing anything
                gens[word] = before  # the slot keeps its row (unless handed out again meanwhile)
            writers.leave(entry)
            if not self.slots.unreserve(seq, 1):
                pairs, _ = self.schema.check(transition, batch_dims=0, warned=self._warned)  # the slot is spent
                return self._write_at(
                    seq, [(f, torch.as_tensor(v, dtype=f.dtype).reshape(1, *f.shape)) for f, v in pairs], 1
                )
        pairs, _ = self.schema.check(transition, batch_dims=0, warned=self._warned)
        return self._write([(f, torch.as_tensor(v, dtype=f.dtype).reshape(1, *f.shape)) for f, v in pairs], 1)

    def add_batch(self, batch: TensorDictBase | Mapping[str, Any]) -> tuple[int, int]:
        """Store ``N`` transitions at reserved slots (``N > capacity`` keeps the newest). Raises as :meth:`add`.

        Returns ``(seq, N)``: the rows got the sequence numbers ``seq .. seq + N - 1`` (the newest ``capacity`` kept).
        """
        fast = self.fast
        n = batch_rows(batch) if fast is not None else 0
        if n:
            seq = self.slots.reserve(n)
            first = seq % self.capacity
            ring = Ring(self.capacity, self.capacity, first)
            if self.chunk_rows:
                self.map_slots(first, min(first + n, self.capacity))
                if first + n > self.capacity:
                    self.map_slots(0, min(first + n - self.capacity, first))
            writers = self.writers
            keep = min(n, self.capacity)
            entry = writers.enter(seq + n - keep, keep)
            if n <= self.capacity - first:  # one run of slots (an env step, most batches): NumPy slice stores
                run = self._gens[1 + first : 1 + first + n]  # of the generations, ~0.3 us each (torch's: 2-5 us)
                before = run.copy()
                run[:] = 0
                wrote = self._fast_batch(batch, ring, entry, seq, n)
                lapped = writers.settle(seq, n, taint=wrote)
                if wrote:
                    run[lapped:] = np.arange(seq + 1 + lapped, seq + n + 1)
                    writers.leave(entry)
                    return seq, n
                run[lapped:] = before[lapped:]  # declined before writing anything
            else:
                seqs, slots = self._placed(seq, n)
                generations = self.slots.generations(slots)
                self.slots.begin(slots)
                wrote = self._fast_batch(batch, ring, entry, seq, n)
                lapped = writers.settle(seq + n - keep, keep, taint=wrote)
                if wrote:
                    self.slots.commit(slots[lapped:], seqs[lapped:])
                    writers.leave(entry)
                    return seq, n
                self.slots.gens.index_copy_(0, slots[lapped:], generations[lapped:])  # declined: nothing written
            writers.leave(entry)
            if not self.slots.unreserve(seq, n):
                pairs, m = self.schema.check(batch, batch_dims=1, warned=self._warned)  # the slots are spent
                values = [(f, torch.as_tensor(v, dtype=f.dtype)) for f, v in pairs]
                return (self._write_at(seq, values, n), n) if m == n else (self._write(values, m), m)
        pairs, n = self.schema.check(batch, batch_dims=1, warned=self._warned)
        if n:
            return self._write([(f, torch.as_tensor(v, dtype=f.dtype)) for f, v in pairs], n), n
        return self.slots.reserved, 0

    def _fast_batch(self, batch: Any, ring: Ring, entry: int, seq: int, n: int) -> bool:
        """The fast path's batch copy; whether it wrote (a refusal writes nothing)."""
        try:
            return self.fast.write_batch(batch, ring) >= 0  # type: ignore[union-attr]
        except BaseException:
            self._abort(entry, seq, n)
            raise

    def _abort(self, entry: int, seq: int, n: int) -> None:
        """A copy of tickets ``seq .. seq + n - 1`` stopped by an exception part way: none of its slots is
        served until rewritten (a lapped one, which may mix its bytes with a newer row's, by a later ticket)."""
        keep = min(n, self.capacity)
        self.writers.settle(seq + n - keep, keep)  # the lapped ones tainted; the others stay unpublished
        self.writers.leave(entry)

    def map_slots(self, lo: int, hi: int) -> None:
        """Map, writable, the chunks of slots ``lo .. hi-1`` this process has not mapped yet (see the module
        docs); nothing where the system cannot (the stores then fault page by page)."""
        chunk_rows, mapped = self.chunk_rows, self.mapped_chunks
        for chunk in range(lo // chunk_rows, (hi - 1) // chunk_rows + 1):
            if not mapped[chunk]:
                start, end = chunk * chunk_rows, min((chunk + 1) * chunk_rows, self.capacity)
                for column in self.columns.values():
                    populate_write(column[start:end].reshape(-1).view(torch.uint8))
                mapped[chunk] = 1

    def _placed(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        keep = min(n, self.capacity)
        seqs = torch.arange(start + n - keep, start + n, dtype=torch.int64)
        return seqs, seqs % self.capacity

    def _write(self, pairs: list[tuple[Field, torch.Tensor]], n: int) -> int:
        return self._write_at(self.slots.reserve(n), pairs, n)

    def _write_at(self, start: int, pairs: list[tuple[Field, torch.Tensor]], n: int) -> int:
        keep = min(n, self.capacity)
        seqs, slots = self._placed(start, n)
        entry = self.writers.enter(start + n - keep, keep)
        self.slots.begin(slots)
        try:
            for field, value in pairs:
                self.columns[field.key].index_copy_(0, slots, value[n - keep :])  # not col[slots] = ...: ~1000x slower
        except BaseException:
            self._abort(entry, start, n)
            raise
        lapped = self.writers.settle(start + n - keep, keep)
        self.slots.commit(slots[lapped:], seqs[lapped:])
        self.writers.leave(entry)
        return start

    # ------------------------------------------------------------------ reads
    def rows(self, step: int = 1) -> TensorDict:
        """Every finished row, oldest to newest, with ``"index"`` (rows being written are left out).

        ``step``: rows go in whole groups of ``step`` (the ``num_envs`` rows of one env step, reserved
        together): a group with a row being written is left out whole, so the rows kept stay env-aligned.
        """
        reserved = self.slots.reserved
        first = -(-max(0, reserved - self.capacity) // step) * step
        seqs = torch.arange(first, reserved - reserved % step, dtype=torch.int64)
        slots = seqs % self.capacity
        done = _whole(self.slots.generations(slots) == seqs + 1, step)
        slots, seqs = slots.index_select(0, done), seqs.index_select(0, done)
        out = {key: column.index_select(0, slots) for key, column in self.columns.items()}
        unsafe = self.writers.unsafe(slots, seqs + 1)  # after the copy, before the generations: see core.inflight
        held = self.slots.generations(slots) == seqs + 1
        kept = _whole(held if unsafe is None else held & ~unsafe, step)  # not rewritten (nor mixed) while read
        out = {key: value.index_select(0, kept) for key, value in out.items()}
        out[INDEX_KEY] = slots.index_select(0, kept)
        return make_tensordict(out, torch.Size([kept.numel()]), None)

    def sample_batch(self, batch_size: int, *, generations: bool = False) -> TensorDict:
        """``batch_size`` finished rows drawn uniformly with replacement; with ``generations``, also
        ``"generation"``: each drawn row's commit generation (int64, ``seq + 1``).

        A drawn row that cannot be served (being written, a write in flight on its slot, or its slot tainted
        by a lapped write: see the module docs) is dropped after the copy and its position redrawn, so the
        batch keeps its size and the draws are uniform (or by priority) over the rows that can be served.

        Raises:
            EmptyBufferError: no finished row.
        """
        k = positive_int(batch_size, "batch_size")
        if self._pid != os.getpid():  # a forked child: its generator is the parent's copy
            self._pid = os.getpid()
            self.generator.seed()
        out: dict[Key, torch.Tensor] = {f.key: torch.empty(k, *f.shape, dtype=f.dtype) for f in self.schema.fields}
        index = torch.empty(k, dtype=torch.int64)
        drawn = torch.empty(k, dtype=torch.int64)  # their generations
        todo = torch.arange(k)
        for _ in range(_MAX_TRIES):
            slots = self.draw(todo.numel())
            if slots is None:
                break
            before = self.slots.generations(slots)
            rows = {key: column.index_select(0, slots) for key, column in self.columns.items()}
            unsafe = self.writers.unsafe(slots, before)  # after the copy, before the generations (core.inflight)
            ok = (before > 0) & (before == self.slots.generations(slots))
            if unsafe is not None:
                ok &= ~unsafe
            if todo.numel() == k and bool(ok.all()):  # the common case: every row was finished
                rows[INDEX_KEY] = slots
                if generations:
                    rows[GENERATION_KEY] = before
                return make_tensordict(rows, torch.Size([k]), None)
            # index_select/index_copy_ only: boolean and advanced indexing are ~1000x slower here
            bad = (before <= 0) | (before <= self.writers.taints.index_select(0, slots))
            self.passed_over(slots.index_select(0, bad.nonzero().squeeze(1)))
            good = ok.nonzero().squeeze(1)
            done = todo.index_select(0, good)
            for key, value in rows.items():
                out[key].index_copy_(0, done, value.index_select(0, good))
            index.index_copy_(0, done, slots.index_select(0, good))
            drawn.index_copy_(0, done, before.index_select(0, good))
            todo = todo.index_select(0, (~ok).nonzero().squeeze(1))
            if todo.numel() == 0:
                out[INDEX_KEY] = index
                if generations:
                    out[GENERATION_KEY] = drawn
                return make_tensordict(out, torch.Size([k]), None)
        raise EmptyBufferError(f"no finished row to sample (reserved {self.reserved}, committed {self.committed()})")

    def draw(self, n: int) -> torch.Tensor | None:
        """``n`` slots to read (int64 ``[n]``), uniform over the slots held; ``None`` when none is held."""
        held = len(self)
        return torch.randint(0, held, (n,), generator=self.generator) if held else None

    def passed_over(self, slots: torch.Tensor) -> None:
        """Told of drawn ``slots`` found being written, left so by a writer that died, or tainted by a lapped
        write: uniform draws just redraw them."""

    def servable(self, slots: torch.Tensor) -> torch.Tensor:
        """Which ``slots`` hold a published row that no lapped write may have mixed (bool; writes in flight
        not considered)."""
        gens = self.slots.generations(slots)
        return (gens > 0) & (gens > self.writers.taints.index_select(0, slots))


def _whole(ok: torch.Tensor, step: int) -> torch.Tensor:
    """Positions of the ``True`` s of ``ok`` (bool ``[n]``, ``n`` a multiple of ``step``) in groups of ``step``
    that are ``True`` throughout."""
    if step > 1:
        ok = ok.view(-1, step).all(1).repeat_interleave(step)
    return ok.nonzero().squeeze(1)


def _remove_folder(folder: str, pid: int) -> None:
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)


def share(buffer: Any, *, seed: int | None = None) -> SharedBuffer:
    """A :class:`SharedBuffer` with ``buffer``'s schema and capacity holding its rows (oldest first).

    Raises:
        InvalidArgumentError: the buffer has no schema yet (write one row first) or does not store on CPU.
    """
    if buffer.schema is None:
        raise InvalidArgumentError("share(buffer): the buffer has no schema yet; write a row first")
    if torch.device(buffer.storing_device).type != "cpu":
        raise InvalidArgumentError(f"share(buffer): storing_device must be cpu, got {buffer.storing_device}")
    shared = SharedBuffer.create(buffer.schema, buffer.buffer_size, seed=seed)
    if len(buffer):
        rows = buffer.sample_all()
        shared.add_batch(rows.exclude(INDEX_KEY))
    return shared


def _forget_mappings() -> None:
    """In a fork child: the parent's page tables of shared mappings are not copied, so nothing is mapped yet."""
    for shared in list(_LIVE):
        shared.mapped_chunks[:] = bytes(len(shared.mapped_chunks))
        shared.writers.forget()  # the parent's entries in the writers table are the parent's


os.register_at_fork(after_in_child=_forget_mappings)
