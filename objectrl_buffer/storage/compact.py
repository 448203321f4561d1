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

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from objectrl_buffer.core.schema import Field, Key, Schema, format_key
from objectrl_buffer.errors import InvalidArgumentError, SchemaError
from objectrl_buffer.storage.frame_pool import FramePool
from objectrl_buffer.storage.table import TransitionStorage

__all__ = ["CompactSpec", "CompactStorage", "VirtualColumn"]

HEAD = -2  # a row's next value is the env's pending head value
SUCCESSOR = -1  # ... its successor's observation


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


class _Stream:
    """One observed key: its frames, pool, per-row pool links and next keys."""

    def __init__(self, field: Field, k: int, stacked: bool, nexts: list[Key], storage: CompactStorage) -> None:
        self.field = field
        self.key = field.key
        self.k = k
        self.stacked = stacked
        self.nexts = nexts
        cap, envs, device = storage.capacity, storage.num_envs, storage.device
        self.frame_shape = field.shape[1:] if stacked else field.shape
        self.span = cap // envs + k - 1  # frame steps kept per env: the rows' plus the margin
        self.frames = TransitionStorage(self.span * envs, device, storage.directory)
        frame_field = Field(field.key, self.frame_shape, field.dtype)
        self.frames.initialize(Schema([frame_field]), {field.key: torch.zeros(self.frame_shape, dtype=field.dtype)})
        self.pool = FramePool(field.shape, field.dtype, device)
        self.anchor = torch.full((cap,), -1, dtype=torch.int64, device=device)  # pool id of the episode start
        self.distance = torch.zeros(cap, dtype=torch.int64, device=device)  # steps since that start
        self.carry_id = torch.full((envs,), -1, dtype=torch.int64, device=device)  # the head rows' anchor
        self.carry_step = torch.zeros(envs, dtype=torch.int64, device=device)
        self.last = torch.zeros((envs, *field.shape), dtype=field.dtype, device=device)  # head rows' value
        self.next_link = {n: torch.full((cap,), HEAD, dtype=torch.int64, device=device) for n in nexts}
        self.pending = {n: torch.zeros((envs, *field.shape), dtype=field.dtype, device=device) for n in nexts}

    @property
    def column(self) -> torch.Tensor:
        return self.frames.columns[self.key]

    @property
    def nbytes(self) -> int:
        per_row = self.anchor.numel() * 16 + sum(t.numel() * 8 for t in self.next_link.values())
        heads = (1 + len(self.nexts)) * self.last.numel() * self.last.element_size()
        return self.frames.nbytes + self.pool.nbytes + per_row + heads

    def close(self) -> None:
        self.frames.close()


class VirtualColumn:
    """A compact key's rows as far as readers of ``storage.columns`` need: ``index_select(0, slots)``,
    slices (copies), ``shape``, ``dtype``, ``device``. Each read rebuilds the rows (new tensors)."""

    def __init__(self, storage: CompactStorage, field: Field) -> None:
        self._storage = storage
        self.field = field
        self.dtype = field.dtype
        self.device = storage.device
        self.shape = torch.Size([storage.capacity, *field.shape])

    def dim(self) -> int:
        return len(self.shape)

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        assert dim == 0
        return self._storage.gather_key(self.field.key, index)

    def __getitem__(self, rows: slice) -> torch.Tensor:
        start, stop, step = rows.indices(self.shape[0])
        return self.index_select(0, torch.arange(start, stop, step, device=self.device))

    def __len__(self) -> int:
        return self.shape[0]


class _Columns(Mapping[Key, Any]):
    """The table's columns and the compact keys' :class:`VirtualColumn` s, in schema order."""

    def __init__(self, storage: CompactStorage) -> None:
        self._storage = storage

    def __getitem__(self, key: Key) -> Any:
        storage = self._storage
        if key in storage.virtual:
            return storage.virtual[key]
        if storage.table is None:
            raise KeyError(key)
        return storage.table.columns[key]

    def __iter__(self) -> Iterator[Key]:
        schema = self._storage.schema
        return iter(() if schema is None else [f.key for f in schema.fields])

    def __len__(self) -> int:
        schema = self._storage.schema
        return 0 if schema is None else len(schema.fields)


