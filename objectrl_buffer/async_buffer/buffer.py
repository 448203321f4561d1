"""AsyncSequenceBuffer: the hub between rollout, reward and training workers (the job of AReaL's
``AsyncIOSequenceBuffer``).

Rollout workers ``put_batch`` generated sequences, reward services ``amend_batch`` them with new keys, and
each consumer (a trainer RPC) ``get_batch``-es ``n_seqs`` entries once they hold its ``input_keys``, oldest
birth time first. Every entry is read at most once per consumer and freed once every consumer has read it.

State lives in a :class:`~objectrl_buffer.async_buffer.slots.SlotTable`: a few preallocated tensors of
``max_size`` rows (occupancy, ids, birth times, key presence, readiness and read bits per consumer), so each
operation is a handful of vector ops over them plus work proportional to its own batch; payloads (each
sample's tensors) are kept per slot. The buffer runs on one asyncio event loop: every state change happens
between two awaits, so no operation ever sees another half-done (an amend can never overlap a read of the
same entry), and one ``asyncio.Condition`` wakes the waiting consumers
(:mod:`~objectrl_buffer.async_buffer.loop`, which says when a buffer is bound to a loop and refuses a second
one with :class:`~objectrl_buffer.errors.ConcurrentUseError`). Arguments are checked by
:mod:`~objectrl_buffer.async_buffer.batches` before anything changes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from objectrl_buffer.async_buffer import persist
from objectrl_buffer.async_buffer.batches import amend_slots, check_amend_ids, check_new_ids
from objectrl_buffer.async_buffer.batches import birth_times as birth_times_of
from objectrl_buffer.async_buffer.consumer import IDS, Consumer, as_consumers
from objectrl_buffer.async_buffer.loop import LoopBinding
from objectrl_buffer.async_buffer.samples import KeySpec, Value, check_schema, gather, parse_samples
from objectrl_buffer.async_buffer.slots import SlotTable, require
from objectrl_buffer.core import validate
from objectrl_buffer.core.validate import positive_int
from objectrl_buffer.errors import BufferFull, InvalidArgumentError

__all__ = ["AsyncSequenceBuffer", "AsyncIOSequenceBuffer"]


class AsyncSequenceBuffer:
    """Sequences put by producers, amended with new keys, read once by each consumer, then freed.

    Args:
        consumers: the readers (:class:`Consumer`, or any object with ``name``, ``input_keys``, ``n_seqs``).
        max_size: the number of slots; a put that does not fit raises :class:`~objectrl_buffer.errors.BufferFull`.
            Every consumer's ``n_seqs`` must be at most ``max_size`` (else its ``get_batch`` could never return).
        device: where ``get_batch`` returns its batches.
        storing_device: where samples are kept (tensors already there are kept as given, not copied:
            treat what you put as handed over).
        on_free: called with the ids of the entries a ``get_batch`` freed (a list, in slot order), once they
            are gone, on the buffer's loop; an exception it raises goes to the loop's exception handler (the
            batch is still returned). :meth:`wait_freed` awaits one entry instead.

    Raises:
        InvalidArgumentError: no consumers, two with one name, an ``n_seqs`` above ``max_size``, a device
            this machine cannot hold data on (``"meta"``, CUDA without CUDA), naming the argument.

    **One event loop at a time.** Construction binds nothing. The first awaited call (``put_batch``,
    ``amend_batch``, ``get_batch``) binds the buffer to its running loop, and the buffer stays bound to that
    loop while it runs or while a call on it (a waiting ``get_batch``) has not returned. An awaited call from
    any other loop in that time, e.g. a second thread with its own ``asyncio.run``, raises
    :class:`~objectrl_buffer.errors.ConcurrentUseError` and changes nothing; threads use
    :meth:`put_batch_threadsafe`, which runs the put on the bound loop. Once the bound loop is closed (its
    ``asyncio.run`` returned), or stopped with no call pending, the next loop that awaits the buffer binds
    it: successive ``asyncio.run`` calls work. The ``*_nowait`` methods are refused from a thread other
    than the one running the bound loop.
    """

    def __init__(
        self,
        consumers: Sequence[Any],
        max_size: int,
        *,
        device: str | torch.device = "cpu",
        storing_device: str | torch.device = "cpu",
        on_free: Callable[[list[Hashable]], object] | None = None,
    ) -> None:
        self._consumers = as_consumers(consumers)
        if on_free is not None and not callable(on_free):
            raise InvalidArgumentError(f"on_free must be callable (it receives the freed ids), got {on_free!r}")
        self._on_free = on_free
        self._waiters: dict[Hashable, list[asyncio.Future[None]]] = {}
        self._int_ids: bool | None = None  # whether ids are ints: fixed by the first put with samples
        self._max_size = positive_int(max_size, "max_size", limit=2**40)
        for c in self._consumers:
            if c.n_seqs > self._max_size:
                raise InvalidArgumentError(
                    f"consumer '{c.name}': n_seqs {c.n_seqs} exceeds max_size {self._max_size}, so its get_batch "
                    "could never gather that many entries; lower n_seqs or raise max_size"
                )
        self.device = validate.device(device, "device")
        self.storing_device = validate.device(storing_device, "storing_device")
        # The keys whose presence decides readiness: every consumer's input_keys (ids are always there).
        self._tracked = sorted({k for c in self._consumers for k in c.input_keys if k != IDS})
        self._column = {k: i for i, k in enumerate(self._tracked)}
        self._needs = torch.tensor(
            [[k in c.input_keys for k in self._tracked] for c in self._consumers], dtype=torch.bool
        ).reshape(len(self._consumers), len(self._tracked))
        self._not_needed = ~self._needs.numpy()
        self._by_name = {c.name: i for i, c in enumerate(self._consumers)}
        self._schema: dict[str, KeySpec] = {}
        self._rows: dict[tuple[bool, ...], np.ndarray] = {}  # presence row per key set (see _presence)
        self._binding = LoopBinding(len(self._consumers))
        self._clear()

    def _clear(self) -> None:
        self._t = SlotTable(self._max_size, len(self._consumers), len(self._tracked))

    # ------------------------------------------------------------------ properties
    @property
    def size(self) -> int:
        """Entries held (put and not yet read by every consumer)."""
        return self._t.size

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
        return len(self._t.candidates[self._consumer_index(consumer)])

    def consumed_ids(self) -> list[Hashable]:
        """Ids of the entries every consumer has read (and that were freed), in the order they were freed.

        This is upstream's recovery list (``hash_vals_to_ignore``); it survives :meth:`save` / :meth:`load`.
        """
        return list(self._t.consumed)

    def __len__(self) -> int:
        return self._t.size

    def __repr__(self) -> str:
        names = ", ".join(c.name for c in self._consumers)
        return f"AsyncSequenceBuffer(size={self._t.size}, max_size={self._max_size}, consumers=[{names}])"

    # ------------------------------------------------------------------ put
    def _presence(self, payloads: list[dict[str, Value]], same_keys: bool) -> np.ndarray:
        """Which readiness keys each sample holds: bool ``[n, n_tracked]``, or one row ``[n_tracked]`` when
        every sample holds the same keys (NumPy broadcasts it where it is assigned)."""
        width = len(self._tracked)
        if not payloads:
            return np.zeros((0, width), dtype=np.bool_)
        keys = payloads[0].keys()
        if same_keys or all(p.keys() == keys for p in payloads):
            first = tuple(k in keys for k in self._tracked)
            row = self._rows.get(first)
            if row is None:  # few key sets ever occur: one small array each, built once
                row = self._rows[first] = np.array(first, dtype=np.bool_).reshape(width)
            return row
        return np.array([[k in p for k in self._tracked] for p in payloads], dtype=np.bool_).reshape(-1, width)

    def _readiness(self, has: np.ndarray) -> np.ndarray:
        """Bool ``[..., n_consumers]`` from ``has [..., n_tracked]``: a consumer is ready when it has all its keys."""
        return (has[..., None, :] | self._not_needed).all(-1)

    def _wake_ready(self) -> None:
        """Wake the consumers that could now read (the caller holds the buffer's lock)."""
        for c, wait in enumerate(self._binding.waits):
            if len(self._t.candidates[c]) >= self._consumers[c].n_seqs:
                wait.notify_all()

    def _full(self, n: int) -> BufferFull:
        return BufferFull(
            f"put of {n} samples does not fit: the buffer holds {self._t.size} of max_size {self._max_size} "
            f"({self._max_size - self._t.size} free); raise max_size or consume faster"
        )

    def _put(self, samples: Any, birth_times: Any) -> torch.Tensor:
        # A put that cannot fit is refused before its samples are parsed: writers that retry on BufferFull
        # (AReaL's) then pay next to nothing per refusal, as upstream's (issue 26).
        if isinstance(samples, list) and len(samples) > self._max_size - self._t.size:
            raise self._full(len(samples))
        parsed = parse_samples(samples, self.storing_device)
        n = len(parsed.ids)
        if n == 0:
            if birth_times is not None:
                birth_times_of(birth_times, 0, self._t.last_birth)
            return torch.empty(0, dtype=torch.int64)
        int_ids = check_new_ids(parsed.ids, self._t.slot_of, self._int_ids)
        births = birth_times_of(birth_times, n, self._t.last_birth)
        new_keys = check_schema(parsed.payloads, self._schema)
        if n > self._max_size - self._t.size:
            raise self._full(n)
        # All checks passed: from here on nothing raises.
        t = self._t
        slot_list = t.pop_free(n)  # the lowest free slots
        slots = np.array(slot_list, dtype=np.int64)
        has = self._presence(parsed.payloads, parsed.same_keys)
        ready = self._readiness(has)
        t.np_occupied[slots] = True
        t.np_birth[slots] = births.numpy()
        t.np_has[slots] = has
        t.np_ready[slots] = ready
        t.np_read[slots] = False
        t.add_candidates(slot_list, ready)
        for slot, sample_id, payload in zip(slot_list, parsed.ids, parsed.payloads, strict=True):
            self._t.payload[slot] = payload
            self._t.ids[slot] = sample_id
            self._t.slot_of[sample_id] = slot
        self._t.puts.update(parsed.ids)
        self._t.size += n
        self._int_ids = int_ids
        self._schema.update(new_keys)
        self._t.last_birth = max(self._t.last_birth, int(births.max()))
        return torch.from_numpy(slots)

    async def put_batch(self, samples: Any, birth_times: Any = None) -> torch.Tensor:
        """Store ``samples`` in the lowest free slots; return those slots (int64 ``[n]``, in sample order).

        Args:
            samples: a list of mappings (each with a unique ``ids`` and any keys; tensors of one key may
                differ in their first dimension between samples; a key may hold
                :class:`~objectrl_buffer.async_buffer.Sequences`, several sequences or only their lengths, or
                a jagged nested tensor, its sequences) or a TensorDict of batch size ``[n]`` (variable-length
                keys as jagged nested tensors). ``ids`` are all int64 (other than -1) or all other hashables
                such as str; the buffer's first put decides which.
            birth_times: ``[n]`` integers (ns) deciding the read order, oldest first; by default monotonic
                time, increasing within the batch and after everything stored.

        Raises:
            BufferFull: fewer free slots than samples (nothing stored).
            InvalidArgumentError: duplicate ``ids`` (in the batch or stored), an int id that is not an int64
                or is ``-1``, an unhashable (or bool, float, None) id, ints mixed with other ids (in the batch
                or against what the buffer holds), ``birth_times`` of the wrong length.
            SchemaError: a key whose dtype or trailing shape differs from what the buffer stores, a tensor
                without strided data (meta device, sparse).
            ConcurrentUseError: the buffer is bound to another event loop (see the class docstring).

        Every check runs before a slot is taken: a refused put stores none of its samples. A list of more
        samples than there are free slots is refused with ``BufferFull`` before its samples are checked.
        """
        cond = self._binding.enter("put_batch")
        try:
            async with cond:
                slots = self._put(samples, birth_times)
                self._wake_ready()
        finally:
            self._binding.leave(cond)
        return slots

    def put_batch_nowait(self, samples: Any, birth_times: Any = None) -> torch.Tensor:
        """:meth:`put_batch` for synchronous code on the buffer's loop thread (or before any loop runs)."""
        self._binding.check_thread("put_batch_nowait")
        slots = self._put(samples, birth_times)
        if len(slots):
            self._binding.wake_soon()
        return slots

    def put_batch_threadsafe(
        self,
        samples: Any,
        birth_times: Any = None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        timeout: float | None = None,
    ) -> torch.Tensor:
        """:meth:`put_batch` from another thread, run on ``loop`` (default: the loop the buffer is bound to).

        Blocks the calling thread until the put is done (at most ``timeout`` seconds) and returns its slots;
        the put's own errors (``BufferFull``, ...) are raised here.
        """
        target = self._binding.threadsafe_target(loop)
        future = asyncio.run_coroutine_threadsafe(self.put_batch(samples, birth_times), target)
        return future.result(timeout)

    # ------------------------------------------------------------------ amend
    def _amend(self, indices: Any, samples: Any) -> None:
        slots = amend_slots(indices, self._t.occupied, self._t.ids)
        parsed = parse_samples(samples, self.storing_device)
        if len(parsed.ids) != slots.numel():
            raise InvalidArgumentError(f"amend_batch: {slots.numel()} indices but {len(parsed.ids)} samples")
        if not parsed.ids:
            return
        slot_list = slots.tolist()
        slots_np = slots.numpy()
        check_amend_ids(slot_list, [self._t.ids[s] for s in slot_list], parsed.ids)
        new_keys = check_schema(parsed.payloads, self._schema)
        # All checks passed: from here on nothing raises.
        for slot, payload in zip(slot_list, parsed.payloads, strict=True):
            stored_payload = self._t.payload[slot]
            assert stored_payload is not None
            stored_payload.update(payload)
        t = self._t
        has = t.np_has[slots_np] | self._presence(parsed.payloads, parsed.same_keys)
        ready = self._readiness(has)
        t.add_candidates(slot_list, ready & ~t.np_ready[slots_np] & ~t.np_read[slots_np])
        t.np_has[slots_np] = has
        t.np_ready[slots_np] = ready
        self._schema.update(new_keys)

    async def amend_batch(self, indices: Any, samples: Any) -> None:
        """Merge the keys of ``samples[i]`` into the entry in slot ``indices[i]`` (its ``ids`` must match).

        Keys already there are replaced. Consumers whose keys are now complete are woken.

        Raises:
            SlotIndexError: a slot out of range or empty (upstream waits forever there); nothing changed.
            InvalidArgumentError: ``ids`` that do not match, a slot named twice, lengths that differ.
            SchemaError: a key whose dtype or trailing shape differs from what the buffer stores.
            ConcurrentUseError: the buffer is bound to another event loop (see the class docstring).
        """
        cond = self._binding.enter("amend_batch")
        try:
            async with cond:
                self._amend(indices, samples)
                self._wake_ready()
        finally:
            self._binding.leave(cond)

    def amend_batch_nowait(self, indices: Any, samples: Any) -> None:
        """:meth:`amend_batch` for synchronous code on the buffer's loop thread."""
        self._binding.check_thread("amend_batch_nowait")
        self._amend(indices, samples)
        self._binding.wake_soon()

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

    def _take(self, c: int) -> tuple[torch.Tensor, TensorDict]:
        consumer = self._consumers[c]
        slots = self._t.oldest(c, consumer.n_seqs)
        slot_list = slots.tolist()
        payloads: list[dict[str, Value]] = [self._t.payload[s] for s in slot_list]
        ids = [self._t.ids[s] for s in slot_list]
        batch = gather(ids, payloads, consumer.input_keys, self._schema, self.device, self._int_ids is not False)
        self._t.np_read[slots, c] = True
        self._t.candidates[c].difference_update(slot_list)
        done = slots[self._t.np_read[slots].all(1)]
        if done.size:
            self._freed(self._t.free(done))
        return torch.from_numpy(slots), batch

    def _freed(self, ids: list[Hashable]) -> None:
        """Tell who waits that the entries of ``ids`` are gone: :meth:`wait_freed` waiters, then ``on_free``."""
        for sample_id in ids:
            for future in self._waiters.pop(sample_id, ()):
                if not future.done():
                    future.set_result(None)
        if self._on_free is not None:
            try:
                self._on_free(ids)
            except Exception as exc:  # the entries are freed and the batch taken: report, do not lose it
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "AsyncSequenceBuffer: the on_free callback raised", "exception": exc}
                )

    def wait_freed(self, sample_id: Hashable) -> asyncio.Future[None]:
        """A future, done once the entry now stored under ``sample_id`` is freed (read by every consumer).

        It is registered at once (call it right after the put, from code on the buffer's loop) and done on
        that loop; ``await buf.wait_freed(i)``. A later put of the same id is a new entry: the future is done
        when the current one is gone. Cancelling it changes nothing in the buffer.

        Raises:
            InvalidArgumentError: no entry holds ``sample_id`` now (never put, or already freed).
            RuntimeError: no event loop is running in this thread.
            ConcurrentUseError: called from a thread other than the one running the buffer's loop.
        """
        self._binding.check_thread("wait_freed")
        loop = asyncio.get_running_loop()
        try:
            stored = sample_id in self._t.slot_of
        except TypeError:
            stored = False
        if not stored:
            raise InvalidArgumentError(f"wait_freed: no entry holds id {sample_id!r} (never put, or already freed)")
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.setdefault(sample_id, []).append(future)
        return future

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
            ConcurrentUseError: the buffer is bound to another event loop (see the class docstring).
        """
        c = self._consumer_index(consumer)
        n = self._consumers[c].n_seqs
        cond = self._binding.enter("get_batch")
        wait = self._binding.waits[c]
        try:
            async with cond:
                await wait.wait_for(lambda: len(self._t.candidates[c]) >= n)
                return self._take(c)
        finally:
            self._binding.leave(cond)

    get_batch_for_rpc = get_batch

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Check every piece of state against the others.

        Raises:
            InconsistentStateError: naming the first inconsistency found.
        """
        t = self._t
        t.check(list(self._by_name))
        occ = t.occupied
        ready = self._readiness(t.np_has[t.np_occupied])
        require(bool((t.np_ready[t.np_occupied] == ready).all()), "readiness differs from the keys held")
        for slot in occ.nonzero().squeeze(1).tolist():
            payload = t.payload[slot]
            assert payload is not None
            for key, col in self._column.items():
                require(bool(t.has[slot, col]) == (key in payload), f"slot {slot}: presence bit of '{key}'")
            for key, value in payload.items():
                spec = self._schema.get(key)
                require(spec is not None and KeySpec.of(value) == spec, f"slot {slot}: key '{key}' off its schema")

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Every entry not yet freed (keys, birth, read bits) plus the recovery list, as tensors + JSON values.

        Raises:
            InvalidArgumentError: ids other than ints and str (a checkpoint holds no other ids).
        """
        slots = self._t.occupied.nonzero().squeeze(1)
        return persist.pack(
            max_size=self._max_size,
            consumers=self._consumers_json(),
            slots=slots,
            ids=[self._t.ids[s] for s in slots.tolist()],
            birth=self._t.birth[slots],
            read=self._t.read[slots],
            payloads=[self._t.payload[s] or {} for s in slots.tolist()],
            schema=self._schema,
            last_birth=self._t.last_birth,
            consumed=self._t.consumed,
            int_ids=self._int_ids is not False,
        )

    def _consumers_json(self) -> list[list[Any]]:
        return [[c.name, list(c.input_keys), c.n_seqs] for c in self._consumers]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the whole state by ``state`` (from :meth:`state_dict` of a buffer with the same consumers
        and ``max_size``); waiting consumers are woken. Checked in full before anything changes.

        Raises:
            CheckpointError: the state does not fit this buffer or is inconsistent.
            ConcurrentUseError: called from a thread other than the one running the buffer's loop.
        """
        self._binding.check_thread("load_state_dict")
        got = persist.unpack(
            state, max_size=self._max_size, consumers=self._consumers_json(), storing_device=self.storing_device
        )
        self._clear()
        self._schema = got.schema
        slots = got.slots
        self._t.occupied[slots] = True
        self._t.birth[slots] = got.birth
        self._t.read[slots] = got.read
        has = self._presence(got.payloads, False)
        slots_np = slots.numpy()
        self._t.np_has[slots_np] = has
        self._t.np_ready[slots_np] = self._readiness(has)
        self._t.add_candidates(slots.tolist(), self._t.np_ready[slots_np] & ~got.read.numpy())
        self._t.free_slots = (~self._t.occupied).nonzero().squeeze(1).tolist()  # ascending: a heap
        for slot, sample_id, payload in zip(slots.tolist(), got.ids, got.payloads, strict=True):
            self._t.payload[slot] = payload
            self._t.ids[slot] = sample_id
            self._t.slot_of[sample_id] = slot
        self._t.size = len(got.payloads)
        self._t.last_birth = got.last_birth
        self._t.consumed = got.consumed
        self._t.puts = Counter(got.consumed) + Counter(got.ids)  # each entry consumed or stored was put
        self._int_ids = got.int_ids if got.ids or got.consumed else None
        if self._t.size:
            self._binding.wake_soon()

    def save(self, path: Any) -> None:
        """Write :meth:`state_dict` to the file ``path``: atomic (temp file, fsync, rename) and crc32-checked.

        Raises:
            InvalidArgumentError: ``path`` is not a ``str`` / ``os.PathLike`` naming a file.
            CheckpointError: the write failed (names the path).
        """
        persist.save_file(self.state_dict(), validate.path(path, "path"))

    def load(self, path: Any) -> None:
        """Load a file written by :meth:`save` (nothing is unpickled); see :meth:`load_state_dict`.

        Raises:
            InvalidArgumentError: ``path`` is not a ``str`` / ``os.PathLike`` naming a file.
            CheckpointError: a missing, damaged or non-fitting file (names the path); nothing changed.
        """
        self.load_state_dict(persist.load_file(validate.path(path, "path")))


#: AReaL's name for the same class.
AsyncIOSequenceBuffer = AsyncSequenceBuffer
