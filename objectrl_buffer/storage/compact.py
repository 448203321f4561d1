"""Pixel observations stored once: ``next_of`` and ``frame_stack`` (issue 25, cpprb's names).

``next_of={"next_state": "state"}`` says that a row's ``next_state`` is the ``state`` of the next row of
the same env stream; ``frame_stack={"state": 4}`` says that ``state`` stacks the last 4 frames along its
first axis, newest last. :class:`CompactStorage` then keeps, per env step, one frame, and rebuilds every
row on read, bit for bit what a plain storage returns for the same writes.

Layout (``E`` envs, ``C`` rows, ``S = C / E`` steps per env, ``k`` frames in a stack):

* The rows' other keys live in a plain :class:`~objectrl_buffer.storage.table.TransitionStorage` (the
  table). Each row also records its env step ``T`` (counted since the storage was emptied).
* Frames: per observed key, a ring of ``(S + k - 1) * E`` frames (a ``TransitionStorage`` of its own:
  CPU memmap files placed like the table's, or device memory), frame of step ``T`` of env ``e`` at
  ``(T mod (S + k - 1)) * E + e``. The ``k - 1`` extra steps are the margin the ring wrap needs: when the
  oldest row of an env is overwritten, the next-oldest rows still read its frame (and older ones), and a
  frame outlives its row by exactly ``k - 1`` steps, so no frame a live row reads is ever overwritten.
* A side pool (:class:`~objectrl_buffer.storage.frame_pool.FramePool`) for the values that do not come
  from the frames: the whole stack of a row at an episode start (its reset padding, or whatever the env
  put there) and the ``next_state`` of a row that ended an episode (terminated or truncated per the
  buffer's :class:`~objectrl_buffer.sampling.slices.TransitionKeys`). Row ``T`` at distance ``m < k - 1``
  after the episode start reads its ``k - 1 - m`` oldest frames from that start's pool entry.
* The newest row of each env (the write head) keeps its ``next_state`` aside until the next row comes.

A row's ``next_state`` is then its successor's ``state`` (same env, next slot), the pool entry, or the
head's value. Memory: one frame per step, plus ``k - 1`` frames per env, plus about ``k + 1`` frames per
episode, plus 8-24 bytes of bookkeeping per row.

Checks: the first write checks the claims' shapes and dtypes (``next_state`` like ``state``; a stacked key's
first axis is ``k``). Every write then compares the overlap it relies on, byte for byte, on the storing
device: ``state[:-1]`` of a row against ``state[1:]`` of the env's previous row, and ``state`` against the
previous row's ``next_state``, unless that row ended an episode. A mismatch raises ``SchemaError`` naming
the key and nothing is stored, so what is served is always what was written.

Compression of frame chunks (zstd/lz4) is not done: it would put a decode on every sampled frame.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from objectrl_buffer.core.schema import Key, Schema, format_key
from objectrl_buffer.errors import ForkedBufferError, InvalidArgumentError, SchemaError
from objectrl_buffer.storage.compact_access import Columns, VirtualColumn
from objectrl_buffer.storage.compact_step import PREVIOUS_ROW, SAME_ROW, StepWriter, overlap_error
from objectrl_buffer.storage.frame_stream import SUCCESSOR, FrameStream, numpy_paths
from objectrl_buffer.storage.table import TransitionStorage

__all__ = ["CompactSpec", "CompactStorage"]


@dataclass(frozen=True)
class CompactSpec:
    """Which keys are stored compactly: ``next_of`` (next key -> observed key), ``frame_stack`` (key -> k)."""

    next_of: tuple[tuple[str, str], ...]
    frame_stack: tuple[tuple[str, int], ...]

    @classmethod
    def build(cls, next_of: Mapping[str, str] | None, frame_stack: Mapping[str, int] | None) -> CompactSpec | None:
        """The checked arguments (``None`` when both are empty).

        Raises:
            InvalidArgumentError: naming the argument: not a mapping of str -> str / str -> int >= 1, a key
                that is the next of two keys or the next of itself, or a stacked next key.
        """
        pairs: list[tuple[str, str]] = []
        stacks: list[tuple[str, int]] = []
        for name, given in (("next_of", next_of), ("frame_stack", frame_stack)):
            if given is not None and not isinstance(given, Mapping):
                raise InvalidArgumentError(f"{name} must be a mapping, got {type(given).__name__}")
        for nxt, obs in (next_of or {}).items():
            if not isinstance(nxt, str) or not isinstance(obs, str):
                raise InvalidArgumentError(f"next_of maps key names to key names, got {nxt!r}: {obs!r}")
            if nxt == obs:
                raise InvalidArgumentError(f"next_of: '{nxt}' cannot be the next value of itself")
            pairs.append((nxt, obs))
        for key, k in (frame_stack or {}).items():
            if not isinstance(key, str) or type(k) is not int or k < 1:
                raise InvalidArgumentError(f"frame_stack maps key names to ints >= 1, got {key!r}: {k!r}")
            stacks.append((key, k))
        nexts = {n for n, _ in pairs}
        if len({o for _, o in pairs}) < len(pairs):
            raise InvalidArgumentError(f"next_of: one next key per observed key, got {dict(pairs)}")
        for _, o in pairs:
            if o in nexts:
                raise InvalidArgumentError(f"next_of: '{o}' is itself a next key; name the observed key")
        for key, _ in stacks:
            if key in nexts:
                raise InvalidArgumentError(
                    f"frame_stack: name the observed key, not its next key '{key}' (it is stacked alike)"
                )
        if not pairs and not stacks:
            return None
        return cls(tuple(pairs), tuple(stacks))

    @property
    def keys(self) -> set[str]:
        """Every key stored compactly."""
        return {n for n, _ in self.next_of} | {o for _, o in self.next_of} | {s for s, _ in self.frame_stack}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` as something whose ``==`` compares bytes (floats: -0.0 is not 0.0, NaN equals its own bits)."""
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t.contiguous().view(torch.uint8)
    return t


