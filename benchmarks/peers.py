"""One adapter per replay buffer compared in ``bench.py``, each driving its library through its own API.

Every adapter takes the same data (dicts of torch tensors made by ``workloads.py``) and converts it to
the library's native input *before* timing starts (``convert``), so the timed calls are the library's
own ``add``/``add_batch``/``sample``. An adapter raises :class:`Unsupported` (with a note for the
table) where its library has no API for a workload; a missing package raises it on import.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]
Batch = dict[str, torch.Tensor]

UPSTREAM_VERSION = "0.2.1"
UPSTREAM_MODULE = "objectrl/replay_buffers/experience_memory.py"


class Unsupported(Exception):
    """The library has no API for this workload (or is not installed); the message goes in the table."""


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _np(value: Any) -> Any:
    return value.numpy() if isinstance(value, torch.Tensor) else value


def _tensordict(data: dict[str, Any], batched: bool) -> Any:
    from tensordict import TensorDict

    if batched:
        return TensorDict(data, batch_size=[next(iter(data.values())).shape[0]])
    return TensorDict(data)


class Peer:
    """A buffer under test. ``forms``: the input forms ``add``/``add_batch`` take.

    "map": a dict of torch tensors (Python numbers for 0-d keys in single adds), "np": the same with
    NumPy arrays (what a gymnasium loop hands over; SB3's and cpprb's native input), "td": a TensorDict.
    """

    name = ""
    forms: tuple[str, ...] = ("map",)

    def __init__(self, device: str = "cpu", storage_dir: str | None = None) -> None:
        self.device = torch.device(device)
        self.storage_dir = storage_dir

    def create(self, capacity: int, spec: Spec, batch_rows: int = 1) -> None:
        raise NotImplementedError

    def convert(self, data: dict[str, Any], form: str, batched: bool) -> Any:
        """Native input for ``data`` (one row of Python scalars/tensors, or a batch of tensors)."""
        return data

    def add(self, item: Any) -> None:
        raise NotImplementedError

    def add_batch(self, item: Any) -> None:
        raise NotImplementedError

    def fill(self, batch: Batch) -> None:
        """Set-up only (never timed): store ``batch`` by the fastest route the library offers."""
        self.add_batch(self.convert(batch, self.forms[0], batched=True))

    def sample(self, k: int) -> Any:
        raise NotImplementedError

    def next_batch(self, k: int) -> Any:
        """ObjectRL's ``get_next_batch(k)`` between gradient steps (random sampling)."""
        raise Unsupported("no get_next_batch")

    def epoch(self, batch_size: int, shuffle: bool) -> Iterable[Any]:
        raise Unsupported("no epoch API")

    def save(self, path: str) -> None:
        raise Unsupported("no data checkpoint")

    def load(self, path: str) -> None:
        raise Unsupported("no data checkpoint")

    def load_unverified(self, path: str) -> None:
        """A load that skips the library's integrity checks (only objectrl_buffer has that choice)."""
        raise Unsupported("no checksums to skip")


def save_columns(arrays: dict[str, np.ndarray], path: str) -> None:
    """Each column's bytes to its own file, fsync each, fsync the folder: a durable save, nothing more."""
    os.makedirs(path, exist_ok=True)
    for k, array in arrays.items():
        with open(os.path.join(path, k), "wb") as f:
            f.write(np.ascontiguousarray(array).data)
            f.flush()
            os.fsync(f.fileno())
    _fsync_dir(path)


def load_columns(spec: Spec, path: str) -> tuple[dict[str, torch.Tensor], int]:
    """Read each column file of :func:`save_columns` into a new tensor; ``(columns, rows)``."""
    size = os.path.getsize(os.path.join(path, next(iter(spec))))
    first_shape, first_dtype = next(iter(spec.values()))
    rows = size // (int(np.prod(first_shape)) * first_dtype.itemsize)
    cols = {}
    for k, (shape, dtype) in spec.items():
        t = torch.empty((rows, *shape), dtype=dtype)
        with open(os.path.join(path, k), "rb") as f:
            f.readinto(t.numpy().data.cast("B"))
        cols[k] = t
    return cols, rows


