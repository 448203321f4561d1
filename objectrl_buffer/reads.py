"""Which rows each of the facade's reads returns: sampling, slices, epochs, a learning phase's iteration.

Each function takes the buffer (its engine, generator and settings) and the arguments as the facade
received them, checks them, picks slots with :mod:`objectrl_buffer.sampling` and reads them through the
engine. The facade (``replay_buffer.py``) keeps ObjectRL's signatures and documents them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

from objectrl_buffer.core.envs import whole_steps
from objectrl_buffer.core.keys import INDEX_KEY
from objectrl_buffer.core.schema import Key, as_keys
from objectrl_buffer.core.validate import integer, positive_int
from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.sampling.nstep import check_n_step
from objectrl_buffer.sampling.slices import StoredRows, pad_slices, require_keys, slice_positions
from objectrl_buffer.sampling.uniform import epochs, num_batches, recent_slots, uniform_slots

if TYPE_CHECKING:
    from objectrl_buffer.replay_buffer import ReplayBuffer

__all__ = ["window", "transitions", "fields", "slices", "everything", "epoch_iterator", "learning_phase"]


def window(rb: ReplayBuffer, recent: int | None) -> int | None:
    """``recent`` checked and rounded up to whole env steps (``None``: no window)."""
    return None if recent is None else whole_steps(positive_int(recent, "recent"), rb.num_envs)


def transitions(rb: ReplayBuffer, k: int, n_step: int | None, gamma: float, recent: int | None) -> TensorDict:
    """``sample_batch`` with n-step targets or a recency window (or after a metadata-only load)."""
    n, g = (None, 0.0) if n_step is None else check_n_step(n_step, gamma)
    limit = window(rb, recent)
    engine = rb.engine
    engine.require_rows()
    ring = engine.ring
    if limit is None and not ring.phantom:
        slots = uniform_slots(ring.size, k, rb.generator)
    else:  # the newest rows: a window, or those that hold data
        slots = recent_slots(ring, limit or ring.held, k, rb.generator)
    return engine.read_transitions(slots, n, g, rb.transition_keys)


def fields(rb: ReplayBuffer, indices: Any, wanted: Any) -> TensorDict:
    """``sample_by_index_fields``: the type of ``wanted`` first (wrong whatever the buffer holds)."""
    keys = as_keys(wanted, "fields")
    engine = rb.engine
    slots = engine.slots(indices)
    engine.require_rows()
    schema = engine.schema
    assert schema is not None
    return engine.read(slots, schema.stored_keys(keys, "fields"), with_index=False)


def slices(rb: ReplayBuffer, num_slices: int, slice_len: int, done_key: Key | None, pad: bool) -> TensorDict:
    """``sample_slices``: ``[num_slices, slice_len]`` rows of one env inside one episode each."""
    k = positive_int(num_slices, "num_slices")
    length = positive_int(slice_len, "slice_len")
    steps = rb.buffer_size // rb.num_envs
    if length > steps:
        per_env = "" if rb.num_envs == 1 else f" per env, num_envs={rb.num_envs}"
        raise InvalidArgumentError(f"slice_len {length} is larger than the buffer ({steps} rows{per_env})")
    if done_key is not None:
        if not isinstance(done_key, (str, tuple)):
            raise InvalidArgumentError(f"done_key must be a key (str or tuple of str), got {done_key!r}")
        (done_key,) = as_keys(done_key, "done_key")
    engine = rb.engine
    engine.require_rows()
    columns = engine.storage.columns
    end_keys = rb.transition_keys.episode_end if done_key is None else (done_key,)
    require_keys(columns, end_keys, "sample_slices")
    rows = StoredRows(columns, end_keys, engine.ring, rb.num_envs)
    positions, mask = slice_positions(rows, k, length, pad, rb.generator)
    batch = engine.read(rows.slots(positions.reshape(-1))).reshape(k, length)
    return pad_slices(batch, mask.to(engine.device), INDEX_KEY) if pad else batch


def everything(rb: ReplayBuffer) -> TensorDict:
    """``sample_all``: oldest to newest; ``[T, num_envs]`` with several envs."""
    engine = rb.engine
    engine.require_rows()
    rows = engine.read(engine.ring.chronological(engine.storing_device))
    return rows if rb.num_envs == 1 else rows.reshape(-1, rb.num_envs)


def epoch_iterator(
    rb: ReplayBuffer, batch_size: int, n_epochs: int, shuffle: bool | None, recent: int | None
) -> Iterator[TensorDict]:
    """``create_epoch_iterator``: epochs over the rows held now (or the newest ``recent``), read lazily."""
    bs = positive_int(batch_size, "batch_size")
    count = positive_int(n_epochs, "n_epochs")
    limit = window(rb, recent)
    engine = rb.engine
    engine.require_rows()
    order = rb.shuffle if shuffle is None else bool(shuffle)
    ring = engine.ring
    rows = None if limit is None and not ring.phantom else ring.chronological(engine.storing_device, limit)
    size = ring.size if rows is None else rows.numel()
    generation = engine.generation  # taken now: a generator body runs lazily

    def read(positions: torch.Tensor, span: tuple[int, int] | None) -> TensorDict:
        # positions are slots themselves, or index a window's slots (which may wrap)
        return engine.read(positions, span=span) if rows is None else engine.read(rows[positions])

    return epochs(read, size, bs, count, order, rb.generator, lambda: engine.generation == generation)


def learning_phase(
    rb: ReplayBuffer, n_epochs: int, max_iter: int, batch_size: int, shuffle: bool | None, recent: int | None
) -> tuple[int, Iterator[TensorDict] | None, int | None]:
    """``get_steps_and_iterator``: ``(gradient steps, epoch iterator or None, random sampling's window)``."""
    n_epochs, max_iter = integer(n_epochs, "n_epochs"), integer(max_iter, "max_iter")
    positive_int(batch_size, "batch_size")  # also for random sampling, whose batches get_next_batch draws
    limit = window(rb, recent)
    if n_epochs <= 0:
        return max_iter, None, limit
    iterator = epoch_iterator(rb, batch_size, n_epochs, shuffle, limit)
    held = rb.engine.ring.held
    return n_epochs * num_batches(held if limit is None else min(limit, held), batch_size), iterator, limit
