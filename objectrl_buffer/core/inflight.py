"""Writes in flight on a shared ring, and the slots a lapped write may have mixed: what makes a lapped slot
detectable (issue 27).

A ring of ``capacity`` slots written by many processes hands out slots by ticket (``seq``, one atomic
fetch-add); ticket ``t`` writes slot ``t % capacity``. A writer preempted inside its copy long enough for
``capacity`` more tickets to be handed out shares its slot with a newer writer: both copy into one row, and
no per-slot stamp can tell, since the newer writer overwrote whatever the older one had stamped. Two shared
records close that gap (one file, ``int64`` words, mapped by every process):

* **the writers table**: ``[0]`` how many entries were ever claimed, ``[1]`` how many taints were ever raised
  (readers skip the taints while it is 0), then ``TABLE`` entries of ``(pid, first ticket + 1, rows, thread
  id)`` (each padded to a cache line), one per writing handle and thread. A writer stores its tickets there
  (:meth:`Writers.enter`) *before* its first store into the slots, and clears them (:meth:`Writers.leave`)
  only after its last. A reader that copied a row checks, *after* the copy, that no entry covers the row's
  slot (:meth:`Writers.unsafe`): a write whose stores it may have read is still listed then, or it has
  finished and what it stored about the slot (below) is visible. A cleared entry is ``0``.
* **taints**, one word per slot: after its copy a writer issues a full fence (an atomic read-modify-write
  on its own entry) and reads the reserve counter ``R``. Rows whose slot was handed out again meanwhile
  (``t + capacity < R``) are *lapped*: the writer does not publish them and raises the slot's taint to
  ``R`` (:meth:`Writers.settle`). A row of that slot with a ticket below the taint is never served: a
  newer row may hold bytes of the lapped write, while a ticket at or above ``R`` was handed out after the
  lapped copy had ended, so its row is whole. The slot thus stays unserved until rewritten by a later
  ticket, and an older ticket never wins over a newer one.

A writer killed inside its copy never clears its entry: its slots stay unserved until a reader finds the
entry lapped and its process gone (``kill(pid, 0)``; a zombie counts as gone): the reader taints the slots
(at the current ``R``) and clears the entry, so only rows written after the death are served there.

Stores are plain aligned 8-byte stores, seen by other processes in program order (x86-64 TSO, as
:mod:`~objectrl_buffer.core.shared_counter` assumes); the one fence is the writer's before it reads ``R``
(a store followed by a load may be reordered). Where this machine has no lock-free atomics
(:func:`~objectrl_buffer.core.atomic.load` is ``None``) the fence is a lock's acquire, and the rare
compare-and-swaps (claiming an entry, raising a taint) go under a :class:`~objectrl_buffer.core.sync.FileLock`.

Limits: ``TABLE`` writing handle-threads at once per buffer (:class:`ConcurrentUseError` beyond, once the
entries of dead processes are reclaimed); an entry of a handle dropped without :meth:`Writers.close` stays
claimed until its process exits; a dead writer's pid reused by a live process keeps that writer's slots
unserved until the entry is reclaimed.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch

from objectrl_buffer.core import atomic
from objectrl_buffer.core.sync import FileLock
from objectrl_buffer.errors import ConcurrentUseError

__all__ = ["Writers", "TABLE"]

TABLE = 1024  # writing handle-threads at once
# pid, first ticket + 1, rows, thread id, then padding: an entry fills a 64-byte cache line of its own, so the
# writers' stores and fences never bounce a line between cores (4 words: 4 writers ran 1.8x slower per add)
_WIDTH = 8
_HEAD = 2  # entries ever claimed, taints ever raised


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


class Writers:
    """The writers table and taints of a ring of ``capacity`` slots, in the file ``path`` (see the module docs).

    Args:
        path: the shared file (made, zeroed, when missing or short: every word starts at 0).
        capacity: slots (> 0).
        reserved: a view of the ring's reserve counter (``reserved[0]``: tickets handed out so far).
    """

    def __init__(self, path: str, capacity: int, reserved: np.ndarray) -> None:
        self.path, self.capacity, self.reserved = path, capacity, reserved
        size = _HEAD + TABLE * _WIDTH + capacity
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(fd).st_size < 8 * size:
                os.ftruncate(fd, 8 * size)
        finally:
            os.close(fd)
        words = torch.from_file(path, shared=True, size=size, dtype=torch.int64)
        self._words = words  # keeps the mapping alive under the atomics' raw addresses
        self.words = words.numpy()
        self.table = self.words[_HEAD : _HEAD + TABLE * _WIDTH].reshape(TABLE, _WIDTH)
        self.taints = words[_HEAD + TABLE * _WIDTH :]
        self.taint_words = self.taints.numpy()
        self._base = words.data_ptr()
        self.lock = FileLock(path)
        self.fence_lock = threading.Lock()
        self.forget()

    # ------------------------------------------------------------------ entries
    def forget(self) -> None:
        """Drop this handle's entries (a fork child: they are its parent's)."""
        self._mine: dict[int, tuple[int, atomic.Atomic64 | None]] = {}
        #: (thread id, entry, fence) of the thread that wrote last: read and replaced as one object, so a
        #: thread never takes another's entry
        self._last: tuple[int, int, atomic.Atomic64 | None] = (-1, -1, None)

    def close(self) -> None:
        """Give back this process's entries of this handle (when not in flight)."""
        for entry, _ in self._mine.values():
            if not self.words[entry + 1]:
                self._cas(entry, os.getpid(), 0)
        self.forget()

    def _address(self, word: int) -> int:
        return self._base + 8 * word

    def _cas(self, word: int, expected: int, desired: int) -> bool:
        """Compare-and-swap of word ``word`` (rare paths: claims, taints, dead writers)."""
        op = atomic.load(self._address(word))
        if op is not None:
            return op.compare_exchange(expected, desired)
        with self.lock:
            if int(self.words[word]) != expected:
                return False
            self.words[word] = desired
            return True

    def _use(self, tid: int) -> tuple[int, int, atomic.Atomic64 | None]:
        mine = self._mine.get(tid)
        if mine is None:
            entry = self._claim(tid)
            at = _HEAD + entry * _WIDTH  # kept as the word of its pid: words[at + 1] is its ticket, [at + 2] its rows
            mine = self._mine[tid] = (at, atomic.load(self._address(at + 3)))
        last = self._last = (tid, *mine)
        return last

    def _claim(self, tid: int) -> int:
        pid, table = os.getpid(), self.table
        entry = next((i for i in range(TABLE) if not table[i, 0] and self._cas(_HEAD + i * _WIDTH, 0, pid)), -1)
        if entry < 0:  # reclaim the entry of a process gone
            for i in range(TABLE):
                owner = int(table[i, 0])
                if owner != pid and not _alive(owner) and self._cas(_HEAD + i * _WIDTH, owner, pid):
                    entry = i
                    self._drop_dead(i, int(table[i, 1]))
                    break
            else:
                raise ConcurrentUseError(
                    f"more than {TABLE} handles and threads write the shared ring at '{self.path}'"
                )
        table[entry, 3] = tid
        while int(self.words[0]) <= entry and not self._cas(0, int(self.words[0]), entry + 1):
            pass
        return entry

    # ------------------------------------------------------------------ writers
    def enter(self, first: int, n: int) -> int:
        """List tickets ``first .. first + n - 1`` as in flight (before any store into their slots); return
        the entry to pass to :meth:`settle` and :meth:`leave`."""
        tid = threading.get_ident()
        last = self._last
        if last[0] != tid:
            last = self._use(tid)
        entry, words = last[1], self.words
        words[entry + 2] = n  # the count first: a reader that sees the ticket sees it
        words[entry + 1] = first + 1
        return entry

    def settle(self, first: int, n: int, *, taint: bool = True) -> int:
        """After the copy of tickets ``first .. first + n - 1``: how many of them (the oldest) were lapped;
        ``taint``: mark their slots (they must not be published). Issues the writer's fence."""
        fence = self._last[2]  # a locked instruction of this thread: any thread's entry serves
        if fence is not None:
            fence.fetch_add(0)  # a locked instruction: every store before it is visible before the load below
        else:
            with self.fence_lock:
                pass
        reserved = self.reserved.item(0)
        lapped = reserved - self.capacity - first
        if lapped <= 0:
            return 0
        lapped = min(n, lapped)
        if taint:
            self.taint(first, lapped, reserved)
        return lapped

    def leave(self, entry: int) -> None:
        """The write of ``entry`` is over (after its last store, publication included)."""
        self.words[entry + 1] = 0

    def taint(self, first: int, n: int, reserved: int) -> None:
        """Rows of the slots of tickets ``first .. first + n - 1`` below ticket ``reserved`` are never served."""
        base = _HEAD + TABLE * _WIDTH
        for slot in sorted({(first + i) % self.capacity for i in range(min(n, self.capacity))}):
            while True:
                seen = int(self.words[base + slot])
                if seen >= reserved or self._cas(base + slot, seen, reserved):
                    break
        while not self._cas(1, self.words.item(1), self.words.item(1) + 1):  # before the entry is cleared
            pass

    # ------------------------------------------------------------------ readers
    def unsafe(self, slots: torch.Tensor, generations: torch.Tensor) -> torch.Tensor | None:
        """Call after copying rows: which of the ``slots`` (int64 ``[k]``), holding rows of commit
        ``generations`` (``seq + 1``) when the copy began, may hold bytes of another write (bool ``[k]``);
        ``None`` when none may (no write in flight, no taint ever raised: the common case)."""
        busy = self.busy()  # the table first, then the taints (a cleared entry's taints are visible then)
        tainted = self.words.item(1)
        if not busy and not tainted:
            return None
        at = slots.numpy()
        out = generations.numpy() <= self.taint_words[at] if tainted else np.zeros(at.shape, dtype=bool)
        cap = self.capacity
        for first, count in busy:  # a few writers at most: a NumPy op or three each
            if count == 1:
                out |= at == first
            elif first + count <= cap:
                out |= (at >= first) & (at < first + count)
            else:
                out |= (at >= first) | (at < first + count - cap)
        return torch.from_numpy(out)

    def busy(self) -> list[tuple[int, int]]:
        """The writes in flight: ``(first slot, slots)`` each. Entries of dead writers found lapped are
        tainted and cleared on the way."""
        claimed = self.words.item(0)
        if not claimed:
            return []
        tickets = self.table[:claimed, 1].tolist()  # loaded before the counts: see the module docs
        out = []
        cap, reserved = self.capacity, -1
        for entry, ticket in enumerate(tickets):
            if ticket:
                count = min(self.table.item(entry, 2), cap)
                if reserved < 0:
                    reserved = self.reserved.item(0)
                if ticket - 1 + cap < reserved and not _alive(self.table.item(entry, 0)):  # lapped, and dead
                    self._drop_dead(entry, ticket)
                    continue
                out.append(((ticket - 1) % cap, count))
        return out

    def _drop_dead(self, entry: int, ticket: int) -> None:
        """A dead writer's entry (``ticket``: its stored first ticket + 1, 0 when idle): taint its slots at
        the current counter, then clear it."""
        if ticket:
            self.taint(ticket - 1, int(self.table[entry, 2]), int(self.reserved[0]))
            self._cas(_HEAD + entry * _WIDTH + 1, ticket, 0)