def _extend(ring: Any, item: dict[str, Any]) -> None:
    """Slice-assign a batch into ``ring.cols`` at ``ring.ptr`` (two slices at the wrap); advance the ring."""
    n = next(iter(item.values())).shape[0]
    p, cap = ring.ptr, ring.capacity
    head = min(n, cap - p)
    for k, v in item.items():
        col = ring.cols[k]
        col[p : p + head] = v[:head]
        if head < n:
            col[: n - head] = v[head:]
    ring.ptr = (p + n) % cap
    ring.size = min(ring.size + n, cap)


class Floor(Peer):
    """The floor: a NumPy ring, ``column[slot] = value`` per key, ``take`` to sample, raw files + fsync to save.

    What a user could write by hand with no checks at all; every ratio in the table is to this. It takes
    what a gymnasium loop holds (NumPy arrays and Python numbers) and, for the "td" form, reads ObjectRL's
    TensorDict the cheapest way this tensordict version allows (its value dict, ``numpy()``/``item()`` per
    value), so the ratio of that row to the NumPy row is the cost of the TensorDict alone. Samples are
    delivered as tensors (``torch.from_numpy``), on ``device``.
    """

    name = "floor"
    forms = ("np", "td")

    def create(self, capacity: int, spec: Spec, batch_rows: int = 1) -> None:
        self.capacity, self.spec = capacity, spec
        self.cols = {k: torch.empty((capacity, *shape), dtype=dtype).numpy() for k, (shape, dtype) in spec.items()}
        self.ptr = self.size = 0
        self.rng = np.random.default_rng(0)

    def convert(self, data: dict[str, Any], form: str, batched: bool) -> Any:
        if form == "td":
            return _tensordict(data, batched)
        return {k: _np(v) for k, v in data.items()}

    def add(self, item: Any) -> None:
        cols, p = self.cols, self.ptr
        if type(item) is dict:
            for k, v in item.items():
                cols[k][p] = v
        else:  # ObjectRL's TensorDict: its values (the dict it keeps), each read as NumPy or a number
            from objectrl_buffer.storage.torchrl_compat import plain_items

            for k, v in plain_items(item, 0).items():  # type: ignore[union-attr]
                cols[k][p] = v.numpy() if v.dim() else v.item()
        self.ptr = p + 1 if p + 1 < self.capacity else 0
        if self.size < self.capacity:
            self.size += 1

    def add_batch(self, item: Any) -> None:
        if type(item) is not dict:
            item = {k: v.numpy() for k, v in item.items()}
        _extend(self, item)

    def _deliver(self, arrays: dict[str, np.ndarray]) -> Batch:
        out = {k: torch.from_numpy(a) for k, a in arrays.items()}
        if self.device.type != "cpu":
            out = {k: v.to(self.device) for k, v in out.items()}
        return out

    def sample(self, k: int) -> Batch:
        idx = self.rng.integers(0, self.size, k)
        return self._deliver({key: col.take(idx, axis=0) for key, col in self.cols.items()})

    def next_batch(self, k: int) -> Batch:
        return self.sample(k)

    def epoch(self, batch_size: int, shuffle: bool) -> Iterator[Batch]:
        cols = self.cols
        if not shuffle:
            for start in range(0, self.size, batch_size):
                yield self._deliver({k: c[start : start + batch_size].copy() for k, c in cols.items()})
            return
        order = self.rng.permutation(self.size)
        for start in range(0, self.size, batch_size):
            idx = order[start : start + batch_size]
            yield self._deliver({k: c.take(idx, axis=0) for k, c in cols.items()})

    def save(self, path: str) -> None:
        save_columns({k: c[: self.size] for k, c in self.cols.items()}, path)

    def load(self, path: str) -> None:
        cols, self.size = load_columns(self.spec, path)
        self.cols = {k: c.numpy() for k, c in cols.items()}


