"""What one shard actor of a :class:`~objectrl_buffer.distributed.remote.RemoteBuffer` runs.

A :class:`Shard` holds a buffer plus

* the write generation of each slot (which write of a slot a sample drew, for stale priority updates);
* the last ``seq`` applied per writer id: a write carries ``(writer_id, seq)`` and one whose ``seq`` is not
  above the last applied is acknowledged without being stored again (a retried batch applies exactly once,
  as each writer sends its batches to a shard in order and retries them in order);
* a journal of its writes since the last committed checkpoint (:mod:`.cut`).

A writer on the shard's own node leaves its batches in files it owns (RAM-backed, see
:mod:`.remote`) and sends a :class:`~.wire.SharedRows` descriptor instead of the rows: the shard maps each column
file once (kept per writer and column set until :meth:`Shard.release` or until the writer's folder is gone)
and copies the rows straight from the mapping into its storage, under the same ``(writer_id, seq)`` rule.

All three ride in the buffer's full checkpoints as the extra state ``"remote_shard"``
(:class:`~.shard_state.ShardState`). When Ray restarts a dead shard, the actor is constructed again: it loads
the generation the manifest names, and counts as lost the rows its journal says it wrote after that
checkpoint; a retried write of one of them is stored again and no longer counted lost. The count of lost rows
(and which writes may still come again) rides in the checkpoints too, and the journal tells a shard's
lifetimes apart (:mod:`.cut`), so ``lost_rows`` adds up over every restart: rows held + rows lost == rows
acknowledged, whatever cuts and restarts came in between.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from objectrl_buffer.core.keys import GENERATION_KEY, INDEX_KEY
from objectrl_buffer.distributed.cut import (
    JournalLine,
    journal_line,
    journal_name,
    read_journal,
    read_manifest,
    shard_name,
)
from objectrl_buffer.distributed.location import Journal, Location, as_location, probe
from objectrl_buffer.distributed.mapped import check_folder, map_column
from objectrl_buffer.distributed.observe import MetricsThread, ShardStats
from objectrl_buffer.distributed.shard_state import ShardState
from objectrl_buffer.distributed.tickets import LateWrites
from objectrl_buffer.distributed.wire import (
    MISSING,
    RAW_WEIGHT,
    SharedRows,
    column_path,
    from_numpy,
    pack,
    to_numpy,
    writer_prefix,
)
from objectrl_buffer.errors import BufferUnavailable, InvalidArgumentError, ReplayBufferError
from objectrl_buffer.flow.limited import batch_rows
from objectrl_buffer.storage.torchrl_compat import plain_items

__all__ = ["CALLABLE", "READABLE", "Shard"]

#: Buffer methods :meth:`Shard.call` runs (reads only: no ``save``/``load`` to a caller's path, no writes that
#: bypass the ``(writer, seq)`` rule or the limiter).
CALLABLE = frozenset(
    {
        "__len__",
        "calculate_num_batches",
        "sample",
        "sample_all",
        "sample_batch",
        "sample_by_index",
        "sample_by_index_fields",
        "sample_random",
        "sample_slices",
    }
)
#: Buffer attributes :meth:`Shard.get` reads.
READABLE = frozenset({"beta", "buffer_size", "num_envs"})


def _priorities(buffer: Any) -> Any:
    """The prioritized extra state of a buffer (its public ``checkpoint_extras``), or ``None``."""
    return next((e for e in getattr(buffer, "checkpoint_extras", ()) if getattr(e, "name", "") == "prioritized"), None)


class Shard:
    """One shard: ``buffer_cls(*args, **kwargs)`` and its bookkeeping (see the module docs).

    Args:
        index: this shard's number (names its checkpoint files).
        checkpoint_root: the remote buffer's ``checkpoint_path``, a local path or URI (:mod:`.location`; ``None``:
            no checkpoints, nothing to reload).
        resume: load the manifest's generation even on a first start (a restart always does).
        buffer_id: the remote buffer's id: a :class:`~.wire.SharedRows` batch is taken only from a folder named by
            :func:`~.wire.writer_prefix` for this buffer and its writer.
        metrics: export this shard's numbers as Ray gauges (see :mod:`.observe`; also after a restart).
    """

    def __init__(
        self,
        buffer_cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        index: int = 0,
        checkpoint_root: Location | str | None = None,
        resume: bool = False,
        buffer_id: str = "",
        metrics: bool = False,
    ) -> None:
        self.buffer = buffer_cls(*args, **kwargs)
        self.buffer_id = buffer_id
        self.capacity = int(self.buffer.buffer_size)
        self.num_envs = int(self.buffer.num_envs)
        self.state = ShardState(self.capacity)
        self.buffer.checkpoint_extras.append(self.state)
        self.priorities = _priorities(self.buffer)  # restored in place by load(): found once
        self.index = index
        self.root = None if checkpoint_root is None else as_location(checkpoint_root)
        self.saved_written: dict[int, int] = {}  # generation -> rows written when this shard saved it
        self.journal: Journal | None = None
        #: writer id -> ``(folder, set index)`` -> ``(capacity, layout)`` and its mapped columns
        self.mapped: dict[str, dict[tuple[str, int], tuple[Any, dict[str, np.ndarray]]]] = {}
        self.arrived = {"mapped": 0, "payload": 0}  # batches stored, by how their rows came
        self.refused: dict[str, int] = {}  # writer -> seq of its batch whose files were not found here
        self.sampled_rows = 0  # rows this actor's draws shipped (see usage())
        self.late = LateWrites()  # rows a lost coordinator admitted, stored after its successor's rebuild
        self.metrics: MetricsThread | None = None  # Ray gauges, once start_metrics() was called
        if self.root is not None:
            import ray

            self.root.makedirs()
            reload = resume or ray.get_runtime_context().was_current_actor_reconstructed
            if reload:
                self._reload()
            # a first start without resume begins empty: an older run's journal says nothing about it
            self.journal = Journal(self.root, journal_name(index), fresh=not reload)
        if metrics:
            self.start_metrics()

    @property
    def lost(self) -> int:
        """Rows acknowledged that this shard's restarts dropped, over all its restarts (not stored again)."""
        return self.state.lost

    def _reload(self) -> None:
        """Load the manifest's generation, then count as lost the journal's writes it does not hold: those
        of the lifetime that saved it made after the save, and all of later lifetimes (each counted once,
        by ``(writer, seq)``). This lifetime is one more than any the journal names."""
        assert self.root is not None
        manifest = read_manifest(self.root)
        if manifest is not None:
            with self.root.loading(shard_name(manifest["generation"], self.index)) as path:
                self.buffer.load(path, progress=False)
        state = self.state
        saved, newest = state.epoch, state.epoch
        for line in read_journal(self.root, self.index):
            newest = max(newest, line.epoch)
            if line.epoch > saved or (line.epoch == saved and line.written > state.written):
                pending = state.pending.setdefault(line.writer, {})
                if line.seq not in pending:
                    pending[line.seq] = line.rows
                    state.lost += line.rows
        state.epoch = newest + 1

    # ------------------------------------------------------------------ writes
    def _wrote(self, pointer: int, n: int) -> None:
        state = self.state
        keep = min(n, self.capacity)
        seqs = np.arange(state.written + n - keep, state.written + n, dtype=np.int64)
        state.generation[(pointer + n - keep + np.arange(keep)) % self.capacity] = seqs
        state.written += n

    def _applied(self, writer: str | None, seq: int) -> bool:
        return writer is not None and seq <= self.state.seqs.get(writer, -1)

    def _record(self, writer: str | None, seq: int, n: int) -> bool:
        """Note the write ``(writer, seq)`` of ``n`` rows applied; whether it was a lost write sent again (its
        rows were counted by the limiter when they were first written)."""
        if writer is None:
            return False
        state = self.state
        state.seqs[writer] = seq
        if self.journal is not None:
            self.journal.write(journal_line(JournalLine(writer, seq, n, state.written, state.epoch)))
        pending = state.pending.get(writer)
        resent = 0
        if pending:  # a lost write sent again is held again; earlier lost seqs of this writer can no longer be
            resent = pending.pop(seq, 0)
            state.lost -= resent
            for old in [old for old in pending if old < seq]:
                del pending[old]  # lost for good (still counted)
            if not pending:
                del state.pending[writer]
        return resent > 0

    def add(
        self, transition: Mapping[str, Any], writer: str | None = None, seq: int = 0, ticket: str | None = None
    ) -> int:
        """Store one transition (``num_envs`` rows) unless ``(writer, seq)`` was applied; rows written.
        ``ticket``: the admission's (see :mod:`.tickets`; ``None``: no limiter)."""
        if not self._applied(writer, seq):
            pointer = int(self.buffer.pointer)
            self.buffer.add(from_numpy(transition))
            self._wrote(pointer, self.num_envs)
            if not self._record(writer, seq, self.num_envs):
                self.late.note(ticket, self.num_envs)
        return self.state.written

    def add_batch(
        self, batch: Mapping[str, Any] | SharedRows, writer: str | None = None, seq: int = 0, ticket: str | None = None
    ) -> int:
        """Store a batch unless ``(writer, seq)`` was applied; rows written, or :data:`~.wire.MISSING`: a
        :class:`~.wire.SharedRows` batch whose files are not here, or a later batch of that writer, nothing stored.
        ``ticket``: the admission's (see :mod:`.tickets`; ``None``: no limiter)."""
        if not self._applied(writer, seq):
            refused = self.refused.get(writer or "")
            if refused is not None and seq > refused:
                return MISSING  # stored only after the refused batch: the writer sends both again, in order
            if isinstance(batch, SharedRows):
                try:
                    batch = self._map(batch, writer or "")
                except BufferUnavailable:
                    if writer is None:
                        raise
                    self.refused[writer] = seq
                    return MISSING
                self.arrived["mapped"] += 1
            else:
                self.arrived["payload"] += 1
            self.refused.pop(writer or "", None)
            pointer = int(self.buffer.pointer)
            self.buffer.add_batch(from_numpy(batch))
            n = batch_rows(batch, self.num_envs)
            self._wrote(pointer, n)
            if not self._record(writer, seq, n):
                self.late.note(ticket, n)
        return self.state.written

    def _map(self, rows: SharedRows, writer: str) -> dict[str, np.ndarray]:
        """Views of the first ``rows.rows`` rows of a writer's column set, its files mapped on first use.

        The folder must be the writer's own and the files are mapped read-only (:mod:`.mapped`: no link, in
        ``/dev/shm`` or the temp folder, named by :func:`~.wire.writer_prefix` of this buffer and writer, this user's
        and not writable by others): the shard never writes to them.

        Raises:
            BufferUnavailable: the files are gone (their writer closed) or are not on this shard's node.
            InvalidArgumentError: the folder or a file is not one this buffer's writer made (named, with why).
        """
        who = f"shard {self.index}"
        check_folder(rows.folder, writer_prefix(self.buffer_id, writer), who)
        sets = self.mapped.get(writer)
        if sets is None:  # a new writer: a good moment to drop the mappings of writers whose files are gone
            self.mapped = {w: m for w, m in self.mapped.items() if all(os.path.isdir(f) for f, _ in m)}
            sets = self.mapped[writer] = {}
        shape = (rows.capacity, rows.layout)
        got = sets.get((rows.folder, rows.index))
        if got is None or got[0] != shape:
            try:
                columns = {
                    key: map_column(
                        column_path(rows.folder, rows.index, j), np.dtype(dtype), (rows.capacity, *per), who
                    )
                    for j, (key, dtype, per) in enumerate(rows.layout)
                }
            except (TypeError, ValueError) as exc:  # a layout that is not one
                raise InvalidArgumentError(f"{who}: a shared-rows batch of a bad layout ({exc}); refused") from None
            got = sets[(rows.folder, rows.index)] = (shape, columns)
        return {key: column[: rows.rows] for key, column in got[1].items()}

    def release(self, writer: str) -> None:
        """Drop the mappings of ``writer``'s files (it is closing)."""
        self.mapped.pop(writer, None)

    def node_id(self) -> str:
        """The Ray node this shard runs on (a writer on it sends :class:`~.wire.SharedRows`)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def sees(self, folder: str) -> bool:
        """Whether ``folder`` (a writer's) is visible here: a shard in a container of its own on the writer's
        node may have a ``/dev/shm`` of its own."""
        return os.path.isdir(folder)

    def probe(self, write: tuple[str, str] | None, read: dict[str, str]) -> tuple[str, list[str]]:
        """One step of the launch check at the checkpoint location (:func:`.location.probe`): this shard's node
        and what went wrong."""
        return self.node_id(), ["has no checkpoint location"] if self.root is None else probe(self.root, write, read)

    def transports(self) -> dict[str, int]:
        """Batches stored since this actor started, by how their rows came: ``mapped`` (from a same-node
        writer's files) or ``payload`` (through Ray)."""
        return dict(self.arrived)

    # ------------------------------------------------------------------ reads
    def counts(self, rebuilt_by: str | None = None) -> tuple[int, int, int]:
        """``(written, held, sampled)``: rows ever written (a restart reloads the cut's and counts on), rows held
        now, and admitted samples counted here: what a restarted coordinator rebuilds its limiter from
        (``rebuilt_by``: its ticket; later writes of other tickets are late, see :mod:`.tickets`)."""
        if rebuilt_by is not None:
            self.late.rebuilt(rebuilt_by)
        return self.state.written, len(self.buffer), self.state.sampled

    def late_rows(self, current: str | None = None) -> tuple[str, int]:
        """``(this actor's incarnation, late rows)``: rows stored under another coordinator's ticket since the
        last rebuild; ``current``: the asking coordinator's ticket (see :meth:`.tickets.LateWrites.report`)."""
        return self.late.report(current)

    def usage(self) -> ShardStats:
        """This shard's numbers for :meth:`RemoteBuffer.stats <.remote.RemoteBuffer.stats>` (see
        :mod:`.observe`): ``restarted`` says whether this actor is a restart of the first (Ray's
        ``was_current_actor_reconstructed``); ``sampled_rows`` counts this actor's draws only."""
        import ray

        context = ray.get_runtime_context()
        return {
            "shard": self.index,
            "node_id": str(context.get_node_id()),
            "rows": len(self.buffer),
            "inserts": self.state.written,
            "sampled_rows": self.sampled_rows,
            "lost_rows": self.lost,
            "restarted": bool(context.was_current_actor_reconstructed),
        }

    def start_metrics(self) -> dict[str, float]:
        """Export this shard's numbers as Ray gauges (see :mod:`.observe`) from now on; what was set."""
        if self.metrics is None:
            self.metrics = MetricsThread(self._metric_values, {"buffer": self.buffer_id, "shard": str(self.index)})
        return dict(self.metrics.last)

    def _metric_values(self) -> dict[str, float]:
        return {
            "objectrl_buffer_shard_rows": len(self.buffer),
            "objectrl_buffer_shard_inserts": self.state.written,
            "objectrl_buffer_shard_sampled_rows": self.sampled_rows,
            "objectrl_buffer_shard_lost_rows": self.lost,
        }

    def stats(self) -> tuple[int, float, int]:
        """``(rows, mass, lost)``: mass is the priority mass of a prioritized buffer, else the row count."""
        priorities = self.priorities
        size = len(self.buffer)
        mass = float(priorities.index.total()) if priorities is not None and size else float(size)
        return size, mass, self.lost

    def sample(self, k: int, _admitted: Any = None, counted: int = 0) -> bytes | ReplayBufferError:
        """The shard's mass and ``k`` rows drawn by the buffer's own rule (with ``"generation"`` and, prioritized,
        the raw weights), :func:`~.wire.pack` ed; no rows when it holds none. ``counted``: samples the limiter admitted
        for this draw, added to this shard's count (the handle tells one shard per admitted sample: a restarted
        coordinator adds them up, see :mod:`.coordinator`). ``_admitted``: a refusal is returned as it is."""
        if isinstance(_admitted, ReplayBufferError):
            return _admitted
        self.state.sampled += counted
        _, mass, _ = self.stats()
        if not mass > 0:
            return pack(0.0, {})
        batch = self.buffer.sample_batch(k)
        self.sampled_rows += k
        items = plain_items(batch, 1)  # the TensorDict's own dict: ~20 us less than its items() walk
        if items is not None and all(type(value) is torch.Tensor for value in items.values()):
            out = {key: value.numpy() for key, value in items.items()}
        else:  # nested keys, or several envs a row
            out = to_numpy(batch)
        slots = out[INDEX_KEY]
        out[GENERATION_KEY] = self.state.generation.take(slots)
        priorities = self.priorities
        if priorities is not None:
            raw = (priorities.priority.index_select(0, batch[INDEX_KEY]) + priorities.eps).pow(priorities.alpha)
            out[RAW_WEIGHT] = raw.numpy()
        return pack(mass, out)

    def update_priority(self, slots: np.ndarray, priority: np.ndarray, generation: np.ndarray | None) -> int:
        """Set priorities at local ``slots``, skipping those rewritten since ``generation``; how many applied."""
        current = self.state.generation
        keep = np.ones(len(slots), dtype=bool) if generation is None else current[slots] == generation
        if keep.any():
            self.buffer.update_priority(torch.from_numpy(slots[keep]), torch.from_numpy(priority[keep]))
        return int(keep.sum())

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, generation: int) -> int:
        """Save this shard into ``generation``'s folder (durable when this returns); rows held."""
        assert self.root is not None
        with self.root.saving(shard_name(generation, self.index)) as path:
            self.buffer.save(path, data=True, progress=False)
        self.saved_written[generation] = self.state.written
        return len(self.buffer)

    def commit(self, generation: int) -> None:
        """The manifest names ``generation`` now: drop journal lines it covers, forget older saves.

        Saved by this lifetime, it covers this lifetime's lines up to its save and every earlier lifetime's
        (their losses are in its ``lost``); saved by an earlier lifetime (this one restarted between the save
        and the commit), it is not known here and every line is kept."""
        assert self.root is not None and self.journal is not None
        covered = self.saved_written.get(generation)
        self.saved_written = {g: w for g, w in self.saved_written.items() if g > generation}
        name = journal_name(self.index)
        self.journal.close()
        epoch = self.state.epoch
        lines = read_journal(self.root, self.index)
        if covered is not None:
            lines = [line for line in lines if line.epoch == epoch and line.written > covered]
        self.root.write_bytes(name, "".join(journal_line(line) for line in lines).encode(), durable=False)
        self.journal = Journal(self.root, name, fresh=False)

    def close(self) -> None:
        """Free the buffer's storage (its folder and files go) and close the journal: the actor is about to be
        killed for good (:meth:`RemoteBuffer.kill <objectrl_buffer.distributed.remote.RemoteBuffer.kill>`)."""
        self.mapped.clear()
        self.buffer.close()
        if self.journal is not None:
            self.journal.close()
            self.journal = None

    # ------------------------------------------------------------------ anything else
    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``buffer.<name>(*args, **kwargs)`` for a name in :data:`CALLABLE`.

        Raises:
            InvalidArgumentError: any other name (named).
        """
        if name not in CALLABLE:
            raise InvalidArgumentError(
                f"call: {name!r} is not one of the buffer methods a shard runs ({sorted(CALLABLE)})"
            )
        return getattr(self.buffer, name)(*args, **kwargs)

    def get(self, name: str) -> Any:
        """``buffer.<name>`` for a name in :data:`READABLE`. Raises as :meth:`call`."""
        if name not in READABLE:
            raise InvalidArgumentError(f"get: {name!r} is not one of the attributes a shard reads ({sorted(READABLE)})")
        return getattr(self.buffer, name)

    def save(self, path: str, data: bool = False) -> None:
        """The buffer's ``save(path, data)`` (:meth:`RemoteBuffer.save
        <objectrl_buffer.distributed.remote.RemoteBuffer.save>`)."""
        self.buffer.save(path, data)
