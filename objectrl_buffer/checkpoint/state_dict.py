"""A buffer's whole state as a torch-style ``state_dict``: tensors and plain values, nothing pickled.

``ReplayBuffer.state_dict()`` returns (format version 1)::

    {
        "format": "objectrl_buffer.state_dict", "format_version": 1,
        "buffer_size": 100000, "data_size": 1234, "pointer": 1234,   # ObjectRL's counters
        "phantom": 0,        # the oldest counted rows that hold no data (after a metadata-only load)
        "num_envs": 1, "shuffle": False,
        "fields": [{"key": "state", "shape": [17], "dtype": "float32"}, ...],   # the schema, in order
        "columns": {"state": <tensor [data_size, 17] float32>, ...},           # rows of slots 0 .. data_size-1
        "generator_device": "cpu", "generator_seed": 0, "generator_state": <uint8 tensor>,
        "extra_arrays": {"prioritized.priority": <tensor>},   # checkpoint_extras, as in a full checkpoint
        "extra_values": {"prioritized.max_priority": 1.0, "prioritized.alpha": 0.6, ...},
    }

Keys of ``fields``/``columns`` are the stored keys themselves (a ``str``, or a tuple for a nested key).
Rows are in slot order, like a full checkpoint's column files, so ``pointer`` needs no remapping and
the restored generator draws what the original would have drawn. Every tensor is a new CPU tensor (a
snapshot: later writes do not change it), so ``torch.save(buffer.state_dict(), f)`` and
``torch.load(f, weights_only=True)`` round-trip it anywhere. A buffer with no schema has no fields and
no columns (every counted row then holds no data: ``phantom == data_size``).

:func:`restore_state_dict` checks everything as a checkpoint load does (the ring, the schema against
the columns, the generator, and the buffer it goes into) and reads the rows into new storage, so a
refused state dict (:class:`~objectrl_buffer.errors.CheckpointError` naming the entry) changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from objectrl_buffer.checkpoint.data import BufferState
from objectrl_buffer.checkpoint.generations import Restored
from objectrl_buffer.checkpoint.metadata import brief, check_ring
from objectrl_buffer.core.schema import Field, Key, Schema, format_key
from objectrl_buffer.core.validate import MAX_SIZE
from objectrl_buffer.errors import CheckpointError, SchemaError
from objectrl_buffer.storage.table import TransitionStorage

__all__ = ["STATE_DICT_FORMAT", "STATE_DICT_VERSION", "make_state_dict", "restore_state_dict"]

STATE_DICT_FORMAT = "objectrl_buffer.state_dict"
STATE_DICT_VERSION = 1
_WHERE = "state_dict"
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def _cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A new CPU tensor with the values of ``tensor`` (never a view of the storage)."""
    return tensor.detach().to("cpu", copy=True).contiguous()


def make_state_dict(state: BufferState) -> dict[str, Any]:
    """The state dict of the buffer described by ``state`` (see the module docstring)."""
    rows = state.data_size
    fields = [] if state.schema is None else list(state.schema.fields)
    generator = state.generator
    return {
        "format": STATE_DICT_FORMAT,
        "format_version": STATE_DICT_VERSION,
        "buffer_size": state.buffer_size,
        "data_size": rows,
        "pointer": state.pointer,
        "phantom": state.phantom if fields else rows,
        "num_envs": state.num_envs,
        "shuffle": bool(state.shuffle),
        "fields": [
            {"key": f.key, "shape": list(f.shape), "dtype": str(f.dtype).removeprefix("torch.")} for f in fields
        ],
        "columns": {f.key: _cpu_copy(state.columns[f.key][:rows]) for f in fields},
        "generator_device": generator.device.type,
        "generator_seed": generator.initial_seed(),
        "generator_state": _cpu_copy(generator.get_state()),
        "extra_arrays": {name: _cpu_copy(array) for name, array in state.extra_arrays.items()},
        "extra_values": dict(state.extra_values),
    }


def _fail(problem: str) -> CheckpointError:
    return CheckpointError(f"{_WHERE}: {problem}; the buffer is unchanged")


