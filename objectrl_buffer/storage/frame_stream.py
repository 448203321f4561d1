"""One observed key of a compact storage: its frames, side pool and per-row links, and how rows are rebuilt.

See :mod:`~objectrl_buffer.storage.compact` for the layout. A row of env step ``T`` of env ``e`` that is
``distance`` steps after the episode start whose whole stack is pool entry ``anchor`` reads frame ``i``
(``k - 1 - i`` steps back) from the frames ring at ``((T - k + 1 + i) mod span) * E + e``, or, when that is
before the episode start, from the pool entry. Its next value is the row of step ``T + 1`` in the same
episode (its frames are written with the row), or a pool entry where the row ended an episode.

On the CPU the gathers use NumPy (``take`` gathers rows of uint8 images ~20x faster than torch's
``index_select`` on a 2-core VM); on an accelerator, torch indexing on the device.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from objectrl_buffer.core.schema import Field, Key, Schema
from objectrl_buffer.storage.frame_pool import FramePool
from objectrl_buffer.storage.table import TransitionStorage

__all__ = ["FrameStream", "SUCCESSOR", "NUMPY_ON_CPU", "numpy_paths"]

SUCCESSOR = -1  # a row's next value is the next step's observation (else: a pool id)
#: Whether CPU storage takes the NumPy paths (reads here, single-row writes in ``compact_step.py``); ``False``
#: makes it take the accelerator's torch paths, which tests use to check those without an accelerator.
NUMPY_ON_CPU = True


class FrameStream:
    """One observed key: its frames, pool, per-row links and (at most one) next key."""

    def __init__(
        self,
        field: Field,
        k: int,
        stacked: bool,
        nxt: Key | None,
        *,
        capacity: int,
        num_envs: int,
        device: torch.device,
        directory: str | os.PathLike[str] | None,
    ) -> None:
        self.field = field
        self.key = field.key
        self.k = k
        self.stacked = stacked
        self.next = nxt
        cap, envs = capacity, num_envs
        self.envs = envs
        self.frame_shape = field.shape[1:] if stacked else field.shape
        # frame steps kept per env: the rows', the k - 1 older frames of the oldest row, and the next
        # frame of the newest row (its next value's newest frame, written with it)
        self.span = cap // envs + k
        self.frames = TransitionStorage(self.span * envs, device, directory)
        frame_field = Field(field.key, self.frame_shape, field.dtype)
        self.frames.initialize(Schema([frame_field]), {field.key: torch.zeros(self.frame_shape, dtype=field.dtype)})
        self.frames.reserve_rows(self.span * envs)
        self.column = self.frames.columns[self.key]
        self.flat = self.column.view(self.span * envs, -1)
        self.back = np.arange(k - 1, -1, -1)  # steps back of frame i of a stack
        self.pool = FramePool(field.shape, field.dtype, device)
        self.anchor = torch.full((cap,), -1, dtype=torch.int64, device=device)  # pool id of the episode start
        self.distance = torch.zeros(cap, dtype=torch.int64, device=device)  # steps since that start
        self.carry_id = torch.full((envs,), -1, dtype=torch.int64, device=device)  # the head rows' anchor
        self.carry_step = torch.zeros(envs, dtype=torch.int64, device=device)
        self.next_link = torch.full((cap,), SUCCESSOR, dtype=torch.int64, device=device)  # or a pool id
        self.cpu = numpy_paths(device)
        if self.cpu:  # the single-row path's views (shared memory with the tensors above)
            self.np_flat = self.flat.numpy()
            self.np = {n: getattr(self, n).numpy() for n in ("anchor", "distance", "carry_id", "carry_step")}
            self.np["next_link"] = self.next_link.numpy()

    @property
    def nbytes(self) -> int:
        per_row = self.anchor.numel() * 24
        return self.frames.nbytes + self.pool.nbytes + per_row

    def close(self) -> None:
        self.frames.close()

    def stack(
        self, step: torch.Tensor, env: torch.Tensor, anchor: torch.Tensor, distance: torch.Tensor
    ) -> torch.Tensor:
        """The values ``[B, *shape]`` of rows of env steps ``step`` of envs ``env`` that are ``distance``
        steps after the episode start in pool entry ``anchor`` (``-1``: more than ``k - 2`` steps)."""
        if self.cpu:
            rows = self.stack_np(step.numpy(), env.numpy(), anchor.numpy(), distance.numpy())
            return torch.from_numpy(rows).view(-1, *self.field.shape)
        span, envs, k = self.span, self.envs, self.k
        back = torch.arange(k - 1, -1, -1, device=step.device)  # steps back of frame i
        index = ((step.unsqueeze(1) - back) % span) * envs + env.unsqueeze(1)  # [B, k]
        out = self.flat.index_select(0, index.reshape(-1))  # [B * k, frame bytes]
        if k > 1:
            need = (anchor >= 0).unsqueeze(1) & (back > distance.unsqueeze(1))  # [B, k]
            if bool(need.any()):
                row, i = need.nonzero(as_tuple=True)
                pool = self.pool.data.view(-1, out.shape[1])
                source = self.pool.slots(anchor[row]) * k + i + distance[row]
                out.index_copy_(0, row * k + i, pool.index_select(0, source))
        return out.view(-1, *self.field.shape)

    def stack_np(self, step: np.ndarray, env: np.ndarray, anchor: np.ndarray, distance: np.ndarray) -> np.ndarray:
        """:meth:`stack` on the CPU with NumPy (its ``take`` gathers image rows ~20x faster than torch's
        ``index_select`` on a 2-core VM), as flat rows ``[B * k, frame elements]``."""
        span, envs, k = self.span, self.envs, self.k
        back = self.back
        index = ((step[:, None] - back) % span) * envs + env[:, None]
        out = self.np_flat.take(index.reshape(-1), axis=0)
        if k > 1:
            need = (anchor >= 0)[:, None] & (back > distance[:, None])
            if need.any():
                row, i = need.nonzero()
                pool = self.pool.data.numpy().reshape(-1, out.shape[1])
                out[row * k + i] = pool[(anchor[row] % self.pool.capacity) * k + i + distance[row]]
        return out

    def head_next(self, step: int) -> torch.Tensor:
        """Per env ``[E, *shape]``, the stored value at env step ``step`` of the newest rows' episodes: their
        next value (frames up to ``step`` are those of the newest rows and their next frame)."""
        distance = step - self.carry_step
        anchor = torch.where(distance <= self.k - 2, self.carry_id, -1)
        step_of = torch.full((self.envs,), step, dtype=torch.int64, device=self.carry_step.device)
        return self.stack(step_of, torch.arange(self.envs, device=step_of.device), anchor, distance)

    def observed(self, slots: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """Rows ``slots`` (env steps ``step``) of the observed key."""
        if self.cpu:
            at = slots.numpy()
            out = self.stack_np(step.numpy(), at % self.envs, self.np["anchor"][at], self.np["distance"][at])
            return torch.from_numpy(out).view(-1, *self.field.shape)
        return self.stack(
            step, slots % self.envs, self.anchor.index_select(0, slots), self.distance.index_select(0, slots)
        )

    def next_value(self, slots: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """Rows ``slots`` of the next key: the observation of the step after (a pool entry at episode ends)."""
        k = self.k
        if self.cpu:
            at = slots.numpy()
            distance = self.np["distance"][at] + 1
            starts = np.where(distance <= k - 2, self.np["anchor"][at], -1)
            out = self.stack_np(step.numpy() + 1, at % self.envs, starts, distance).reshape(at.size, -1)
            link = self.np["next_link"][at]
            explicit = link >= 0
            if explicit.any():
                pool = self.pool.data.numpy().reshape(self.pool.capacity, -1)
                out[explicit] = pool[link[explicit] % self.pool.capacity]
            return torch.from_numpy(out).view(-1, *self.field.shape)
        distance = self.distance.index_select(0, slots) + 1
        anchor = torch.where(distance <= k - 2, self.anchor.index_select(0, slots), -1)
        value = self.stack(step + 1, slots % self.envs, anchor, distance)
        link = self.next_link.index_select(0, slots)
        explicit = link >= 0
        if bool(explicit.any()):
            value[explicit] = self.pool.data.index_select(0, self.pool.slots(link[explicit]))
        return value


def numpy_paths(device: torch.device) -> bool:
    """Whether a compact storage on ``device`` takes the NumPy paths (see :data:`NUMPY_ON_CPU`)."""
    return device.type == "cpu" and NUMPY_ON_CPU
