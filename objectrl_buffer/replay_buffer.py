"""ReplayBuffer: a drop-in for ObjectRL's ``experience_memory.ReplayBuffer``.

Only the contract lives here: ObjectRL's constructor, attributes and methods, their argument checks,
and which slots each sampling method reads. Rows are written and read by the
:class:`~objectrl_buffer.engine.Engine`; slots are chosen by :mod:`objectrl_buffer.sampling`;
checkpoints are made by :mod:`objectrl_buffer.checkpoint`. Upstream's bugs are fixed (see the README):
``get_next_batch`` works before any iterator exists, ``sample_by_index_fields`` takes a list, ``reset()``
frees memory, ``sample_all`` is oldest-to-newest after the ring wraps, bad input changes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import torch
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer

from objectrl_buffer.checkpoint.data import BufferState
from objectrl_buffer.checkpoint.extras import ExtraState, saved_kwargs
from objectrl_buffer.checkpoint.generations import (
    Restored,
    load_checkpoint,
    restore_devices,
    save_checkpoint,
)
from objectrl_buffer.checkpoint.state_dict import make_state_dict, restore_state_dict
from objectrl_buffer.core import validate
from objectrl_buffer.core.envs import whole_steps
from objectrl_buffer.core.keys import INDEX_KEY
from objectrl_buffer.core.schema import Key, as_keys, format_key
from objectrl_buffer.core.seeding import derived_seed
from objectrl_buffer.core.validate import env_multiple, integer, positive_int
from objectrl_buffer.engine import Engine, Slots, Transition
from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.sampling.nstep import check_n_step
from objectrl_buffer.sampling.slices import StoredRows, TransitionKeys, pad_slices, require_keys, slice_positions
from objectrl_buffer.sampling.uniform import epochs, num_batches, recent_slots, uniform_slots

__all__ = ["ReplayBuffer"]

RB = TypeVar("RB", bound="ReplayBuffer")


class ReplayBuffer:
    """A ring buffer of transitions over a torchrl storage, sampled onto the training device.

    Args:
        device: where samples are delivered (the training device), e.g. ``"cuda"`` or ``"cpu"``.
        storing_device: where rows live: ``"cpu"`` is torchrl ``LazyMemmapStorage`` (files in
            ``storage_dir``), any other device a torchrl ``LazyTensorStorage`` there.
        buffer_size: capacity in transitions (> 0); the oldest rows are overwritten once full.
        print_gc_warning: accepted for ObjectRL compatibility; unused.
        seed: seed of the buffer's own ``torch.Generator`` (the global RNG is never touched). ``None``:
            derived from the global torch seed and the order buffers are built in
            (:mod:`~objectrl_buffer.core.seeding`), so runs seeded alike sample alike.
        shuffle: default ``shuffle`` of the epoch iterators (``False``: ObjectRL's slot order).
        storage_dir: parent folder of the CPU files; ``None`` chooses at the first write
            (:mod:`~objectrl_buffer.storage.placement`: ``/dev/shm`` when the whole buffer fits in a
            quarter of its room, reserved as rows are written, else the temp folder).
        transition_keys: key names n-step sampling and episode ends read (default: ObjectRL's).
        num_envs: envs of a vector environment written together (a divisor of ``buffer_size``):
            :meth:`add` takes ``[num_envs]`` steps, :meth:`add_batch` ``[T, num_envs]``; env ``e`` of
            step ``t`` goes to slot ``t * num_envs + e``; n-step returns and slices never cross envs.

    Attributes:
        device, storing_device, buffer_size, data_size, pointer: as ObjectRL's (``pointer`` is the
            next slot written). epoch_iterator: what :meth:`get_next_batch` draws from, or ``None``.
        checkpoint_extras: :class:`~objectrl_buffer.checkpoint.extras.ExtraState` objects whose state
            full checkpoints carry (a subclass or room appends its own).

    Samples are new ``TensorDict`` s on ``device`` with the stored keys and ``"index"`` (each row's
    slot). ``pickle``/``copy.deepcopy``/``torch.save`` give a full, independent buffer (no epoch iterator).

    Threads: one thread may ``add``/``add_batch`` while others sample (``sample_batch`` with or without
    ``n_step``/``recent``, ``sample_by_index(_fields)``, ``sample_all``, epoch iterators, ``sample_slices``):
    a sample never holds a half-written row (:meth:`Engine.read <objectrl_buffer.engine.Engine.read>`).
    Other concurrent use (two writers, ``reset``/``load``/``close`` during a sample) needs a lock.

    Raises:
        InvalidArgumentError: naming the argument: a device torch does not know (``"gpu"``: did you mean
            ``"cuda"``?), ``"meta"``, or one not available here (``"cuda"`` without CUDA); a number for a
            device (Stable-Baselines3's argument order); a size that is not a positive int (at most
            ``2**62``); a ``seed`` that is not an int a ``torch.Generator`` takes; a ``storage_dir`` that
            is not a str/PathLike, is empty, or is (or lies below) a file, or where no folder can be made.
    """

    #: Types of :attr:`checkpoint_extras` whose saved values give :meth:`from_checkpoint` constructor arguments.
    extra_state_types: ClassVar[tuple[type, ...]] = ()

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
        where, stored_on = validate.buffer_devices(device, storing_device, buffer_size)
        envs = positive_int(num_envs, "num_envs")
        size = env_multiple(positive_int(buffer_size, "buffer_size"), envs)
        seed = None if seed is None else validate.seed(seed)
        if storage_dir is not None:
            storage_dir = validate.folder(storage_dir, "storage_dir")
        self._engine = Engine(size, where, stored_on, storage_dir, num_envs=envs)
        self.print_gc_warning = print_gc_warning
        self.shuffle = shuffle
        self.transition_keys = TransitionKeys() if transition_keys is None else transition_keys
        self.epoch_iterator: Iterator[TensorDict] | None = None
        self.checkpoint_extras: list[ExtraState] = []
        self._random_recent: int | None = None  # recency window of get_next_batch's random sampling
        self.generator = torch.Generator(device=self.storing_device)
        self.generator.manual_seed(derived_seed() if seed is None else seed)
        self._bind()

    def _bind(self) -> None:
        # The per-env-step call goes straight to the engine: no extra Python frame on the hot path.
        if type(self).add is ReplayBuffer.add:
            self.__dict__["add"] = self._engine.add

    # ------------------------------------------------------------------ ObjectRL attributes
    device = property(lambda self: self._engine.device, doc="Where samples are delivered.")
    storing_device = property(lambda self: self._engine.storing_device, doc="Where rows live.")
    storage_dir = property(lambda self: self._engine.storage_dir, doc="Parent folder of the CPU files, if given.")
    num_envs = property(lambda self: self._engine.num_envs, doc="Envs written together (see the class docs).")
    buffer_size = property(lambda self: self._engine.ring.capacity, doc="Capacity in transitions.")
    data_size = property(lambda self: self._engine.ring.size, doc="Stored transitions (ObjectRL's counter).")
    pointer = property(lambda self: self._engine.ring.pointer, doc="The next slot written.")
    size = data_size
    schema = property(lambda self: self._engine.schema, doc="Stored keys, row shapes and dtypes (or ``None``).")

    @property
    def engine(self) -> Engine:
        """The :class:`~objectrl_buffer.engine.Engine` this buffer is built on (its ring and storage), for
        rooms and subclasses that extend it; write and sample through the buffer's own methods."""
        return self._engine

    @property
    def storage_folder(self) -> str | None:
        """Folder of the CPU files (chosen at the first write when ``storage_dir`` is ``None``)."""
        return self._engine.storage.folder

    @property
    def memory(self) -> TensorDictReplayBuffer:
        """A torchrl ``TensorDictReplayBuffer`` over the same storage, for reading (write through :meth:`add`)."""
        return self._engine.torchrl_view()

    def __len__(self) -> int:
        return self._engine.ring.size

    def __repr__(self) -> str:
        """``ReplayBuffer(1234/100000 rows, pointer=1234, cpu->cuda:0, keys=['state': float32 (17,), ...])``:
        the fill level, the write head, storing -> training device, and the stored keys."""
        ring = self._engine.ring
        rows = f"{ring.size}/{ring.capacity} rows"
        if ring.phantom:
            rows += f" ({ring.phantom} hold no data)"
        envs = f", num_envs={self.num_envs}" if self.num_envs > 1 else ""
        schema = self.schema
        if self._engine.storage.closed:
            keys = "closed"
        elif schema is None:
            keys = "empty"
        else:
            described = (
                f"{format_key(f.key)!r}: {str(f.dtype).removeprefix('torch.')} {tuple(f.shape)}" for f in schema.fields
            )
            keys = f"keys=[{', '.join(described)}]"
        return (
            f"{type(self).__name__}({rows}, pointer={ring.pointer}{envs}, {self.storing_device}->{self.device}, {keys})"
        )

    # ------------------------------------------------------------------ lifecycle
    def reset(self, buffer_size: int | None = None) -> None:
        """Empty the buffer (optionally resize it); the next write may bring a new schema. CPU storage
        keeps its reserved files for a next write of the same schema; older epoch iterators go stale.

        Raises:
            InvalidArgumentError: a bad ``buffer_size`` (the buffer is unchanged).
        """
        size = None if buffer_size is None else env_multiple(positive_int(buffer_size, "buffer_size"), self.num_envs)
        self._engine.clear(size)

    def close(self) -> None:
        """Free the storage and its files now; later writes raise ``ClosedBufferError``."""
        self._engine.close()
        self.epoch_iterator = None

    def __enter__(self: RB) -> RB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("add", "epoch_iterator", "generator")}
        state["generator"] = (self.generator.device, self.generator.get_state())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        device, generator_state = state.pop("generator")
        # Tensor attributes are cloned: multiprocessing's pickler would hand them over in shared memory.
        self.__dict__.update({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()})
        self.epoch_iterator = None
        self.generator = torch.Generator(device=device)
        self.generator.set_state(generator_state)
        self._bind()

    # ------------------------------------------------------------------ writes
    def add(self, transition: Transition) -> None:
        """Store one transition (``[num_envs]`` with ``num_envs > 1``) at ``pointer``: a ``TensorDict``
        of batch size ``[]`` or a mapping of tensors, NumPy values and numbers (``"index"`` is ignored).

        Raises:
            SchemaError: it does not fit the stored schema beyond a lossless cast or size-1 reshape
                (:mod:`~objectrl_buffer.core.schema`); nothing is stored.
            InvalidArgumentError: a batched TensorDict or a non-mapping.

        Warns:
            CastWarning: once per key, when a tensor was cast or reshaped to be stored.
        """
        self._engine.add(transition)

    def add_batch(self, batch: Transition) -> None:
        """Store ``N`` transitions (``[T, num_envs]`` with ``num_envs > 1``) at ``pointer, pointer + 1, ...``;
        ``N > buffer_size`` keeps the newest. Raises as :meth:`add`, also for keys that disagree on ``N``."""
        self._engine.add_batch(batch)

    def extend(self, batch: Transition) -> None:
        """Alias of :meth:`add_batch` (torchrl's and Stable-Baselines3's name)."""
        self.add_batch(batch)

    # ------------------------------------------------------------------ sampling
    def sample_batch(
        self, batch_size: int, *, n_step: int | None = None, gamma: float = 0.99, recent: int | None = None
    ) -> TensorDict:
        """``batch_size`` rows drawn uniformly with replacement, with ``"index"``.

        Args:
            n_step: when given (1 included): ``reward`` becomes the discounted sum of up to ``n`` rewards,
                stopping at an episode end or the newest row; ``next_state``/``terminated``/``truncated``
                come from the row it stopped at; ``discount`` is ``gamma ** steps`` (float32)
                (:mod:`~objectrl_buffer.sampling.nstep`).
            gamma: the n-step discount in ``[0, 1]``.
            recent: draw only from the newest ``recent`` rows (rounded up to whole env steps).

        Raises:
            EmptyBufferError: no rows. InvalidArgumentError: a bad argument. SchemaError: n-step needs
                a key that is not stored.
        """
        k = positive_int(batch_size, "batch_size")
        engine = self._engine
        if n_step is None and recent is None and not engine.ring.phantom:  # the per-gradient-step path
            engine.require_rows()
            return engine.read(uniform_slots(engine.ring.size, k, self.generator))
        n, g = (None, 0.0) if n_step is None else check_n_step(n_step, gamma)
        window = self._window(recent)
        engine.require_rows()
        ring = engine.ring
        if window is None and not ring.phantom:
            slots = uniform_slots(ring.size, k, self.generator)
        else:  # the newest rows: a window, or those that hold data
            slots = recent_slots(ring, window or ring.held, k, self.generator)
        return engine.read_transitions(slots, n, g, self.transition_keys)

    def sample(
        self, batch_size: int, *, n_step: int | None = None, gamma: float = 0.99, recent: int | None = None
    ) -> TensorDict:
        """Alias of :meth:`sample_batch` (torchrl's and Stable-Baselines3's name)."""
        return self.sample_batch(batch_size, n_step=n_step, gamma=gamma, recent=recent)

    def sample_random(self, batch_size: int) -> TensorDict:
        """Alias of :meth:`sample_batch` (ObjectRL's name)."""
        return self.sample_batch(batch_size)

    def sample_by_index(self, indices: Slots) -> TensorDict:
        """Rows at storage slots ``indices`` (ints, a range or an integer tensor), in that order.

        Raises:
            SlotIndexError: a slot outside ``[0, len)`` or holding no data. InvalidArgumentError: not integers.
        """
        slots = self._engine.slots(indices)
        if slots.numel():
            self._engine.require_rows()
        return self._engine.read(slots)

    def sample_by_index_fields(self, indices: Slots, fields: str | Key | Iterable[Key]) -> TensorDict:
        """Only ``fields`` (a key or a list of keys) of the rows at ``indices``.

        Raises:
            SchemaError: a field is not stored. SlotIndexError, InvalidArgumentError: as :meth:`sample_by_index`.
        """
        keys = as_keys(fields, "fields")  # its type first: wrong whatever the buffer holds
        slots = self._engine.slots(indices)
        self._engine.require_rows()
        schema = self._engine.schema
        assert schema is not None
        return self._engine.read(slots, schema.stored_keys(keys, "fields"), with_index=False)

    def sample_slices(
        self, num_slices: int, slice_len: int, *, done_key: Key | None = None, pad: bool = False
    ) -> TensorDict:
        """``[num_slices, slice_len]`` consecutive transitions of one env, each inside one episode.

        A slice never crosses an episode end (a non-zero ``terminated``/``truncated``, or ``done_key``;
        the end row may be its last) nor the write head. Starts are uniform among the valid ones; with
        ``pad=True`` shorter segments are drawn whole and padded (``"mask"`` is ``False`` there, ``"index"``
        -1). See :mod:`~objectrl_buffer.sampling.slices`.

        Raises:
            InvalidArgumentError: bad sizes. EmptyBufferError: no rows, or no slice fits.
            SchemaError: an episode-end key is not stored.
        """
        k = positive_int(num_slices, "num_slices")
        length = positive_int(slice_len, "slice_len")
        steps = self.buffer_size // self.num_envs
        if length > steps:
            per_env = "" if self.num_envs == 1 else f" per env, num_envs={self.num_envs}"
            raise InvalidArgumentError(f"slice_len {length} is larger than the buffer ({steps} rows{per_env})")
        if done_key is not None:
            if not isinstance(done_key, (str, tuple)):
                raise InvalidArgumentError(f"done_key must be a key (str or tuple of str), got {done_key!r}")
            (done_key,) = as_keys(done_key, "done_key")
        engine = self._engine
        engine.require_rows()
        columns = engine.storage.columns
        end_keys = self.transition_keys.episode_end if done_key is None else (done_key,)
        require_keys(columns, end_keys, "sample_slices")
        rows = StoredRows(columns, end_keys, engine.ring, self.num_envs)
        positions, mask = slice_positions(rows, k, length, pad, self.generator)
        batch = engine.read(rows.slots(positions.reshape(-1))).reshape(k, length)
        return pad_slices(batch, mask.to(self.device), INDEX_KEY) if pad else batch

    def sample_all(self) -> TensorDict:
        """Every row, oldest to newest (also after the ring wraps), with ``"index"``; ``[T, num_envs]``
        when ``num_envs > 1``. Raises ``EmptyBufferError`` when no row holds data."""
        self._engine.require_rows()
        rows = self._engine.read(self._engine.ring.chronological(self.storing_device))
        return rows if self.num_envs == 1 else rows.reshape(-1, self.num_envs)

    def _window(self, recent: int | None) -> int | None:
        return None if recent is None else whole_steps(positive_int(recent, "recent"), self.num_envs)

    # ------------------------------------------------------------------ epochs and iterations
    def calculate_num_batches(self, batch_size: int) -> int:
        """Batches in one epoch: ``ceil(len / batch_size)``."""
        return num_batches(self._engine.ring.held, positive_int(batch_size, "batch_size"))

    def create_epoch_iterator(
        self, batch_size: int, n_epochs: int = 1, shuffle: bool | None = None, *, recent: int | None = None
    ) -> Iterator[TensorDict]:
        """``n_epochs`` epochs of ``ceil(N / batch_size)`` batches, every row once per epoch: slot order,
        or a fresh permutation with ``shuffle`` (default: the buffer's). ``recent=m``: only the newest
        ``N = min(m, len)`` rows. Also stored in ``epoch_iterator``; stale after a reset.

        Raises:
            InvalidArgumentError: a bad argument. EmptyBufferError: no rows.
        """
        bs = positive_int(batch_size, "batch_size")
        epochs_ = positive_int(n_epochs, "n_epochs")
        window = self._window(recent)
        engine = self._engine
        engine.require_rows()
        shuffle = self.shuffle if shuffle is None else bool(shuffle)
        ring = engine.ring
        rows = None if window is None and not ring.phantom else ring.chronological(self.storing_device, window)
        size = ring.size if rows is None else rows.numel()
        generation = engine.generation  # taken now: a generator body runs lazily

        def read(positions: torch.Tensor, span: tuple[int, int] | None) -> TensorDict:
            # positions are slots themselves, or index a window's slots (which may wrap)
            return engine.read(positions, span=span) if rows is None else engine.read(rows[positions])

        current = lambda: engine.generation == generation  # noqa: E731
        self.epoch_iterator = epochs(read, size, bs, epochs_, shuffle, self.generator, current)
        return self.epoch_iterator

    def get_steps_and_iterator(
        self, n_epochs: int, max_iter: int, batch_size: int, shuffle: bool | None = None, *, recent: int | None = None
    ) -> int:
        """Prepare a learning phase; return its gradient steps: ``n_epochs > 0`` builds the epoch iterator
        (``n_epochs * ceil(N / batch_size)``), else random sampling (``max_iter``). ``recent=m`` limits
        both to the newest ``m`` rows until the next call.

        Raises:
            InvalidArgumentError: a bad argument (and as :meth:`create_epoch_iterator`).
        """
        n_epochs, max_iter = integer(n_epochs, "n_epochs"), integer(max_iter, "max_iter")
        positive_int(batch_size, "batch_size")  # also for random sampling, whose batches get_next_batch draws
        window = self._window(recent)
        if n_epochs > 0:
            self.create_epoch_iterator(batch_size, n_epochs, shuffle, recent=window)
            self._random_recent = window
            held = self._engine.ring.held
            return n_epochs * num_batches(held if window is None else min(window, held), batch_size)
        self.epoch_iterator = None
        self._random_recent = window
        return max_iter

    def get_next_batch(self, batch_size: int) -> TensorDict:
        """The next batch of ``epoch_iterator``, or ``sample_batch(batch_size)`` when there is none.

        Raises:
            StopIteration: the epoch iterator is exhausted (as ObjectRL's buffer does).
        """
        if self.epoch_iterator is None:
            return self.sample_batch(batch_size, recent=self._random_recent)
        return next(self.epoch_iterator)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str], data: bool = False, *, progress: bool | None = None) -> None:
        """Write ``path.metadata`` (ObjectRL's counters, ``torch.load``-able; a ``path`` ending in ``.metadata``
        names that file itself); ``data=True`` adds every row,
        the generator state and :attr:`checkpoint_extras`, crash-safe (:mod:`~objectrl_buffer.checkpoint`).

        Raises:
            CheckpointError, CheckpointNotFoundError: the destination cannot be written (naming it); the
                previous checkpoint stays intact.
        """
        save_checkpoint(path, self._checkpoint_state(), data=data, progress=progress)

    def load(self, path: str | os.PathLike[str], *, verify: bool = True, progress: bool | None = None) -> None:
        """Restore what :meth:`save` wrote (``path`` as given to it, or its ``.metadata`` file's name). A
        metadata-only checkpoint restores the counters; rows it counts that this buffer does not hold are
        never returned (a ``RuntimeWarning`` says how many). A full one restores rows, ring, schema,
        generator, ``shuffle`` and extras; ``verify`` checks every crc32.

        Raises:
            CheckpointError, CheckpointNotFoundError: missing, damaged, or not fitting a buffer that holds
                rows (another capacity, schema or ``num_envs``); the buffer is then unchanged.
        """
        restored = load_checkpoint(self._checkpoint_state(), path, self._check_extras, verify, progress)
        self._adopt(restored)

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
        """A new buffer of the saved capacity holding the checkpoint at ``path``. Devices default to the
        saved ones (``"cpu"`` where unavailable); ``kwargs`` go to the constructor, saved settings (a full
        checkpoint's ``num_envs``, an extra's, e.g. PER's ``alpha``) fill in what is not given.

        Raises:
            CheckpointError, CheckpointNotFoundError: as :meth:`load`.
        """
        ckpt, device, storing_device = restore_devices(path, device, storing_device)
        settings = saved_kwargs(ckpt, kwargs, cls.extra_state_types)
        buffer = cls(device, storing_device, ckpt.meta["buffer_size"], **settings)
        try:
            buffer.load(path, verify=verify, progress=progress)
        except BaseException:
            buffer.close()
            raise
        if "shuffle" in kwargs:
            buffer.shuffle = kwargs["shuffle"]
        return buffer

    def state_dict(self) -> dict[str, Any]:
        """Everything a full checkpoint holds, as a dict of tensors and plain values (torch's convention):
        rows, ring (phantom rows included), schema, generator state, ``shuffle``, ``num_envs`` and the
        state of :attr:`checkpoint_extras` (e.g. PER's priorities). Its tensors are new CPU tensors (a
        snapshot), so ``torch.save`` it and ``torch.load(f, weights_only=True)`` it back; the layout is
        documented in :mod:`~objectrl_buffer.checkpoint.state_dict`. For large buffers prefer
        :meth:`save` with ``data=True``, which streams to disk instead of copying into RAM."""
        return make_state_dict(self._checkpoint_state())

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, as :meth:`load` restores a full checkpoint (an empty
        buffer takes any capacity and schema; one holding rows only its own).

        Raises:
            CheckpointError: ``state_dict`` is not one (naming the entry that is wrong), or does not fit
                a buffer that holds rows; the buffer is then unchanged.
        """
        restored = restore_state_dict(self._checkpoint_state(), state_dict, self._check_extras)
        self._adopt(restored)

    def _adopt(self, restored: Restored) -> None:
        self._engine.restore(restored, self.checkpoint_extras)
        self.epoch_iterator = None
        if restored.generator_state is not None:
            self.generator.set_state(restored.generator_state)
        elif restored.generator_seed is not None:
            self.generator.manual_seed(restored.generator_seed)
        if restored.shuffle is not None:
            self.shuffle = restored.shuffle

    def _checkpoint_state(self) -> BufferState:
        return self._engine.checkpoint_state(self.generator, self.shuffle, self.checkpoint_extras)

    def _check_extras(self, restored: Restored) -> None:
        self._engine.check_extras(restored, self.checkpoint_extras)
