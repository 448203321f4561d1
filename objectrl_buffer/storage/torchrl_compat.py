"""The one module that touches private attributes of torchrl and tensordict.

We reach past their public APIs in a few measured places (each function says why). Keeping every such
access here means an upgrade of torchrl or tensordict that renames one breaks one file, and
:func:`missing_internals` (run by ``tests/storage/test_torchrl_compat.py``) names the attribute that
went away instead of letting a write path fail somewhere deep inside a training run.

Pinned versions this was written against: torchrl 0.14.x, tensordict 0.14.x.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = [
    "jagged_view",
    "new_tensordict",
    "plain_items",
    "stored_tensordict",
    "allocate",
    "drop_stored",
    "sync_view",
    "sampler_total",
    "set_sampler_generator",
    "missing_internals",
]


def new_tensordict(
    source: dict[str, Any], batch_size: torch.Size, device: torch.device | None, nested: bool = True
) -> TensorDict:
    """A TensorDict over freshly made tensors (all of ``batch_size`` and on ``device``), unchecked.

    ``TensorDict._new_unsafe`` skips the per-key shape/device validation of the public constructor,
    ~20 us per 256-row sample: the tensors were just gathered with the right shapes and device. With
    ``nested=False`` (no dict among the values) the device is set afterwards: ``_new_unsafe``'s device
    path re-wraps it and probes for MPS on every call (~2 us of a ~45 us ``sample(256)``).
    """
    if nested:
        return TensorDict._new_unsafe(source, batch_size=batch_size, device=device)
    td = TensorDict._new_unsafe(source, batch_size=batch_size, nested=False)
    td._device = device
    return td


def _nested_tensor_class() -> Any:
    try:
        from torch.nested._internal import nested_tensor as internal

        internal._store_val_in_tensor(0)
        return internal.NestedTensor, internal._store_val_in_tensor
    except (ImportError, AttributeError, TypeError):
        return None


_NJT = _nested_tensor_class()


def jagged_view(values: torch.Tensor, offsets: torch.Tensor, min_seqlen: int, max_seqlen: int) -> torch.Tensor | None:
    """``torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=, max_seqlen=)`` built directly by
    torch's jagged tensor class (~15 us instead of ~150 us: the public call goes through a view op's
    dispatch), or ``None`` where this torch lacks those internals (then use the public call)."""
    if _NJT is None:
        return None
    cls, store = _NJT
    try:
        return cls(values, offsets, _metadata_cache={"min_seqlen": store(min_seqlen), "max_seqlen": store(max_seqlen)})
    except (TypeError, RuntimeError):  # an internal signature that changed
        return None


def plain_items(data: Any, batch_dims: int) -> dict[str, Any] | None:
    """The key -> value dict inside a plain ``TensorDict`` with ``batch_dims`` batch dims, else ``None``.

    ``td.items()`` costs ~0.5 us per key more than reading the dict the TensorDict keeps: on the
    per-step ``add`` path of a 7-key transition that is most of the call.
    """
    if type(data) is TensorDict and len(data._batch_size) == batch_dims:
        return data._tensordict
    return None


def stored_tensordict(storage: Any) -> TensorDictBase | None:
    """The TensorDict a torchrl ``TensorStorage`` allocated (``None`` before its first write).

    torchrl exposes rows through ``storage.get(index)`` (a TensorDict indexing per call); we keep
    plain views of its columns instead, so we need the allocated TensorDict itself once.
    """
    stored = storage._storage
    return stored if isinstance(stored, TensorDictBase) else None


def allocate(storage: Any, example: Any) -> None:
    """Let a torchrl ``TensorStorage`` allocate its rows shaped like ``example``, writing none of them.

    ``storage.set(0, example)`` would allocate and write slot 0; a RAM-backed file must not be written
    before its pages are reserved (``table.py``: a full ``/dev/shm`` kills a writer with SIGBUS).
    """
    storage._init(example)


def drop_stored(storage: Any) -> None:
    """Make a torchrl ``TensorStorage`` forget its rows (back to lazy, unallocated), freeing them now.

    A locked TensorDict caches key views that point back at it: a reference cycle that keeps every
    memmap mapped until the next cyclic GC. Erasing the caches lets refcounting free them at once;
    then the storage is reset to the state torchrl gives a fresh one.
    """
    stored = storage._storage
    if isinstance(stored, TensorDictBase):
        for td in [stored, *(v for v in stored.values(include_nested=True) if isinstance(v, TensorDictBase))]:
            td._erase_cache()
    del stored
    storage._storage = None
    storage.initialized = False
    storage._storage_keys = None
    storage._len = 0


def sync_view(storage: Any, writer: Any, length: int, cursor: int) -> None:
    """Tell torchrl's storage and writer how many rows there are and where the next one goes.

    Our writes go straight into the columns (see ``table.py``), so torchrl's own length and cursor
    are only brought in line when a user asks for the torchrl view (``ReplayBuffer.memory``).
    """
    storage._len = length
    writer._cursor = cursor


def sampler_total(sampler: Any, capacity: int) -> float:
    """Total weight in a torchrl ``PrioritizedSampler``'s sum tree (it has no public accessor)."""
    tree = sampler._sum_tree
    if sampler.device.type == "cuda":  # the CUDA trees take tensor bounds
        bounds = torch.tensor([0, capacity], device=sampler.device)
        return float(tree.query(bounds[0], bounds[1]))
    return float(tree.query(0, capacity))


def set_sampler_generator(sampler: Any, generator: torch.Generator) -> None:
    """Make a torchrl ``PrioritizedSampler`` draw from ``generator`` (it takes none in its API), so a
    seeded buffer's prioritized samples are reproducible and the global RNG is never touched."""
    sampler._rng = generator


def missing_internals() -> list[str]:
    """Names of the private attributes above that this torchrl/tensordict no longer has (``[]``: all there)."""
    from torchrl.data import LazyTensorStorage, RoundRobinWriter

    missing = []
    td = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    for name in ("_new_unsafe",):
        if not hasattr(TensorDict, name):
            missing.append(f"tensordict.TensorDict.{name}")
    for name in ("_batch_size", "_tensordict", "_device"):
        if not hasattr(td, name):
            missing.append(f"tensordict.TensorDict().{name}")
    if not hasattr(TensorDictBase, "_erase_cache"):
        missing.append("tensordict.TensorDictBase._erase_cache")
    storage = LazyTensorStorage(2)
    storage.set(0, TensorDict({"x": torch.zeros(())}, batch_size=[]))
    for name in ("_storage", "_storage_keys", "_len", "initialized", "_init"):
        if not hasattr(storage, name):
            missing.append(f"torchrl LazyTensorStorage().{name}")
    writer = RoundRobinWriter()
    if not hasattr(writer, "_cursor"):
        missing.append("torchrl RoundRobinWriter()._cursor")
    try:
        from torchrl.data import PrioritizedSampler

        sampler = PrioritizedSampler(2, 0.6, 0.4)
        for name in ("_sum_tree", "_rng"):
            if not hasattr(sampler, name):
                missing.append(f"torchrl PrioritizedSampler().{name}")
    except (ImportError, RuntimeError, OSError):  # its compiled extension does not load: not used here
        pass
    return missing