class Limit(Peer):
    """Preallocated tensors with a ring pointer: slice assignment to add, ``index_select`` to sample."""

    name = "limit"

    def create(self, capacity: int, spec: Spec, batch_rows: int = 1) -> None:
        self.capacity, self.spec = capacity, spec
        self.cols = {k: torch.empty((capacity, *shape), dtype=dtype) for k, (shape, dtype) in spec.items()}
        self.ptr = self.size = 0
        self.gen = torch.Generator().manual_seed(0)

    def add(self, item: dict[str, Any]) -> None:
        cols, p = self.cols, self.ptr
        for k, v in item.items():
            cols[k][p] = v
        self.ptr = p + 1 if p + 1 < self.capacity else 0
        if self.size < self.capacity:
            self.size += 1

    def add_batch(self, item: Batch) -> None:
        _extend(self, item)

    def _gather(self, idx: torch.Tensor) -> Batch:
        out = {k: c.index_select(0, idx) for k, c in self.cols.items()}
        if self.device.type != "cpu":
            out = {k: v.to(self.device) for k, v in out.items()}
        return out

    def sample(self, k: int) -> Batch:
        return self._gather(torch.randint(0, self.size, (k,), generator=self.gen))

    def epoch(self, batch_size: int, shuffle: bool) -> Iterator[Batch]:
        order = torch.randperm(self.size, generator=self.gen) if shuffle else torch.arange(self.size)
        for start in range(0, self.size, batch_size):
            yield self._gather(order[start : start + batch_size])

    def next_batch(self, k: int) -> Batch:
        return self.sample(k)

    def save(self, path: str) -> None:
        """Raw baseline: each column's bytes to its own file, fsync each, fsync the folder."""
        save_columns({k: c[: self.size].contiguous().numpy() for k, c in self.cols.items()}, path)

    def load(self, path: str) -> None:
        """Raw baseline: read each column file into a new preallocated tensor."""
        self.cols, self.size = load_columns(self.spec, path)


class ObjectRLAPI(Peer):
    """A peer with ObjectRL's method names: ``add``, ``add_batch``, ``sample_batch`` on ``self.rb``."""

    rb: Any

    def add(self, item: Any) -> None:
        self.rb.add(item)

    def add_batch(self, item: Any) -> None:
        self.rb.add_batch(item)

    def sample(self, k: int) -> Any:
        return self.rb.sample_batch(k)

    def next_batch(self, k: int) -> Any:
        """ObjectRL's per-gradient-step read: ``get_next_batch`` after a random-sampling learning phase."""
        if getattr(self, "_phase_of", None) is not self.rb:  # once per buffer: the learning phase
            self.rb.get_steps_and_iterator(0, 10**9, k)
            self._phase_of = self.rb
        return self.rb.get_next_batch(k)


class Ours(ObjectRLAPI):
    """objectrl_buffer.ReplayBuffer (mapping and TensorDict input)."""

    name = "objectrl_buffer"
    forms = ("map", "np", "td")

    def create(self, capacity: int, spec: Spec, batch_rows: int = 1) -> None:
        from objectrl_buffer import ReplayBuffer

        self.cls = ReplayBuffer
        self.capacity = capacity
        self.rb = ReplayBuffer(self.device, "cpu", capacity, seed=0, storage_dir=self.storage_dir)

    def convert(self, data: dict[str, Any], form: str, batched: bool) -> Any:
        if form == "td" and batched:
            return _tensordict(data, batched)
        if form == "np":
            return {k: _np(v) for k, v in data.items()}
        return data

    def epoch(self, batch_size: int, shuffle: bool) -> Iterable[Any]:
        return self.rb.create_epoch_iterator(batch_size, 1, shuffle=shuffle)

    def save(self, path: str) -> None:
        self.rb.save(path, data=True)

    def load(self, path: str, verify: bool = True) -> None:
        rb = self.cls(self.device, "cpu", self.capacity, storage_dir=self.storage_dir)
        rb.load(path, verify=verify)
        self.rb = rb

    def load_unverified(self, path: str) -> None:
        self.load(path, verify=False)


def upstream_module_path(cache_dir: str, wheel: str | None, download: bool = True) -> str:
    """Path of upstream ObjectRL's ``experience_memory.py`` unpacked from its published wheel.

    The wheel is ``wheel`` if given, else looked up in (or downloaded with pip into) ``cache_dir``.
    Only the one module file is extracted; nothing of ObjectRL is kept in this repository.
    """
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"objectrl-{UPSTREAM_VERSION}" / UPSTREAM_MODULE
    if target.exists():
        return str(target)
    found = [Path(wheel)] if wheel else sorted(cache.glob(f"objectrl-{UPSTREAM_VERSION}-*.whl"))
    if not found and download:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--python-version", "3.12"]
        cmd += ["--only-binary=:all:", f"objectrl=={UPSTREAM_VERSION}", "-d", str(cache), "-q"]
        subprocess.run(cmd, check=False, capture_output=True, timeout=300)
        found = sorted(cache.glob(f"objectrl-{UPSTREAM_VERSION}-*.whl"))
    if not found or not found[0].exists():
        raise Unsupported(f"ObjectRL {UPSTREAM_VERSION} wheel not available (pip download failed or offline)")
    with zipfile.ZipFile(found[0]) as zf:
        zf.extract(UPSTREAM_MODULE, target.parents[2])
    return str(target)