class CompactStorage:
    """Rows of one schema whose ``next_of``/``frame_stack`` keys are kept as frames (see the module docs).

    Offers what the :class:`~objectrl_buffer.engine.Engine` uses of a
    :class:`~objectrl_buffer.storage.table.TransitionStorage`; there is no fast single-row path (``fast``)
    and no NumPy view (``arrays``): every write goes through the checked path, whose overlap checks need it.

    Args:
        capacity, device, directory: as ``TransitionStorage``. num_envs: env streams (slot ``t * E + e``).
        spec: the claims. end_keys: keys whose non-zero value ends an episode (``terminated``, ``truncated``).
    """

    fast = None
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
        self.streams: dict[Key, _Stream] = {}
        self.virtual: dict[Key, VirtualColumn] = {}
        self.columns: Mapping[Key, Any] = _Columns(self)
        self.closed = False
        self._reset_rows()

    def _reset_rows(self) -> None:
        self.steps = 0  # env steps written since the storage was emptied
        self.step = torch.zeros(self.capacity, dtype=torch.int64, device=self.device)  # each row's env step
        self.last_ended = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)

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
    def initialize(self, schema: Schema, first_row: dict[Key, torch.Tensor], *, populate: bool = True) -> None:
        """Check the claims against ``schema`` and allocate the table, frames and pools.

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
        for nxt, obs in self.spec.next_of:
            a, b = by_key[nxt], by_key[obs]
            if a.shape != b.shape or a.dtype != b.dtype:
                raise SchemaError(
                    f"key '{nxt}': next_of says it is the next row's '{obs}' ({b.describe()}), got {a.describe()}"
                )
        observed = [f for f in schema.fields if f.key in stacks or f.key in {o for _, o in self.spec.next_of}]
        plain = [f for f in schema.fields if f.key not in self.spec.keys]
        if plain:
            assert self.table is not None
            self.table.initialize(Schema(plain), {f.key: first_row[f.key] for f in plain}, populate=populate)
        else:
            self.table = self.table.close() if self.table is not None else None
        for s in self.streams.values():
            s.close()
        self.streams = {}
        for f in observed:
            nexts: list[Key] = [n for n, o in self.spec.next_of if o == f.key]
            self.streams[f.key] = _Stream(f, stacks.get(str(f.key), 1), f.key in stacks, nexts, self)
        self.virtual = {f.key: VirtualColumn(self, f) for f in schema.fields if f.key in self.spec.keys}
        self.schema = schema
        self._reset_rows()

    def release(self) -> None:
        """Drop the rows and the schema (``reset()``)."""
        if self.table is not None:
            self.table.release()
        self._drop_streams()

    def resize(self, capacity: int) -> None:
        """Drop the rows and take a new capacity."""
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
        self.streams, self.virtual, self.schema = {}, {}, None
        if self.table is None and not self.closed:
            self.table = TransitionStorage(self.capacity, self.device, self.directory)

    def reserve_rows(self, rows: int, populate: bool = True) -> None:
        if self.table is not None:
            self.table.reserve_rows(rows, populate)

    # ------------------------------------------------------------------ writes
    def write(self, slot: int, pairs: list[tuple[Any, Any]]) -> None:
        """One checked row at ``slot`` (the ring's pointer)."""
        batch = [(f, torch.as_tensor(v, dtype=f.dtype).reshape(f.shape).unsqueeze(0)) for f, v in pairs]
        self.write_rows(slot, batch, first=0, n=1)

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
        values = {f.key: v for f, v in pairs}
        ended = torch.zeros(rows, dtype=torch.bool, device=device)
        for key in self.end_keys:
            if key in values:
                ended |= values[key].to(device).reshape(rows, -1).ne(0).any(1)
        ended = ended.view(steps, envs)
        prev_ended = torch.cat([self.last_ended.unsqueeze(0), ended[:-1]])  # [steps, E]: episode starts
        links = ~prev_ended
        observed: dict[Key, torch.Tensor] = {}
        for key, s in self.streams.items():  # every check before anything is written
            x = values[key].to(device).view(steps, envs, *s.field.shape)
            observed[key] = x
            prev = torch.cat([s.last.unsqueeze(0), x[:-1]])
            if s.stacked and s.k > 1:
                self._refuse(links & ~_same(x[:, :, :-1], prev[:, :, 1:], 2), key, "frames 0..k-2 of", "1..k-1")
            for nxt in s.nexts:
                nx = values[nxt].to(device).view(steps, envs, *s.field.shape)
                before = torch.cat([s.pending[nxt].unsqueeze(0), nx[:-1]])
                self._refuse(links & ~_same(x, before, 2), nxt, f"'{key}' of", f"'{format_key(nxt)}' of")
        first_step = self.steps
        step_of = torch.arange(first_step, first_step + steps, device=device)  # [steps]
        oldest = first_step + steps - cap // envs  # the oldest env step still held after this write
        kept = torch.arange(first, rows, device=device)
        slots = (start + kept - first) % cap
        env_ids = torch.arange(envs, device=device)
        head_slots = (start - first - envs + env_ids) % cap  # the env's newest rows before this write
        for key, s in self.streams.items():
            x = observed[key]
            s.pool.expire(oldest)
            newest = x[:, :, -1] if s.stacked else x
            keep = min(steps, s.span)
            frame_slots = ((step_of[-keep:] % s.span).unsqueeze(1) * envs + env_ids).reshape(-1)
            s.frames.reserve_rows(int(frame_slots.max()) + 1)
            s.column.index_copy_(0, frame_slots, newest[-keep:].reshape(-1, *s.frame_shape))
            if s.stacked and s.k > 1:
                self._link_starts(s, x, prev_ended, step_of, kept, slots)
            for nxt in s.nexts:
                nx = values[nxt].to(device).view(steps, envs, *s.field.shape)
                link = s.next_link[nxt]
                if first_step:  # the previous head rows: their next is this write's first observation
                    link[head_slots] = torch.where(self.last_ended, link[head_slots], SUCCESSOR)
                ends = ended.nonzero()
                ids = s.pool.push(nx[ends[:, 0], ends[:, 1]], step_of[ends[:, 0]])
                per_row = torch.full((steps, envs), SUCCESSOR, dtype=torch.int64, device=device)
                per_row[ends[:, 0], ends[:, 1]] = ids
                per_row[-1] = torch.where(ended[-1], per_row[-1], HEAD)
                link[slots] = per_row.reshape(-1)[kept]
                s.pending[nxt] = nx[-1].clone()
            s.last = x[-1].clone()
        self.step[slots] = step_of.repeat_interleave(envs)[kept]
        self.last_ended = ended[-1].clone()
        self.steps = first_step + steps
        if self.table is not None:
            plain = [(f, v) for f, v in pairs if f.key not in self.virtual]
            self.table.write_rows(start, plain, first, n)

    @staticmethod
    def _refuse(bad: torch.Tensor, key: Key, ours: str, theirs: str) -> None:
        if bool(bad.any()):
            step, env = (int(i) for i in bad.nonzero()[0])
            raise SchemaError(
                f"key '{format_key(key)}': {ours} row {step} of this write (env {env}) differ from {theirs} the "
                "env's previous row, which did not end an episode; next_of/frame_stack promise they are equal. "
                "Nothing was stored"
            )

    def _link_starts(
        self,
        s: _Stream,
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
        s.carry_id, s.carry_step = anchor[-1].clone(), anchor_step[-1].clone()
        s.anchor[slots] = anchor.reshape(-1)[kept]
        s.distance[slots] = distance.reshape(-1)[kept]

    # ------------------------------------------------------------------ reads
    def _observed(self, s: _Stream, slots: torch.Tensor) -> torch.Tensor:
        """Rows ``slots`` of the observed key of ``s`` (new tensor ``[B, *shape]``)."""
        envs = self.num_envs
        step = self.step.index_select(0, slots)
        env = slots % envs
        if not s.stacked:
            return s.column.index_select(0, (step % s.span) * envs + env)
        k, b = s.k, slots.numel()
        back = torch.arange(k - 1, -1, -1, device=slots.device)  # steps back of frame i
        frame_slots = ((step.unsqueeze(1) - back) % s.span) * envs + env.unsqueeze(1)
        out = s.column.index_select(0, frame_slots.reshape(-1)).view(b, k, *s.frame_shape)
        if k > 1:
            anchor = s.anchor.index_select(0, slots)
            distance = s.distance.index_select(0, slots)
            need = (anchor >= 0).unsqueeze(1) & (back > distance.unsqueeze(1))  # [B, k]
            if bool(need.any()):
                row, i = need.nonzero(as_tuple=True)
                flat = s.pool.data.view(-1, *s.frame_shape)
                out[row, i] = flat.index_select(0, s.pool.slots(anchor[row]) * k + i + distance[row])
        return out

    def _next(self, s: _Stream, key: Key, slots: torch.Tensor) -> torch.Tensor:
        link = s.next_link[key].index_select(0, slots)
        out = self._observed(s, (slots + self.num_envs) % self.capacity)
        explicit = link >= 0
        if bool(explicit.any()):
            out[explicit] = s.pool.data.index_select(0, s.pool.slots(link[explicit]))
        head = link == HEAD
        if bool(head.any()):
            out[head] = s.pending[key].index_select(0, slots[head] % self.num_envs)
        return out

    def gather_key(self, key: Key, slots: torch.Tensor) -> torch.Tensor:
        """Rows ``slots`` of one key (a new tensor on the storing device)."""
        if key in self.streams:
            return self._observed(self.streams[key], slots)
        if key in self.virtual:
            obs = dict(self.spec.next_of)[str(key)]
            return self._next(self.streams[obs], key, slots)
        assert self.table is not None
        return self.table.gather(slots, [key])[key]

    def gather(self, slots: torch.Tensor, keys: list[Key] | None = None) -> dict[Key, torch.Tensor]:
        """New tensors holding ``slots`` of each key (all by default, in schema order)."""
        wanted = list(self.columns) if keys is None else keys
        plain = [k for k in wanted if k not in self.virtual]
        got = {} if not plain or self.table is None else self.table.gather(slots, plain)
        return {k: got[k] if k in got else self.gather_key(k, slots) for k in wanted}

    def gather_range(self, start: int, stop: int, keys: list[Key] | None = None) -> dict[Key, torch.Tensor]:
        return self.gather(torch.arange(start, stop, device=self.device), keys)