def _same(a: torch.Tensor, b: torch.Tensor, lead: int) -> torch.Tensor:
    """Per leading index (``lead`` dims), whether ``a`` and ``b`` hold the same bytes."""
    eq = _bits(a) == _bits(b)
    return eq.reshape(*eq.shape[:lead], -1).all(-1)


class CompactStorage:
    """Rows of one schema whose ``next_of``/``frame_stack`` keys are kept as frames (see the module docs).

    Offers what the :class:`~objectrl_buffer.engine.Engine` uses of a
    :class:`~objectrl_buffer.storage.table.TransitionStorage`: its per-step path ``fast`` (one env on the
    CPU: a :class:`~objectrl_buffer.storage.compact_step.StepWriter`, which checks the overlaps too) and no
    NumPy view (``arrays``): batches go through :meth:`write_rows`, which checks them as a whole.

    Args:
        capacity, device, directory: as ``TransitionStorage``. num_envs: env streams (slot ``t * E + e``).
        spec: the claims. end_keys: keys whose non-zero value ends an episode (``terminated``, ``truncated``).
    """

    arrays = None

    def __init__(
        self,
        capacity: int,
        device: torch.device,
        directory: str | os.PathLike[str] | None,
        *,
        num_envs: int,
        spec: CompactSpec,
        end_keys: Iterable[Key],
    ) -> None:
        self.capacity = capacity
        self.device = device
        self.directory = directory
        self.num_envs = num_envs
        self.spec = spec
        self.end_keys = tuple(end_keys)
        self.schema: Schema | None = None
        self.table: TransitionStorage | None = TransitionStorage(capacity, device, directory)
        self.streams: dict[Key, FrameStream] = {}
        self.virtual: dict[Key, VirtualColumn] = {}
        self.columns: Mapping[Key, Any] = Columns(self)
        self.fast: StepWriter | None = None
        self.closed = False
        # Changes (writes, resets) so far, in memory a fork child shares: see _unchanged_since_fork()
        self._owner = os.getpid()
        self.changes = np.frombuffer(mmap.mmap(-1, 8), dtype=np.int64)
        self.changes_seen = 0  # the changes this process made or knows of
        self._reset_rows()

    def _reset_rows(self) -> None:
        self.steps = 0  # env steps written since the storage was emptied
        self.step = torch.zeros(self.capacity, dtype=torch.int64, device=self.device)  # each row's env step
        self.last_ended = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)  # the head rows'
        if self.device.type == "cpu":
            self.step_np, self.last_ended_np = self.step.numpy(), self.last_ended.numpy()

    # ------------------------------------------------------------------ what the engine reads
    @property
    def initialized(self) -> bool:
        return self.schema is not None

    @property
    def folder(self) -> str | None:
        return None if self.table is None else self.table.folder

    @property
    def torchrl(self) -> Any:
        assert self.table is not None
        return self.table.torchrl

    @property
    def nbytes(self) -> int:
        """Bytes allocated for rows: the table, frames, pools and bookkeeping (0 before the first write)."""
        if self.schema is None:
            return 0
        table = 0 if self.table is None else self.table.nbytes
        return table + self.step.numel() * 8 + sum(s.nbytes for s in self.streams.values())

    # ------------------------------------------------------------------ lifecycle
    def initialize(
        self,
        schema: Schema,
        first_row: dict[Key, torch.Tensor],
        *,
        populate: bool = True,
        table: TransitionStorage | None = None,
    ) -> None:
        """Check the claims against ``schema`` and allocate the table, frames and pools. ``table``: take
        this (restored) table of the other keys instead of allocating one (a checkpoint load).

        Raises:
            SchemaError: a claimed key is not written, a next key differs from its observed key in shape
                or dtype, or a stacked key's first axis is not its ``k``.
        """
        by_key = schema.by_key
        for key in self.spec.keys:
            if key not in by_key:
                raise SchemaError(
                    f"key '{key}' is named in next_of/frame_stack but the first write has no such key; "
                    f"written keys: {[format_key(f.key) for f in schema.fields]}"
                )
        stacks = dict(self.spec.frame_stack)
        for key, k in stacks.items():
            shape = by_key[key].shape
            if len(shape) == 0 or shape[0] != k:
                raise SchemaError(
                    f"key '{key}': frame_stack says {k} frames along the first axis, got shape {tuple(shape)}"
                )
        for later, obs in self.spec.next_of:
            a, b = by_key[later], by_key[obs]
            if a.shape != b.shape or a.dtype != b.dtype:
                raise SchemaError(
                    f"key '{later}': next_of says it is the next row's '{obs}' ({b.describe()}), got {a.describe()}"
                )
        observed = [f for f in schema.fields if f.key in stacks or f.key in {o for _, o in self.spec.next_of}]
        plain = [f for f in schema.fields if f.key not in self.spec.keys]
        if not plain:
            raise SchemaError(
                "next_of/frame_stack name every written key: a compact buffer needs at least one other key "
                "(reward, action, terminated, ...)"
            )
        if table is not None:
            if self.table is not None:
                self.table.close()
            self.table = table
        else:
            assert self.table is not None
            self.table.initialize(Schema(plain), {f.key: first_row[f.key] for f in plain}, populate=populate)
        for s in self.streams.values():
            s.close()
        self.streams = {}
        self.observed_of: dict[Key, Key] = {n: o for n, o in self.spec.next_of}
        for f in observed:
            nxt = next((n for n, o in self.spec.next_of if o == f.key), None)
            self.streams[f.key] = FrameStream(
                f,
                stacks.get(str(f.key), 1),
                f.key in stacks,
                nxt,
                capacity=self.capacity,
                num_envs=self.num_envs,
                device=self.device,
                directory=self.directory,
            )
        self.virtual = {f.key: VirtualColumn(self, f) for f in schema.fields if f.key in self.spec.keys}
        self.schema = schema
        self._reset_rows()
        if numpy_paths(self.device) and self.num_envs == 1:
            self.fast = StepWriter(self, schema)

    def _changed(self) -> None:
        self.changes_seen += 1
        self.changes[0] = self.changes_seen

    def _unchanged_since_fork(self) -> None:
        """In a process that inherited this storage through ``fork``: refuse to read once the parent has
        written (or reset) it since. The frames are the parent's shared files, the links this process's
        copy: rows rebuilt from both could be stacks that were never written.

        Raises:
            ForkedBufferError: the parent changed the rows since the fork.
        """
        if int(self.changes[0]) != self.changes_seen:
            raise ForkedBufferError(
                "this compact (next_of/frame_stack) buffer was inherited through fork and the parent process has "
                "written to it since: its rows cannot be read here. Share it before the fork "
                "(objectrl_buffer.distributed.process.become_shared, or hand it to the Process) to read its rows"
            )

    def release(self) -> None:
        """Drop the rows and the schema (``reset()``)."""
        self._changed()
        if self.table is not None:
            self.table.release()
        self._drop_streams()

    def resize(self, capacity: int) -> None:
        """Drop the rows and take a new capacity."""
        self._changed()
        self._drop_streams()
        self.capacity = capacity
        if self.table is not None:
            self.table.resize(capacity)
        else:
            self.table = TransitionStorage(capacity, self.device, self.directory)
        self._reset_rows()

    def close(self) -> None:
        if self.table is not None:
            self.table.close()
        self._drop_streams()
        self.closed = True

    def _drop_streams(self) -> None:
        for s in self.streams.values():
            s.close()
        self.streams, self.virtual, self.schema, self.fast = {}, {}, None, None
        if self.table is None and not self.closed:
            self.table = TransitionStorage(self.capacity, self.device, self.directory)

    def reserve_rows(self, rows: int, populate: bool = True) -> None:
        if self.table is not None:
            self.table.reserve_rows(rows, populate)

    # ------------------------------------------------------------------ writes
    def write(self, slot: int, pairs: list[tuple[Any, Any]]) -> None:
        """One checked row at ``slot`` (the ring's pointer)."""
        if self.fast is not None and self.steps:
            self.fast.write_checked(slot, {f.key: np.asarray(v) for f, v in pairs})
            return
        batch = [(f, torch.as_tensor(v, dtype=f.dtype).reshape(f.shape).unsqueeze(0)) for f, v in pairs]
        self.write_rows(slot, batch, first=0, n=1)

    def _ended(self, values: Mapping[Key, torch.Tensor], rows: int) -> torch.Tensor:
        ended = torch.zeros(rows, dtype=torch.bool, device=self.device)
        for key in self.end_keys:
            if key in values:
                ended |= values[key].to(self.device).reshape(rows, -1).ne(0).any(1)
        return ended

    @torch.no_grad()
    def write_rows(self, start: int, pairs: list[tuple[Any, Any]], first: int, n: int) -> None:
        """Rows ``first .. first+n-1`` of each batched value to slots ``start, ...`` (mod capacity); the
        ``first`` rows before them are checked and their frames kept, as the plain storage's are dropped.

        Raises:
            SchemaError: naming the key, a claimed overlap does not hold (nothing is stored).
        """
        envs, cap, device = self.num_envs, self.capacity, self.device
        rows = first + n
        steps = rows // envs
        values = {f.key: torch.as_tensor(v) for f, v in pairs}
        ended = self._ended(values, rows).view(steps, envs)
        starts = torch.cat([self.last_ended.unsqueeze(0), ended[:-1]])  # [steps, E]: episode starts
        links = ~starts
        first_step = self.steps
        step_of = torch.arange(first_step, first_step + steps, device=device)  # [steps]
        env_ids = torch.arange(envs, device=device)
        observed: dict[Key, torch.Tensor] = {}
        for key, s in self.streams.items():  # every check before anything is written
            x = values[key].to(device).view(steps, envs, *s.field.shape)
            observed[key] = x
            stored = s.head_next(first_step)
            if s.next is None:
                if s.stacked and s.k > 1:
                    older = torch.cat([stored[:, :-1].unsqueeze(0), x[:-1, :, 1:]])
                    self._refuse(links & ~_same(x[:, :, :-1], older, 2), key, "frames 0..k-2 of", "1..k-1 of")
                continue
            nx = values[s.next].to(device).view(steps, envs, *s.field.shape)
            before = torch.cat([stored.unsqueeze(0), nx[:-1]])
            self._refuse(links & ~_same(x, before, 2), key, f"'{key}' of", f"'{s.next}' of")
            if s.stacked and s.k > 1:
                bad = ~ended & ~_same(nx[:, :, :-1], x[:, :, 1:], 2)
                self._refuse(bad, s.next, "frames 0..k-2 of", f"frames 1..k-1 of '{key}' in", SAME_ROW)
        self._changed()  # before and after the write: a fork child's read meanwhile sees a change
        oldest = first_step + steps - cap // envs  # the oldest env step still held after this write
        kept = torch.arange(first, rows, device=device)
        slots = (start + kept - first) % cap
        for key, s in self.streams.items():
            x = observed[key]
            s.pool.expire(oldest)
            newest = x[:, :, -1] if s.stacked else x
            last = first_step + steps  # the newest frame written: the next one of the newest row
            fresh = step_of >= last - s.span + 1  # frames older than that are overwritten in this write
            frame_slots = ((step_of[fresh] % s.span).unsqueeze(1) * envs + env_ids).reshape(-1)
            s.flat.index_copy_(0, frame_slots, newest[fresh].reshape(frame_slots.numel(), s.flat.shape[1]))
            if s.stacked and s.k > 1:
                self._link_starts(s, x, starts, step_of, kept, slots)
            if s.next is None:
                continue
            nx = values[s.next].to(device).view(steps, envs, *s.field.shape)
            going = ~ended & (step_of + 1 >= last - s.span + 1).unsqueeze(1)  # [steps, E]
            t, e = going.nonzero(as_tuple=True)
            nxt_frames = (nx[:, :, -1] if s.stacked else nx)[t, e]
            s.flat.index_copy_(
                0, ((step_of[t] + 1) % s.span) * envs + e, nxt_frames.reshape(t.numel(), s.flat.shape[1])
            )
            ends = ended.nonzero()
            ids = s.pool.push(nx[ends[:, 0], ends[:, 1]], step_of[ends[:, 0]])
            per_row = torch.full((steps, envs), SUCCESSOR, dtype=torch.int64, device=device)
            per_row[ends[:, 0], ends[:, 1]] = ids
            s.next_link[slots] = per_row.reshape(-1)[kept]
        self.step[slots] = step_of.repeat_interleave(envs)[kept]
        self.last_ended.copy_(ended[-1])
        self.steps = first_step + steps
        self._changed()
        if self.table is not None:
            plain = [(f, v) for f, v in pairs if f.key not in self.virtual]
            self.table.write_rows(start, plain, first, n)

    @staticmethod
    def _refuse(
        bad: torch.Tensor,
        key: Key,
        ours: str,
        theirs: str,
        where: str = PREVIOUS_ROW,
    ) -> None:
        if bool(bad.any()):
            step, env = (int(i) for i in bad.nonzero()[0])
            raise overlap_error(key, ours, theirs, row=step, env=env, where=where)

    def _link_starts(
        self,
        s: FrameStream,
        x: torch.Tensor,
        starts: torch.Tensor,
        step_of: torch.Tensor,
        kept: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        """Put the episode starts' stacks in the pool and link each row to the start it borrows from."""
        steps, envs = starts.shape
        where = starts.nonzero()
        ids = s.pool.push(x[where[:, 0], where[:, 1]], step_of[where[:, 0]] + s.k - 2)
        start_id = torch.full((steps, envs), -1, dtype=torch.int64, device=x.device)
        start_id[where[:, 0], where[:, 1]] = ids
        t = torch.arange(steps, device=x.device).unsqueeze(1).expand(steps, envs)
        latest = torch.where(starts, t, -1).cummax(0).values  # [steps, E]: the last start at or before t
        at = latest.clamp(min=0)
        anchor = torch.where(latest >= 0, start_id.gather(0, at), s.carry_id)
        anchor_step = torch.where(latest >= 0, step_of[at], s.carry_step)
        distance = step_of.unsqueeze(1) - anchor_step
        anchor = torch.where(distance <= s.k - 2, anchor, -1)
        s.carry_id.copy_(anchor[-1])
        s.carry_step.copy_(anchor_step[-1])
        s.anchor[slots] = anchor.reshape(-1)[kept]
        s.distance[slots] = distance.reshape(-1)[kept]

    # ------------------------------------------------------------------ reads
    def gather_key(self, key: Key, slots: torch.Tensor) -> torch.Tensor:
        """Rows ``slots`` of one key (a new tensor on the storing device).

        Raises:
            ForkedBufferError: in a fork child, once the parent has changed the rows.
        """
        if os.getpid() != self._owner:
            self._unchanged_since_fork()
            value = self._gather_key(key, slots)
            self._unchanged_since_fork()
            return value
        return self._gather_key(key, slots)

    def _gather_key(self, key: Key, slots: torch.Tensor) -> torch.Tensor:
        if key in self.streams:
            return self.streams[key].observed(slots, self.step.index_select(0, slots))
        if key in self.virtual:
            s = self.streams[self.observed_of[key]]
            return s.next_value(slots, self.step.index_select(0, slots))
        assert self.table is not None
        return self.table.gather(slots, [key])[key]

    def gather(self, slots: torch.Tensor, keys: list[Key] | None = None) -> dict[Key, torch.Tensor]:
        """New tensors holding ``slots`` of each key (all by default, in schema order)."""
        wanted = list(self.columns) if keys is None else keys
        plain = [k for k in wanted if k not in self.virtual]
        got = {} if not plain or self.table is None else self.table.gather(slots, plain)
        return {k: got[k] if k in got else self.gather_key(k, slots) for k in wanted}  # gather_key: fork check

    def gather_range(self, start: int, stop: int, keys: list[Key] | None = None) -> dict[Key, torch.Tensor]:
        return self.gather(torch.arange(start, stop, device=self.device), keys)
