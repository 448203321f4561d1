"""AsyncSequenceBuffer: the hub between rollout, reward and training workers (the job of AReaL's
``AsyncIOSequenceBuffer``).

Rollout workers ``put_batch`` generated sequences, reward services ``amend_batch`` them with new keys, and
each consumer (a trainer RPC) ``get_batch``-es ``n_seqs`` entries once they hold its ``input_keys``, oldest
birth time first. Every entry is read at most once per consumer and freed once every consumer has read it.

State lives in a few preallocated tensors of ``max_size`` rows (occupancy, ids, birth times, key presence,
readiness and read bits per consumer), so each operation is a handful of vector ops over them plus work
proportional to its own batch; payloads (each sample's tensors) are kept per slot. The buffer runs on one
asyncio event loop: every state change happens between two awaits, so no operation ever sees another
half-done (an amend can never overlap a read of the same entry), and one ``asyncio.Condition`` wakes
the waiting consumers.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict

from objectrl_buffer.async_buffer import persist
from objectrl_buffer.async_buffer.consumer import IDS, Consumer, as_consumers
from objectrl_buffer.async_buffer.samples import KeySpec, check_schema, gather, parse_samples
from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.errors import BufferFull, InconsistentStateError, InvalidArgumentError, SlotIndexError

__all__ = ["AsyncSequenceBuffer", "AsyncIOSequenceBuffer"]

_EMPTY_ID = -1
_INT64_MAX = torch.iinfo(torch.int64).max


class AsyncSequenceBuffer:
    """Sequences put by producers, amended with new keys, read once by each consumer, then freed.

    Args:
        consumers: the readers (:class:`Consumer`, or any object with ``name``, ``input_keys``, ``n_seqs``).
        max_size: the number of slots; a put that does not fit raises :class:`~objectrl_buffer.errors.BufferFull`.
        device: where ``get_batch`` returns its batches.
        storing_device: where samples are kept (tensors already there are kept as given, not copied:
            treat what you put as handed over).
    """

    def __init__(
        self,
        consumers: Sequence[Any],
        max_size: int,
        *,
        device: str | torch.device = "cpu",
        storing_device: str | torch.device = "cpu",
    ) -> None:
        self._consumers = as_consumers(consumers)
        self._max_size = positive_int(max_size, "max_size", limit=2**40)
        try:
            self.device = torch.device(device)
            self.storing_device = torch.device(storing_device)
        except (RuntimeError, TypeError) as exc:
            raise InvalidArgumentError(f"device/storing_device: {exc}") from None
        # The keys whose presence decides readiness: every consumer's input_keys (ids are always there).
        self._tracked = sorted({k for c in self._consumers for k in c.input_keys if k != IDS})
        self._column = {k: i for i, k in enumerate(self._tracked)}
        self._needs = torch.tensor(
            [[k in c.input_keys for k in self._tracked] for c in self._consumers], dtype=torch.bool
        ).reshape(len(self._consumers), len(self._tracked))
        self._by_name = {c.name: i for i, c in enumerate(self._consumers)}
        self._schema: dict[str, KeySpec] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cond: asyncio.Condition | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._clear()

    def _clear(self) -> None:
        m, c = self._max_size, len(self._consumers)
        self._occupied = torch.zeros(m, dtype=torch.bool)
        self._ids = torch.full((m,), _EMPTY_ID, dtype=torch.int64)
        self._birth = torch.zeros(m, dtype=torch.int64)
        self._has = torch.zeros(m, len(self._tracked), dtype=torch.bool)
        self._ready = torch.zeros(m, c, dtype=torch.bool)
        self._read = torch.zeros(m, c, dtype=torch.bool)
        # Per consumer, the slots ready for it and not yet read by it; and a min-heap of the free slots.
        # Both change by the batch of each operation, so no operation scans max_size rows.
        self._candidates: list[set[int]] = [set() for _ in range(c)]
        self._free_slots = list(range(m))  # sorted, hence a heap
        self._payload: list[dict[str, torch.Tensor] | None] = [None] * m
        self._slot_of: dict[int, int] = {}
        self._size = 0
        self._last_birth = 0
        self._consumed: list[int] = []

    # ------------------------------------------------------------------ properties
    @property
    def size(self) -> int:
        """Entries held (put and not yet read by every consumer)."""
        return self._size

    @property
    def max_size(self) -> int:
        return self._max_size

    @property
    def n_consumers(self) -> int:
        return len(self._consumers)

    @property
    def consumers(self) -> tuple[Consumer, ...]:
        return self._consumers

    def ready(self, consumer: Any) -> int:
        """How many entries ``consumer`` (a :class:`Consumer` or its name) could read now: held, holding its
        ``input_keys``, not yet read by it. ``get_batch`` returns at once when this is at least ``n_seqs``.

        Raises:
            ValueError: an unknown consumer.
        """
        return len(self._candidates[self._consumer_index(consumer)])

    def consumed_ids(self) -> list[int]:
        """Ids of the entries every consumer has read (and that were freed), in the order they were freed.

        This is upstream's recovery list (``hash_vals_to_ignore``); it survives :meth:`save` / :meth:`load`.
        """
        return list(self._consumed)

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        names = ", ".join(c.name for c in self._consumers)
        return f"AsyncSequenceBuffer(size={self._size}, max_size={self._max_size}, consumers=[{names}])"

    # ------------------------------------------------------------------ event loop
    def _condition(self) -> asyncio.Condition:
        """The Condition of the running loop (a buffer used from a new loop, e.g. after asyncio.run, rebinds)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._cond is None:
            self._loop, self._cond = loop, asyncio.Condition()
        return self._cond

    async def _notify(self) -> None:
        cond = self._condition()
        async with cond:
            cond.notify_all()

    def _check_loop_thread(self, what: str) -> None:
        """Refuse a synchronous call from another thread while the buffer's loop runs (state is not locked)."""
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not loop:
            raise RuntimeError(
                f"{what} was called from a thread other than the one running the buffer's event loop; "
                "use put_batch_threadsafe(...) there"
            )

    def _wake_soon(self) -> None:
        """Wake the waiting consumers after a synchronous change (runs on the buffer's loop)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # no loop ever ran get_batch: nobody waits
        if loop.is_running():
            task = loop.create_task(self._notify())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            loop.call_soon_threadsafe(self._wake_soon)

    # ------------------------------------------------------------------ put
    def _birth_times(self, birth_times: Any, n: int) -> torch.Tensor:
        if birth_times is None:
            start = max(time.monotonic_ns(), self._last_birth + 1)  # strictly after everything stored
            return torch.arange(start, start + n, dtype=torch.int64)
        try:
            births = torch.as_tensor(birth_times)
        except (TypeError, ValueError, RuntimeError):
            raise InvalidArgumentError(f"birth_times must be {n} integers, got {birth_times!r}") from None
        if births.dim() != 1 or births.shape[0] != n or births.dtype not in (torch.int64, torch.int32):
            raise InvalidArgumentError(
                f"birth_times must be a 1-D integer sequence of length {n} (one per sample), got "
                f"{births.dtype} of shape {list(births.shape)}"
            )
        return births.to(torch.int64)

    def _add_candidates(self, slots: list[int], ready: torch.Tensor) -> None:
        """Add ``slots[i]`` to consumer ``c``'s candidates where ``ready[i, c]``."""
        if ready.any():
            for c, column in enumerate(ready.t().tolist()):
                self._candidates[c].update(s for s, r in zip(slots, column, strict=True) if r)

    def _presence(self, payloads: list[dict[str, torch.Tensor]], same_keys: bool) -> torch.Tensor:
        """``[n, n_tracked]`` bool: which readiness keys each sample holds."""
        if same_keys and payloads:
            row = torch.tensor([k in payloads[0] for k in self._tracked], dtype=torch.bool)
            return row.expand(len(payloads), -1)
        rows = [[k in p for k in self._tracked] for p in payloads]
        return torch.tensor(rows, dtype=torch.bool).reshape(len(payloads), len(self._tracked))

    def _readiness(self, has: torch.Tensor) -> torch.Tensor:
        """``[n, n_consumers]`` bool from ``has [n, n_tracked]``: a consumer is ready when it has all its keys."""
        return (has.unsqueeze(1) | ~self._needs.unsqueeze(0)).all(-1)

    def _put(self, samples: Any, birth_times: Any) -> torch.Tensor:
        parsed = parse_samples(samples, self.storing_device)
        n = len(parsed.ids)
        if n == 0:
            if birth_times is not None:
                self._birth_times(birth_times, 0)
            return torch.empty(0, dtype=torch.int64)
        if len(set(parsed.ids)) != n:
            seen: set[int] = set()
            twice = sorted({i for i in parsed.ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
            raise InvalidArgumentError(f"samples: ids {twice[:10]} appear more than once in the batch")
        stored = [i for i in parsed.ids if i in self._slot_of]
        if stored:
            raise InvalidArgumentError(f"samples: ids {stored[:10]} are already in the buffer")
        births = self._birth_times(birth_times, n)
        new_keys = check_schema(parsed.payloads, self._schema)
        if n > self._max_size - self._size:
            raise BufferFull(
                f"put of {n} samples does not fit: the buffer holds {self._size} of max_size {self._max_size} "
                f"({self._max_size - self._size} free); raise max_size or consume faster"
            )
        # All checks passed: from here on nothing raises.
        slot_list = [heapq.heappop(self._free_slots) for _ in range(n)]  # the lowest free slots
        slots = torch.tensor(slot_list, dtype=torch.int64)
        has = self._presence(parsed.payloads, parsed.same_keys)
        ready = self._readiness(has)
        self._occupied[slots] = True
        self._ids[slots] = torch.tensor(parsed.ids, dtype=torch.int64)
        self._birth[slots] = births
        self._has[slots] = has
        self._ready[slots] = ready
        self._read[slots] = False
        self._add_candidates(slot_list, ready)
        for slot, sample_id, payload in zip(slot_list, parsed.ids, parsed.payloads, strict=True):
            self._payload[slot] = payload
            self._slot_of[sample_id] = slot
        self._size += n
        self._schema.update(new_keys)
        self._last_birth = max(self._last_birth, int(births.max()))
        return slots

    async def put_batch(self, samples: Any, birth_times: Any = None) -> torch.Tensor:
        """Store ``samples`` in the lowest free slots; return those slots (int64 ``[n]``, in sample order).

        Args:
            samples: a list of mappings (each with a unique integer ``ids`` and any keys; tensors of one key
                may differ in their first dimension between samples) or a TensorDict of batch size ``[n]``
                (variable-length keys as jagged nested tensors).
            birth_times: ``[n]`` integers (ns) deciding the read order, oldest first; by default monotonic
                time, increasing within the batch and after everything stored.

        Raises:
            BufferFull: fewer free slots than samples (nothing stored).
            InvalidArgumentError: duplicate ``ids`` (in the batch or stored), ``birth_times`` of the wrong length.
            SchemaError: a key whose dtype or trailing shape differs from what the buffer stores.
        """
        cond = self._condition()
        async with cond:
            slots = self._put(samples, birth_times)
            cond.notify_all()
        return slots

    def put_batch_nowait(self, samples: Any, birth_times: Any = None) -> torch.Tensor:
        """:meth:`put_batch` for synchronous code on the buffer's loop thread (or before any loop runs)."""
        self._check_loop_thread("put_batch_nowait")
        slots = self._put(samples, birth_times)
        if len(slots):
            self._wake_soon()
        return slots

    def put_batch_threadsafe(
        self,
        samples: Any,
        birth_times: Any = None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        timeout: float | None = None,
    ) -> torch.Tensor:
        """:meth:`put_batch` from another thread, run on ``loop`` (default: the loop the buffer last ran on).

        Blocks the calling thread until the put is done (at most ``timeout`` seconds) and returns its slots;
        the put's own errors (``BufferFull``, ...) are raised here.
        """
        target = loop or self._loop
        if target is None or target.is_closed():
            raise RuntimeError("put_batch_threadsafe: the buffer has no running event loop yet; pass loop=")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is target:
            raise RuntimeError(
                "put_batch_threadsafe called on the buffer's own loop (it would block it): await put_batch"
            )
        future = asyncio.run_coroutine_threadsafe(self.put_batch(samples, birth_times), target)
        return future.result(timeout)

    # ------------------------------------------------------------------ amend
    def _slots(self, indices: Any) -> torch.Tensor:
        try:
            slots = torch.as_tensor(indices)
        except (TypeError, ValueError, RuntimeError):
            raise InvalidArgumentError(f"indices must be integer slots, got {indices!r}") from None
        if slots.dim() == 0:
            slots = slots.reshape(1)
        if slots.dim() != 1 or (slots.numel() and slots.dtype not in (torch.int64, torch.int32, torch.int16)):
            raise InvalidArgumentError(f"indices must be a 1-D sequence of integer slots, got {slots.dtype} {slots}")
        slots = slots.to(torch.int64).cpu()
        if slots.numel():
            bad = slots[(slots < 0) | (slots >= self._max_size)]
            if bad.numel():
                raise SlotIndexError(f"indices {bad[:10].tolist()} are out of range [0, {self._max_size})")
            empty = slots[~self._occupied[slots]]
            if empty.numel():
                raise SlotIndexError(f"indices {empty[:10].tolist()} are empty slots (never put, or already freed)")
            if torch.unique(slots).numel() != slots.numel():
                raise InvalidArgumentError(f"indices {slots.tolist()} name a slot more than once")
        return slots

    def _amend(self, indices: Any, samples: Any) -> None:
        slots = self._slots(indices)
        parsed = parse_samples(samples, self.storing_device)
        if len(parsed.ids) != slots.numel():
            raise InvalidArgumentError(f"amend_batch: {slots.numel()} indices but {len(parsed.ids)} samples")
        if not parsed.ids:
            return
        stored = self._ids[slots].tolist()
        wrong = [(s, a, b) for s, a, b in zip(slots.tolist(), stored, parsed.ids, strict=True) if a != b]
        if wrong:
            s, a, b = wrong[0]
            raise InvalidArgumentError(f"amend_batch: slot {s} holds ids {a}, the sample amending it has ids {b}")
        new_keys = check_schema(parsed.payloads, self._schema)
        # All checks passed: from here on nothing raises.
        for slot, payload in zip(slots.tolist(), parsed.payloads, strict=True):
            stored_payload = self._payload[slot]
            assert stored_payload is not None
            stored_payload.update(payload)
        has = self._has[slots] | self._presence(parsed.payloads, parsed.same_keys)
        ready = self._readiness(has)
        self._add_candidates(slots.tolist(), ready & ~self._ready[slots] & ~self._read[slots])
        self._has[slots] = has
        self._ready[slots] = ready
        self._schema.update(new_keys)

    async def amend_batch(self, indices: Any, samples: Any) -> None:
        """Merge the keys of ``samples[i]`` into the entry in slot ``indices[i]`` (its ``ids`` must match).

        Keys already there are replaced. Consumers whose keys are now complete are woken.

        Raises:
            SlotIndexError: a slot out of range or empty (upstream waits forever there); nothing changed.
            InvalidArgumentError: ``ids`` that do not match, a slot named twice, lengths that differ.
            SchemaError: a key whose dtype or trailing shape differs from what the buffer stores.
        """
        cond = self._condition()
        async with cond:
            self._amend(indices, samples)
            cond.notify_all()

    def amend_batch_nowait(self, indices: Any, samples: Any) -> None:
        """:meth:`amend_batch` for synchronous code on the buffer's loop thread."""
        self._check_loop_thread("amend_batch_nowait")
        self._amend(indices, samples)
        self._wake_soon()

    # ------------------------------------------------------------------ get
    def _consumer_index(self, consumer: Any) -> int:
        name = consumer if isinstance(consumer, str) else getattr(consumer, "name", None)
        index = self._by_name.get(name) if isinstance(name, str) else None
        if index is None:
            known = ", ".join(self._by_name)
            raise InvalidArgumentError(
                f"consumer {name if name is not None else consumer!r} is unknown (known: {known})"
            )
        return index

    def _oldest(self, c: int, n: int) -> torch.Tensor:
        """The ``n`` oldest slots (birth time, then slot) ready for consumer ``c`` and unread by it, oldest first."""
        candidates = torch.tensor(list(self._candidates[c]), dtype=torch.int64)
        births = self._birth[candidates]
        if candidates.numel() > n:
            # Keep every candidate born no later than the n-th oldest (ties included), then order exactly.
            cutoff = torch.topk(births, n, largest=False).values.max()
            keep = births <= cutoff
            candidates, births = candidates[keep], births[keep]
        candidates, by_slot = torch.sort(candidates)
        order = torch.sort(births[by_slot], stable=True).indices[:n]  # stable: ties go by slot
        return candidates[order]

    def _take(self, c: int) -> tuple[torch.Tensor, TensorDict]:
        consumer = self._consumers[c]
        slots = self._oldest(c, consumer.n_seqs)
        payloads = [self._payload[s] for s in slots.tolist()]
        batch = gather(self._ids[slots], payloads, consumer.input_keys, self._schema, self.device)
        self._read[slots, c] = True
        self._candidates[c].difference_update(slots.tolist())
        done = slots[self._read[slots].all(1)]
        if done.numel():
            self._free(done)
        return slots, batch

    def _free(self, slots: torch.Tensor) -> None:
        ids = self._ids[slots].tolist()
        for slot, sample_id in zip(slots.tolist(), ids, strict=True):
            self._payload[slot] = None
            del self._slot_of[sample_id]
            heapq.heappush(self._free_slots, slot)
        self._consumed.extend(ids)
        self._occupied[slots] = False
        self._ids[slots] = _EMPTY_ID
        self._birth[slots] = 0
        self._has[slots] = False
        self._ready[slots] = False
        self._read[slots] = False
        self._size -= slots.numel()

    async def get_batch(self, consumer: Any) -> tuple[torch.Tensor, TensorDict]:
        """Wait for ``n_seqs`` entries holding ``consumer``'s keys and unread by it; return the oldest.

        Args:
            consumer: a consumer given to the constructor, or its name.

        Returns:
            ``(slots, batch)``: int64 ``[n_seqs]`` slots, oldest birth first, and a TensorDict of batch size
            ``[n_seqs]`` on ``device`` with ``ids`` and the consumer's ``input_keys`` (fresh copies). A key
            whose lengths differ between the sequences is a jagged nested tensor (``.values()`` packed,
            ``.offsets()`` the cu_seqlens, ``.to_padded_tensor(0)``); the others are plain tensors.

        Raises:
            InvalidArgumentError: an unknown consumer. Cancelling the wait leaves the buffer unchanged.
        """
        c = self._consumer_index(consumer)
        n = self._consumers[c].n_seqs
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: len(self._candidates[c]) >= n)
            return self._take(c)

    get_batch_for_rpc = get_batch

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Check every piece of state against the others.

        Raises:
            InconsistentStateError: naming the first inconsistency found.
        """

        def require(ok: bool, problem: str) -> None:
            if not ok:
                raise InconsistentStateError(f"AsyncSequenceBuffer state is inconsistent: {problem}")

        occ = self._occupied
        require(int(occ.sum()) == self._size, f"size {self._size} but {int(occ.sum())} slots occupied")
        require(len(self._slot_of) == self._size, f"size {self._size} but {len(self._slot_of)} ids indexed")
        held = [s for s, p in enumerate(self._payload) if p is not None]
        require(held == occ.nonzero().squeeze(1).tolist(), "payloads held do not match the occupied slots")
        empty = ~occ
        require(bool((self._ids[empty] == _EMPTY_ID).all()), "an empty slot keeps an id")
        require(
            not bool(self._has[empty].any() | self._ready[empty].any() | self._read[empty].any()),
            "an empty slot keeps key, ready or read bits",
        )
        require(bool((self._birth[empty] == 0).all()), "an empty slot keeps a birth time")
        require(bool((self._birth[occ] <= self._last_birth).all()), "a birth time is after the last one given")
        require(
            bool((self._ready[occ] == self._readiness(self._has[occ])).all()), "readiness differs from the keys held"
        )
        require(not bool(self._read[occ].all(1).any()), "an entry read by every consumer was not freed")
        for c, name in enumerate(self._by_name):
            ready = (occ & self._ready[:, c] & ~self._read[:, c]).nonzero().squeeze(1).tolist()
            require(set(ready) == self._candidates[c], f"the slots ready for '{name}' differ from its candidates")
        require(sorted(self._free_slots) == empty.nonzero().squeeze(1).tolist(), "free slots differ from empty ones")
        require(
            all(self._free_slots[(i - 1) // 2] <= v for i, v in enumerate(self._free_slots) if i),
            "the free slots are not a heap",
        )
        for sample_id, slot in self._slot_of.items():
            require(bool(occ[slot]) and int(self._ids[slot]) == sample_id, f"id {sample_id} indexed at slot {slot}")
        for slot in held:
            payload = self._payload[slot]
            assert payload is not None
            for key, col in self._column.items():
                require(bool(self._has[slot, col]) == (key in payload), f"slot {slot}: presence bit of '{key}'")
            for key, t in payload.items():
                spec = self._schema.get(key)
                require(spec is not None and KeySpec.of(t) == spec, f"slot {slot}: key '{key}' off its schema")
        require(len(set(self._consumed)) == len(self._consumed), "an id was consumed twice")

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Every entry not yet freed (keys, birth, read bits) plus the recovery list, as tensors + JSON values."""
        slots = self._occupied.nonzero().squeeze(1)
        return persist.pack(
            max_size=self._max_size,
            consumers=self._consumers_json(),
            slots=slots,
            ids=self._ids[slots],
            birth=self._birth[slots],
            read=self._read[slots],
            payloads=[self._payload[s] or {} for s in slots.tolist()],
            schema=self._schema,
            last_birth=self._last_birth,
            consumed=self._consumed,
        )

    def _consumers_json(self) -> list[list[Any]]:
        return [[c.name, list(c.input_keys), c.n_seqs] for c in self._consumers]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the whole state by ``state`` (from :meth:`state_dict` of a buffer with the same consumers
        and ``max_size``); waiting consumers are woken. Checked in full before anything changes.

        Raises:
            CheckpointError: the state does not fit this buffer or is inconsistent.
        """
        got = persist.unpack(
            state, max_size=self._max_size, consumers=self._consumers_json(), storing_device=self.storing_device
        )
        self._clear()
        self._schema = got.schema
        slots = got.slots
        self._occupied[slots] = True
        self._ids[slots] = got.ids
        self._birth[slots] = got.birth
        self._read[slots] = got.read
        has = self._presence(got.payloads, False)
        self._has[slots] = has
        self._ready[slots] = self._readiness(has)
        self._add_candidates(slots.tolist(), self._ready[slots] & ~got.read)
        self._free_slots = (~self._occupied).nonzero().squeeze(1).tolist()  # ascending: a heap
        for slot, sample_id, payload in zip(slots.tolist(), got.ids.tolist(), got.payloads, strict=True):
            self._payload[slot] = payload
            self._slot_of[sample_id] = slot
        self._size = len(got.payloads)
        self._last_birth = got.last_birth
        self._consumed = got.consumed
        if self._size:
            self._wake_soon()

    def save(self, path: Any) -> None:
        """Write :meth:`state_dict` to the file ``path``: atomic (temp file, fsync, rename) and crc32-checked."""
        persist.save_file(self.state_dict(), path)

    def load(self, path: Any) -> None:
        """Load a file written by :meth:`save` (nothing is unpickled); see :meth:`load_state_dict`."""
        self.load_state_dict(persist.load_file(path))


#: AReaL's name for the same class.
AsyncIOSequenceBuffer = AsyncSequenceBuffer