def _entry(state: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    if name not in state:
        raise _fail(f"it lacks the key {name!r}")
    value = state[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _fail(f"{name} must be {what}, got {brief(value)}")
    return value


def _key(raw: Any) -> Key:
    if isinstance(raw, str) and raw:
        return raw
    if isinstance(raw, (tuple, list)) and raw and all(isinstance(p, str) and p for p in raw):
        return raw[0] if len(raw) == 1 else tuple(raw)
    raise _fail(f"a field has the key {brief(raw)}, expected a str or a tuple of str")


def _schema(raw: Any) -> Schema | None:
    if not isinstance(raw, list):
        raise _fail(f"fields must be a list, got {brief(raw)}")
    fields = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            raise _fail(f"a field is {brief(entry)}, expected a dict of key, shape and dtype")
        key = _key(entry.get("key"))
        raw_shape, dtype_name = entry.get("shape"), entry.get("dtype")
        if not isinstance(raw_shape, (list, tuple)) or len(raw_shape) > 64:
            raise _fail(f"field '{format_key(key)}' has the shape {brief(raw_shape)}, expected a list of sizes")
        shape: list[int] = list(raw_shape)
        if not all(type(s) is int and 0 <= s <= MAX_SIZE for s in shape):
            raise _fail(f"field '{format_key(key)}' has the shape {shape}, expected a list of sizes")
        if math.prod(shape) > MAX_SIZE:
            raise _fail(f"field '{format_key(key)}' has the shape {shape}: too large")
        if dtype_name not in _DTYPES:
            raise _fail(f"field '{format_key(key)}' has an unknown dtype {brief(dtype_name)}")
        fields.append(Field(key, torch.Size(shape), _DTYPES[dtype_name]))
    if not fields:
        return None
    try:
        schema = Schema(fields)
    except SchemaError as exc:
        raise _fail(str(exc)) from None
    if len(schema.by_key) != len(fields):
        raise _fail("fields name a key twice")
    return schema


def _columns(raw: Any, schema: Schema | None, rows: int) -> dict[Key, torch.Tensor]:
    if not isinstance(raw, Mapping):
        raise _fail(f"columns must be a dict of key -> tensor, got {brief(raw)}")
    fields = () if schema is None else schema.fields
    extra = [k for k in raw if schema is None or k not in schema.by_key]
    if extra:
        raise _fail(f"columns hold {brief(extra[0])}, which fields do not declare")
    columns = {}
    for f in fields:
        column = raw.get(f.key)
        expected = f"a tensor of dtype {str(f.dtype).removeprefix('torch.')} and shape {[rows, *f.shape]}"
        if not isinstance(column, torch.Tensor) or column.dtype != f.dtype or column.shape != (rows, *f.shape):
            got = (
                "nothing"
                if column is None
                else (f"{column.dtype} {list(column.shape)}" if isinstance(column, torch.Tensor) else brief(column))
            )
            raise _fail(f"column '{format_key(f.key)}' must be {expected}, got {got}")
        columns[f.key] = column
    return columns


def _extras(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    arrays = _entry(state, "extra_arrays", Mapping, "a dict of name -> tensor")
    values = _entry(state, "extra_values", Mapping, "a dict of name -> number or string")
    for name, array in arrays.items():
        if not isinstance(name, str) or not isinstance(array, torch.Tensor):
            raise _fail(f"extra_arrays holds {brief(name)}: {brief(array)}, expected a name and a tensor")
    for name, value in values.items():
        plain = isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value))
        if not isinstance(name, str) or not plain:
            raise _fail(f"extra_values holds {brief(name)}: {brief(value)}, expected a name and a finite number")
    return {k: _cpu_copy(v) for k, v in arrays.items()}, dict(values)


def restore_state_dict(
    state: BufferState, saved: Any, check: Callable[[Restored], None] = lambda restored: None
) -> Restored:
    """Validate ``saved`` (a :func:`make_state_dict`) against the buffer described by ``state``, copy its
    rows into new storage, let ``check`` refuse it, and return it for the buffer to adopt.

    The same rules as a checkpoint load: a buffer that holds rows only takes a state dict of its own
    capacity, schema and ``num_envs``; an empty buffer takes any.

    Raises:
        CheckpointError: naming what is wrong with ``saved``, or what ``check`` refuses; nothing changed.
    """
    if not isinstance(saved, Mapping) or saved.get("format") != STATE_DICT_FORMAT:
        raise _fail(
            f"{brief(saved) if not isinstance(saved, Mapping) else 'this dict'} is not a state_dict of "
            "objectrl_buffer (no format 'objectrl_buffer.state_dict')"
        )
    version = saved.get("format_version")
    if type(version) is not int or not 1 <= version <= STATE_DICT_VERSION:
        raise _fail(f"format version {brief(version)}; this objectrl_buffer reads up to {STATE_DICT_VERSION}")
    capacity, size, pointer = check_ring(dict(saved), _WHERE)
    phantom = _entry(saved, "phantom", int, "an int")
    num_envs = _entry(saved, "num_envs", int, "an int")
    shuffle = _entry(saved, "shuffle", bool, "a bool")
    if not 0 <= phantom <= size:
        raise _fail(f"phantom must be in [0, data_size={size}], got {phantom}")
    if num_envs < 1 or capacity % num_envs or size % num_envs or pointer % num_envs:
        raise _fail(
            f"num_envs={num_envs} does not divide buffer_size, data_size and pointer ({capacity}, {size}, {pointer})"
        )
    schema = _schema(_entry(saved, "fields", list, "a list"))
    if schema is None and phantom != size:
        raise _fail(f"it has no fields but counts {size - phantom} rows that hold data")
    columns = _columns(_entry(saved, "columns", Mapping, "a dict"), schema, size)
    generator_device = _entry(saved, "generator_device", str, "a device type")
    seed = _entry(saved, "generator_seed", int, "an int")
    generator_state = _entry(saved, "generator_state", torch.Tensor, "a uint8 tensor")
    if not 0 <= seed < 2**64:
        raise _fail(f"generator_seed must be in [0, 2**64), got {brief(seed)}")
    extra_arrays, extra_values = _extras(saved)
    if state.schema is not None:
        if capacity != state.buffer_size:
            raise _fail(
                f"it has buffer_size {capacity} but this buffer holds data with capacity "
                f"{state.buffer_size}: reset() it first"
            )
        if schema is not None and schema != state.schema:
            raise _fail(f"it holds {schema!r} but this buffer holds data of {state.schema!r}: reset() it first")
        if num_envs != state.num_envs:
            raise _fail(
                f"it has num_envs={num_envs} but this buffer holds data of num_envs={state.num_envs}: reset() it first"
            )
    restored_state: torch.Tensor | None = None
    if generator_device == state.storing_device.type:
        restored_state = _cpu_copy(generator_state)
        try:
            torch.Generator(device=state.storing_device).set_state(restored_state)
        except (RuntimeError, TypeError) as exc:
            raise _fail(f"generator_state is not a valid generator state ({exc})") from None
    storage = TransitionStorage(capacity, state.storing_device, state.storage_dir)
    try:
        if schema is not None:
            storage.initialize(schema, {f.key: torch.zeros(f.shape, dtype=f.dtype) for f in schema.fields})
            storage.write_rows(0, [(f, columns[f.key]) for f in schema.fields], first=0, n=size)
        restored = Restored(
            capacity,
            size,
            pointer,
            storage,
            restored_state,
            None if restored_state is not None else seed,
            shuffle,
            extra_arrays=extra_arrays,
            extra_values=extra_values,
            source=_WHERE,
            phantom=phantom,
            num_envs=num_envs,
        )
        check(restored)
    except BaseException as exc:
        storage.close()
        if isinstance(exc, (OSError, RuntimeError)) and not isinstance(exc, CheckpointError):
            raise CheckpointError(
                f"{_WHERE}: cannot copy the rows into new storage on {state.storing_device}: {exc}"
            ) from exc
        raise
    return restored
