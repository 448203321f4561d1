"""The engine every buffer is built on: rows of one schema in a ring, one door in and one door out.

* In: :meth:`Engine.add` / :meth:`Engine.add_batch` check a write against the schema (the first write
  fixes it, :mod:`~objectrl_buffer.core.schema`), store it at the ring's pointer through the fast path
  (:mod:`~objectrl_buffer.storage.fast_write`) or the checked one, and advance the ring
  (:mod:`~objectrl_buffer.core.ring`). A rejected write changes nothing.
* Out: :meth:`Engine.read` gathers the rows at given slots (:mod:`~objectrl_buffer.storage.table`)
  and delivers them as a new ``TensorDict`` on the training device, through pinned staging from CPU
  storage to CUDA (:mod:`~objectrl_buffer.storage.staging`).

Threads: one writer thread (``add``/``add_batch``) and any number of reader threads. The writer marks
the rows it is writing (``ring.begun`` before, ``ring.done`` after: two int stores on the per-step path);
a read re-reads the rows that a write began on meanwhile, so no row comes back half-written. Anything
else run concurrently (two writers, reset, load, close, PER's priority updates) needs the caller's lock.

Which slots to read is decided by the caller with :mod:`objectrl_buffer.sampling`; the ObjectRL facade
(:class:`~objectrl_buffer.ReplayBuffer`), prioritized replay and the other rooms compose an engine
instead of re-implementing any of this.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, cast

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import RandomSampler, RoundRobinWriter, TensorDictReplayBuffer

from objectrl_buffer.core.envs import check_env_step, flatten_steps
from objectrl_buffer.core.keys import INDEX_KEY
from objectrl_buffer.core.ring import Ring
from objectrl_buffer.core.schema import Key, Schema, format_key, require_mapping
from objectrl_buffer.core.validate import slot_indices
from objectrl_buffer.errors import ConcurrentUseError, EmptyBufferError, InvalidArgumentError
from objectrl_buffer.sampling.nstep import n_step_targets
from objectrl_buffer.sampling.slices import TransitionKeys
from objectrl_buffer.storage import torchrl_compat
from objectrl_buffer.storage.compact import CompactSpec, CompactStorage
from objectrl_buffer.storage.staging import StagingRing
from objectrl_buffer.storage.table import TransitionStorage, make_tensordict

__all__ = ["Engine", "Transition", "Slots", "READ_ATTEMPTS"]

#: Re-reads of rows that a concurrent write keeps overwriting before ``ConcurrentUseError`` (Engine.read),
#: with sleeps doubling from 2 µs to 50 ms between them (about 0.5 s in all) so that the writer can finish.
READ_ATTEMPTS = 24

#: One write: a ``TensorDict`` or a mapping of key -> tensor / NumPy array / Python number.
Transition: TypeAlias = TensorDictBase | Mapping[str, Any]
#: Storage slots as users give them: an int, a sequence or range of ints, or an integer tensor.
Slots: TypeAlias = Sequence[int] | range | torch.Tensor | int


class Engine:
    """Rows of one schema in a ring of ``capacity`` slots on ``storing_device``, read out onto ``device``.

    Args:
        capacity: slots (> 0, a multiple of ``num_envs``; the caller validates it).
        device: where :meth:`read` delivers rows (the training device).
        storing_device: where rows live (CPU: memory-mapped files, see :mod:`~objectrl_buffer.storage.table`).
        storage_dir: parent folder of the CPU files (``None``: chosen at the first write).
        num_envs: rows per env step; env ``e`` of step ``t`` goes to slot ``t * num_envs + e``.
        compact: ``next_of``/``frame_stack`` claims: rows live in a
            :class:`~objectrl_buffer.storage.compact.CompactStorage` (pixels stored once); ``end_keys``:
            the keys ending an episode there.

    Attributes:
        ring: the ring state (:class:`~objectrl_buffer.core.ring.Ring`), the one owner of capacity,
            size, pointer and the phantom rows of a metadata-only load.
        storage: the columns (:class:`~objectrl_buffer.storage.table.TransitionStorage`).
        generation: bumped whenever the rows are dropped or replaced (reset, close, a load): readers
            that outlive a generation (epoch iterators) compare it.
    """

    def __init__(
        self,
        capacity: int,
        device: torch.device,
        storing_device: torch.device,
        storage_dir: str | os.PathLike[str] | None = None,
        *,
        num_envs: int = 1,
        compact: CompactSpec | None = None,
        end_keys: tuple[Key, ...] = (),
    ) -> None:
        self.device = device
        self.storing_device = storing_device
        self.storage_dir = storage_dir
        self.num_envs = num_envs
        self.ring = Ring(capacity)
        self.compact = compact
        self.end_keys = end_keys
        self.storage = self.new_storage(capacity, storage_dir)
        self.staging = self._new_staging()
        self.cast_warned: set[Key] = set()  # keys whose tensors were cast/reshaped: CastWarning once each
        self.generation = 0
        self._view: TensorDictReplayBuffer | None = None

    def new_storage(self, capacity: int, storage_dir: str | os.PathLike[str] | None) -> TransitionStorage:
        """Empty storage of ``capacity`` rows of this engine's kind: a
        :class:`~objectrl_buffer.storage.compact.CompactStorage` when it has claims (which offers the part of
        ``TransitionStorage`` the engine, reads and checkpoints use, hence the cast)."""
        if self.compact is None:
            return TransitionStorage(capacity, self.storing_device, storage_dir)
        compact = CompactStorage(
            capacity,
            self.storing_device,
            storage_dir,
            num_envs=self.num_envs,
            spec=self.compact,
            end_keys=self.end_keys,
        )
        return cast(TransitionStorage, compact)

    def _new_staging(self) -> StagingRing | None:
        # CPU storage, CUDA training device: samples go through pinned staging buffers
        return StagingRing(self.device) if self.device.type == "cuda" and self.storing_device.type == "cpu" else None

    @property
    def schema(self) -> Schema | None:
        """Stored keys with per-row shapes and dtypes; ``None`` until the first write."""
        return self.storage.schema

    def describe(self) -> str:
        """The fill level, the write head, storing -> training device and the stored keys, for ``repr``."""
        ring = self.ring
        rows = f"{ring.size}/{ring.capacity} rows" + (f" ({ring.phantom} hold no data)" if ring.phantom else "")
        envs = f", num_envs={self.num_envs}" if self.num_envs > 1 else ""
        schema = self.schema
        if self.storage.closed:
            keys = "closed"
        elif schema is None:
            keys = "empty"
        else:
            dtype = lambda f: str(f.dtype).removeprefix("torch.")  # noqa: E731
            shown = (f"{format_key(f.key)!r}: {dtype(f)} {tuple(f.shape)}" for f in schema.fields)
            keys = f"keys=[{', '.join(shown)}]"
        return f"{rows}, pointer={ring.pointer}{envs}, {self.storing_device}->{self.device}, {keys}"

    # ------------------------------------------------------------------ writes
    def add(self, transition: Transition) -> None:
        """Store one transition (one env step of every env when ``num_envs > 1``) at the pointer.

        Raises:
            SchemaError: it does not fit the stored schema (nothing is stored).
            InvalidArgumentError: a batched TensorDict, or not a mapping.
            ClosedBufferError: after :meth:`close`.
        """
        ring = self.ring
        if self.num_envs > 1:  # before the fast path, which would take a dict of numbers as one row
            check_env_step(transition, self.num_envs)
            self.add_batch(transition, steps=False)
            return
        fast = self.storage.fast
        done = ring.done + 1
        ring.begun = done  # a sampler thread re-reads what it read of this row meanwhile (see read())
        pointer = ring.pointer
        try:  # free unless raised: a compact storage's fast path refuses a broken overlap (SchemaError)
            handled = fast is not None and fast.write_row(transition, pointer, self.cast_warned)
        except BaseException:
            ring.begun = ring.done
            raise
        if handled:
            capacity = ring.capacity
            pointer += 1
            ring.pointer = pointer if pointer < capacity else 0
            size = ring.size
            if size < capacity:
                ring.size = size + 1
            elif ring.phantom:  # the full ring overwrote its oldest row: a phantom one
                ring.phantom -= 1
            ring.done = done
            return
        try:
            self._add_checked(transition)
        finally:
            ring.begun = ring.done

    def _add_checked(self, transition: Transition) -> None:
        ring = self.ring
        if isinstance(transition, TensorDictBase):
            if transition.batch_dims:
                raise InvalidArgumentError(
                    f"add() takes one transition (batch_size []), got batch_size {list(transition.batch_size)}: "
                    "use add_batch() for several"
                )
        elif not isinstance(transition, Mapping):
            require_mapping(transition, "add")
        storage = self.storage
        if storage.schema is None:
            schema, values = Schema.infer(transition, batch_dims=0)
            storage.initialize(schema, values)
            pairs: list[tuple[Any, Any]] = [(schema.by_key[k], v) for k, v in values.items()]
        else:
            pairs, _ = storage.schema.check(transition, batch_dims=0, warned=self.cast_warned)
        storage.write(ring.pointer, pairs)
        ring.advance(1)
        ring.done += 1

    def add_batch(self, batch: Transition, *, steps: bool = True) -> tuple[int, int]:
        """Store ``N`` rows at the pointer (wrapping); return ``(start, kept)``: the rows kept went to
        slots ``start, start + 1, ...`` (mod capacity), ``kept = min(N, capacity)`` of them.

        ``steps``: with ``num_envs > 1``, ``batch`` is ``[T, num_envs]`` time-major steps (``False``:
        it is already ``[N]`` rows).

        Raises:
            SchemaError, InvalidArgumentError: as :meth:`add`; also keys that disagree on ``N``.
        """
        if self.num_envs > 1 and steps:
            batch = flatten_steps(batch, self.num_envs)
        ring = self.ring
        # Any row may be under way until the batch is done (its length is known once it is checked).
        ring.begun = ring.done + ring.capacity
        try:
            fast = self.storage.fast
            n = -1 if fast is None else fast.write_batch(batch, ring)
            start, kept = ring.advance(n) if n >= 0 else self._add_batch_checked(batch)
            ring.done += kept
            return start, kept
        finally:
            ring.begun = ring.done

    def _add_batch_checked(self, batch: Transition) -> tuple[int, int]:
        ring = self.ring
        if isinstance(batch, TensorDictBase):
            if batch.batch_dims != 1:
                raise InvalidArgumentError(
                    f"add_batch() takes a TensorDict of batch_size [N], got {list(batch.batch_size)}"
                )
        else:
            require_mapping(batch, "add_batch")
        storage = self.storage
        if storage.schema is None:
            schema, values = Schema.infer(batch, batch_dims=1)
            n = next(iter(values.values())).shape[0]
            if n == 0:
                return ring.pointer, 0
            storage.initialize(schema, {k: v[0] for k, v in values.items()})
            pairs: list[tuple[Any, Any]] = [(schema.by_key[k], v) for k, v in values.items()]
        else:
            pairs, n = storage.schema.check(batch, batch_dims=1, warned=self.cast_warned)
            if n == 0:
                return ring.pointer, 0
        start, kept = ring.placement(n)
        storage.write_rows(start, pairs, first=n - kept, n=kept)
        return ring.advance(n)

    # ------------------------------------------------------------------ lifecycle
    def clear(self, capacity: int | None = None) -> None:
        """Drop every row (optionally take a new capacity); the next write may bring a new schema.

        CPU storage keeps its files and reserved pages for a next write of the same schema
        (:meth:`TransitionStorage.release`); a new capacity frees them now.
        """
        if capacity is not None and capacity != self.ring.capacity:
            self.storage.resize(capacity)
        else:
            self.storage.release()
        self.ring.clear(capacity)
        self.generation += 1

    def close(self) -> None:
        """Free the storage, its files and the pinned staging memory; later writes raise ``ClosedBufferError``."""
        self.storage.close()
        self.ring.clear()
        self.generation += 1
        self.staging = None

    def adopt(self, storage: TransitionStorage | None, ring: Ring) -> None:
        """Take restored rows (``storage``; ``None`` keeps the current one, as a metadata-only load does)
        and ring state, of the same capacity as the storage."""
        if storage is not None:
            old, self.storage = self.storage, storage
            self._view = None
            old.close()
        self.ring = ring
        self.generation += 1

    # ------------------------------------------------------------------ reads
    def require_rows(self) -> None:
        """Raise :class:`EmptyBufferError` unless some row holds data."""
        ring = self.ring
        if ring.size == 0:
            raise EmptyBufferError("cannot sample from an empty buffer: add transitions first")
        if self.storage.schema is None or ring.held == 0:
            raise EmptyBufferError(
                f"the buffer counts {ring.size} rows but holds no data: load() restored metadata only"
            )

    def read(
        self,
        slots: torch.Tensor,
        keys: list[Key] | None = None,
        with_index: bool = True,
        span: tuple[int, int] | None = None,
    ) -> TensorDict:
        """The rows at ``slots`` (int64, on the storing device, valid) as a new TensorDict on ``device``.

        ``keys``: only those (default all); ``with_index``: add ``"index"`` (the slots); ``span=(start,
        stop)`` says that ``slots`` is ``start .. stop-1``: read as one contiguous copy.

        Rows that another thread's :meth:`add`/:meth:`add_batch` overwrote while they were being read are
        read again, so no row comes back half-written (:meth:`Ring.overwritten`).

        Raises:
            ConcurrentUseError: they were overwritten during each of ``READ_ATTEMPTS`` reads in a row.
        """
        ring = self.ring
        done = ring.done
        batch = self._gather(slots, keys, with_index, span)
        if ring.begun == done:  # no write began meanwhile: the single-threaded path ends here, nothing more
            return batch
        return self._stable(
            lambda rows: self._gather(rows, keys, with_index, span if rows is slots else None), slots, None
        )

    def _stable(
        self,
        read: Callable[[torch.Tensor], TensorDict],
        slots: torch.Tensor,
        touched: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> TensorDict:
        """``read(slots)`` (a ``[k]`` batch), whose rows that a concurrent write may have changed meanwhile
        are read again, until none was: a seqlock, the writer marks rows begun before and done after
        writing them. ``touched(slots)``: every slot each row's read looks at (default: its own).

        Raises:
            ConcurrentUseError: rows were still being overwritten after ``READ_ATTEMPTS`` re-reads.
        """
        ring = self.ring
        done = ring.done  # before the pointer: a write ending between the two is then covered
        pointer = ring.pointer
        batch = read(slots)
        where = None  # positions in the batch of the rows read last (None: all of them)
        for attempt in range(READ_ATTEMPTS):
            if ring.begun == done:  # no write began since: the single-threaded path ends here
                return batch
            suspect = ring.overwritten(slots if touched is None else touched(slots), done, pointer)
            if suspect is None or not bool(suspect.any()):
                return batch
            if attempt:  # the writer may be waiting for the GIL or a core: let it finish its row
                time.sleep(min(1e-6 * 2**attempt, 0.05))
            where = suspect.nonzero().squeeze(1) if where is None else where[suspect]
            slots = slots[suspect]
            done = ring.done
            pointer = ring.pointer
            batch[where.to(batch.device)] = read(slots)
        raise ConcurrentUseError(
            f"thread {threading.current_thread().name!r} read rows that another thread's add()/add_batch() "
            f"was overwriting, again in each of {READ_ATTEMPTS} re-reads over about half a second: is a writer "
            "stuck in the middle of a write? Take a lock around writes and reads"
        )

    def _gather(
        self, slots: torch.Tensor, keys: list[Key] | None, with_index: bool, span: tuple[int, int] | None
    ) -> TensorDict:
        storage = self.storage
        staging = self.staging
        if staging is not None and storage.arrays is not None:  # CPU storage -> CUDA via pinned staging
            rows = slots.numpy() if span is None else slice(*span)
            wanted = storage.arrays.keys() if keys is None else keys
            values = staging.gather(storage.arrays, rows, wanted, {INDEX_KEY: slots} if with_index else None)
            return make_tensordict(values, slots.shape, self.device)
        values = storage.gather(slots, keys) if span is None else storage.gather_range(span[0], span[1], keys)
        if with_index:
            values[INDEX_KEY] = slots
        if self.device != self.storing_device:
            values = {k: self.to_device(v) for k, v in values.items()}
        schema = storage.schema
        return make_tensordict(values, slots.shape, self.device, schema is None or schema.nested)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the training device; non-blocking only host -> device (a non-blocking
        device -> host copy could be read before it lands)."""
        return tensor.to(self.device, non_blocking=self.device.type != "cpu")

    def read_transitions(
        self, slots: torch.Tensor, n_step: int | None, gamma: float, keys: TransitionKeys
    ) -> TensorDict:
        """:meth:`read`; when ``n_step`` is given, with n-step targets and ``discount``
        (:mod:`~objectrl_buffer.sampling.nstep`)."""
        if n_step is None:
            return self.read(slots)
        columns = self.storage.columns
        stride = self.num_envs

        def read(rows: torch.Tensor) -> TensorDict:
            targets = n_step_targets(columns, rows, self.ring, n_step, gamma, keys, stride=stride)
            batch = self._gather(rows, [key for key in columns if key not in targets], True, None)
            for key, value in targets.items():
                batch.set(key, self.to_device(value))
            return batch

        def window(rows: torch.Tensor) -> torch.Tensor:  # every row an n-step target may read
            n = min(n_step, max(1, self.ring.capacity // stride))
            return self.ring.forward(rows.unsqueeze(1), torch.arange(n, device=rows.device) * stride)

        return self._stable(read, slots, window)

    def slots(self, indices: Slots, name: str = "indices") -> torch.Tensor:
        """``indices`` as a validated 1-D int64 slot tensor on the storing device (see
        :func:`~objectrl_buffer.core.validate.slot_indices` for what is refused)."""
        return slot_indices(indices, self.ring, self.storing_device, name)

    def torchrl_view(self) -> TensorDictReplayBuffer:
        """A torchrl ``TensorDictReplayBuffer`` over the same storage (for reading), its length and write
        cursor brought in line with the ring. Built on first use."""
        if self._view is None:
            # compilable: plain-int counters, no multiprocessing.Value and its semaphore in /dev/shm
            writer = RoundRobinWriter(compilable=True)
            self._view = TensorDictReplayBuffer(storage=self.storage.torchrl, sampler=RandomSampler(), writer=writer)
        # after a metadata-only load the counters describe rows this storage does not hold
        length = self.ring.size if self.storage.initialized else 0
        torchrl_compat.sync_view(self.storage.torchrl, self._view.writer, length, self.ring.pointer)
        return self._view

    # ------------------------------------------------------------------ copies
    def __getstate__(self) -> dict[str, Any]:
        """What ``pickle``/``copy.deepcopy``/``torch.save`` keep: settings, the ring, the schema and the rows
        of slots ``0 .. size-1`` as new tensors (each at its slot). The storage, its files, the staging
        buffers and the torchrl view are rebuilt by the copy, never shared."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("storage", "staging", "_view")}
        storage = self.storage
        rows = None
        if storage.schema is not None:
            rows = {key: column[: self.ring.size].clone() for key, column in storage.columns.items()}
        state["rows"] = (storage.schema, rows, storage.closed)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        schema, rows, closed = state.pop("rows")
        self.__dict__.update(state)
        self.__dict__.setdefault("compact", None)
        self.__dict__.setdefault("end_keys", ())
        self.ring = Ring(*self.ring.state())  # never shared with the original
        self.storage = self.new_storage(self.ring.capacity, None if closed else self.storage_dir)
        self._view = None
        self.staging = self._new_staging()
        if closed:
            self.storage.close()
        elif schema is not None and rows is not None:
            self.storage.initialize(schema, {f.key: torch.zeros(f.shape, dtype=f.dtype) for f in schema.fields})
            n = self.ring.size
            # oldest first: a compact storage checks each row against the one before it
            oldest = (self.ring.pointer - n) % self.ring.capacity
            order = (torch.arange(n) + oldest) % self.ring.capacity
            pairs = [
                (field, rows[field.key].index_select(0, order.to(rows[field.key].device))) for field in schema.fields
            ]
            self.storage.write_rows(oldest, pairs, first=0, n=n)
