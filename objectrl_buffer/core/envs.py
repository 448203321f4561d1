"""Vector environments: how a step of ``num_envs`` envs maps onto the flat ring of slots.

The ring stays one flat row of ``buffer_size`` slots; an env step takes ``num_envs`` consecutive slots,
env ``e`` of the step at ``t`` (counting steps since the ring was empty) at slot
``(t * num_envs + e) % buffer_size``. ``buffer_size`` is a multiple of ``num_envs``, so ``pointer``
and ``data_size`` (kept in rows, as ObjectRL's) are always multiples of it, and the next row of the
same env is ``slot + num_envs``. Everything that counts rows (uniform sampling, slots, epochs,
checkpoints) is unchanged; what walks through time (n-step, slices, ``sample_all``) steps by
``num_envs``. With ``num_envs == 1`` the layout is ObjectRL's.

These functions only validate and reshape writes; they never touch storage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from objectrl_buffer.core.schema import format_key, leaves, require_mapping
from objectrl_buffer.errors import InvalidArgumentError, SchemaError

__all__ = ["check_env_step", "flatten_steps", "whole_steps", "vector_step_size", "SCALAR_STEP_KEYS"]

#: Leaf names that hold one number per env step in every RL row; a first write where they too have a
#: leading size ``E > 1`` is a vector step (:func:`vector_step_size`).
SCALAR_STEP_KEYS = frozenset({"reward", "rewards", "terminated", "truncated", "done", "dones"})


def _shape(value: Any) -> tuple[int, ...]:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return tuple(value.shape)
    if isinstance(value, (bool, int, float)):
        return ()
    try:
        return tuple(np.shape(value))
    except ValueError:  # a ragged list: the schema check names it
        return ()


def check_env_step(step: TensorDictBase | Mapping[str, Any], num_envs: int) -> None:
    """Raise unless ``step`` is one row per env: a TensorDict of batch size ``[num_envs]``, or a mapping
    whose every value has a leading dimension ``num_envs``.

    Raises:
        SchemaError: naming ``num_envs`` and the key (or batch size) that does not have it.
        InvalidArgumentError: ``step`` is neither a TensorDict nor a mapping.
    """
    if isinstance(step, TensorDictBase):
        if list(step.batch_size) != [num_envs]:
            raise SchemaError(
                f"add() of a buffer with num_envs={num_envs} takes one step of every env: a TensorDict of "
                f"batch_size [{num_envs}], got batch_size {list(step.batch_size)}"
            )
        return
    require_mapping(step, "add")
    for key, value in leaves(step):
        shape = _shape(value)
        if not shape or shape[0] != num_envs:
            raise SchemaError(
                f"key '{format_key(key)}': add() of a buffer with num_envs={num_envs} takes values with a "
                f"leading dimension of {num_envs} (one row per env), got shape {shape}"
            )


def vector_step_size(values: Mapping[Any, torch.Tensor]) -> int:
    """``E`` when one transition's ``values`` (key -> tensor, as a first write infers them) look like one
    step of ``E > 1`` vector envs, else 0: every key has the same leading size ``E``, and a per-step
    scalar (a key named in :data:`SCALAR_STEP_KEYS`, nested or not) is exactly ``[E]``. A row with a vector
    state beside a scalar reward, or rows without any per-step scalar (token sequences), are not."""
    leading = {tuple(v.shape[:1]) for v in values.values()}
    if len(leading) != 1:
        return 0
    (first,) = leading
    if not first or first[0] < 2:
        return 0
    size = first[0]
    for key, value in values.items():
        name = key[-1] if isinstance(key, tuple) else key
        if name in SCALAR_STEP_KEYS and tuple(value.shape) == (size,):
            return size
    return 0


def flatten_steps(batch: TensorDictBase | Mapping[str, Any], num_envs: int) -> TensorDictBase | dict[str, Any]:
    """``[T, num_envs, ...]`` steps as ``[T * num_envs, ...]`` rows, time-major (row ``t * num_envs + e``).

    Args:
        batch: a TensorDict of batch size ``[T, num_envs]``, or a mapping of values with leading
            dimensions ``[T, num_envs]`` (tensors, NumPy arrays or nested lists; not converted, only
            reshaped, so the schema's cast rules see the original dtypes).

    Raises:
        InvalidArgumentError: a TensorDict whose batch size is not 2-D, or a non-mapping.
        SchemaError: a value (or the TensorDict) lacks the ``num_envs`` dimension, or keys disagree on ``T``.
    """
    if isinstance(batch, TensorDictBase):
        if batch.batch_dims != 2:
            raise InvalidArgumentError(
                f"add_batch() of a buffer with num_envs={num_envs} takes a TensorDict of batch_size "
                f"[T, {num_envs}] (time-major), got {list(batch.batch_size)}"
            )
        if batch.batch_size[1] != num_envs:
            raise SchemaError(
                f"add_batch() of a buffer with num_envs={num_envs} takes batch_size [T, {num_envs}], "
                f"got {list(batch.batch_size)}"
            )
        return batch.reshape(-1)
    require_mapping(batch, "add_batch")
    out: dict[str, Any] = {}
    steps = -1
    for key, value in leaves(batch):
        if not isinstance(value, (torch.Tensor, np.ndarray)):
            with contextlib.suppress(ValueError):  # ragged: the schema check names it
                value = np.asarray(value)
        shape = _shape(value)
        if len(shape) < 2 or shape[1] != num_envs:
            raise SchemaError(
                f"key '{format_key(key)}': add_batch() of a buffer with num_envs={num_envs} takes values of "
                f"shape [T, {num_envs}, ...] (time-major), got shape {shape}"
            )
        if steps >= 0 and shape[0] != steps:
            raise SchemaError(
                f"key '{format_key(key)}' has {shape[0]} steps but an earlier key has {steps}: every key of a batch "
                f"needs the same leading dimension (add_batch() with num_envs={num_envs} takes [T, {num_envs}, ...])"
            )
        steps = shape[0]
        node = out
        parts = (key,) if isinstance(key, str) else key
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value.reshape(shape[0] * num_envs, *shape[2:])
    return out


def whole_steps(rows: int, num_envs: int) -> int:
    """``rows`` rounded up to whole env steps: a recency window never splits a step."""
    return -(-rows // num_envs) * num_envs
