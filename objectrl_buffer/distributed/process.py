"""A CPU ``ReplayBuffer`` handed to child processes shares its rows with them, as torch shares tensors.

Only ``multiprocessing``'s own pickler (``ForkingPickler``: ``Process`` arguments under ``spawn`` and
``forkserver``, ``Queue``/``Pipe``/``Pool`` under every start method, ``torch.multiprocessing``) calls
:func:`reduce_for_process`; ``pickle``, ``copy.deepcopy`` and ``torch.save`` still make independent copies.

At the first such pickle the buffer *becomes shared*, in place: its rows move into a
:class:`~objectrl_buffer.distributed.shared.SharedBuffer` (files in ``/dev/shm``; one copy of every row,
O(rows): ~1 s per GB), it keeps its slots, counters and generator (its ``rate_limiter``'s counters move to
shared memory too: every process admits by the same counts), and from then on its ``add``,
``add_batch``, ``sample_batch``, ``len``, ``pointer`` and ``data_size`` go to the shared rows, in every
process that holds it. The child gets a buffer of the same class attached to the same files. The parent
owns the files (removed at its :meth:`close` or exit); a child's handle keeps its mapping until it exits.

``fork``: ``Process`` arguments are not pickled there; the buffers a forking ``Process`` holds are shared
just before the fork instead, and every other buffer a fork child inherits is read-only there
(:mod:`objectrl_buffer.forks` says which and why). One shared before the fork (through a ``Queue``/``Pipe``,
or :func:`become_shared`) stays shared in the child.

Reads that the shared rows do not serve natively (``sample_all``, ``sample_by_index``, n-step and
``recent`` samples, slices, epochs, ``save``, ``state_dict``) first copy the committed rows into this
process's own storage (a snapshot, O(rows), at their shared slots; rows still being written are left out,
see :meth:`SharedMode.snapshot`) and then run as usual. ``reset``, ``load`` and ``load_state_dict`` are
refused (other processes hold the rows).

``num_envs > 1``: every process's ``add`` of one ``[num_envs]`` env step reserves ``num_envs`` consecutive
slots at once, and ``add_batch`` of ``[T, num_envs]`` steps ``T * num_envs``; as the capacity is a multiple of
``num_envs``, every reservation starts at a step boundary, so env ``e`` of a step always lands at a slot
``= e (mod num_envs)``: the single-process layout, whatever the writers' interleaving. Snapshots keep whole
steps (a step with a row being written is left out whole), so n-step returns and slices never mix envs.

A ``PrioritizedReplayBuffer`` is shared with its priorities (a
:class:`~objectrl_buffer.distributed.shared_prioritized.SharedPrioritizedBuffer`): every process's ``add``
gives the new row the shared max priority, ``update_priority`` from any process changes what every process
draws, and ``sample_batch`` draws by the shared priorities with the importance weights of the single-process
buffer. ``alpha`` and ``eps`` are fixed once shared; ``beta`` is each process's own. Its samples also carry
``"generation"`` (which write of each slot was drawn): ``update_priority(index, priority, generation)`` skips
the slots rewritten since, by any process, and returns how many rows it applied.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

from objectrl_buffer.core.envs import check_env_step, flatten_steps
from objectrl_buffer.core.keys import INDEX_KEY
from objectrl_buffer.core.ring import Ring
from objectrl_buffer.distributed.shared import SharedBuffer
from objectrl_buffer.distributed.shared_compact import SharedCompactBuffer
from objectrl_buffer.distributed.shared_prioritized import SharedPrioritizedBuffer, open_shared
from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.flow.limiter import RateLimiter

__all__ = ["reduce_for_process", "is_shared", "SharedMode"]

_CLASSES: dict[type, type] = {}

if TYPE_CHECKING:
    _Base = Any
else:
    _Base = object


#: The method a wrapper of the library lists what it holds with (``objectrl_buffer.forks.HOLDS``; e.g.
#: ``flow.limited``'s buffer and limiter): sharing a wrapper shares what it holds, as the fork hook does.
_HOLDS = "__objectrl_holds__"


def _held(buffer: Any) -> tuple[Any, ...] | None:
    """What ``buffer`` holds if it is one of the library's wrappers (``None`` for a buffer itself)."""
    holds = getattr(type(buffer), _HOLDS, None)
    return tuple(holds(buffer)) if callable(holds) else None


def is_shared(buffer: Any) -> bool:
    """Whether ``buffer`` writes and reads shared rows (it was handed to a child process); for a wrapper
    (``flow.limited(...)``), whether the buffers it holds do."""
    held = _held(buffer)
    if held is not None:
        return all(is_shared(item) for item in held if not isinstance(item, RateLimiter))
    return isinstance(buffer, SharedMode)


