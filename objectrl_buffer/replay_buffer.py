"""ReplayBuffer: a drop-in for ObjectRL's ``experience_memory.ReplayBuffer``.

Same constructor, attributes and methods (see ``shared/reference/objectrl-upstream.md``), with the
upstream bugs fixed: ``get_next_batch`` works before any iterator exists, ``sample_by_index_fields``
takes a list, ``reset()`` frees memory at once, ``sample_all`` is oldest-to-newest after the ring
wraps, paths may be ``os.PathLike``, and bad input raises a clear error that changes nothing.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import RandomSampler, RoundRobinWriter, TensorDictReplayBuffer

from objectrl_buffer.checkpoint.data import BufferState
from objectrl_buffer.checkpoint.generations import (
    Checkpoint,
    Restored,
    build_from_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from objectrl_buffer.core.envs import check_env_step, flatten_steps, whole_steps
from objectrl_buffer.core.schema import INDEX_KEY, Key, Schema, require_mapping
from objectrl_buffer.core.seeding import derived_seed
from objectrl_buffer.errors import (
    CheckpointError,
    EmptyBufferError,
    InvalidArgumentError,
    SchemaError,
    SlotIndexError,
    StaleIteratorError,
)
from objectrl_buffer.sampling.nstep import check_n_step, n_step_targets
from objectrl_buffer.sampling.slices import StoredRows, TransitionKeys, pad_slices, require_keys, slice_positions
from objectrl_buffer.sampling.uniform import (
    chronological_slots,
    epoch_slots,
    num_batches,
    recent_slots,
    rows_still_held,
    uniform_slots,
    window_slots,
)
from objectrl_buffer.storage.staging import StagingRing
from objectrl_buffer.storage.table import TransitionStorage, make_tensordict

__all__ = ["ReplayBuffer"]

Transition: TypeAlias = TensorDictBase | Mapping[str, Any]
Slots: TypeAlias = Sequence[int] | range | torch.Tensor | int
RB = TypeVar("RB", bound="ReplayBuffer")


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool):  # bool has __index__, but True as a size is a bug in the caller
        raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(value, int):
        try:
            value = int(value.__index__())
        except (AttributeError, TypeError):
            raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}") from None
    if value <= 0:
        raise InvalidArgumentError(f"{name} must be a positive int, got {value}")
    return value


class ReplayBuffer:
    """A ring buffer of transitions over a torchrl storage, sampled onto the training device.

    Args:
        device: where samples are delivered (the training device), e.g. ``"cuda"`` or ``"cpu"``.
        storing_device: where rows are stored. ``"cpu"`` uses torchrl ``LazyMemmapStorage`` (files in
            ``storage_dir``); any other device a torchrl ``LazyTensorStorage`` on that device.
        buffer_size: capacity in transitions (> 0). The oldest rows are overwritten once full.
        print_gc_warning: accepted for ObjectRL compatibility; unused (nothing here needs a GC retry).
        seed: seed of the buffer's own ``torch.Generator``. Same seed and same writes give the same
            samples and shuffles; global RNG state is never touched. ``None``: derived from the global
            torch seed (``torch.manual_seed``) and the order in which buffers are built, so two runs
            seeded alike sample alike (see :mod:`~objectrl_buffer.core.seeding`).
        shuffle: default of ``shuffle`` for the epoch iterators (``False`` keeps ObjectRL's slot order).
            Setting it here lets unmodified ObjectRL trainers get shuffled epochs.
        storage_dir: parent folder for the CPU memmap files (e.g. a disk folder, to keep a large buffer
            out of RAM). ``None`` chooses at the first write (:mod:`~objectrl_buffer.storage.placement`):
            ``/dev/shm`` when the whole buffer takes at most a quarter of its free space, of the
            available memory and of the container's memory limit (all its pages are then reserved at
            once, so it never hits a full ``/dev/shm`` later), else the system temp folder
            (usually disk; reserved too where it is a tmpfs). A 64 MB ``/dev/shm`` works.
        transition_keys: names of the reward/next_state/terminated/truncated keys that n-step
            sampling and episode boundaries read (default: ObjectRL's names).
        num_envs: envs of a vector environment (``gymnasium.make_vec``) written together (>= 1, a
            divisor of ``buffer_size``). With ``num_envs > 1``, :meth:`add` takes one step of every env
            (``[num_envs]``) and :meth:`add_batch` ``[T, num_envs]`` (time-major); env ``e`` of a step
            goes to slot ``t * num_envs + e`` (mod ``buffer_size``), so a sample's env is
            ``index % num_envs``. Counters (``len``, ``pointer``, ``recent``) stay in rows. Uniform
            sampling draws over all rows; n-step returns and slices follow one env's stream and never
            cross into another; :meth:`sample_all` returns ``[T, num_envs]``. See
            :mod:`~objectrl_buffer.core.envs`.

    Attributes:
        device, storing_device (torch.device), buffer_size, data_size, pointer (int): ring state;
            ``pointer`` is the next slot written, slot ``pointer - 1`` the newest row.
        epoch_iterator: the iterator ``get_next_batch`` draws from, or ``None`` (random sampling).

    Rows are TensorDicts: a write is a ``TensorDict`` (batch size ``[]`` for ``add``, ``[N]`` for
    ``add_batch``) or a mapping of key -> tensor/array/number. The first write fixes the schema.
    Every sample is a new ``TensorDict`` on ``device`` (never a view of storage) carrying the stored
    keys plus ``"index"``: the storage slot of each row (int64).

    ``pickle``, ``copy.deepcopy`` and ``torch.save``/``torch.load(weights_only=False)`` give a full,
    independent buffer: its own storage holding the same rows at the same slots, the same counters,
    settings and generator state; an epoch iterator is not carried over (``epoch_iterator`` is ``None``).
    """

    def __init__(
        self,
        device: torch.device | str,
        storing_device: torch.device | str,
        buffer_size: int,
        print_gc_warning: bool = False,
        *,
        seed: int | None = None,
        shuffle: bool = False,
        storage_dir: str | os.PathLike[str] | None = None,
        transition_keys: TransitionKeys | None = None,
        num_envs: int = 1,
    ) -> None:
        self.device = torch.device(device)
        self.storing_device = torch.device(storing_device)
        self.num_envs = _positive_int(num_envs, "num_envs")
        self.buffer_size = self._env_multiple(_positive_int(buffer_size, "buffer_size"))
        self.print_gc_warning = print_gc_warning
        self.shuffle = shuffle
        self.storage_dir = storage_dir
        self.data_size = 0
        self.pointer = 0
        # Rows counted in data_size that hold no data (a metadata-only load): always the oldest ones,
        # so reads use the newest data_size - _phantom rows, and writes overwrite phantom rows first.
        self._phantom = 0
        self.epoch_iterator: Iterator[TensorDict] | None = None
        self.transition_keys = TransitionKeys() if transition_keys is None else transition_keys
        self._random_recent: int | None = None  # recency window of get_next_batch's random sampling
        self._cast_warned: set[Key] = set()  # keys whose tensors were cast/reshaped: CastWarning once each
        self.generator = torch.Generator(device=self.storing_device)
        # seed=None follows the global torch seed, as upstream's global sampling does (see seeding.py)
        self.generator.manual_seed(derived_seed() if seed is None else seed)
        self._generation = 0  # bumped by reset(): epoch iterators of an older generation are stale
        self._storage = TransitionStorage(self.buffer_size, self.storing_device, storage_dir)
        self._memory = self._make_memory()
        # CPU storage, CUDA training device: samples go through pinned staging (transfer.py)
        cuda_from_cpu = self.device.type == "cuda" and self.storing_device.type == "cpu"
        self._staging: StagingRing | None = StagingRing(self.device) if cuda_from_cpu else None

    # ------------------------------------------------------------------ ObjectRL attributes
    @property
    def memory(self) -> TensorDictReplayBuffer:
        """The torchrl ``TensorDictReplayBuffer`` over this buffer's storage (for reading).

        Its length and write cursor are brought in line with ``data_size``/``pointer`` on access.
        Write through :meth:`add`/:meth:`add_batch`, not through it.
        """
        # after a metadata-only load the counters describe rows this storage does not hold
        self._storage.torchrl._len = self.data_size if self._storage.initialized else 0
        self._memory._writer._cursor = self.pointer
        return self._memory

    def _env_multiple(self, buffer_size: int) -> int:
        """``buffer_size`` if whole env steps fill it, else :class:`InvalidArgumentError`."""
        if buffer_size % self.num_envs:
            raise InvalidArgumentError(
                f"buffer_size {buffer_size} is not a multiple of num_envs {self.num_envs}: every env step "
                "takes num_envs slots"
            )
        return buffer_size

    def _make_memory(self) -> TensorDictReplayBuffer:
        # compilable: plain-int counters, no multiprocessing.Value and its semaphore in /dev/shm (see storage.py)
        writer = RoundRobinWriter(compilable=True)
        return TensorDictReplayBuffer(storage=self._storage.torchrl, sampler=RandomSampler(), writer=writer)

    def __len__(self) -> int:
        return self.data_size

    @property
    def size(self) -> int:
        """Number of stored transitions (same as ``len(buffer)``)."""
        return self.data_size

    @property
    def schema(self) -> Schema | None:
        """Stored keys with per-row shapes and dtypes; ``None`` until the first write."""
        return self._storage.schema

    @property
    def storage_folder(self) -> str | None:
        """Folder holding the CPU memmap files: in ``storage_dir`` from the start, or chosen at the first
        write when ``storage_dir`` is ``None`` (``None`` until then, and on an accelerator)."""
        return self._storage.folder

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.data_size}/{self.buffer_size}, pointer={self.pointer}, "
            f"device={self.device}, storing_device={self.storing_device}, schema={self.schema!r})"
        )

    # ------------------------------------------------------------------ lifecycle
    def reset(self, buffer_size: int | None = None) -> None:
        """Empty the buffer, optionally with a new capacity; the next write may bring a new schema.

        CPU storage keeps its files and reserved pages for the next write of the same schema (a reset
        and that write then cost in proportion to the rows written, not the capacity); a new schema, a
        new size or :meth:`close` frees them now (not at the next garbage collection). Epoch iterators
        created before the reset raise :class:`StaleIteratorError` when advanced.

        Raises:
            InvalidArgumentError: ``buffer_size`` is not a positive int, or not a multiple of
                ``num_envs`` (the buffer is unchanged).
        """
        new_size = self.buffer_size if buffer_size is None else _positive_int(buffer_size, "buffer_size")
        self._env_multiple(new_size)
        if new_size != self.buffer_size:
            self._storage.resize(new_size)
            self.buffer_size = new_size
        else:
            self._storage.release()
        self.data_size = 0
        self.pointer = 0
        self._phantom = 0
        self._generation += 1

    def close(self) -> None:
        """Free the storage, its files and the pinned staging memory; the buffer cannot be used afterwards.

        Epoch iterators created before raise :class:`StaleIteratorError`, later writes
        :class:`ClosedBufferError`, and sampling :class:`EmptyBufferError`.
        """
        self._storage.close()
        self.data_size = self.pointer = self._phantom = 0
        self._generation += 1
        self.epoch_iterator = None
        self._staging = None

    def __enter__(self: RB) -> RB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ copies
    # Rebuilt by a copy, never copied: the storage (a copy gets its own, filled from the rows through
    # the normal write path), the torchrl view of it, the pinned staging, and the epoch iterator (it
    # reads the buffer it was made from). The generator travels as its state. multiprocessing's own
    # pickler uses these too (a full copy); sharing the storage with a child process instead is a
    # ForkingPickler.register of a reducer for the class, which takes precedence for that pickler only.
    _NOT_COPIED = ("_storage", "_memory", "_staging", "epoch_iterator", "generator")

    def __getstate__(self) -> dict[str, Any]:
        """What ``pickle``, ``copy.deepcopy`` and ``torch.save`` keep: every setting and counter, the
        generator state, the schema and the rows of slots ``0 .. data_size-1`` as new tensors (only the
        filled slots, each at its slot)."""
        state = {key: value for key, value in self.__dict__.items() if key not in self._NOT_COPIED}
        storage = self._storage
        rows = None
        if storage.schema is not None:
            rows = {key: column[: self.data_size].clone() for key, column in storage.columns.items()}
        state["_copied_rows"] = (storage.schema, rows, storage.closed)
        state["_copied_generator"] = (self.generator.device, self.generator.get_state())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild a buffer from :meth:`__getstate__`: its own storage (and private folder, removed at
        :meth:`close` or exit) holding the same rows at the same slots; no epoch iterator."""
        state = dict(state)
        schema, rows, closed = state.pop("_copied_rows")
        generator_device, generator_state = state.pop("_copied_generator")
        # Tensor attributes (a subclass's priorities, ...) are cloned: multiprocessing's pickler hands
        # tensors over in shared memory, which would tie the copy to the original.
        self.__dict__.update({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()})
        self.epoch_iterator = None
        self.generator = torch.Generator(device=generator_device)
        self.generator.set_state(generator_state)
        self._storage = TransitionStorage(self.buffer_size, self.storing_device, None if closed else self.storage_dir)
        if closed:
            self._storage.close()
        elif schema is not None:
            self._storage.initialize(schema, {f.key: torch.zeros(f.shape, dtype=f.dtype) for f in schema.fields})
            n = self.data_size
            self._storage.write_rows(0, [(field, rows[field.key]) for field in schema.fields], first=0, n=n)
        self._memory = self._make_memory()
        cuda_from_cpu = self.device.type == "cuda" and self.storing_device.type == "cpu"
        self._staging = StagingRing(self.device) if cuda_from_cpu else None

    # ------------------------------------------------------------------ writes
    def add(self, transition: Transition) -> None:
        """Store one transition at slot ``pointer``.

        Args:
            transition: a ``TensorDict`` with batch size ``[]`` or a mapping of key -> value, each value
                one row (tensor, NumPy array or Python number). An ``"index"`` key is ignored.

        With ``num_envs > 1``: one step of every env, a ``TensorDict`` of batch size ``[num_envs]`` or a
        mapping of values with a leading dimension ``num_envs``; env ``e``'s row goes to slot
        ``pointer + e``.

        Raises:
            SchemaError: keys, shapes or dtypes differ from the stored schema beyond a lossless cast or
                size-1 reshape (the rule: :mod:`objectrl_buffer.core.schema`), a value does not fit its
                column, or (``num_envs > 1``) a value's leading dimension is not ``num_envs`` (nothing is
                stored).
            InvalidArgumentError: a batched TensorDict (use :meth:`add_batch`) or a non-mapping.

        Warns:
            CastWarning: once per key per buffer, when a tensor was cast or reshaped to be stored.
        """
        if self.num_envs > 1:  # before the fast path, which would take a dict of numbers as one row
            self._add_env_step(transition)
            return
        fast = self._storage.fast
        if fast is not None and fast.write_row(transition, self.pointer):
            pointer = self.pointer + 1
            self.pointer = pointer if pointer < self.buffer_size else 0
            if self.data_size < self.buffer_size:
                self.data_size += 1
            elif self._phantom:  # the full ring overwrote its oldest row: a phantom one
                self._phantom -= 1
            return
        if isinstance(transition, TensorDictBase):
            if transition.batch_dims:
                raise InvalidArgumentError(
                    f"add() takes one transition (batch_size []), got batch_size {list(transition.batch_size)}: "
                    "use add_batch() for several"
                )
        elif not isinstance(transition, Mapping):
            require_mapping(transition, "add")
        storage = self._storage
        pointer = self.pointer
        if storage.schema is None:
            schema, values = Schema.infer(transition, batch_dims=0)
            storage.initialize(schema, values)
            pairs: list[tuple[Any, Any]] = [(schema.by_key[k], v) for k, v in values.items()]
        else:
            pairs, _ = storage.schema.check(transition, batch_dims=0, warned=self._cast_warned)
        storage.write(pointer, pairs)
        self.pointer = pointer + 1 if pointer + 1 < self.buffer_size else 0
        if self.data_size < self.buffer_size:
            self.data_size += 1
        elif self._phantom:
            self._phantom -= 1

    def _add_env_step(self, step: Transition) -> tuple[int, int]:
        """:meth:`add` with ``num_envs > 1``; returns ``(start, kept)`` as :meth:`_add_batch`."""
        check_env_step(step, self.num_envs)
        return self._add_batch(step, rows=True)

    def add_batch(self, batch: Transition) -> None:
        """Store ``N`` transitions at slots ``pointer, pointer+1, ...`` (wrapping around).

        Args:
            batch: a ``TensorDict`` with batch size ``[N]`` or a mapping of key -> tensor/array with a
                leading dimension ``N``. When ``N > buffer_size`` only the newest ``buffer_size`` rows are
                kept (as if added one by one). An ``"index"`` key is ignored.

        With ``num_envs > 1``: ``T`` steps of every env, time-major (as a rollout is collected): a
        ``TensorDict`` of batch size ``[T, num_envs]`` or a mapping of values of shape
        ``[T, num_envs, ...]``; they are stored as ``T`` calls of :meth:`add` would store them.

        Raises:
            SchemaError: keys, per-row shapes or dtypes differ from the stored schema beyond a lossless
                cast or size-1 reshape, a value does not fit its column, keys disagree on ``N``, or (with
                ``num_envs > 1``) a value lacks the ``num_envs`` dimension (nothing is stored).
            InvalidArgumentError: a TensorDict whose batch size is not 1-D (2-D with ``num_envs > 1``),
                or a non-mapping.

        Warns:
            CastWarning: as :meth:`add`.
        """
        self._add_batch(batch)

    def _add_batch(self, batch: Transition, rows: bool = False) -> tuple[int, int]:
        """:meth:`add_batch`; returns ``(start, kept)``: the rows kept went to slots ``start, start+1, ...``
        (mod ``buffer_size``), ``kept`` of them (0 for an empty batch). ``rows``: ``batch`` is already
        ``[N]`` rows, even with ``num_envs > 1``."""
        if self.num_envs > 1 and not rows:
            batch = flatten_steps(batch, self.num_envs)
        fast = self._storage.fast
        if fast is not None:
            n = fast.write_batch(batch, self.pointer, self.buffer_size)
            if n >= 0:
                return self._advance(n)
        if isinstance(batch, TensorDictBase):
            if batch.batch_dims != 1:
                raise InvalidArgumentError(
                    f"add_batch() takes a TensorDict of batch_size [N], got {list(batch.batch_size)}"
                )
        else:
            require_mapping(batch, "add_batch")
        storage = self._storage
        if storage.schema is None:
            schema, values = Schema.infer(batch, batch_dims=1)
            n = next(iter(values.values())).shape[0]
            if n == 0:
                return self.pointer, 0
            storage.initialize(schema, {k: v[0] for k, v in values.items()})
            pairs: list[tuple[Any, Any]] = [(schema.by_key[k], v) for k, v in values.items()]
        else:
            pairs, n = storage.schema.check(batch, batch_dims=1, warned=self._cast_warned)
            if n == 0:
                return self.pointer, 0
        kept = min(n, self.buffer_size)
        storage.write_rows((self.pointer + n - kept) % self.buffer_size, pairs, first=n - kept, n=kept)
        return self._advance(n)

    def _advance(self, n: int) -> tuple[int, int]:
        """Move the ring past ``n`` rows just written; return ``(start, kept)`` as :meth:`_add_batch`."""
        capacity = self.buffer_size
        kept = min(n, capacity)
        start = (self.pointer + n - kept) % capacity
        if self._phantom:  # rows past the capacity overwrite the oldest ones, phantom ones first
            self._phantom = max(0, self._phantom - max(0, self.data_size + n - capacity))
        self.pointer = (self.pointer + n) % capacity
        self.data_size = min(self.data_size + n, capacity)
        return start, kept

    # ------------------------------------------------------------------ reads
    @property
    def _held(self) -> int:
        """Rows that hold data: the newest ``data_size - phantom`` (all of them but after a metadata-only load)."""
        return self.data_size - self._phantom

    def _require_rows(self) -> None:
        if self.data_size == 0:
            raise EmptyBufferError("cannot sample from an empty buffer: add transitions first")
        if self._storage.schema is None or self._phantom == self.data_size:
            raise EmptyBufferError(
                f"the buffer counts {self.data_size} rows but holds no data: load() restored metadata only"
            )

    def _read(
        self,
        slots: torch.Tensor,
        keys: list[Key] | None = None,
        with_index: bool = True,
        span: tuple[int, int] | None = None,
    ) -> TensorDict:
        """Rows at ``slots`` (on the storing device) as a new TensorDict on ``self.device``.

        ``span=(start, stop)`` says that ``slots`` is ``start .. stop-1``: read as one contiguous copy.
        """
        storage = self._storage
        staging = self._staging
        if staging is not None and storage.arrays is not None:  # CPU storage -> CUDA via pinned staging
            rows = slots.numpy() if span is None else slice(*span)
            wanted = storage.arrays.keys() if keys is None else keys
            values = staging.gather(storage.arrays, rows, wanted, {INDEX_KEY: slots} if with_index else None)
            return make_tensordict(values, slots.shape, self.device)
        values = storage.gather(slots, keys) if span is None else storage.gather_range(span[0], span[1], keys)
        if with_index:
            values[INDEX_KEY] = slots
        if self.device != self.storing_device:
            values = {k: self._to_device(v) for k, v in values.items()}
        return make_tensordict(values, slots.shape, self.device)

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the training device; non-blocking only host -> device (a non-blocking
        device -> host copy could be read before it lands)."""
        return tensor.to(self.device, non_blocking=self.device.type != "cpu")

    def _as_slots(self, indices: Slots, name: str = "indices") -> torch.Tensor:
        """Validated int64 slot tensor on the storing device (``name``: the argument, for errors)."""
        if isinstance(indices, torch.Tensor):
            if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
                raise InvalidArgumentError(f"{name} must be integers, got a tensor of dtype {indices.dtype}")
            slots = indices.to(device=self.storing_device, dtype=torch.int64)
        else:
            try:
                # No dtype= here: it would truncate 0.9 to slot 0 and read True as slot 1.
                values = torch.as_tensor(indices if isinstance(indices, (Sequence, int, float)) else list(indices))
            except (TypeError, ValueError, RuntimeError) as exc:
                raise InvalidArgumentError(f"{name} must be ints, a range, a list or a tensor of ints: {exc}") from None
            if values.numel() and (values.is_floating_point() or values.is_complex() or values.dtype == torch.bool):
                raise InvalidArgumentError(f"{name} must be integers, got {indices!r}")
            slots = values.to(device=self.storing_device, dtype=torch.int64)
        slots = slots.reshape(-1)
        if slots.numel():
            low, high = int(slots.min()), int(slots.max())
            if low < 0 or high >= self.data_size:
                bad = low if low < 0 else high
                raise SlotIndexError(f"index {bad} is out of range for a buffer of {self.data_size} rows")
            if self._phantom:
                position = (slots - (self.pointer - self.data_size)).remainder_(self.buffer_size)
                phantom = position < self._phantom
                if bool(phantom.any()):
                    bad = int(slots[phantom][0])
                    raise SlotIndexError(
                        f"index {bad} is a slot that holds no data: the buffer counts {self.data_size} rows, "
                        f"but only the newest {self._held} were written since load() restored counters only"
                    )
        return slots

    def sample_batch(
        self, batch_size: int, *, n_step: int | None = None, gamma: float = 0.99, recent: int | None = None
    ) -> TensorDict:
        """``batch_size`` rows drawn uniformly with replacement (``batch_size > len`` is fine).

        Args:
            batch_size: rows to draw (> 0).
            n_step: when given (any ``n >= 1``, 1 included), ``reward`` becomes the discounted sum of
                up to ``n`` rewards from each drawn row on, ``next_state``/``terminated``/``truncated``
                come from the row the sum stopped at, and a ``discount`` key holds ``gamma ** steps``
                (float32; ``gamma`` on every row at ``n = 1``). The sum stops early at an episode end
                (a truncation stops it but is not a termination) and at the newest row. Key names:
                ``transition_keys``. See :mod:`objectrl_buffer.sampling.nstep`. ``None`` (default): the
                stored rows as they are, no ``discount``.
            gamma: the n-step discount, in ``[0, 1]`` (unused when ``n_step`` is not given).
            recent: draw only from the newest ``recent`` rows (all rows if fewer are stored); with
                ``num_envs > 1`` rounded up to whole env steps.

        Returns:
            TensorDict of batch size ``[batch_size]`` on ``device``, with ``"index"`` (slots).

        Raises:
            EmptyBufferError: the buffer holds no rows.
            InvalidArgumentError: ``batch_size`` or ``recent`` is not a positive int, ``n_step`` is
                not an int >= 1, or ``gamma`` is outside ``[0, 1]``.
            SchemaError: n-step sampling needs a key that is not stored.
        """
        k = _positive_int(batch_size, "batch_size")
        if n_step is None and recent is None and not self._phantom:  # the per-gradient-step path
            self._require_rows()
            return self._read(uniform_slots(self.data_size, k, self.generator))
        n, g = (None, 0.0) if n_step is None else check_n_step(n_step, gamma)
        window = None if recent is None else whole_steps(_positive_int(recent, "recent"), self.num_envs)
        self._require_rows()
        if window is None and not self._phantom:
            slots = uniform_slots(self.data_size, k, self.generator)
        else:  # the newest rows: a window, or those that hold data
            held = self._held
            slots = recent_slots(self.pointer, held, self.buffer_size, window or held, k, self.generator)
        return self._read_transitions(slots, n, g)

    def _read_transitions(self, slots: torch.Tensor, n_step: int | None, gamma: float) -> TensorDict:
        """:meth:`_read`, with the n-step keys replaced and ``discount`` added when ``n_step`` is given."""
        if n_step is None:
            return self._read(slots)
        columns = self._storage.columns
        targets = n_step_targets(
            columns,
            slots,
            self.pointer,
            self._held,
            self.buffer_size,
            n_step,
            gamma,
            self.transition_keys,
            stride=self.num_envs,
        )
        batch = self._read(slots, [key for key in columns if key not in targets])
        for key, value in targets.items():
            batch.set(key, self._to_device(value))
        return batch

    def sample_random(self, batch_size: int) -> TensorDict:
        """Alias of :meth:`sample_batch` (ObjectRL's name)."""
        return self.sample_batch(batch_size)

    def sample_by_index(self, indices: Slots) -> TensorDict:
        """Rows at storage slots ``indices`` (list, range, int or tensor), in that order.

        Slots are physical ring positions: slot ``pointer - 1`` is the newest row.

        Returns:
            TensorDict of batch size ``[len(indices)]`` on ``device``, with ``"index"``.

        Raises:
            SlotIndexError: an index is negative or ``>= len(buffer)``, or names a slot counted but holding
                no data (after a metadata-only :meth:`load`).
            InvalidArgumentError: an index is not an integer (floats, bools, complex numbers).
            EmptyBufferError: the buffer holds no data.
        """
        slots = self._as_slots(indices)
        if slots.numel():
            self._require_rows()
        return self._read(slots)

    def sample_by_index_fields(self, indices: Slots, fields: str | Key | Iterable[Key]) -> TensorDict:
        """Only ``fields`` (a key or a list of keys) of the rows at ``indices``.

        Returns:
            TensorDict of batch size ``[len(indices)]`` on ``device`` with exactly those keys.

        Raises:
            SchemaError: a field is not a stored key. SlotIndexError: as :meth:`sample_by_index`.
        """
        keys: list[Key] = [fields] if isinstance(fields, (str, tuple)) else list(fields)
        # ("reward",) is tensordict's spelling of "reward" (ObjectRL code passes 1-tuples).
        keys = [k[0] if isinstance(k, tuple) and len(k) == 1 else k for k in keys]
        schema = self._storage.schema
        slots = self._as_slots(indices)
        self._require_rows()
        assert schema is not None
        for key in keys:
            if key not in schema.by_key:
                raise SchemaError(f"field {key!r} is not stored; stored keys: {[f.key for f in schema.fields]}")
        return self._read(slots, keys, with_index=False)

    def sample_slices(
        self, num_slices: int, slice_len: int, *, done_key: Key | None = None, pad: bool = False
    ) -> TensorDict:
        """``num_slices`` runs of ``slice_len`` consecutive transitions, each inside one episode.

        With ``num_envs > 1`` a slice is consecutive steps of one env (slots ``s, s + num_envs, ...``).
        A slice never crosses an episode end (a row with a non-zero ``terminated`` or ``truncated``,
        or ``done_key`` if given; the end row itself may be a slice's last row) nor the write head
        (the seam between the newest and the oldest row). Starts are drawn uniformly with replacement
        among all valid ones. Episode segments shorter than ``slice_len`` are skipped, or with
        ``pad=True`` drawn whole (from their first row) and padded.

        Returns:
            TensorDict of batch size ``[num_slices, slice_len]`` on ``device``, rows in time order,
            with ``"index"`` (slots). With ``pad=True`` also ``"mask"`` (bool, ``False`` on padding,
            where every value is zero and ``"index"`` is -1).

        Raises:
            InvalidArgumentError: ``num_slices`` or ``slice_len`` is not a positive int, or
                ``slice_len > buffer_size // num_envs`` (the steps one env holds).
            EmptyBufferError: the buffer holds no rows, or no slice fits (the message names the
                longest stored episode segment).
            SchemaError: an episode-end key is not stored.

        Cost: ``O(num_slices * slice_len)`` when valid slices are common (rejection sampling over the
        done flags); ``O(len)`` when they are rare or absent (a table of all valid starts).
        """
        k = _positive_int(num_slices, "num_slices")
        length = _positive_int(slice_len, "slice_len")
        if length > self.buffer_size // self.num_envs:
            per_env = "" if self.num_envs == 1 else f" per env, num_envs={self.num_envs}"
            raise InvalidArgumentError(
                f"slice_len {length} is larger than the buffer ({self.buffer_size // self.num_envs} rows{per_env})"
            )
        self._require_rows()
        columns = self._storage.columns
        end_keys = self.transition_keys.episode_end if done_key is None else (done_key,)
        require_keys(columns, end_keys, "sample_slices")
        rows = StoredRows(columns, end_keys, self.pointer, self._held, self.buffer_size, self.num_envs)
        positions, mask = slice_positions(rows, k, length, pad, self.generator)
        batch = self._read(rows.slots(positions.reshape(-1))).reshape(k, length)
        return pad_slices(batch, mask.to(self.device), INDEX_KEY) if pad else batch

    def sample_all(self) -> TensorDict:
        """Every stored row, oldest to newest (also after the ring wraps), with ``"index"`` (slots).

        Returns:
            TensorDict of batch size ``[len]``; with ``num_envs > 1``, ``[T, num_envs]`` (``T = len //
            num_envs`` steps, oldest first; column ``e`` is env ``e``'s stream), ready for a backward
            GAE pass over the time dimension.

        Raises:
            EmptyBufferError: the buffer holds no data.
        """
        self._require_rows()
        rows = self._read(chronological_slots(self.pointer, self._held, self.buffer_size, self.storing_device))
        # slots are time-major (t * num_envs + e) and data_size counts whole steps
        return rows if self.num_envs == 1 else rows.reshape(-1, self.num_envs)

    # ------------------------------------------------------------------ epochs and iterations
    def calculate_num_batches(self, batch_size: int) -> int:
        """Batches in one epoch: ``ceil(len / batch_size)``, counting the last partial one."""
        return num_batches(self._held, _positive_int(batch_size, "batch_size"))

    def create_epoch_iterator(
        self, batch_size: int, n_epochs: int = 1, shuffle: bool | None = None, *, recent: int | None = None
    ) -> Iterator[TensorDict]:
        """An iterator of ``n_epochs`` epochs over the rows stored now, stored in ``epoch_iterator``.

        Each epoch yields ``ceil(N / batch_size)`` TensorDicts (the last one partial) covering every
        one of the ``N`` rows exactly once: in slot order, or a fresh permutation per epoch when
        ``shuffle`` (default: the buffer's ``shuffle``). Rows are read when each batch is yielded.
        With ``recent=m`` the epochs cover only the newest ``N = min(m, len)`` rows (oldest first
        unless shuffled), those stored when the iterator is created; with ``num_envs > 1``, ``m`` is
        rounded up to whole env steps.

        Raises:
            InvalidArgumentError: ``batch_size``, ``n_epochs`` or ``recent`` is not a positive int.
            EmptyBufferError: the buffer holds no data.
        """
        bs = _positive_int(batch_size, "batch_size")
        epochs = _positive_int(n_epochs, "n_epochs")
        window = None if recent is None else whole_steps(_positive_int(recent, "recent"), self.num_envs)
        self._require_rows()
        shuffle = self.shuffle if shuffle is None else shuffle
        rows = None
        if window is not None or self._phantom:  # the newest rows: a window, or those that hold data
            held = self._held
            rows = window_slots(self.pointer, held, self.buffer_size, window or held, self.storing_device)
        size = self.data_size if rows is None else rows.numel()
        # The generation is taken now, not at the first next(): a generator body runs lazily.
        self.epoch_iterator = self._epochs(self._generation, size, bs, epochs, shuffle, rows)
        return self.epoch_iterator

    def _epochs(
        self,
        generation: int,
        size: int,
        batch_size: int,
        n_epochs: int,
        shuffle: bool,
        rows: torch.Tensor | None = None,
    ) -> Iterator[TensorDict]:
        """Epochs over positions ``0 .. size-1``: slots themselves, or indices into ``rows`` (slots)."""
        for _ in range(n_epochs):
            batches: Iterator[tuple[torch.Tensor, tuple[int, int] | None]]
            if shuffle:
                batches = ((slots, None) for slots in epoch_slots(size, batch_size, True, self.generator))
            else:
                # slot order (ObjectRL's): each batch is a contiguous range, and a slice copy beats an
                # indexed gather ~2x
                spans = ((start, min(start + batch_size, size)) for start in range(0, size, batch_size))
                batches = ((torch.arange(start, stop), (start, stop)) for start, stop in spans)
            for slots, span in batches:
                if generation != self._generation:
                    raise StaleIteratorError("the buffer was reset after this epoch iterator was created")
                # a window's positions index into its slots, which may wrap: gather those
                yield self._read(slots, span=span) if rows is None else self._read(rows[slots])

    def get_steps_and_iterator(
        self,
        n_epochs: int,
        max_iter: int,
        batch_size: int,
        shuffle: bool | None = None,
        *,
        recent: int | None = None,
    ) -> int:
        """Prepare a learning phase; return how many gradient steps it has.

        ``n_epochs > 0``: builds the epoch iterator and returns ``n_epochs * ceil(N / batch_size)``.
        Otherwise sets ``epoch_iterator = None`` (random sampling) and returns ``max_iter``.
        ``recent=m`` limits both to the newest ``m`` rows (``N = min(m, len)``); it applies to the
        random batches of :meth:`get_next_batch` until the next call of this method (with
        ``num_envs > 1`` rounded up to whole env steps).

        Raises:
            InvalidArgumentError: ``recent`` is not a positive int (and as :meth:`create_epoch_iterator`).
        """
        window = None if recent is None else whole_steps(_positive_int(recent, "recent"), self.num_envs)
        if n_epochs > 0:
            self.create_epoch_iterator(batch_size, n_epochs, shuffle, recent=window)
            self._random_recent = window
            rows = self._held if window is None else min(window, self._held)
            return n_epochs * num_batches(rows, _positive_int(batch_size, "batch_size"))
        self.epoch_iterator = None
        self._random_recent = window
        return max_iter

    def get_next_batch(self, batch_size: int) -> TensorDict:
        """The next batch of ``epoch_iterator``, or ``sample_batch(batch_size)`` when there is none
        (from the newest rows only, if :meth:`get_steps_and_iterator` was given ``recent``).

        Raises:
            StopIteration: the epoch iterator is exhausted (as ObjectRL's buffer does).
        """
        if self.epoch_iterator is None:
            return self.sample_batch(batch_size, recent=self._random_recent)
        return next(self.epoch_iterator)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str], data: bool = False, *, progress: bool | None = None) -> None:
        """Save a checkpoint at ``path``; crash-safe (see :mod:`objectrl_buffer.checkpoint.generations`).

        ``data=False`` (ObjectRL's behaviour) writes only ``path + ".metadata"``: a dict of ints
        (``buffer_size``, ``data_size``, ``pointer``) readable by plain ``torch.load``. ``data=True``
        also writes every row, the schema, the generator state and ``shuffle`` into a data folder
        ``path + ".data-<id>"`` (raw column files, JSON manifest, crc32 checksums), in chunks, with
        no pickle. ``progress``: a tqdm bar (``None``: only when stderr is a terminal and not in CI).

        Raises:
            CheckpointError: the destination cannot be written (a file where a folder is expected or
                the reverse, read-only, disk full, ...), naming the path; the previous checkpoint at
                ``path`` stays intact and loadable. CheckpointNotFoundError: the folder does not exist.
        """
        save_checkpoint(path, self._checkpoint_state(), data=data, progress=progress)

    def load(self, path: str | os.PathLike[str], *, verify: bool = True, progress: bool | None = None) -> None:
        """Restore what ``save(path, ...)`` wrote.

        A metadata-only checkpoint restores ``buffer_size``, ``data_size``, ``pointer`` (ObjectRL's
        behaviour). Rows it counts that this buffer does not hold (all of them in a new process) are
        never returned: every read (sampling, n-step, slices, epochs, ``sample_all``, PER) uses only the
        newest rows, those written since, and an index of such a slot raises :class:`SlotIndexError`.
        ``len()`` and ``pointer`` stay as restored; rows written later replace the missing ones first as
        the ring wraps. A ``RuntimeWarning`` says how many rows hold no data.

        A full checkpoint restores every row at its slot, the ring state, the schema, the generator
        state (same next samples; on a storing device of another type the generator is re-seeded with
        the saved seed instead) and ``shuffle``, onto this buffer's storing device.
        ``verify`` checks every crc32 checksum (``False`` skips that read-time cost).

        A buffer holding rows only loads a checkpoint of the same ``buffer_size`` (and schema, and
        ``num_envs``); an empty buffer adopts the saved capacity, schema and ``num_envs`` (a checkpoint
        without ``num_envs``, from before it existed, has 1).

        Raises:
            CheckpointNotFoundError, CheckpointError: missing, damaged or unsupported checkpoint, or
                a capacity/schema that does not fit; the buffer is then unchanged.
        """
        load_checkpoint(self, path, verify=verify, progress=progress)

    @classmethod
    def from_checkpoint(
        cls: type[RB],
        path: str | os.PathLike[str],
        device: torch.device | str | None = None,
        storing_device: torch.device | str | None = None,
        *,
        verify: bool = True,
        progress: bool | None = None,
        **kwargs: Any,
    ) -> RB:
        """A new buffer of the saved capacity holding the checkpoint at ``path``.

        ``device``/``storing_device`` default to those recorded at save time when available here,
        else ``"cpu"``. ``kwargs`` go to the constructor (``seed`` is overridden by a saved generator
        state; an explicit ``shuffle`` wins over the saved one; a subclass's saved settings, such as
        a PrioritizedReplayBuffer's ``alpha``/``beta``/``eps``, are used unless given here; a full
        checkpoint's ``num_envs`` is always the saved one: a different one given is a :class:`CheckpointError`).

        Raises:
            CheckpointNotFoundError, CheckpointError: as :meth:`load`.
        """
        buffer = build_from_checkpoint(
            lambda d, s, ckpt: cls(d, s, ckpt.meta["buffer_size"], **cls._checkpoint_kwargs(ckpt, kwargs)),
            lambda b: b.load(path, verify=verify, progress=progress),
            lambda b: b.close(),
            path,
            device,
            storing_device,
        )
        if "shuffle" in kwargs:
            buffer.shuffle = kwargs["shuffle"]
        return buffer

    # ------------------------------------------------------------------ checkpoint hooks
    @classmethod
    def _checkpoint_kwargs(cls, ckpt: Checkpoint, given: dict[str, Any]) -> dict[str, Any]:
        """The constructor keyword arguments of :meth:`from_checkpoint`: those ``given``, plus the saved
        ``num_envs`` of a full checkpoint and any a subclass takes from the checkpoint.

        Raises:
            CheckpointError: ``num_envs`` is given and differs from the saved one.
        """
        kwargs = dict(given)
        if ckpt.manifest is not None:  # a metadata-only checkpoint keeps the buffer's num_envs
            saved = ckpt.manifest.num_envs
            if kwargs.setdefault("num_envs", saved) != saved:
                raise CheckpointError(
                    f"'{ckpt.data_folder}' was saved with num_envs={saved}, not num_envs={given['num_envs']}"
                )
        return kwargs

    def _checkpoint_state(self) -> BufferState:
        """References to everything a checkpoint holds (nothing is copied)."""
        return BufferState(
            buffer_size=self.buffer_size,
            data_size=self.data_size,
            pointer=self.pointer,
            schema=self._storage.schema,
            columns=self._storage.columns,
            generator=self.generator,
            shuffle=self.shuffle,
            device=self.device,
            storing_device=self.storing_device,
            storage_dir=self.storage_dir,
            phantom=self._phantom,
            num_envs=self.num_envs,
        )

    def _check_checkpoint(self, restored: Restored) -> None:
        """Raise :class:`CheckpointError` if this buffer cannot adopt ``restored`` (a plain buffer adopts any)."""

    def _restore_checkpoint(self, restored: Restored) -> None:
        """Adopt a checkpoint that :func:`~objectrl_buffer.checkpoint.generations.load_checkpoint` has checked."""
        if restored.storage is None:  # metadata only: counters over the rows held, as ObjectRL
            if restored.buffer_size != self.buffer_size:
                self.reset(restored.buffer_size)
            # only rows this buffer wrote are data; the counters may count more (all, in a new process)
            held = self._held if self._storage.initialized else 0
            held = rows_still_held(self.pointer, held, restored.pointer, restored.data_size, restored.buffer_size)
            phantom = restored.data_size - held
            if phantom:
                warnings.warn(
                    f"'{restored.source}' is a metadata-only checkpoint: {phantom} rows are counted "
                    f"(len() == {restored.data_size}) but hold no data, and will not be sampled; rows "
                    "written from now on replace them as the ring wraps",
                    RuntimeWarning,
                    stacklevel=4,
                )
        else:
            phantom = restored.phantom
            old, self._storage = self._storage, restored.storage
            self.buffer_size = restored.buffer_size
            self._memory = self._make_memory()
            old.close()
        self._generation += 1  # epoch iterators over the old rows (or old counters) are stale
        self.epoch_iterator = None
        if restored.generator_state is not None:
            self.generator.set_state(restored.generator_state)
        elif restored.generator_seed is not None:
            self.generator.manual_seed(restored.generator_seed)
        if restored.shuffle is not None:
            self.shuffle = restored.shuffle
        self.data_size = restored.data_size
        self.pointer = restored.pointer
        self._phantom = phantom
        self.num_envs = restored.num_envs
