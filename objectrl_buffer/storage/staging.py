"""Storing device (CPU) -> training device (CUDA): gather into pinned staging memory, copy asynchronously.

``cpu_tensor.to("cuda")`` from ordinary (pageable) memory is a synchronous copy through a driver-owned
bounce buffer. Here rows are gathered straight into page-locked ("pinned") staging tensors and copied
with ``non_blocking=True``: one host copy (the gather) and one DMA transfer, with no extra bounce and
no wait for the copy before the sample is handed over.

Synchronisation: a staging buffer may be refilled only once the copy out of it has finished. A small
ring of staging sets is used in turn; after queuing a set's copies we record a CUDA event on the
current stream, and before refilling that set we wait for its event. The tensors handed out are the
fresh device tensors the copies write into, so a sample never aliases storage or staging memory, and
kernels queued on the same stream see the data (stream order). Using a sample on another stream needs
the usual ``wait_stream`` / ``record_stream``, as for any non-blocking copy.

Without CUDA (``device`` is the CPU, ``pin=False``) the same logic runs with plain memory and a clone in
place of the device copy, so it is testable anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from objectrl_buffer.core.schema import Key

__all__ = ["StagingRing"]


class StagingRing:
    """A ring of ``depth`` reusable staging sets (one buffer per key) for host-to-device sample delivery.

    Args:
        device: the training device the samples are delivered to.
        depth: staging sets used in turn (>= 1). With 2, filling the next sample overlaps the copy of
            the previous one; a third request waits for the oldest copy to finish.
        pin: page-lock the staging memory (default: when ``device`` is CUDA).
    """

    def __init__(self, device: torch.device | str, depth: int = 2, pin: bool | None = None) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.device = torch.device(device)
        self.depth = depth
        self.pin = self.device.type == "cuda" if pin is None else pin
        self._stages: list[dict[Key, Any]] = [{} for _ in range(depth)]  # key -> (buffer, NumPy dtype)
        self._events: list[Any] = [None] * depth
        self._turn = 0

    def buffers(self) -> list[torch.Tensor]:
        """Every staging buffer allocated so far (for inspection: are they pinned?)."""
        return [held[0] for stage in self._stages for held in stage.values()]

    def _buffer(self, stage: dict[Key, Any], key: Key, rows: int, like: np.ndarray) -> torch.Tensor:
        """Rows ``[:rows]`` of ``stage``'s buffer for ``key``, (re)allocated when too small or of another layout."""
        held = stage.get(key)
        if held is None or held[0].shape[0] < rows or held[1] != like.dtype or held[0].shape[1:] != like.shape[1:]:
            capacity = rows if held is None else max(rows, held[0].shape[0])
            dtype = torch.from_numpy(like[:0]).dtype
            held = stage[key] = (torch.empty((capacity, *like.shape[1:]), dtype=dtype, pin_memory=self.pin), like.dtype)
        buffer: torch.Tensor = held[0]
        return buffer[:rows]

    def _send(self, staged: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return staged.clone()
        return staged.to(self.device, non_blocking=True)

    def gather(
        self,
        arrays: Mapping[Key, np.ndarray],
        rows: np.ndarray | slice,
        keys: Iterable[Key],
        extra: Mapping[Key, torch.Tensor] | None = None,
    ) -> dict[Key, torch.Tensor]:
        """New tensors on ``device``: ``arrays[key][rows]`` for each of ``keys``, plus the ``extra`` tensors.

        Args:
            arrays: CPU columns as NumPy arrays of shape ``[capacity, *row_shape]``.
            rows: valid row indices (int64 array of length ``k``) or a ``slice`` of ``k`` contiguous rows.
            keys: which columns to read.
            extra: small CPU tensors of ``k`` rows to deliver alongside (e.g. the slot indices).
        """
        turn = self._turn
        self._turn = (turn + 1) % self.depth
        event = self._events[turn]
        if event is not None:
            event.synchronize()  # the copies out of this set, queued `depth` calls ago, have finished
        stage = self._stages[turn]
        count = len(rows) if isinstance(rows, np.ndarray) else len(range(*rows.indices(1 << 62)))
        out: dict[Key, torch.Tensor] = {}
        for key in keys:
            array = arrays[key]
            staged = self._buffer(stage, key, count, array)
            target = staged.numpy()
            if isinstance(rows, slice):
                np.copyto(target, array[rows])
            else:
                # mode="clip": no temporary (mode="raise" buffers `out`); the caller validated the rows
                array.take(rows, axis=0, out=target, mode="clip")
            out[key] = self._send(staged)
        for key, tensor in (extra or {}).items():
            staged = self._buffer(stage, key, count, tensor.numpy())
            staged.copy_(tensor)
            out[key] = self._send(staged)
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self._events[turn] = event
        return out
