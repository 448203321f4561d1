"""What a buffer stores: its keys, per-row shapes and dtypes, and how inputs are checked against them.

The first write fixes the schema. Every later write is checked key by key *before* anything is
written, so a write that does not fit raises :class:`~objectrl_buffer.errors.SchemaError` and stores
nothing. The check is a handful of attribute comparisons per key: cheap enough for the per-step path.

Dtype rule: a ``torch.Tensor`` must carry exactly the stored dtype (a silent cast of a tensor usually
hides a bug). Values without a torch dtype of their own (Python numbers, NumPy arrays and scalars,
lists) are cast to the stored dtype when NumPy's ``same_kind`` rule allows it (float64 -> float32 yes,
float -> int no), which is what a gymnasium loop produces.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import torch
from tensordict import TensorDictBase

from objectrl_buffer.errors import InvalidArgumentError, SchemaError

__all__ = ["Field", "Schema", "Key", "INDEX_KEY", "leaves", "format_key", "require_mapping"]

#: A key as tensordict spells it: ``"state"`` at the top level, ``("obs", "pixels")`` when nested.
Key: TypeAlias = str | tuple[str, ...]

#: Reserved key: samples carry the storage slot of each row under it (as ObjectRL's buffer does);
#: writes may carry it too (a sample written back) and it is dropped, never stored.
INDEX_KEY = "index"

_PY_SCALARS = (bool, int, float)


def format_key(key: Key) -> str:
    """``"state"`` or ``"obs.pixels"``: a key as messages show it."""
    return key if isinstance(key, str) else ".".join(key)


def leaves(data: TensorDictBase | Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[Key, Any]]:
    """Yield ``(key, value)`` for every leaf of a TensorDict or a (nested) mapping, ``index`` excluded."""
    for name, value in data.items():
        if not prefix and name == INDEX_KEY:
            continue
        if isinstance(value, (TensorDictBase, Mapping)):
            yield from leaves(value, (*prefix, name))
        else:
            yield ((*prefix, name) if prefix else name), value


@dataclass(frozen=True)
class Field:
    """One stored key: ``shape`` is per row (no batch dimension)."""

    key: Key
    shape: torch.Size
    dtype: torch.dtype

    @property
    def row_bytes(self) -> int:
        """Bytes one row of this field takes."""
        return self.shape.numel() * self.dtype.itemsize

    def describe(self) -> str:
        """``shape=(17,), dtype=float32``: the per-row layout as messages show it."""
        return f"shape={tuple(self.shape)}, dtype={str(self.dtype).removeprefix('torch.')}"


def _out_of_range(value: int, dtype: torch.dtype) -> bool:
    """Whether a Python int does not fit an integer ``dtype`` (floating and bool columns take any int)."""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return False
    info = torch.iinfo(dtype)
    return not info.min <= value <= info.max


def _as_tensor(key: Key, value: Any) -> torch.Tensor:
    """A tensor for a NumPy array/scalar, Python number or nested list (tensors pass through).

    Raises :class:`SchemaError` naming ``key`` for values torch cannot hold (strings, ragged lists, ...).
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.get_default_dtype())
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        value = value.copy()  # torch.from_numpy refuses read-only arrays
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise SchemaError(
            f"key '{format_key(key)}': a {type(value).__name__} cannot be stored as a tensor ({exc})"
        ) from None