class Upstream(ObjectRLAPI):
    """ObjectRL 0.2.1's ReplayBuffer, imported by file path from its wheel (TensorDict input only)."""

    name = "objectrl"
    forms = ("td",)
    module_path = ""

    def create(self, capacity: int, spec: Spec, batch_rows: int = 1) -> None:
        if not self.module_path:
            raise Unsupported("upstream module path not given")
        loader = importlib.util.spec_from_file_location("objectrl_upstream_experience_memory", self.module_path)
        assert loader is not None and loader.loader is not None
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        self.rb = module.ReplayBuffer(torch.device(self.device), torch.device("cpu"), capacity)

    def convert(self, data: dict[str, Any], form: str, batched: bool) -> Any:
        return _tensordict(data, batched)

    def epoch(self, batch_size: int, shuffle: bool) -> Iterable[Any]:
        if shuffle:
            raise Unsupported("no shuffled epochs")
        return self.rb.create_epoch_iterator(batch_size, 1)

    def save(self, path: str) -> None:
        raise Unsupported("save() writes metadata only")


class TorchRL(Peer):
    """Raw torchrl ``TensorDictReplayBuffer`` over ``LazyMemmapStorage`` (default scratch dir)."""

    name = "torchrl"
    forms = ("td",)

    def create(self, capacity: int, spec: Spec, batch_rows: int = 1) -> None:
        from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

        self.capacity = capacity
        self.storage = LazyMemmapStorage(capacity)
        self.rb = TensorDictReplayBuffer(storage=self.storage)

    def convert(self, data: dict[str, Any], form: str, batched: bool) -> Any:
        return _tensordict(data, batched)

    def add(self, item: Any) -> None:
        self.rb.add(item)

    def add_batch(self, item: Any) -> None:
        self.rb.extend(item)

    def sample(self, k: int) -> Any:
        out = self.rb.sample(k)
        return out if self.device.type == "cpu" else out.to(self.device)

    def epoch(self, batch_size: int, shuffle: bool) -> Iterable[Any]:
        from torchrl.data import SamplerWithoutReplacement, TensorDictReplayBuffer

        sampler = SamplerWithoutReplacement(drop_last=False, shuffle=shuffle)
        return TensorDictReplayBuffer(storage=self.storage, sampler=sampler, batch_size=batch_size)

    def save(self, path: str) -> None:
        self.rb.dumps(path)  # torchrl's own checkpoint (memmap copy; no fsync)

    def load(self, path: str) -> None:
        from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

        rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(self.capacity))
        rb.loads(path)
        self.rb = rb


