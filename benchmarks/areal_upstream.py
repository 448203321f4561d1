"""A model of AReaL's ``AsyncIOSequenceBuffer`` (``realhf/system/buffer.py``), written here from its description
in the project's reference notes: no installable wheel ships it, so the benchmark runs this model instead.

It does what upstream does per call, with the same data structures: NumPy state of ``max_size`` rows under
one ``asyncio.Condition``; a put takes the lowest-index empty slots (``BufferFull`` when fewer are free,
checked before anything else), marks them, stores the entries and recomputes readiness; an amend waits until
its slots are idle, merges the keys and recomputes readiness; a read waits (re-evaluating a predicate over
all ``max_size`` rows at every wake-up) until ``n_seqs`` slots are ready for the consumer, takes the oldest
by birth time, decrements each entry's reuse count, frees those at zero and gathers the consumer's keys
(packed: one ``torch.cat`` per key plus the per-sequence lengths). Used by ``async_bench.py`` only.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


class BufferFull(Exception):
    """No room for the put (upstream's exception)."""


@dataclass
class Sample:
    """A packed sample of one id (upstream's ``SequenceSample`` reduced to what the buffer touches)."""

    ids: list[Any]
    seqlens: dict[str, list[list[int]]]
    data: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def keys(self) -> set[str]:
        return set(self.seqlens)

    def update_(self, other: Sample) -> None:
        assert self.ids == other.ids
        self.seqlens.update(other.seqlens)
        self.data.update(other.data)

    @staticmethod
    def gather(samples: list[Sample], keys: tuple[str, ...]) -> Sample:
        ids = [i for s in samples for i in s.ids]
        seqlens = {k: [sl for s in samples for sl in s.seqlens[k]] for k in keys}
        data = {k: torch.cat([s.data[k] for s in samples]) for k in keys if all(k in s.data for s in samples)}
        return Sample(ids, seqlens, data)


@dataclass
class _Entry:
    reuses_left: int
    receive_time: float
    sample: Sample


class UpstreamModel:
    """``AsyncIOSequenceBuffer(rpcs, max_size)``: ``rpcs`` are objects with ``name``, ``input_keys``, ``n_seqs``."""

    def __init__(self, rpcs: list[Any], max_size: int) -> None:
        self.rpcs = list(rpcs)
        self.max_size = max_size
        self.keys = sorted({k for r in rpcs for k in r.input_keys})
        self._key_col = {k: i for i, k in enumerate(self.keys)}
        self._rpc_keys = np.array([[k in r.input_keys for k in self.keys] for r in rpcs], dtype=bool)
        self._entries: list[_Entry | None] = [None] * max_size
        self._has_keys = np.zeros((max_size, len(self.keys)), dtype=bool)
        self._is_empty = np.ones(max_size, dtype=bool)
        self._is_idle = np.zeros(max_size, dtype=bool)
        self._is_being_put = np.zeros(max_size, dtype=bool)
        self._is_being_amended = np.zeros(max_size, dtype=bool)
        self._is_being_read = np.zeros(max_size, dtype=bool)
        self._n_amenders = np.zeros(max_size, dtype=np.int64)
        self._n_readers = np.zeros(max_size, dtype=np.int64)
        self._birth_time = np.zeros(max_size, dtype=np.int64)
        self._ready_for_rpcs = np.zeros((max_size, len(rpcs)), dtype=bool)
        self._completed_rpc = np.zeros((max_size, len(rpcs)), dtype=bool)
        self._size = 0
        self._cond = asyncio.Condition(asyncio.Lock())

    @property
    def size(self) -> int:
        return self._size

    def _update_readiness(self, idx: np.ndarray) -> None:
        for i in idx:
            entry = self._entries[i]
            assert entry is not None
            self._has_keys[i] = [k in entry.sample.keys for k in self.keys]
        has = self._has_keys[idx]
        self._ready_for_rpcs[idx] = (has[:, None, :] | ~self._rpc_keys[None]).all(-1)

    async def put_batch(self, samples: list[Sample], birth_times: np.ndarray | None = None) -> np.ndarray:
        n = len(samples)
        if n == 0:
            return np.empty(0, dtype=np.int64)
        async with self._cond:
            free = np.nonzero(self._is_empty)[0]
            if len(free) < n:
                raise BufferFull(f"buffer full: {self._size} of {self.max_size}")
            idx = free[:n]
            self._is_empty[idx] = False
            self._is_being_put[idx] = True
        if birth_times is None:
            birth_times = time.monotonic_ns() + np.arange(n, dtype=np.int64)
        for i, s in zip(idx, samples, strict=True):
            self._entries[i] = _Entry(len(self.rpcs), time.monotonic(), s)
        async with self._cond:
            self._birth_time[idx] = birth_times
            self._update_readiness(idx)
            self._is_being_put[idx] = False
            self._is_idle[idx] = True
            self._size += n
            self._cond.notify(len(self.rpcs))
        return idx

    async def amend_batch(self, indices: np.ndarray, samples: list[Sample]) -> None:
        indices = np.asarray(indices)
        async with self._cond:
            await self._cond.wait_for(lambda: bool((self._is_idle[indices] | self._is_being_amended[indices]).all()))
            self._is_idle[indices] = False
            self._is_being_amended[indices] = True
            self._n_amenders[indices] += 1
        for i, s in zip(indices, samples, strict=True):
            entry = self._entries[i]
            assert entry is not None
            entry.sample.update_(s)
        async with self._cond:
            self._update_readiness(indices)
            self._n_amenders[indices] -= 1
            done = indices[self._n_amenders[indices] == 0]
            self._is_being_amended[done] = False
            self._is_idle[done] = True
            self._cond.notify(len(self.rpcs))

    def _can_read(self, r: int) -> np.ndarray:
        return (self._is_idle | self._is_being_read) & self._ready_for_rpcs[:, r] & ~self._completed_rpc[:, r]

    async def get_batch_for_rpc(self, rpc: Any) -> tuple[np.ndarray, Sample]:
        r = [x.name for x in self.rpcs].index(rpc.name)
        async with self._cond:
            await self._cond.wait_for(lambda: int(self._can_read(r).sum()) >= rpc.n_seqs)
            ready = np.nonzero(self._can_read(r))[0]
            idx = ready[np.argsort(self._birth_time[ready], kind="stable")[: rpc.n_seqs]]
            self._is_idle[idx] = False
            self._is_being_read[idx] = True
            self._n_readers[idx] += 1
        entries = []
        popped = []
        for i in idx:
            entry = self._entries[i]
            assert entry is not None
            entry.reuses_left -= 1
            entries.append(entry.sample)
            if entry.reuses_left == 0:
                self._entries[i] = None
                popped.append(i)
        async with self._cond:
            self._n_readers[idx] -= 1
            self._completed_rpc[idx, r] = True
            done = idx[self._n_readers[idx] == 0]
            self._is_being_read[done] = False
            self._is_idle[done] = True
            if popped:
                p = np.array(popped)
                self._is_idle[p] = False
                self._is_empty[p] = True
                self._has_keys[p] = False
                self._ready_for_rpcs[p] = False
                self._completed_rpc[p] = False
                self._size -= len(p)
            self._cond.notify(len(self.rpcs))
        return idx, Sample.gather(entries, tuple(rpc.input_keys))


# ---------------------------------------------------------------------------------------------------------
# AReaL's own code, when the user has it: ``--areal-source DIR`` (a checkout holding realhf/system/buffer.py
# and realhf/api/core/data_api.py, e.g. AReaL before January 2026). Loaded by file path with small stubs for
# the rest of realhf (and transformers, which the buffer never calls); needs pydantic. Nothing of AReaL is
# kept in this repository.


def load_real(source: str) -> tuple[Any, Any, type[Exception]]:
    """``(AsyncIOSequenceBuffer, SequenceSample, BufferFull)`` from AReaL's own files under ``source``."""
    import importlib.util
    import logging as std_logging
    import os
    import sys
    import types

    def stub(name: str, **attrs: Any) -> types.ModuleType:
        module = sys.modules.get(name) or types.ModuleType(name)
        module.__dict__.update(attrs)
        module.__path__ = []  # a package, so submodules import
        sys.modules[name] = module
        return module

    class _Anything:
        def __getattr__(self, name: str) -> Any:
            return object

    anything = _Anything()
    stub("transformers", __getattr__=lambda name: object)
    for name in ("realhf", "realhf.api", "realhf.api.core", "realhf.base", "realhf.system"):
        stub(name)
    stub("realhf.api.cli_args", MicroBatchSpec=object)
    stub("realhf.api.core.config", __getattr__=lambda name: object)
    stub("realhf.api.core.dfg", MFCDef=object)
    stub("realhf.utils", load_hf_or_local_file=lambda path: path)
    stub("realhf.base.logging", getLogger=lambda name, *a, **k: std_logging.getLogger(f"areal.{name}"))
    for name in ("constants", "datapack", "seeding"):
        stub(f"realhf.base.{name}", __getattr__=lambda attr: getattr(anything, attr))
    sys.modules["realhf.api.core"].config = sys.modules["realhf.api.core.config"]  # type: ignore[attr-defined]
    sys.modules["realhf.api.core"].dfg = sys.modules["realhf.api.core.dfg"]  # type: ignore[attr-defined]
    for name in ("constants", "datapack", "logging", "seeding"):
        setattr(sys.modules["realhf.base"], name, sys.modules[f"realhf.base.{name}"])

    def load(name: str, rel: str) -> types.ModuleType:
        spec = importlib.util.spec_from_file_location(name, os.path.join(source, rel))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    data_api = load("realhf.api.core.data_api", "realhf/api/core/data_api.py")
    buffer = load("realhf.system.buffer", "realhf/system/buffer.py")
    std_logging.getLogger("areal").setLevel(std_logging.ERROR)  # its "buffer 95% full" warnings
    return buffer.AsyncIOSequenceBuffer, data_api.SequenceSample, buffer.BufferFull