class Schema:
    """The fields of a buffer, in the order of the first write.

    Build it with :meth:`infer` from the first write; check later writes with :meth:`check`.
    """

    def __init__(self, fields: list[Field]) -> None:
        if not fields:
            raise SchemaError("a transition needs at least one key besides 'index'")
        self.fields = tuple(fields)
        self.by_key = {f.key: f for f in fields}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.fields == other.fields

    def __hash__(self) -> int:
        return hash(self.fields)

    def __repr__(self) -> str:
        inner = ", ".join(f"{format_key(f.key)}: {f.describe()}" for f in self.fields)
        return f"Schema({inner})"

    @property
    def row_bytes(self) -> int:
        """Bytes one transition takes in storage."""
        return sum(f.row_bytes for f in self.fields)

    @classmethod
    def infer(cls, data: TensorDictBase | Mapping[str, Any], batch_dims: int) -> tuple[Schema, dict[Key, torch.Tensor]]:
        """Schema of a first write, and its values as tensors.

        ``batch_dims`` is 0 for one transition (``add``) and 1 for a batch (``add_batch``).
        """
        values: dict[Key, torch.Tensor] = {}
        fields = []
        for key, value in leaves(data):
            tensor = _as_tensor(key, value)
            if tensor.dim() < batch_dims:
                raise SchemaError(f"key '{format_key(key)}': a batch needs a leading batch dimension, got a 0-d value")
            values[key] = tensor
            fields.append(Field(key, tensor.shape[batch_dims:], tensor.dtype))
        schema = cls(fields)
        schema._check_batch(values, batch_dims)
        return schema, values

    def check(self, data: TensorDictBase | Mapping[str, Any], batch_dims: int) -> tuple[list[tuple[Field, Any]], int]:
        """Check a write against the schema.

        Returns ``(pairs, n)``: each field with the value to write (a tensor, or a Python number for a
        single row), and the number of rows (1 for ``batch_dims == 0``). Raises :class:`SchemaError`
        naming the first key that does not fit; nothing is written by this method.
        """
        by_key = self.by_key
        pairs: list[tuple[Field, Any]] = []
        n = -1
        for key, value in leaves(data):
            field = by_key.get(key)
            if field is None:
                raise SchemaError(
                    f"key '{format_key(key)}' is not in the stored schema {self!r}; "
                    "call reset() before writing a different set of keys"
                )
            if batch_dims == 0 and isinstance(value, _PY_SCALARS):
                if field.shape:
                    raise SchemaError(self._mismatch(field, f"a Python {type(value).__name__}"))
                if isinstance(value, float) and not (field.dtype.is_floating_point or field.dtype.is_complex):
                    raise SchemaError(self._mismatch(field, "a Python float"))
                if field.dtype == torch.bool and not isinstance(value, bool):  # same_kind: int -> bool is unsafe
                    raise SchemaError(self._mismatch(field, f"a Python {type(value).__name__}"))
                if type(value) is int and _out_of_range(value, field.dtype):  # else the write fails half-way
                    raise SchemaError(self._mismatch(field, f"the int {value}, out of range"))
                pairs.append((field, value))
                continue
            if not isinstance(value, torch.Tensor):
                value = _as_tensor(key, value)
                if value.dtype != field.dtype and not torch.can_cast(value.dtype, field.dtype):
                    raise SchemaError(self._mismatch(field, f"dtype {value.dtype} (cannot be cast safely)"))
            elif value.dtype != field.dtype:
                raise SchemaError(self._mismatch(field, f"a tensor of dtype {str(value.dtype).removeprefix('torch.')}"))
            shape = value.shape
            if batch_dims == 0:
                if shape != field.shape:
                    raise SchemaError(self._mismatch(field, f"shape={tuple(shape)}"))
            else:
                if len(shape) < 1 or shape[1:] != field.shape:
                    raise SchemaError(self._mismatch(field, f"batch shape={tuple(shape)}"))
                if n < 0:
                    n = shape[0]
                elif shape[0] != n:
                    raise SchemaError(
                        f"key '{format_key(key)}' has {shape[0]} rows but an earlier key has {n}: "
                        "every key of a batch needs the same leading dimension"
                    )
            pairs.append((field, value))
        if len(pairs) != len(self.fields):
            given = {f.key for f, _ in pairs}
            missing = [format_key(f.key) for f in self.fields if f.key not in given]
            raise SchemaError(f"write is missing key(s) {missing} of the stored schema {self!r}")
        return pairs, (1 if batch_dims == 0 else max(n, 0))

    def _check_batch(self, values: dict[Key, torch.Tensor], batch_dims: int) -> None:
        if batch_dims == 1:
            sizes = {format_key(k): v.shape[0] for k, v in values.items()}
            if len(set(sizes.values())) > 1:
                raise SchemaError(f"every key of a batch needs the same number of rows, got {sizes}")

    def _mismatch(self, field: Field, got: str) -> str:
        return f"key '{format_key(field.key)}': the buffer stores {field.describe()} per row, the write has {got}"


def require_mapping(data: object, method: str) -> None:
    """Raise if ``data`` is not a TensorDict or a mapping (the two accepted input types)."""
    if not isinstance(data, (TensorDictBase, Mapping)):
        raise InvalidArgumentError(
            f"{method}() takes a TensorDict or a mapping of key -> value, got {type(data).__name__}"
        )