class SharedMode(_Base):
    """What a buffer's class gains once it is shared (mixed in before it; see the module docs)."""

    shared: SharedBuffer

    def __len__(self) -> int:
        return len(self.shared)

    pointer = property(lambda self: self.shared.pointer, doc="The next slot reserved (by any process).")
    data_size = property(lambda self: len(self.shared), doc="Stored transitions, over every process.")
    size = data_size
    schema = property(lambda self: self.shared.schema, doc="Stored keys, row shapes and dtypes.")
    nbytes = property(lambda self: self.shared.nbytes, doc="Bytes of memory the shared files take (every process's).")

    @property
    def total_adds(self) -> int:
        """Rows ever added, by every process."""
        return self.shared.reserved

    def add(self, transition: Any, *, timeout: float | None = None) -> None:
        envs = self.num_envs
        if envs == 1:
            self.shared.add(transition)
        else:  # one step of every env: num_envs consecutive slots, reserved together (checked first)
            check_env_step(transition, envs)
            self.shared.add_batch(transition)

    def add_batch(self, batch: Any, *, timeout: float | None = None) -> None:
        envs = self.num_envs
        self.shared.add_batch(batch if envs == 1 else flatten_steps(batch, envs))

    def sample_batch(self, batch_size: int, **kwargs: Any) -> TensorDict:
        if any(value is not None for key, value in kwargs.items() if key not in ("gamma", "timeout")):
            self.snapshot()
            return super().sample_batch(batch_size, **kwargs)
        out = self.shared.sample_batch(batch_size)
        return out if self.device.type == "cpu" else out.to(self.device, non_blocking=True)

    def snapshot(self) -> None:
        """Copy the committed shared rows into this process's own storage, oldest at its shared slot, the
        others after it (O(rows)). Rows being written are left out (whole env steps with ``num_envs > 1``),
        and the ring ends after the newest row copied: it never serves a slot that holds no finished row.
        With no row in flight every row keeps its shared slot; a row in flight between finished ones (a slow
        or killed writer) moves the rows after it back by its slot."""
        rows = self.shared.rows(self.num_envs)
        engine = self.engine
        engine.clear()
        if rows.batch_size[0]:
            engine.ring.pointer = int(rows[INDEX_KEY][0])
            engine.add_batch(rows.exclude(INDEX_KEY), steps=False)

    def _snapshot_then(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            self.snapshot()
            return getattr(super(), name)(*args, **kwargs)

        method.__name__ = name
        method.__doc__ = f"The buffer's ``{name}`` over a snapshot of the shared rows (see the module docs)."
        return method

    sample_all = _snapshot_then("sample_all")
    sample_by_index = _snapshot_then("sample_by_index")
    sample_by_index_fields = _snapshot_then("sample_by_index_fields")
    sample_slices = _snapshot_then("sample_slices")
    create_epoch_iterator = _snapshot_then("create_epoch_iterator")
    get_steps_and_iterator = _snapshot_then("get_steps_and_iterator")
    calculate_num_batches = _snapshot_then("calculate_num_batches")
    save = _snapshot_then("save")
    state_dict = _snapshot_then("state_dict")
    del _snapshot_then

    def _refused(self, *args: Any, **kwargs: Any) -> None:
        raise InvalidArgumentError(
            "reset/load/load_state_dict of a shared buffer: other processes hold its rows; "
            "load into a new buffer (ReplayBuffer.from_checkpoint) before handing it to child processes"
        )

    reset = load = load_state_dict = _refused

    def close(self) -> None:
        self.shared.close()
        super().close()

    def __reduce_ex__(self, protocol: Any) -> Any:
        # plain pickle / deepcopy / torch.save: an independent, ordinary buffer of the original class
        self.snapshot()
        return _plain_copy, (_base(type(self)), self.__getstate__())


class SharedPrioritizedMode(SharedMode):
    """What a ``PrioritizedReplayBuffer``'s class gains once it is shared: priorities in shared files."""

    shared: SharedPrioritizedBuffer

    def sample_batch(self, batch_size: int, **kwargs: Any) -> TensorDict:
        if any(value is not None for key, value in kwargs.items() if key not in ("gamma", "timeout")):
            return super().sample_batch(batch_size, **kwargs)  # over a snapshot, with its priorities
        out = self.shared.sample_batch(batch_size, self.beta)
        return out if self.device.type == "cpu" else out.to(self.device, non_blocking=True)

    def update_priority(self, index: Any, priority: Any, generation: Any = None) -> int:
        """Set the priorities at slots ``index``, as the single-process buffer's ``update_priority``; with
        ``generation`` (a sample's ``"generation"``, one per index), rows whose slot was rewritten since they
        were drawn are skipped. Returns how many rows were applied (every row without ``generation``).

        Raises:
            InvalidArgumentError: as the single-process buffer's; also a ``generation`` that is not one
                integer per index. SlotIndexError: a slot out of range. Nothing changes then.
        """
        ring = Ring(self.shared.capacity, len(self.shared))  # the slots of every process's rows
        slots, values = self.checked_rows(index, priority, ring)
        gens = None if generation is None else _generations(generation, slots.numel())
        return self.shared.update_priority(slots, values, gens)

    def importance_weights(self, slots: torch.Tensor) -> torch.Tensor:
        return self.shared.weights(slots, self.beta)

    @property
    def max_priority(self) -> float:
        return self.shared.max_priority

    @property
    def alpha(self) -> float:
        return self.shared.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        raise InvalidArgumentError("alpha of a shared buffer is fixed: other processes draw by its weights")

    def priorities(self) -> torch.Tensor:
        return self.shared.priority[: len(self.shared)].clone()

    def priority_state(self) -> dict[str, torch.Tensor]:
        return self.shared.priority_state()

    def load_priority_state(self, state: Any) -> None:
        self._refused()

    def snapshot(self) -> None:
        """Copy the committed shared rows and their priorities into this process's own storage (O(rows))."""
        super().snapshot()
        base: Any = super(SharedMode, self)
        base.load_priority_state(self.shared.priority_state())


def _generations(generation: Any, n: int) -> torch.Tensor:
    """``generation`` as int64 ``[n]`` (a sample's ``"generation"``: a tensor, an array or a list of ints)."""
    try:
        gens = torch.as_tensor(generation)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidArgumentError(f"generation must be a sample's 'generation' (integers): {exc}") from None
    if gens.numel() and (gens.is_floating_point() or gens.is_complex() or gens.dtype == torch.bool):
        raise InvalidArgumentError(f"generation must be integers (a sample's 'generation'), got dtype {gens.dtype}")
    if gens.numel() != n:
        raise InvalidArgumentError(f"generation has {gens.numel()} values but index has {n}: give one per index")
    return gens.to("cpu", torch.int64).reshape(-1)


def _plain_copy(cls: Any, state: dict[str, Any]) -> Any:
    buffer = cls.__new__(cls)
    buffer.__setstate__(state)
    return buffer


def _base(cls: type) -> type:
    """The buffer class a shared class was made from."""
    return next(c for c in cls.__mro__ if not issubclass(c, SharedMode))


def _shared_class(cls: type) -> type:
    shared = _CLASSES.get(cls)
    if shared is None:
        mode = SharedPrioritizedMode if hasattr(cls, "update_priority") else SharedMode
        shared = type(f"Shared{cls.__name__}", (mode, cls), {"__module__": cls.__module__})
        _CLASSES[cls] = shared
    return shared


def _check(buffer: Any) -> None:
    if torch.device(buffer.storing_device).type != "cpu":
        raise InvalidArgumentError(f"storing_device must be cpu to share a buffer, got {buffer.storing_device}")
    if buffer.schema is None:
        raise InvalidArgumentError("a buffer shares its rows once it has a schema: add a row before handing it over")


def become_shared(buffer: Any) -> None:
    """Move ``buffer``'s rows into shared files and switch it to them, in place (see the module docs): what
    handing it to a child process does; call it before a ``fork`` that hands it over some other way (a
    global, an object the ``Process`` does not hold). O(rows) (one copy of every row); a no-op on a buffer
    already shared.

    Raises:
        InvalidArgumentError: storage off the CPU or no schema yet.

    A wrapper of the library (``flow.limited(buffer, limiter)``) is not switched itself: the buffers it holds
    become shared and its limiter's counters move to a shared file (buffers first: a buffer that cannot be
    shared raises before the limiter's counters move).
    """
    wrapped = _held(buffer)
    if wrapped is not None:
        for item in sorted(wrapped, key=lambda item: isinstance(item, RateLimiter)):
            if isinstance(item, RateLimiter):
                item.share()
            else:
                become_shared(item)
        return
    if is_shared(buffer):
        return
    _check(buffer)
    limiter = getattr(buffer, "rate_limiter", None)
    if limiter is not None:  # its counters go with the rows: every process admits by the same counts
        limiter.share()
    held = len(buffer)
    start = buffer.pointer if held == buffer.buffer_size else 0  # the rows keep their slots
    shared: SharedBuffer
    if hasattr(buffer, "update_priority"):
        shared = SharedPrioritizedBuffer.create(
            buffer.schema, buffer.buffer_size, start=start, alpha=buffer.alpha, eps=buffer.eps
        )
    elif buffer.engine.compact is not None:  # the compact form in shared memory: one frame a row
        shared = SharedCompactBuffer.create_compact(
            buffer.schema,
            buffer.buffer_size,
            next_of=buffer.engine.compact.next_of,
            frame_stack=buffer.engine.compact.frame_stack,
            end_keys=buffer.engine.end_keys,
            num_envs=buffer.num_envs,
            start=start,
        )
    else:
        shared = SharedBuffer.create(buffer.schema, buffer.buffer_size, start=start)
    ring = buffer.engine.ring
    last = (ring.pointer - 1) % buffer.buffer_size  # the slot after which rows added from now on land
    if held:
        rows = buffer.sample_all().reshape(-1)  # [T, num_envs] -> [T * num_envs]
        last = int(rows[INDEX_KEY][-1])
        shared.add_batch(rows.exclude(INDEX_KEY))
    if isinstance(shared, SharedPrioritizedBuffer):  # the rows kept their slots: so do their priorities
        state = buffer.priority_state()
        shared.load_priorities(state["priority"], float(state["max_priority"]))
    _attach(buffer, shared)  # first: a thread sampling meanwhile (a Queue's feeder shares) finds every row
    _carry_over(buffer, shared, last)
    buffer.engine.clear()  # its own storage keeps only snapshots from now on
    if buffer.engine.compact is not None:  # snapshots interleave many processes' streams: plain rows
        _plain_snapshots(buffer.engine)


def _plain_snapshots(engine: Any) -> None:
    """Make ``engine`` keep plain rows (the snapshots of a shared compact buffer, whose writers' streams
    interleave on the ring)."""
    engine.storage.close()
    engine.compact = None
    engine.storage = engine.new_storage(engine.ring.capacity, engine.storage_dir)


def _carry_over(buffer: Any, shared: SharedBuffer, last: int) -> None:
    """Store in ``shared`` the rows another thread added to ``buffer``'s own storage after the copy (a fork
    hook or a ``Queue``'s feeder shares the buffer while a writer thread adds): at the slots after ``last``,
    up to the pointer, once the write in flight at the switch has finished. They land after the rows that
    thread has added to the shared rows since the switch (a few rows out of order, none lost)."""
    ring, capacity = buffer.engine.ring, buffer.buffer_size
    deadline = time.monotonic() + 5.0
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:  # a call that looked ``add`` up before the switch may
        time.sleep(0.001)  # still write into the old rows: look again until two checks find nothing new
        if ring.begun != ring.done:
            quiet = 0
            continue  # an add into the old rows is in flight
        extra = (ring.pointer - 1 - last) % capacity
        if not extra:
            quiet += 1
            continue
        quiet = 0
        slots = (last + 1 + torch.arange(extra, dtype=torch.int64)) % capacity
        shared.add_batch(buffer.engine.read(slots, with_index=False))
        last = (last + extra) % capacity


def _attach(buffer: Any, shared: SharedBuffer) -> None:
    buffer.__class__ = _shared_class(type(buffer))
    buffer.__dict__["shared"] = shared
    shared.generator = buffer.generator  # samples keep the buffer's seeded stream (a fork child reseeds)
    buffer.__dict__.pop("add", None)
    limiter = getattr(buffer, "rate_limiter", None)
    if limiter is not None:
        limiter.attach(buffer)  # gate the shared methods
    elif buffer.num_envs == 1:
        buffer.__dict__["add"] = shared.add  # the per-step call: no extra Python frame


def _rebuild(cls: type, folder: str, device: torch.device, settings: dict[str, Any]) -> Any:
    """In the child: a buffer of ``cls`` attached to the shared files in ``folder``."""
    shared = open_shared(folder)
    buffer = cls(device, "cpu", shared.capacity, **settings)
    _attach(buffer, shared)
    return buffer


def reduce_for_process(buffer: Any) -> tuple[Any, ...]:
    """``ForkingPickler``'s reduction of a buffer: share it (once), then hand over a handle on its files."""
    become_shared(buffer)
    settings = {
        "shuffle": buffer.shuffle,
        "num_envs": buffer.num_envs,
        "transition_keys": buffer.transition_keys,
        "rate_limiter": getattr(buffer, "rate_limiter", None),
    }
    if isinstance(buffer.shared, SharedPrioritizedBuffer):
        # the child's own index is used only for its snapshots: our tree, whatever the parent's backend
        settings.update(alpha=buffer.alpha, beta=buffer.beta, eps=buffer.eps, backend="torch")
    return _rebuild, (_base(type(buffer)), buffer.shared.folder, buffer.device, settings)
