"""Map the pages of a CPU tensor in one system call before a bulk copy writes them.

Why this exists: CPU storage lives in torchrl's memory-mapped files. A bulk copy into a fresh mapping
(a checkpoint load) takes one page fault per 4 KiB page, and on a disk-backed file each one also
reserves its block (ext4's ``page_mkwrite``): loading 176 MB that way costs ~75 ms on top of the copy.
``madvise(MADV_POPULATE_WRITE)`` (Linux >= 5.14) maps the same pages in one call, ~3x cheaper, after
which the copy runs at anonymous-memory speed. Neither torch nor torchrl offers it. Elsewhere (other
systems, older kernels, device tensors) :func:`populate_write` does nothing and the copy faults as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import torch

__all__ = ["PrefaultAhead", "populate_all", "populate_write"]

_MADV_POPULATE_WRITE = 23  # <linux/mman.h>; not exported by Python's mmap module before 3.13
_PAGE = mmap.PAGESIZE


def _load_madvise() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _load_madvise()
_supported = _madvise is not None


def populate_write(flat: torch.Tensor) -> bool:
    """Pre-fault, writable, the whole pages inside the memory of the contiguous CPU tensor ``flat``.

    Only pages lying wholly inside ``flat``'s bytes are touched (their contents are kept), so the call
    is safe on any part of any CPU allocation. Returns whether the kernel did it; ``False`` (device
    tensor, unsupported system, or an error such as a full file system) changes nothing, and the
    caller's copy then faults page by page as it would have anyway.
    """
    global _supported
    if not _supported or flat.device.type != "cpu" or not flat.is_contiguous():
        return False
    start = flat.data_ptr()
    end = start + flat.numel() * flat.element_size()
    first = -(-start // _PAGE) * _PAGE
    last = end // _PAGE * _PAGE
    if last <= first:
        return False
    assert _madvise is not None
    if _madvise(first, last - first, _MADV_POPULATE_WRITE) == 0:
        return True
    if ctypes.get_errno() == 22:  # EINVAL: this kernel predates MADV_POPULATE_WRITE; stop asking
        _supported = False
    return False


def populate_all(tensors: list[torch.Tensor], chunk_bytes: int = 64 << 20, workers: int = 2) -> None:
    """:func:`populate_write` every contiguous CPU tensor of ``tensors``, in ``chunk_bytes`` pieces spread
    over ``workers`` threads (the kernel work releases the GIL). Best effort, like :func:`populate_write`."""
    pieces = []
    for tensor in tensors:
        flat = tensor.reshape(-1).view(torch.uint8) if tensor.is_contiguous() else None
        if flat is not None and flat.device.type == "cpu":
            pieces += [flat[start : start + chunk_bytes] for start in range(0, flat.numel(), chunk_bytes)]
    if len(pieces) < 2 or workers < 2:
        for piece in pieces:
            populate_write(piece)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="objectrl_buffer-prefault") as pool:
        list(pool.map(populate_write, pieces))


class PrefaultAhead:
    """Pre-faults ``pieces`` (contiguous CPU tensors, in the order a writer will fill them) on ``workers``
    threads, keeping at most ``ahead`` pieces in front of the writer, so the mapping work runs beside
    the copy without racing far ahead of it (or all the way through a target that a failed copy
    abandons). Call :meth:`wait` before writing piece ``i``; :meth:`close` (or leaving the ``with``
    block) drops the pieces not started yet and waits for the running ones.
    """

    def __init__(self, pieces: list[torch.Tensor], workers: int = 2, ahead: int = 8) -> None:
        self._pieces = pieces
        self._ahead = ahead
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="objectrl_buffer-prefault")
        self._futures: dict[int, Future[bool]] = {}
        self._submitted = 0

    def wait(self, i: int) -> None:
        """Return once piece ``i`` is pre-faulted (or was tried), queueing the next ones."""
        stop = min(len(self._pieces), i + 1 + self._ahead)
        while self._submitted < stop:
            self._futures[self._submitted] = self._pool.submit(populate_write, self._pieces[self._submitted])
            self._submitted += 1
        future = self._futures.pop(i, None)
        if future is not None:
            future.result()

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
        self._pool.shutdown(wait=True)

    def __enter__(self) -> PrefaultAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
