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
from multiprocessing.reduction import ForkingPickler
from typing import Any, ClassVar, TypeVar

import torch
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer

from objectrl_buffer import forks, persistence, reads
from objectrl_buffer.checkpoint.compact import CompactSettings
from objectrl_buffer.checkpoint.extras import ExtraState
from objectrl_buffer.core import validate
from objectrl_buffer.core.schema import Key
from objectrl_buffer.core.seeding import derived_seed
from objectrl_buffer.core.validate import env_multiple, positive_int
from objectrl_buffer.engine import Engine, Slots, Transition
from objectrl_buffer.sampling.slices import TransitionKeys
from objectrl_buffer.sampling.uniform import num_batches, uniform_slots
from objectrl_buffer.storage.compact import CompactSpec

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
        next_of: ``{"next_state": "state"}``: each named key is the next row's value of the other key in the
            same env stream (except where a row ends an episode: ``transition_keys.episode_end``), so it is
            stored only where it is not (episode ends, the write head). See :doc:`/pixels`.
        frame_stack: ``{"state": 4}``: the key's per-row value stacks the last 4 frames along its first
            axis, newest last (its ``next_of`` key too); it is stored as one frame per env step plus what
            episode starts cannot borrow. Reads are bit-identical to a plain buffer's; a write breaking
            either claim raises ``SchemaError`` and stores nothing
            (:mod:`~objectrl_buffer.storage.compact`).
        rate_limiter: a :class:`objectrl_buffer.flow.RateLimiter` admitting :meth:`add`, :meth:`add_batch`
            and :meth:`sample_batch` (they then take ``timeout=``; a batch is admitted whole); its counters
            ride in full checkpoints. ``None``: no limit.

    Attributes:
        nbytes: bytes the stored rows take (all keys, frames and bookkeeping; 0 before the first write).
        device, storing_device, buffer_size, data_size, pointer: as ObjectRL's (``pointer`` is the
            next slot written). epoch_iterator: what :meth:`get_next_batch` draws from, or ``None``.
        checkpoint_extras: :class:`~objectrl_buffer.checkpoint.extras.ExtraState` objects whose state
            full checkpoints carry (a subclass or room appends its own).

    Samples are new ``TensorDict`` s on ``device`` with the stored keys and ``"index"`` (each row's
    slot). ``pickle``/``copy.deepcopy``/``torch.save`` give a full, independent buffer (no epoch iterator).

    Threads: one writer thread and any number of sampler threads are safe (a sample never holds a
    half-written row); any other concurrent use needs a lock (README, "Bad arguments and threads").

    Raises:
        InvalidArgumentError: naming the argument: an unknown or unavailable device (``"gpu"``: did you
            mean ``"cuda"``?), a size that is not a positive int, a bad ``seed`` or ``storage_dir``.
    """

    #: Types of :attr:`checkpoint_extras` whose saved values give :meth:`from_checkpoint` constructor arguments.
    extra_state_types: ClassVar[tuple[type, ...]] = (CompactSettings,)

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
        rate_limiter: Any = None,
        next_of: Mapping[str, str] | None = None,
        frame_stack: Mapping[str, int] | None = None,
    ) -> None:
        where, stored_on = validate.buffer_devices(device, storing_device, buffer_size)
        envs = positive_int(num_envs, "num_envs")
        size = env_multiple(positive_int(buffer_size, "buffer_size"), envs)
        seed = None if seed is None else validate.seed(seed)
        if storage_dir is not None:
            storage_dir = validate.folder(storage_dir, "storage_dir")
        self.transition_keys = TransitionKeys() if transition_keys is None else transition_keys
        compact = CompactSpec.build(next_of, frame_stack)
        ends = self.transition_keys.episode_end
        self._engine = Engine(size, where, stored_on, storage_dir, num_envs=envs, compact=compact, end_keys=ends)
        self.print_gc_warning = print_gc_warning
        self.shuffle = shuffle
        self.epoch_iterator: Iterator[TensorDict] | None = None
        self.checkpoint_extras: list[ExtraState] = []
        self._random_recent: int | None = None  # recency window of get_next_batch's random sampling
        self.generator = torch.Generator(device=self.storing_device)
        self.generator.manual_seed(derived_seed() if seed is None else seed)
        self.rate_limiter = rate_limiter
        self._bind()
        forks.track_for_fork(self)  # a fork child may read it but not write it unless shared first
        if rate_limiter is not None:
            rate_limiter.attach(self)  # objectrl_buffer.flow gates add/add_batch/sample_batch

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ForkingPickler.register(cls, forks.reduce_for_process)

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
    nbytes = property(
        lambda self: self._engine.storage.nbytes,
        doc="Bytes the stored rows take: every key's storage, frames and bookkeeping (0 before the first write).",
    )

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
        """``ReplayBuffer(1234/100000 rows, pointer=1234, cpu->cuda:0, keys=['state': float32 (17,), ...])``."""
        return f"{type(self).__name__}({self._engine.describe()})"

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
        return persistence.copy_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        persistence.from_copy_state(self, state)

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
        """``batch_size`` rows drawn uniformly with replacement, with ``"index"``. ``n_step`` (1 included):
        n-step returns stopping at an episode end or the newest row, plus ``discount = gamma ** steps``
        (:mod:`~objectrl_buffer.sampling.nstep`); ``recent``: only the newest rows (whole env steps).

        Raises:
            EmptyBufferError: no rows. InvalidArgumentError: a bad argument. SchemaError: a missing n-step key.
        """
        k = positive_int(batch_size, "batch_size")
        engine = self._engine
        if n_step is None and recent is None and not engine.ring.phantom:  # the per-gradient-step path
            engine.require_rows()
            return engine.read(uniform_slots(engine.ring.size, k, self.generator))
        return reads.transitions(self, k, n_step, gamma, recent)

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
        return reads.fields(self, indices, fields)

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
        return reads.slices(self, num_slices, slice_len, done_key, pad)

    def sample_all(self) -> TensorDict:
        """Every row, oldest to newest (also after the ring wraps), with ``"index"``; ``[T, num_envs]``
        when ``num_envs > 1``. Raises ``EmptyBufferError`` when no row holds data."""
        return reads.everything(self)

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
        self.epoch_iterator = reads.epoch_iterator(self, batch_size, n_epochs, shuffle, recent)
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
        steps, self.epoch_iterator, self._random_recent = reads.learning_phase(
            self, n_epochs, max_iter, batch_size, shuffle, recent
        )
        return steps

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
        """Write ``path.metadata`` (ObjectRL's counters); ``data=True`` adds every row, the generator and
        :attr:`checkpoint_extras`, crash-safe (:mod:`~objectrl_buffer.checkpoint`). Raises
        ``CheckpointError`` naming a destination that cannot be written; the previous checkpoint stays."""
        persistence.save(self, path, data, progress)

    def load(self, path: str | os.PathLike[str], *, verify: bool = True, progress: bool | None = None) -> None:
        """Restore what :meth:`save` wrote (``path`` or its ``.metadata`` file): metadata only, the counters
        (rows this buffer does not hold are never returned; a ``RuntimeWarning`` says how many); a full
        checkpoint, rows, ring, schema, generator and extras (``verify``: check every crc32). Raises
        ``CheckpointError``/``CheckpointNotFoundError``, the buffer unchanged, for a missing, damaged or
        not fitting checkpoint (a buffer holding rows takes only its own capacity, schema, ``num_envs``)."""
        persistence.load(self, path, verify, progress)

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
        """A new buffer holding the checkpoint at ``path`` (devices: the saved ones where available; saved
        settings such as ``num_envs`` or PER's ``alpha`` fill in ``kwargs``). Raises as :meth:`load`."""
        return persistence.from_checkpoint(cls, path, device, storing_device, verify, progress, kwargs)

    def state_dict(self) -> dict[str, Any]:
        """Everything a full checkpoint holds, as new CPU tensors and plain values (torch's convention,
        ``torch.load(f, weights_only=True)`` reads it back; layout: :mod:`~objectrl_buffer.checkpoint.state_dict`).
        For large buffers prefer :meth:`save` with ``data=True``, which streams to disk."""
        return persistence.state_dict(self)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, as :meth:`load` restores a full checkpoint. Raises
        ``CheckpointError`` naming a wrong entry, or for one that does not fit; the buffer is unchanged."""
        persistence.load_state_dict(self, state_dict)


# Handed to a child process by multiprocessing's own pickler, a buffer shares its rows (pickle copies them).
ForkingPickler.register(ReplayBuffer, forks.reduce_for_process)
