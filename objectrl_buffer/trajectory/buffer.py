"""``TrajectoryReplayBuffer``: RLinf's trajectory buffer on this library's storage.

Rollout workers add whole batched trajectories ``[T, B, ...]``; the trainer samples transitions
("chunks") uniformly, with replacement, from the newest ``sample_window_size`` trajectories. Rows live in
a :class:`~objectrl_buffer.trajectory.rows.RowStore` (the library's storage: memory-mapped CPU files, or
process memory for a buffer that keeps only its window), so sampling never reads a trajectory file. With
``save_trajectories=True`` a background thread also keeps an RLinf folder in ``storage_dir``
(:mod:`~objectrl_buffer.trajectory.files`) that loads after a kill at any moment.

Differences from rlinf 0.3.0 (``rlinf/data/replay_buffer.py``), each on purpose:

* ``capacity`` (transitions) evicts whole oldest trajectories (upstream grows without bound).
* Without saving (and without ``capacity``) only the newest ``sample_window_size`` trajectories are kept:
  upstream then forces its cache to that many slots and keeps nothing else (its index still counts the
  others, so its ``len`` keeps growing; ours is what is stored, and :attr:`num_added` is upstream's count,
  which :meth:`is_ready` reads as upstream does). Nothing outside the window can be sampled either way, and
  memory stays bounded over a long run; widening ``sample_window_size`` later is refused, since the older
  trajectories are gone. ``sample_window_size=0``, ``capacity`` or ``save_trajectories`` keep every trajectory.
* A trajectory without samples is a ``ValueError`` (upstream skips it silently).
* The global RNG is never touched (upstream seeds ``np.random``).
* ``save_checkpoint`` always writes a loadable folder naming exactly the files it holds. Without saving on,
  rlinf 0.3.0 writes its cached trajectories under an index naming every one added (its own loader then
  fails on the missing files), the seed-era buffer only warns; ours writes what it still holds, and a buffer
  that keeps only its window warns (:class:`~objectrl_buffer.errors.PartialCheckpointWarning`) and records
  ``num_added`` and ``kept`` in ``metadata.json``.
* ``clear_cache()`` waits for the writer and keeps the buffer usable (upstream shuts its writer down, so
  the next saving add raises). ``enable_cache``/``cache_size`` are accepted and reported by
  :meth:`get_stats`; every stored trajectory is in the library's storage, so a sample has no slow path.
  RLinf's cleanup ``close(); clear(); clear_cache()`` works: ``clear`` and ``clear_cache`` are the two
  calls a closed buffer accepts.
* A trajectory without one of RLinf's tensor fields the buffer holds (RLinf's ``extract_intervene_traj()``
  drops ``versions``) is stored with :data:`~objectrl_buffer.trajectory.table.FILL_VALUE` rows and a
  presence mask in every sample (:attr:`optional_keys`); upstream samples whatever its cache slot held
  there (uninitialised memory).
"""

from __future__ import annotations

import operator
import os
import threading
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from objectrl_buffer.core.keys import PRESENT_KEY
from objectrl_buffer.core.schema import Key, Schema
from objectrl_buffer.core.seeding import derived_seed
from objectrl_buffer.core.validate import device as checked_device
from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.errors import (
    ClosedBufferError,
    EmptyBufferError,
    InvalidArgumentError,
    PartialCheckpointWarning,
)
from objectrl_buffer.storage.table import make_tensordict
from objectrl_buffer.trajectory import checkpoint, files
from objectrl_buffer.trajectory.files import Entry
from objectrl_buffer.trajectory.rows import Pairs, RowStore
from objectrl_buffer.trajectory.table import Table, complete, shutdown
from objectrl_buffer.trajectory.trajectory import Flat, Trajectory, flatten, trajectory_fields
from objectrl_buffer.trajectory.writer import TrajectoryWriter

__all__ = ["TrajectoryReplayBuffer"]

_UNSET: Any = object()