class SB3(Peer):
    """Stable-Baselines3 ``ReplayBuffer`` (NumPy input; ``n_envs=batch_rows`` for batched adds)."""

    name = "sb3"
    forms = ("np", "map")  # SB3 converts tensors itself (np.array), so it can take the tensor mapping too

    def create(self, capacity: int, spec: Spec, batch_rows: int = 1) -> None:
        try:
            from gymnasium import spaces
            from stable_baselines3.common.buffers import ReplayBuffer
        except ImportError as exc:
            raise Unsupported(f"stable-baselines3 not installed ({exc.name})") from None
        shape, dtype = spec["state"]
        if dtype == torch.uint8:
            obs = spaces.Box(0, 255, shape, np.uint8)
            act: Any = spaces.Discrete(6)
        else:
            obs = spaces.Box(-np.inf, np.inf, shape, np.float32)
            act = spaces.Box(-1.0, 1.0, spec["action"][0], np.float32)
        self.rb = ReplayBuffer(capacity, obs, act, device=self.device, n_envs=batch_rows)
        self.has_truncated = "truncated" in spec

    def convert(self, data: dict[str, Any], form: str, batched: bool) -> Any:
        """SB3's ``add`` arguments; "map" keeps the tensors (SB3 copies them with ``np.array``)."""
        d = {k: np.asarray(_np(v)) if form == "np" or not isinstance(v, torch.Tensor) else v for k, v in data.items()}
        if not batched:
            d = {k: v[None] if isinstance(v, (np.ndarray, torch.Tensor)) else np.array([v]) for k, v in d.items()}
        n = d["state"].shape[0]
        trunc = np.asarray(d["truncated"]).astype(bool) if self.has_truncated else np.zeros(n, bool)
        infos = [{"TimeLimit.truncated": bool(t)} for t in trunc]
        return d["state"], d["next_state"], d["action"], d["reward"], d["terminated"], infos

    def add(self, item: Any) -> None:
        self.rb.add(*item)

    add_batch = add

    def fill(self, batch: Batch) -> None:
        rb, n = self.rb, batch["state"].shape[0]
        for start in range(0, n, rb.buffer_size):
            chunk = {k: v[start : start + rb.buffer_size].numpy() for k, v in batch.items()}
            m = chunk["state"].shape[0]
            pos = rb.pos
            head = min(m, rb.buffer_size - pos)
            for dst, src in ((rb.observations, "state"), (rb.next_observations, "next_state")):
                dst[pos : pos + head, 0] = chunk[src][:head]
                dst[: m - head, 0] = chunk[src][head:]
            act = chunk["action"].reshape(m, -1)
            rb.actions[pos : pos + head, 0] = act[:head]
            rb.actions[: m - head, 0] = act[head:]
            for dst, src in ((rb.rewards, "reward"), (rb.dones, "terminated")):
                dst[pos : pos + head, 0] = chunk[src][:head]
                dst[: m - head, 0] = chunk[src][head:]
            rb.full = rb.full or pos + m >= rb.buffer_size
            rb.pos = (pos + m) % rb.buffer_size

    def sample(self, k: int) -> Any:
        return self.rb.sample(k)

    def epoch(self, batch_size: int, shuffle: bool) -> Iterator[Any]:
        size = self.rb.size()
        order = np.random.permutation(size) if shuffle else np.arange(size)
        for start in range(0, size, batch_size):
            yield self.rb._get_samples(order[start : start + batch_size])  # SB3's indexed read (no public API)

    def save(self, path: str) -> None:
        from stable_baselines3.common.save_util import save_to_pkl

        save_to_pkl(path, self.rb, verbose=0)

    def load(self, path: str) -> None:
        from stable_baselines3.common.save_util import load_from_pkl

        self.rb = load_from_pkl(path, verbose=0)


class CPPRB(Peer):
    """cpprb ``ReplayBuffer`` (NumPy input)."""

    name = "cpprb"
    forms = ("np", "map")

    def create(self, capacity: int, spec: Spec, batch_rows: int = 1) -> None:
        try:
            import cpprb
        except ImportError:
            raise Unsupported("cpprb not installed") from None
        self.env_dict = {
            k: {"shape": shape or 1, "dtype": torch.empty((), dtype=dtype).numpy().dtype}
            for k, (shape, dtype) in spec.items()
        }
        self.capacity = capacity
        self.rb = cpprb.ReplayBuffer(capacity, self.env_dict)

    def convert(self, data: dict[str, Any], form: str, batched: bool) -> Any:
        return {k: _np(v) for k, v in data.items()} if form == "np" else data

    def add(self, item: Any) -> None:
        self.rb.add(**item)

    add_batch = add

    def sample(self, k: int) -> Any:
        out = {name: torch.from_numpy(v) for name, v in self.rb.sample(k).items()}
        return out if self.device.type == "cpu" else {n: v.to(self.device) for n, v in out.items()}

    def epoch(self, batch_size: int, shuffle: bool) -> Iterable[Any]:
        raise Unsupported("no public index/epoch API")

    def save(self, path: str) -> None:
        self.rb.save_transitions(path, safe=True)

    def load(self, path: str) -> None:
        import cpprb

        rb = cpprb.ReplayBuffer(self.capacity, self.env_dict)
        rb.load_transitions(path + ".npz")
        self.rb = rb


PEERS: dict[str, type[Peer]] = {p.name: p for p in (Floor, Limit, Ours, Upstream, TorchRL, SB3, CPPRB)}
