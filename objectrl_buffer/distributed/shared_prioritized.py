"""Prioritized replay over a :class:`~objectrl_buffer.distributed.shared.SharedBuffer`: priorities every process
draws by and updates, in shared files beside the rows.

Files (in the shared buffer's folder): ``priority.bin``, float64 ``[1 + capacity]``: ``[0]`` the largest priority
given (what new rows get; 1.0 at first), ``[1 + s]`` slot ``s``'s raw priority; ``tree.bin``, the levels of a
:class:`~objectrl_buffer.sampling.sum_tree.SumTree` of the sampling weights ``(p + eps) ** alpha`` laid out one
after the other; ``priorities.json``: ``alpha`` and ``eps``.

Every change of a priority or of the tree happens under one :class:`~objectrl_buffer.core.sync.FileLock` on
``priority.bin`` (a ``flock`` the kernel releases if its holder dies, apart from the slots' reserve lock so
that reservations never wait on a priority update); draws take it too, so a draw never sees a tree half
updated. A writer sets its row's priority *after* committing the row, and only if the slot still holds that
row (its commit generation is the row's), so a slot never drawable before its first commit, and a slow
writer never overwrites the priority of a newer row at its slot. A slot drawn while it is being rewritten
(its generation shows the write) is redrawn, as uniform samples are, and the sampler takes its sampling
weight off (under the lock, if the slot is still being written: the writer's priority, set after its
commit, gives it back), so a writer killed mid-write leaves a slot that is not drawn until rewritten. So
does a slot tainted by a lapped write (:mod:`objectrl_buffer.distributed.shared`): a lapped row is never
published, so it never gets a priority; the slot's next row, committed by a later ticket, gets one.

Stale updates: a sample carries each row's commit generation (``"generation"``, the slot's ``seq + 1``);
:meth:`SharedPrioritizedBuffer.update_priority` given it compares it with the slot's generation under the
priority lock and skips a slot rewritten (or being rewritten) since the draw: a learner's late TD error never
lands on a newer row, which keeps the max priority its writer gave it.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Mapping
from typing import Any, BinaryIO

import torch
from tensordict import TensorDict, TensorDictBase

from objectrl_buffer.checkpoint.io import atomic_write, read_small_file
from objectrl_buffer.core.keys import INDEX_KEY, WEIGHT_KEY
from objectrl_buffer.core.schema import Schema
from objectrl_buffer.core.sync import FileLock
from objectrl_buffer.core.validate import last_per_slot
from objectrl_buffer.distributed.shared import SharedBuffer
from objectrl_buffer.sampling.sum_tree import SumTree

__all__ = ["SharedPrioritizedBuffer", "open_shared"]

_SETTINGS = "priorities.json"
_PRIORITY = "priority.bin"
_TREE = "tree.bin"


def _tree_words(capacity: int) -> int:
    return sum(level.numel() for level in SumTree(capacity).levels)


class SharedPrioritizedBuffer(SharedBuffer):
    """A :class:`SharedBuffer` whose samples follow priorities shared by every process holding it.

    Slot ``i`` of the committed rows is drawn with probability ``(p_i + eps) ** alpha / sum_j (p_j + eps) ** alpha``
    (the conventions of :class:`~objectrl_buffer.PrioritizedReplayBuffer`); samples carry ``"index"``,
    ``"weight"`` (float32 ``(P(i) / min_batch P) ** -beta``, the largest 1) and ``"generation"`` (which write of
    each slot was drawn: :meth:`update_priority` skips slots rewritten since). New rows get :attr:`max_priority`.
    """

    def __init__(self, folder: str, *, seed: int | None = None, owner: bool = False) -> None:
        super().__init__(folder, seed=seed, owner=owner)
        settings = json.loads(read_small_file(os.path.join(folder, _SETTINGS), 1 << 16))
        self.alpha, self.eps = float(settings["alpha"]), float(settings["eps"])
        path = os.path.join(folder, _PRIORITY)
        words = torch.from_file(path, shared=True, size=1 + self.capacity, dtype=torch.float64)
        self.head = words.numpy()  # [0]: max priority (NumPy: scalar loads and stores at ~0.1 us)
        self.priority = words[1:]
        self.tree = SumTree(self.capacity)
        flat = torch.from_file(
            os.path.join(folder, _TREE), shared=True, size=_tree_words(self.capacity), dtype=torch.float64
        )
        self.tree.levels = list(flat.split([level.numel() for level in self.tree.levels]))
        self.priority_lock = FileLock(path)

    @classmethod
    def create(
        cls,
        schema: Schema,
        capacity: int,
        folder: str | os.PathLike[str] | None = None,
        *,
        seed: int | None = None,
        start: int = 0,
        alpha: float = 0.6,
        eps: float = 1e-6,
    ) -> SharedPrioritizedBuffer:
        """A new, empty shared prioritized buffer (this process owns its files); ``alpha``/``eps`` as
        :class:`~objectrl_buffer.PrioritizedReplayBuffer` (checked by it)."""
        path = cls.make_folder(schema, capacity, folder, start=start)
        try:
            with open(os.path.join(path, _PRIORITY), "xb") as f:
                f.truncate(8 * (1 + capacity))
                f.write(struct.pack("<d", 1.0))
            with open(os.path.join(path, _TREE), "xb") as f:
                f.truncate(8 * _tree_words(capacity))
            settings = json.dumps({"alpha": alpha, "eps": eps}).encode()

            def write(f: BinaryIO) -> None:
                f.write(settings)

            atomic_write(os.path.join(path, _SETTINGS), write)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return cls(path, seed=seed, owner=True)

    # ------------------------------------------------------------------ priorities
    @property
    def max_priority(self) -> float:
        """The priority new rows get: the largest given so far, 1.0 before any."""
        return float(self.head[0])

    def _weight(self, priority: torch.Tensor) -> torch.Tensor:
        return (priority + self.eps).pow(self.alpha)

    def update_priority(
        self, slots: torch.Tensor, priority: torch.Tensor, generation: torch.Tensor | None = None
    ) -> int:
        """Set float64 ``priority`` at int64 ``slots`` (both ``[k]``, checked by the caller: see
        :meth:`~objectrl_buffer.PrioritizedReplayBuffer.checked_rows`; a slot given twice takes the last
        value), under the priority lock. With ``generation`` (int64 ``[k]``: a sample's ``"generation"``),
        a row whose slot was rewritten (or is being rewritten) since it was drawn is skipped.

        Returns:
            how many of the ``k`` rows were applied (all ``k`` without ``generation``).
        """
        if slots.numel() == 0:
            return 0
        with self.priority_lock:  # a writer sets its new row's priority under it, after its commit
            if generation is not None:
                held = (self.slots.generations(slots) == generation).nonzero().squeeze(1)
                if held.numel() < slots.numel():
                    slots, priority = slots.index_select(0, held), priority.index_select(0, held)
                if slots.numel() == 0:
                    return 0
            applied = slots.numel()
            slots, priority = last_per_slot(slots, priority)
            self.priority.index_copy_(0, slots, priority)
            self.tree.update(slots, self._weight(priority))
            self.head[0] = max(float(self.head[0]), float(priority.max()))
        return applied

    def load_priorities(self, priority: torch.Tensor, max_priority: float) -> None:
        """Adopt raw priorities of every slot (float64 ``[capacity]``) and the max priority; slots holding no
        finished row keep weight 0."""
        with self.priority_lock:
            self.priority.copy_(priority)
            everything = torch.arange(self.capacity)
            self.tree.rebuild(self._weight(priority) * self.servable(everything))
            self.head[0] = max_priority

    def priority_state(self) -> dict[str, torch.Tensor]:
        """A copy of ``priority`` (float64 ``[capacity]``) and ``max_priority`` (float64, 0-d)."""
        with self.priority_lock:
            return {
                "priority": self.priority.clone(),
                "max_priority": torch.tensor(float(self.head[0]), dtype=torch.float64),
            }

    def _new_rows(self, seq: int, n: int) -> None:
        """Give the committed rows ``seq .. seq + n - 1`` the max priority, where the slot still holds them."""
        if n == 1:
            slot = seq % self.capacity
            with self.priority_lock:
                if self._gens[1 + slot] == seq + 1:
                    top = float(self.head[0])
                    self.priority[slot] = top
                    self.tree.update_one(slot, (top + self.eps) ** self.alpha)
            return
        seqs, slots = self._placed(seq, n)
        with self.priority_lock:
            held = (self.slots.generations(slots) == seqs + 1).nonzero().squeeze(1)
            if held.numel():
                slots = slots.index_select(0, held)
                values = torch.full(slots.shape, float(self.head[0]), dtype=torch.float64)
                self.priority.index_copy_(0, slots, values)
                self.tree.update(slots, self._weight(values))

    # ------------------------------------------------------------------ writes and reads
    def add(self, transition: TensorDictBase | Mapping[str, Any]) -> int:
        """As :meth:`SharedBuffer.add`; the committed row then gets :attr:`max_priority`."""
        seq = super().add(transition)
        self._new_rows(seq, 1)
        return seq

    def add_batch(self, batch: TensorDictBase | Mapping[str, Any]) -> tuple[int, int]:
        """As :meth:`SharedBuffer.add_batch`; the committed rows then get :attr:`max_priority`."""
        seq, n = super().add_batch(batch)
        if n:
            self._new_rows(seq, n)
        return seq, n

    def draw(self, n: int) -> torch.Tensor | None:
        """``n`` slots drawn by priority (``None`` when no slot has weight)."""
        with self.priority_lock:
            if not float(self.tree.total()) > 0:
                return None
            return self.tree.sample(n, self.generator)

    def passed_over(self, slots: torch.Tensor) -> None:
        """Take the sampling weight off ``slots`` still being written (their raw priority stays): a heavy
        slot that a writer left half-written (killed) is not drawn again and again until rewritten. The
        writer's priority, set under the lock after its commit, gives the weight back."""
        if slots.numel() == 0:
            return
        slots = slots.unique()
        with self.priority_lock:
            open_ = (~self.servable(slots)).nonzero().squeeze(1)  # checked under the lock
            if open_.numel():
                slots = slots.index_select(0, open_)
                self.tree.update(slots, torch.zeros(slots.shape, dtype=torch.float64))

    def weights(self, slots: torch.Tensor, beta: float) -> torch.Tensor:
        """``(P(i) / min_j P(j)) ** -beta`` over ``slots`` (float32 ``[k]``; computed in logs, as the
        single-process buffer)."""
        if self.alpha == 0 or beta == 0:
            return torch.ones(slots.shape, dtype=torch.float32)
        log_weight = (self.priority.index_select(0, slots) + self.eps).log_().mul_(self.alpha)
        return (log_weight - log_weight.min()).mul_(-beta).exp_().to(torch.float32)

    def sample_batch(self, batch_size: int, beta: float = 0.4, *, generations: bool = True) -> TensorDict:
        """``batch_size`` committed rows drawn by priority with replacement, with ``"index"``, ``"weight"`` and
        (``generations``) ``"generation"``: each row's commit generation, for :meth:`update_priority`.

        Raises:
            EmptyBufferError: no finished row with weight.
        """
        out = super().sample_batch(batch_size, generations=generations)
        out.set(WEIGHT_KEY, self.weights(out[INDEX_KEY], beta))
        return out


def open_shared(folder: str) -> SharedBuffer:
    """A handle on the shared buffer in ``folder``: prioritized when its files say so."""
    if os.path.exists(os.path.join(folder, _SETTINGS)):
        return SharedPrioritizedBuffer(folder)
    from objectrl_buffer.distributed.shared_compact import COMPACT_FILE, SharedCompactBuffer

    if os.path.exists(os.path.join(folder, COMPACT_FILE)):
        return SharedCompactBuffer(folder)
    return SharedBuffer(folder)