def _non_negative(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int, got {value!r}")
    return value


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a bool, got {value!r}")
    return value


def _folder_path(value: Any, name: str) -> str:
    """``value`` (a str or PathLike naming a folder) as a str; :class:`InvalidArgumentError` for anything else."""
    try:
        path = os.fspath(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be a str or os.PathLike, got {type(value).__name__}") from None
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError(f"{name} must name a folder, got {value!r}")
    return path


def _alias(name: str, value: Any, default: Any, alias: str, alias_value: Any) -> Any:
    """``value``, or RLinf 0.3's renamed keyword ``alias`` if that was given instead (both differing: error)."""
    if alias_value is _UNSET:
        return default if value is _UNSET else value
    if value is not _UNSET and value != alias_value:
        raise InvalidArgumentError(f"{name}={value!r} and its alias {alias}={alias_value!r} disagree: pass one")
    return alias_value


class TrajectoryReplayBuffer:
    """Whole batched trajectories in, uniformly drawn transitions from the newest ones out.

    The arguments up to ``save_trajectories`` are RLinf's, in its positional order; the rest are keyword-only.

    Args:
        seed: seed of the buffer's own ``torch.Generator`` (``None``: derived from torch's global seed,
            see :mod:`~objectrl_buffer.core.seeding`). The global RNG is never touched.
        enable_cache, cache_size: RLinf's cache settings (trajectories kept in RAM), kept for compatibility
            and reported by :meth:`get_stats`. Every stored trajectory lives in the library's storage, so
            none is ever read back from a file.
        storage_dir: the RLinf folder the writer keeps (needed with ``save_trajectories``). If it already
            holds a ``metadata.json``, the buffer resumes from it, as RLinf's seed-era buffer does.
        storage_format: ``"pt"`` (``torch.save``) or ``"pkl"`` (pickle) trajectory files.
        sample_window_size: sample from the newest N trajectories; 0 means all.
        save_trajectories: persist every added trajectory in ``storage_dir`` on a background thread.
        capacity: transitions kept at most (whole oldest trajectories are evicted); ``None``: every
            trajectory with ``save_trajectories`` or ``sample_window_size=0``, else the newest
            ``sample_window_size`` (:attr:`keep`), as rlinf keeps.
        device: where samples are returned. storing_device: where rows live (CPU: memory-mapped RAM-backed
            files; the newest-window store of :attr:`keep` uses process memory, rewritten in place).
        allow_pickle: let :meth:`load_checkpoint` (and resuming) read ``.pkl`` files, which runs their code.
        auto_save, auto_save_path, trajectory_format: RLinf 0.3's names of ``save_trajectories``,
            ``storage_dir`` and ``storage_format``.

    Attributes:
        keep: the most trajectories stored (``None``: no such limit): ``sample_window_size`` without saving
            and without ``capacity``, fixed at construction.

    Raises:
        InvalidArgumentError (a ValueError): an argument out of range, or ``save_trajectories`` without ``storage_dir``.
    """

    def __init__(
        self,
        seed: int | None = 1234,
        enable_cache: bool = True,
        cache_size: int = 5,
        storage_dir: str | os.PathLike[str] | None = _UNSET,
        storage_format: str = _UNSET,
        sample_window_size: int = 100,
        save_trajectories: bool = _UNSET,
        *,
        capacity: int | None = None,
        device: str | torch.device = "cpu",
        storing_device: str | torch.device = "cpu",
        allow_pickle: bool = False,
        auto_save: bool = _UNSET,
        auto_save_path: str | os.PathLike[str] | None = _UNSET,
        trajectory_format: str = _UNSET,
    ) -> None:
        save = _flag(_alias("save_trajectories", save_trajectories, False, "auto_save", auto_save), "save_trajectories")
        folder = _alias("storage_dir", storage_dir, None, "auto_save_path", auto_save_path)
        fmt = _alias("storage_format", storage_format, "pt", "trajectory_format", trajectory_format)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidArgumentError(f"seed must be an int or None, got {seed!r}")
        self.enable_cache = _flag(enable_cache, "enable_cache")
        self.cache_size = _non_negative(cache_size, "cache_size")
        self._window_size = _non_negative(sample_window_size, "sample_window_size")
        if fmt not in files.FORMATS:
            raise InvalidArgumentError(f"storage_format must be 'pt' or 'pkl', got {fmt!r}")
        if folder == "":
            folder = None
        if save and folder is None:
            raise InvalidArgumentError("save_trajectories=True needs storage_dir (the folder trajectories go to)")
        self.capacity = None if capacity is None else positive_int(capacity, "capacity")
        self.device = checked_device(device, "device")
        self.storing_device = checked_device(storing_device, "storing_device")
        self.allow_pickle = _flag(allow_pickle, "allow_pickle")
        self.storage_dir = None if folder is None else os.fspath(folder)
        self.storage_format = fmt
        self.save_trajectories = save
        self.seed = derived_seed() if seed is None else seed
        self.generator = torch.Generator().manual_seed(self.seed)
        # Without saving (and without capacity) only the sampling window can ever be read again: keep just
        # that, as rlinf does (its cache is then forced to sample_window_size slots), so memory stays bounded.
        window = self._window_size
        self.keep: int | None = window if (not save and self.capacity is None and window > 0) else None
        self._added = 0  # trajectories added since construction, clear or load: rlinf's size
        self._added_samples = 0  # and their transitions: rlinf's total_samples
        self._optional: dict[Key, None] = {}  # stored keys some trajectory lacked (ordered set), see optional_keys
        self._lock = threading.RLock()
        self._holder = [Table(self.capacity, self.storing_device, self.keep)]  # a list: the finalizer sees swaps
        self._counter = 0
        self._version = 0
        self._window: tuple[int, int, torch.Tensor, torch.Tensor, int, dict[Key, torch.Tensor]] | None = None
        self._closed = False
        self._writer: TrajectoryWriter | None = None
        # ids a resumed folder's index names that the table could not keep (capacity): dropped from the index
        # (and their files deleted) by the first add that persists, never on open
        self._unkept: list[int] = []
        if save:
            assert self.storage_dir is not None
            if os.path.exists(os.path.join(self.storage_dir, files.METADATA)):
                folder_info = files.read_folder(self.storage_dir)
                if folder_info.fmt != fmt:
                    raise InvalidArgumentError(
                        f"storage_dir '{self.storage_dir}' holds '{folder_info.fmt}' trajectories, not '{fmt}'"
                    )
                self._load(folder_info, folder_info.entries)
                kept = {e.trajectory_id for e in self._table.entries}
                self._unkept = [e.trajectory_id for e in folder_info.entries if e.trajectory_id not in kept]
                self._writer = TrajectoryWriter(self.storage_dir, fmt, self.seed, folder_info.entries, publish=False)
            else:
                self._writer = TrajectoryWriter(self.storage_dir, fmt, self.seed)
        self._finalizer = weakref.finalize(self, shutdown, self._writer, self._holder)

    # ------------------------------------------------------------------ state
    @property
    def _table(self) -> Table:
        return self._holder[0]

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedBufferError("this TrajectoryReplayBuffer was closed; build a new one")

    def __len__(self) -> int:
        """Number of stored trajectories."""
        return len(self._table.entries)

    @property
    def sample_window_size(self) -> int:
        """Sample from the newest this many trajectories (0: all). It may be changed, but a buffer that keeps
        only its window (:attr:`keep`) cannot widen it (the older trajectories are gone):
        :class:`InvalidArgumentError`."""
        return self._window_size

    @sample_window_size.setter
    def sample_window_size(self, value: int) -> None:
        value = _non_negative(value, "sample_window_size")
        keep = self.keep
        if keep is not None and (value == 0 or value > keep):
            raise InvalidArgumentError(
                f"sample_window_size={value}: this buffer keeps only its newest {keep} trajectories (built without "
                "save_trajectories or capacity), the older ones are gone; build it with capacity= or "
                "save_trajectories=True to sample from more"
            )
        self._window_size = value

    @property
    def rows(self) -> RowStore:
        """Where the stored trajectories' rows live (for inspection: chunks, spare; do not write to it)."""
        return self._table.rows

    @property
    def num_added(self) -> int:
        """Trajectories added since construction, :meth:`clear` or a load (a load counts its share; a full
        load of a checkpoint holding fewer than were added, the count it records), evicted ones included: what
        RLinf's ``size`` counts."""
        return self._added

    @property
    def num_added_samples(self) -> int:
        """Transitions of the :attr:`num_added` trajectories: what RLinf's ``total_samples`` counts."""
        return self._added_samples

    @property
    def optional_keys(self) -> list[Key]:
        """Stored keys that some trajectory added (or loaded) since construction, :meth:`clear` or a load
        lacked, in the order first seen. Each sample then carries, per such key, ``("present", *key)``: a
        bool ``[k]``, ``False`` where the row's trajectory lacked the key (its rows hold
        :data:`~objectrl_buffer.trajectory.table.FILL_VALUE`, 0). Empty while every trajectory had every key."""
        return list(self._optional)

    @property
    def size(self) -> int:
        """Number of stored trajectories (RLinf's attribute)."""
        return len(self._table.entries)

    @property
    def total_samples(self) -> int:
        """Number of stored transitions (``sum T*B``)."""
        return self._table.total

    @property
    def trajectory_ids(self) -> list[int]:
        """Ids of the stored trajectories, oldest first."""
        return [e.trajectory_id for e in self._table.entries]

    def trajectory_info(self, trajectory_id: int) -> dict[str, Any]:
        """RLinf's index entry of a stored trajectory: ``{num_samples, trajectory_id, max_episode_length, shape,
        model_weights_id}`` (``shape`` a list, ``[T, B, ...]`` of its ``prev_logprobs`` or ``rewards``), plus
        ``missing``: the stored keys it lacked (dotted names, e.g. ``["versions"]``).

        Raises:
            InvalidArgumentError: ``trajectory_id`` is not stored (:attr:`trajectory_ids`).
        """
        with self._lock:
            return self._table.info(self._table.position(trajectory_id))

    def get_trajectory(self, trajectory_id: int) -> TensorDict:
        """A copy of one stored trajectory: a TensorDict of batch size ``[T, B]`` on ``device``, nested keys
        for the dict fields, without the keys it lacked. Done-like fields hold ``T`` rows (aligned with
        ``rewards``, as stored). Its metadata: :meth:`trajectory_info`.

        Raises:
            InvalidArgumentError: ``trajectory_id`` is not stored. ClosedBufferError: the buffer was closed.
        """
        self._check_open()
        with self._lock:
            i = self._table.position(trajectory_id)
            shape = self._table.entries[i].shape
            rows = self._table.read(i)
        T, B = shape[0], shape[1]
        values = {key: value.reshape(T, B, *value.shape[1:]).to(self.device) for key, value in rows.items()}
        return make_tensordict(values, torch.Size([T, B]), self.device)

    def trajectory_payload(self, trajectory_id: int) -> dict[str, Any]:
        """One stored trajectory as its RLinf file holds it, read from storage (CPU copies): fields
        ``[T, B, ...]`` (done-like ones with their ``T + E`` rows, as added), the dict fields as dicts,
        ``max_episode_length`` and ``model_weights_id``; a field it lacked is left out.

        Raises:
            InvalidArgumentError: ``trajectory_id`` is not stored. ClosedBufferError: the buffer was closed.
        """
        self._check_open()
        with self._lock:
            return self._table.payload(self._table.position(trajectory_id))

    def is_ready(self, min_size: int) -> bool:
        """Whether at least ``min_size`` trajectories were added (:attr:`num_added`, as RLinf counts: a buffer
        that evicts is ready as soon as that many went through it, not only once it holds them).

        Raises:
            InvalidArgumentError: ``min_size`` is not an integer.
        """
        try:
            wanted = operator.index(min_size)
        except TypeError:
            raise InvalidArgumentError(f"min_size must be an int, got {min_size!r}") from None
        return self._added >= wanted

    async def is_ready_async(self, min_size: int) -> bool:
        """:meth:`is_ready`, awaitable (RLinf's async trainers poll it)."""
        return self.is_ready(min_size)

    def get_stats(self) -> dict[str, int]:
        """``{num_trajectories, total_samples, cache_size}`` (RLinf's keys)."""
        n = len(self)
        return {
            "num_trajectories": n,
            "total_samples": self.total_samples,
            "cache_size": min(n, self.cache_size) if self.enable_cache else 0,
        }

    # ------------------------------------------------------------------ adding
    def add_trajectories(
        self, trajectories: Sequence[Trajectory | TensorDictBase] | Trajectory | TensorDictBase
    ) -> None:
        """Store each trajectory (a :class:`Trajectory`, or a TensorDict of batch size ``[T, B]``) as ``T*B`` rows.

        Ids are sequential ints. Every trajectory is checked (shapes, the stored schema, ``capacity``) before
        any is stored: a bad one raises (``ValueError``/:class:`SchemaError`) and leaves the buffer as it was.
        With ``save_trajectories`` the files are written in the background (see :meth:`flush`).
        """
        self._check_open()
        if isinstance(trajectories, TensorDictBase) or trajectory_fields(trajectories) is not None:
            trajectories = [trajectories]
        if not isinstance(trajectories, Sequence):
            raise InvalidArgumentError(
                f"trajectories must be a list of Trajectory or TensorDict, got {type(trajectories).__name__}"
            )
        if not trajectories:
            return
        if self._writer is not None:
            self._writer.raise_error()
        with self._lock:
            table = self._table
            schema = table.rows.schema
            ready: list[tuple[Flat, Schema, Pairs, int, frozenset[Key]]] = []
            for i, item in enumerate(trajectories):
                where = f"trajectories[{i}]"
                flat = flatten(item, where)
                rows, missing = complete(flat.rows, schema, where)
                schema, pairs, n = table.rows.prepare(rows, schema)
                if self.capacity is not None and n > self.capacity:
                    raise InvalidArgumentError(f"{where} has {n} transitions, more than capacity={self.capacity}")
                ready.append((flat, schema, pairs, n, missing))
            for flat, schema, pairs, n, missing in ready:
                self._store(table, flat, schema, pairs, n, self._counter, persist=True, missing=missing)
                self._counter += 1
                self._added += 1
                self._added_samples += n
                self._optional.update(dict.fromkeys(sorted(missing, key=str)))
            self._version += 1

    def _store(
        self,
        table: Table,
        flat: Flat,
        schema: Schema,
        pairs: Pairs,
        n: int,
        trajectory_id: int,
        persist: bool,
        missing: frozenset[Key] = frozenset(),
    ) -> None:
        entry = Entry(trajectory_id, n, flat.max_episode_length, flat.shape, flat.model_weights_id, heads=flat.heads)
        _, evicted = table.append(schema, pairs, n, entry, missing)
        writer = self._writer
        if persist and writer is not None:
            if evicted or self._unkept:
                writer.drop([e.trajectory_id for e in evicted] + self._unkept)
                self._unkept = []
            writer.submit(entry, table.payload(len(table.entries) - 1))

    # ------------------------------------------------------------------ sampling
    def _window_tensors(self) -> tuple[torch.Tensor, torch.Tensor, int, dict[Key, torch.Tensor]]:
        """``(cumulative ends, address offsets, transitions, presence)`` of the window, cached per add and
        window size; ``presence[key]``: per window trajectory, whether it held the optional ``key``."""
        window = self.sample_window_size
        cached = self._window
        if cached is not None and cached[0] == self._version and cached[1] == window:
            return cached[2], cached[3], cached[4], cached[5]
        table = self._table
        start = max(0, len(table.entries) - window) if window > 0 else 0
        counts = torch.tensor([e.num_samples for e in table.entries[start:]], dtype=torch.int64)
        firsts = torch.tensor(table.firsts[start:], dtype=torch.int64)
        ends = counts.cumsum(0)
        offsets = firsts - (ends - counts)  # address = sample index + offset of its trajectory
        total = int(ends[-1]) if ends.numel() else 0
        presence = {
            key: torch.tensor([key not in lacked for lacked in table.missing[start:]], dtype=torch.bool)
            for key in self._optional
        }
        self._window = (self._version, window, ends, offsets, total, presence)
        return ends, offsets, total, presence

    def sample(self, num_chunks: int) -> TensorDict:
        """``num_chunks`` transitions drawn uniformly with replacement from the newest ``sample_window_size``
        trajectories, as a TensorDict of batch size ``[k]`` on ``device`` (nested keys for the dict fields).

        ``k = min(num_chunks, transitions in the window)``, as RLinf clips it. For each of
        :attr:`optional_keys` the sample also holds ``("present", *key)``, a bool ``[k]`` (see there).

        Raises:
            InvalidArgumentError: ``num_chunks`` is not a positive int.
            EmptyBufferError (a RuntimeError): "Cannot sample from an empty buffer."
        """
        self._check_open()
        num_chunks = positive_int(num_chunks, "num_chunks")
        with self._lock:
            if self._table.total == 0:
                raise EmptyBufferError("Cannot sample from an empty buffer.")
            ends, offsets, total, presence = self._window_tensors()
            k = min(num_chunks, total)
            index = torch.randint(total, (k,), generator=self.generator)
            owner = torch.bucketize(index, ends, right=True)
            addresses = index + offsets[owner]
            if self.storing_device.type != "cpu":
                addresses = addresses.to(self.storing_device)
            values = self._table.rows.gather(addresses)
        if self.device != self.storing_device:
            values = {key: value.to(self.device) for key, value in values.items()}
        for key, held in presence.items():
            values[(PRESENT_KEY, key) if isinstance(key, str) else (PRESENT_KEY, *key)] = held[owner].to(self.device)
        return make_tensordict(values, torch.Size([k]), self.device)

    # ------------------------------------------------------------------ lifecycle
    def flush(self, timeout: float | None = None) -> None:
        """Wait until every added trajectory is on disk and indexed (no-op without ``save_trajectories``).

        Raises ``TimeoutError`` after ``timeout`` seconds, :class:`CheckpointError` if writing failed."""
        self._check_open()
        if self._writer is not None:
            self._writer.flush(timeout)

    def close(self, wait: bool = True) -> None:
        """Stop the writer after its queued work (with ``wait``, wait for it) and free the rows. Idempotent;
        any later use but :meth:`clear` and :meth:`clear_cache` (RLinf's cleanup runs ``close(); clear();
        clear_cache()``) raises :class:`ClosedBufferError`."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        try:
            if self._writer is not None:
                self._writer.close(wait=wait)  # raises the writer's failure, if any
        finally:
            self._table.rows.close()

    def clear(self) -> None:
        """Forget every trajectory and reset the id counter. The writer's index is emptied too; trajectory
        files already written stay on disk (as RLinf leaves them), unindexed. On a closed buffer it only
        resets the counts (``len`` 0; the folder is left as the close published it)."""
        with self._lock:
            old = self._table
            self._holder[0] = Table(self.capacity, self.storing_device, self.keep)
            old.rows.close()
            self._counter = 0
            self._added = 0
            self._added_samples = 0
            self._optional = {}
            self._version += 1
            self._unkept = []
            if self._writer is not None and not self._closed:
                self._writer.reset([])

    def clear_cache(self) -> None:
        """RLinf's ``clear_cache``: wait for pending writes. Rows stay stored and the buffer stays usable;
        on a closed buffer it does nothing."""
        if not self._closed:
            self.flush()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_path: str | os.PathLike[str]) -> None:
        """Write every stored trajectory to ``save_path`` as an RLinf folder (files first, then index and
        metadata, each atomically; over an existing checkpoint, built beside it and swapped in at once, so a
        kill leaves the old checkpoint or the new one). Into the buffer's own ``storage_dir`` this is a
        :meth:`flush`. The ``storage_dir`` of another live buffer's writer (``save_trajectories``, in this
        process or another) is refused: each writer holds a kernel-released lock on its folder while it runs
        (see :func:`~objectrl_buffer.trajectory.checkpoint.write_folder`), and the save would swap the folder
        away under it.

        A checkpoint holding fewer trajectories than :attr:`num_added` (evicted by ``capacity``, or outside the
        window of a buffer that keeps only its window) records both in ``metadata.json``: ``num_added`` and
        ``kept`` (a sentence saying which are in it); a full load restores :attr:`num_added`. A buffer that keeps
        only its window also warns then (:class:`~objectrl_buffer.errors.PartialCheckpointWarning`): the
        older trajectories are gone, build it with ``save_trajectories=True`` or ``capacity=`` to keep them.

        Raises:
            InvalidArgumentError: ``save_path`` is empty, not a folder, or another live writer's folder.
            CheckpointError: writing failed.
        """
        self._check_open()
        path = _folder_path(save_path, "save_path")
        writer = self._writer
        if writer is not None and os.path.realpath(path) == os.path.realpath(writer.folder):
            writer.flush()
            return
        with self._lock:
            held, added = len(self._table.entries), self._added
            note = None
            if held < added:
                why = "capacity" if self.keep is None else f"sample_window_size={self.keep}, without save_trajectories"
                kept = f"the newest {held} of the {added} trajectories added (the buffer kept only those: {why})"
                note = {files.NUM_ADDED: added, "kept": kept}
                if self.keep is not None:
                    warnings.warn(
                        f"save_checkpoint('{path}') writes {kept}; the others are gone. Build the buffer with "
                        "save_trajectories=True (or capacity=) to checkpoint them",
                        PartialCheckpointWarning,
                        stacklevel=2,
                    )
            checkpoint.write_folder(path, self._table, self.storage_format, self.seed, note)

    def load_checkpoint(
        self,
        load_path: str | os.PathLike[str],
        is_distributed: bool = False,
        local_rank: int = 0,
        world_size: int = 1,
    ) -> None:
        """Replace the buffer's trajectories with those of an RLinf folder (ours or RLinf's own).

        With ``is_distributed``, only rank ``local_rank``'s contiguous share of the index, the remainder
        going to the low ranks (10 trajectories over 3 ranks: 4, 3, 3). The generator is re-seeded from the
        folder's seed, as RLinf does. Ids are kept; the next id follows the largest loaded one (a full
        load: the folder's counter).

        Raises:
            InvalidArgumentError: ``local_rank`` outside ``[0, world_size)``, ``world_size`` < 1.
            CheckpointNotFoundError (a FileNotFoundError): the metadata, index or trajectory files are
                missing (all of them named). CheckpointError: a damaged folder, or ``.pkl`` files without
                ``allow_pickle``. The buffer is unchanged by any of these.
        """
        self._check_open()
        path = _folder_path(load_path, "load_path")
        if is_distributed:
            world_size = checkpoint.check_rank(local_rank, world_size)
        own = self._writer is not None and os.path.realpath(path) == os.path.realpath(self._writer.folder)
        if own and is_distributed:
            raise InvalidArgumentError(
                f"a sharded load from the buffer's own storage_dir '{path}' would drop the other ranks' "
                "trajectories from its index: give each rank its own storage_dir"
            )
        if own:
            self.flush()  # the folder then names exactly what the writer holds: loading it rewrites nothing
        folder = files.read_folder(path)
        entries = checkpoint.rank_share(folder.entries, local_rank, world_size) if is_distributed else folder.entries
        with self._lock:
            self._load(folder, entries)
            self._unkept = []
            if self._writer is not None:
                table = self._table
                if own:  # as on opening: ids the table could not keep leave the index at the next add
                    kept = {e.trajectory_id for e in table.entries}
                    self._unkept = [e.trajectory_id for e in entries if e.trajectory_id not in kept]
                else:
                    self._writer.reset([])
                    for i, entry in enumerate(table.entries):
                        self._writer.submit(entry, table.payload(i))

    def _load(self, folder: files.Folder, entries: list[Entry]) -> None:
        """Build a new table from ``entries``' files, then swap it in (the old one is untouched on error)."""
        kept = entries[-self.keep :] if self.keep is not None else entries  # the rest would be evicted at once
        table = checkpoint.read_table(folder, kept, self.capacity, self.storing_device, self.allow_pickle, self.keep)
        old, self._holder[0] = self._holder[0], table
        old.rows.close()
        self._added = len(entries)
        recorded = folder.metadata.get(files.NUM_ADDED)  # a partial checkpoint's count (save_checkpoint)
        if len(entries) == len(folder.entries) and isinstance(recorded, int) and not isinstance(recorded, bool):
            self._added = max(recorded, len(entries))
        self._added_samples = sum(e.num_samples for e in entries)
        self._optional = {key: None for lacked in table.missing for key in sorted(lacked, key=str)}
        ids = [e.trajectory_id for e in entries]
        counter = folder.metadata.get("trajectory_counter", 0) if len(entries) == len(folder.entries) else 0
        self._counter = max(counter if isinstance(counter, int) else 0, max(ids, default=-1) + 1)
        seed = folder.seed
        if isinstance(seed, int) and not isinstance(seed, bool):
            self.seed = seed
            self.generator.manual_seed(seed)
        self._version += 1
