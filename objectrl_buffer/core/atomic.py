"""Lock-free 64-bit atomics on shared memory, through the C runtime's ``libatomic`` (no extension to build).

Python cannot issue an atomic read-modify-write, and a lock taken per call costs two syscalls (``flock``:
~0.9 us uncontended; contended, the loser sleeps in the kernel and is woken: ~3 us). ``libatomic`` (GCC's
runtime, shipped with every Linux distribution's toolchain libraries) exports ``__atomic_fetch_add_8`` and
``__atomic_compare_exchange_8``, which on x86-64 and aarch64 are single instructions (``lock xadd``,
``lock cmpxchg``; LSE or LL/SC) on the given address: atomic across processes that map the same page,
and nothing to release if the caller dies. Called through ``ctypes.PyDLL`` with prebuilt arguments a call
costs ~0.35 us (argument conversion included); an empty ``ctypes`` call is most of it.

:func:`load` returns ``None`` where the library is missing or the operation is not lock-free on this
machine (``libatomic`` would then fall back to a lock private to each process, useless across processes);
callers keep a lock-based path for that case. So does every process whose environment sets
``OBJECTRL_BUFFER_NO_ATOMICS=1`` (read once, at the first use; children inherit it, so the processes of one
run agree: mixing the two paths on one counter would lose updates).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache

__all__ = ["Atomic64", "load"]

_SEQ_CST = 5  # __ATOMIC_SEQ_CST


class Atomic64:
    """A 64-bit signed integer at ``address`` (8-byte aligned, in memory the caller keeps mapped)."""

    def __init__(self, library: ctypes.CDLL, address: int) -> None:
        if address % 8:
            raise ValueError(f"address {address:#x} is not 8-byte aligned")
        self._add = library["__atomic_fetch_add_8"]  # [] : a dotted name would be mangled in a class
        self._add.restype = ctypes.c_int64
        self._cas = library["__atomic_compare_exchange_8"]
        self._cas.restype = ctypes.c_bool
        self._pointer = ctypes.c_void_p(address)
        self._order = ctypes.c_int(_SEQ_CST)
        self._steps: dict[int, ctypes.c_int64] = {}

    def fetch_add(self, n: int) -> int:
        """Add ``n`` and return the value before (one atomic instruction)."""
        step = self._steps.get(n)
        if step is None:  # the usual n (1, a batch size) is converted once
            step = ctypes.c_int64(n)
            if len(self._steps) < 64:
                self._steps[n] = step
        return self._add(self._pointer, step, self._order)

    def compare_exchange(self, expected: int, desired: int) -> bool:
        """Set the value to ``desired`` if it is ``expected``; whether it was."""
        seen = ctypes.c_int64(expected)
        return bool(self._cas(self._pointer, ctypes.byref(seen), ctypes.c_int64(desired), self._order, self._order))


@cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("OBJECTRL_BUFFER_NO_ATOMICS", "") not in ("", "0"):
        return None
    try:  # PyDLL: no GIL release around a one-instruction call
        try:
            library = ctypes.PyDLL("libatomic.so.1")
        except OSError:
            library = ctypes.PyDLL(ctypes.util.find_library("atomic") or "libatomic.so")
        lock_free = library["__atomic_is_lock_free"]
        lock_free.restype = ctypes.c_bool
        lock_free.argtypes = [ctypes.c_size_t, ctypes.c_void_p]
        word = ctypes.c_int64(0)
        if not lock_free(8, ctypes.addressof(word)):
            return None
    except (OSError, AttributeError):
        return None
    return library


def load(address: int) -> Atomic64 | None:
    """Lock-free atomics on the 8 bytes at ``address``, or ``None`` where this machine has none."""
    library = _library()
    return None if library is None else Atomic64(library, address)
