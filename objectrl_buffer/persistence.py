"""How a buffer is persisted: a full or metadata-only checkpoint, a state dict, and adopting either.

The facade's ``save``/``load``/``from_checkpoint``/``state_dict``/``load_state_dict`` call these; the
formats themselves live in :mod:`objectrl_buffer.checkpoint`. What a buffer saves beside its rows comes
from its ``checkpoint_extras`` (the extra-state contract of :mod:`objectrl_buffer.checkpoint.extras`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from objectrl_buffer.checkpoint import compact
from objectrl_buffer.checkpoint.data import BufferState
from objectrl_buffer.checkpoint.extras import collect, in_metadata, own, saved_kwargs
from objectrl_buffer.checkpoint.generations import Restored, load_checkpoint, restore_devices, save_checkpoint
from objectrl_buffer.checkpoint.state_dict import make_state_dict, restore_state_dict
from objectrl_buffer.core.ring import Ring
from objectrl_buffer.errors import CheckpointError
from objectrl_buffer.forks import track_for_fork
from objectrl_buffer.storage.compact import CompactStorage

if TYPE_CHECKING:
    from objectrl_buffer.replay_buffer import ReplayBuffer

__all__ = [
    "buffer_state",
    "save",
    "load",
    "from_checkpoint",
    "state_dict",
    "load_state_dict",
    "copy_state",
    "from_copy_state",
]

RB = TypeVar("RB", bound="ReplayBuffer")


def buffer_state(rb: ReplayBuffer, loading: bool = False) -> BufferState:
    """References to everything a checkpoint of ``rb`` holds (nothing copied), its extras included.

    ``loading``: the state a load checks what it reads against. A compact buffer then says no schema
    (its saved columns are not its keys): :func:`adopt` checks its capacity and keys once the rows read
    are in its form."""
    engine = rb.engine
    ring = engine.ring
    arrays, values = collect(rb.checkpoint_extras)
    schema, columns = engine.schema, engine.storage.columns
    storage: Any = engine.storage
    if isinstance(storage, CompactStorage) and storage.table is not None and storage.initialized:
        # compact: the other keys as columns, the frames and links as extra arrays (checkpoint/compact.py)
        schema, columns = (None if loading else storage.table.schema), storage.table.columns
        compact_arrays, compact_values = compact.saved_state(storage, ring.size)
        arrays.update(compact_arrays)
        values.update(compact_values)
    return BufferState(
        buffer_size=ring.capacity,
        data_size=ring.size,
        pointer=ring.pointer,
        schema=schema,
        columns=columns,
        generator=rb.generator,
        shuffle=rb.shuffle,
        device=engine.device,
        storing_device=engine.storing_device,
        storage_dir=engine.storage_dir,
        extra_arrays=arrays,
        extra_values=values,
        phantom=ring.phantom,
        num_envs=engine.num_envs,
        metadata_values=in_metadata(rb.checkpoint_extras, values),
    )


def _checker(rb: ReplayBuffer) -> Any:
    def check(restored: Restored) -> None:  # each extra may refuse its saved state before anything changes
        for extra in rb.checkpoint_extras:
            arrays, values = own(extra.name, restored.extra_arrays), own(extra.name, restored.extra_values)
            extra.check(arrays, values, restored.data_size, restored.source)

    return check


def adopt(rb: ReplayBuffer, restored: Restored) -> None:
    """Make ``rb`` hold a checked checkpoint: its rows (or, metadata only, ObjectRL's counters over the rows
    ``rb`` holds: the others become phantom rows, with a ``RuntimeWarning``), generator, ``shuffle`` and
    the state of each of its extras."""
    engine = rb.engine
    table = restored.storage
    if table is not None:  # into this buffer's form (compact or plain) before anything changes
        make = lambda spec: CompactStorage(  # noqa: E731
            restored.buffer_size,
            engine.storing_device,
            engine.storage_dir,
            num_envs=restored.num_envs,
            spec=spec,
            end_keys=engine.end_keys,
        )
        try:
            restored = compact.convert(restored, engine.compact, make, engine.storage_dir)
        except BaseException:
            table.close()
            raise
        assert restored.storage is not None
        if engine.compact is not None and engine.storage.initialized:  # what load_checkpoint checks for plain ones
            got = (restored.buffer_size, restored.storage.schema, restored.num_envs)
            if got != (engine.ring.capacity, engine.schema, engine.num_envs):
                restored.storage.close()
                ours = f"{engine.schema!r} (buffer_size {engine.ring.capacity}, num_envs {engine.num_envs})"
                raise CheckpointError(
                    f"'{restored.source}' holds {got[1]!r} (buffer_size {got[0]}, num_envs {got[2]}) but this "
                    f"buffer holds data of {ours}: reset() it first, or use ReplayBuffer.from_checkpoint()"
                )
    if restored.storage is None:
        if restored.buffer_size != engine.ring.capacity:
            engine.clear(restored.buffer_size)
        held = engine.ring.held_under(restored.pointer, restored.data_size) if engine.storage.initialized else 0
        phantom = restored.data_size - held
        if phantom:
            warnings.warn(
                f"'{restored.source}' is a metadata-only checkpoint: {phantom} rows are counted "
                f"(len() == {restored.data_size}) but hold no data, and will not be sampled; rows "
                "written from now on replace them as the ring wraps",
                RuntimeWarning,
                stacklevel=4,
            )
    else:
        phantom = restored.phantom
    engine.adopt(restored.storage, Ring(restored.buffer_size, restored.data_size, restored.pointer, phantom))
    engine.num_envs = restored.num_envs
    for extra in rb.checkpoint_extras:
        extra.restore(own(extra.name, restored.extra_arrays), own(extra.name, restored.extra_values))
    rb.epoch_iterator = None
    if restored.generator_state is not None:
        rb.generator.set_state(restored.generator_state)
    elif restored.generator_seed is not None:
        rb.generator.manual_seed(restored.generator_seed)
    if restored.shuffle is not None:
        rb.shuffle = restored.shuffle


def save(rb: ReplayBuffer, path: str | os.PathLike[str], data: bool, progress: bool | None) -> None:
    """``rb.save``: see :meth:`ReplayBuffer.save <objectrl_buffer.ReplayBuffer.save>`."""
    save_checkpoint(path, buffer_state(rb), data=data, progress=progress)


def load(rb: ReplayBuffer, path: str | os.PathLike[str], verify: bool, progress: bool | None) -> None:
    """``rb.load``: read, check (extras included), then adopt; ``rb`` is unchanged on any error."""
    adopt(rb, load_checkpoint(buffer_state(rb, True), path, _checker(rb), verify, progress))


def from_checkpoint(
    cls: type[RB],
    path: str | os.PathLike[str],
    device: torch.device | str | None,
    storing_device: torch.device | str | None,
    verify: bool,
    progress: bool | None,
    kwargs: dict[str, Any],
) -> RB:
    """``cls.from_checkpoint``: a new buffer built with the saved capacity and settings, then loaded."""
    ckpt, device, storing_device = restore_devices(path, device, storing_device)
    settings = saved_kwargs(ckpt, kwargs, cls.extra_state_types)
    buffer = cls(device, storing_device, ckpt.meta["buffer_size"], **settings)
    try:
        buffer.load(path, verify=verify, progress=progress)
    except BaseException:
        buffer.close()
        raise
    if "shuffle" in kwargs:
        buffer.shuffle = kwargs["shuffle"]
    return buffer


def state_dict(rb: ReplayBuffer) -> dict[str, Any]:
    """``rb.state_dict()``: see :mod:`objectrl_buffer.checkpoint.state_dict` for the layout."""
    return make_state_dict(buffer_state(rb))


def load_state_dict(rb: ReplayBuffer, sd: Mapping[str, Any]) -> None:
    """``rb.load_state_dict(sd)``: checked as a load is, then adopted."""
    adopt(rb, restore_state_dict(buffer_state(rb, True), sd, _checker(rb)))


def copy_state(rb: ReplayBuffer) -> dict[str, Any]:
    """What ``pickle``/``copy.deepcopy``/``torch.save`` keep of ``rb``: its settings, its engine (which
    copies its rows, see :meth:`Engine.__getstate__ <objectrl_buffer.engine.Engine.__getstate__>`) and
    the generator state; not the epoch iterator."""
    state = {k: v for k, v in rb.__dict__.items() if k not in _NOT_COPIED}
    state["generator"] = (rb.generator.device, rb.generator.get_state())
    return state


def from_copy_state(rb: ReplayBuffer, state: dict[str, Any]) -> None:
    """Rebuild ``rb`` from :func:`copy_state`: a full, independent buffer."""
    device, generator_state = state.pop("generator")
    # Tensor attributes are cloned: multiprocessing's pickler would hand them over in shared memory.
    rb.__dict__.update({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()})
    rb.epoch_iterator = None
    rb.generator = torch.Generator(device=device)
    rb.generator.set_state(generator_state)
    if state.get("rate_limiter") is not None:
        rb.rate_limiter.attach(rb)
    track_for_fork(rb)


#: Bound methods (the per-step ``add``, a rate limiter's gates, a fork guard's refusals), the epoch iterator,
#: a shared handle, the fork guard's mark: a copy is an ordinary buffer of its own.
_NOT_COPIED = (
    *("add", "add_batch", "sample_batch", "epoch_iterator", "generator", "shared"),
    *("forked_from", "reset", "load", "load_state_dict", "close"),
)
