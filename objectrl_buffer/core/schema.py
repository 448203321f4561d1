"""What a buffer stores: its keys, per-row shapes and dtypes, and how inputs are checked against them.

The first write fixes the schema. Every later write is checked key by key *before* anything is
written, so a write that does not fit raises :class:`~objectrl_buffer.errors.SchemaError` and stores
nothing. The check is a handful of attribute comparisons per key: cheap enough for the per-step path.

Casts follow :mod:`~objectrl_buffer.core.casts` (lossless casts and size-1 reshapes only).

Every value of a write is checked (and converted) before any of it is written, so a refused value
never leaves half a row behind.

First write (the dtype of each column): a tensor keeps its dtype, and so does a NumPy array with a
per-row shape (a float64 MuJoCo observation stays float64; pass ``obs.astype(np.float32)`` or a tensor
to choose). A float *number* per row, however it comes (a Python float, a NumPy ``float64`` scalar, a
0-d ``float64`` array, or a ``[N]`` array/list of them in ``add_batch`` or from ``num_envs`` envs), is
stored in torch's default dtype (``torch.get_default_dtype()``, float32 unless changed), as
``torch.tensor(0.5)`` and ObjectRL's ``TensorDict`` store a Python float. So a gymnasium reward gives the
same float32 column from one env or many, whichever type the env returns. Other NumPy scalars keep
their dtype (``np.float32``, ``np.float16``, ``np.int64``); a Python int is int64, a bool bool.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import torch
from tensordict import TensorDictBase

from objectrl_buffer.core.casts import (
    CHECK_VALUES,
    REFUSED,
    SAME,
    UNCHECKED,
    cast_rule,
    exact_ints,
    first_inexact,
    first_overflow,
    int_fits,
    narrows,
    real_part,
    same_meaning,
)
from objectrl_buffer.core.keys import INDEX_KEY
from objectrl_buffer.errors import CastWarning, InvalidArgumentError, SchemaError

__all__ = [
    "Field",
    "Schema",
    "as_keys",
    "Key",
    "INDEX_KEY",
    "leaves",
    "format_key",
    "require_mapping",
    "without_data",
    "cast_rule",
    "exact_ints",
    "SAME",
    "UNCHECKED",
    "CHECK_VALUES",
    "REFUSED",
]

#: A key as tensordict spells it: ``"state"`` at the top level, ``("obs", "pixels")`` when nested.
Key: TypeAlias = str | tuple[str, ...]


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


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def without_data(value: torch.Tensor) -> str | None:
    """Why a buffer cannot store ``value``'s elements as they are, as the end of "a tensor ...": on the meta
    device (no data at all) or of a layout other than strided (sparse); ``None`` for a storable tensor."""
    if value.device.type == "meta":
        return "on the meta device (it holds no data)"
    if value.layout != torch.strided:
        return f"of layout {value.layout}"
    return None


def _as_tensor(key: Key, value: Any) -> torch.Tensor:
    """A tensor for a NumPy array/scalar, Python number or nested list (tensors pass through).

    Raises :class:`SchemaError` naming ``key`` for values torch cannot hold (strings, ragged lists, ...).
    """
    if isinstance(value, torch.Tensor):
        where = without_data(value)
        if where is not None:
            raise SchemaError(f"key '{format_key(key)}': a tensor {where} cannot be stored")
        return value
    if isinstance(value, float):
        tensor = torch.tensor(value, dtype=torch.get_default_dtype())
        if math.isfinite(value) and not bool(torch.isfinite(tensor)):
            raise SchemaError(_overflow(key, value, tensor.dtype, "a Python float is held in torch's default dtype"))
        return tensor
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        value = value.copy()  # torch.from_numpy refuses read-only arrays
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise SchemaError(
            f"key '{format_key(key)}': a {type(value).__name__} cannot be stored as a tensor ({exc})"
        ) from None
    if (
        tensor.dtype == torch.get_default_dtype()
        and not isinstance(value, (np.ndarray, np.generic))
        and not bool(torch.isfinite(tensor).all())
    ):  # Python floats in a list are held in the default dtype: one beyond it became inf
        bad = first_overflow(torch.as_tensor(value, dtype=torch.float64), tensor)
        if bad is not None:
            raise SchemaError(
                _overflow(key, bad, tensor.dtype, "Python floats in a list are held in torch's default dtype")
            )
    return tensor


def _overflow(key: Key, value: Any, dtype: torch.dtype, why: str) -> str:
    """The message for a finite ``value`` of ``key`` that ``dtype`` cannot hold (it would become +-inf)."""
    return f"key '{format_key(key)}': the value {value} does not fit {_dtype_name(dtype)} (it would become inf; {why})"


class Schema:
    """The fields of a buffer, in the order of the first write.

    Build it with :meth:`infer` from the first write; check later writes with :meth:`check`.
    """

    def __init__(self, fields: list[Field]) -> None:
        if not fields:
            raise SchemaError("a transition needs at least one key besides 'index'")
        self.fields = tuple(fields)
        self.by_key = {f.key: f for f in fields}
        #: Whether some key is nested (a tuple): reads then build nested TensorDicts.
        self.nested = any(not isinstance(f.key, str) for f in fields)

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
            if tensor.dim() == batch_dims and tensor.dtype == torch.float64 and not isinstance(value, torch.Tensor):
                tensor = tensor.to(torch.get_default_dtype())  # a float number: see "First write" above
            values[key] = tensor
            fields.append(Field(key, tensor.shape[batch_dims:], tensor.dtype))
        schema = cls(fields)
        schema.check_batch_rows(values, batch_dims)
        return schema, values

    def check(
        self, data: TensorDictBase | Mapping[str, Any], batch_dims: int, warned: set[Key] | None = None
    ) -> tuple[list[tuple[Field, Any]], int]:
        """Check a write against the schema and convert every value to the stored dtype and shape.

        Returns ``(pairs, n)``: each field with the value to write (a tensor of the stored dtype and
        per-row shape, or a Python number that the column holds exactly, for a single row), and the
        number of rows (1 for ``batch_dims == 0``). Writing the pairs cannot fail, so a write either
        stores every value or none. Raises :class:`SchemaError` naming the first key that does not fit
        (the cast rule is in the module docstring); nothing is written by this method.

        ``warned``: the keys this buffer has already warned about; a tensor cast or reshaped for a key
        not in it issues a :class:`CastWarning` (once the whole write is accepted) and joins it.
        """
        by_key = self.by_key
        pairs: list[tuple[Field, Any]] = []
        notes: list[tuple[Field, torch.dtype, torch.Size]] = []  # tensors cast or reshaped: warned at the end
        n = -1
        for key, value in leaves(data):
            field = by_key.get(key)
            if field is None:
                raise SchemaError(
                    f"key '{format_key(key)}' is not in the stored schema {self!r}; "
                    "call reset() before writing a different set of keys"
                )
            if batch_dims == 0 and isinstance(value, _PY_SCALARS):
                pairs.append((field, self._python_number(field, value)))
                continue
            is_tensor = isinstance(value, torch.Tensor)
            tensor = _as_tensor(key, value)
            shape = tensor.shape
            if batch_dims == 0:
                rows = shape
            else:
                if len(shape) < 1:
                    raise SchemaError(self._mismatch(field, f"batch shape={tuple(shape)}"))
                rows = shape[1:]
                if n < 0:
                    n = shape[0]
                elif shape[0] != n:
                    raise SchemaError(
                        f"key '{format_key(key)}' has {shape[0]} rows but an earlier key has {n}: "
                        "every key of a batch needs the same leading dimension"
                    )
            if rows != field.shape and not same_meaning(rows, field.shape):
                got = f"shape={tuple(shape)}" if batch_dims == 0 else f"batch shape={tuple(shape)}"
                raise SchemaError(self._mismatch(field, got))
            converted = self._convert(field, tensor, is_tensor)
            if rows != field.shape:
                converted = converted.reshape((*shape[:batch_dims], *field.shape))
            if is_tensor and (tensor.dtype != field.dtype or rows != field.shape):
                notes.append((field, tensor.dtype, rows))
            pairs.append((field, converted))
        if len(pairs) != len(self.fields):
            given = {f.key for f, _ in pairs}
            missing = [format_key(f.key) for f in self.fields if f.key not in given]
            raise SchemaError(f"write is missing key(s) {missing} of the stored schema {self!r}")
        if warned is not None:
            for field, dtype, rows in notes:
                if field.key not in warned:
                    warned.add(field.key)
                    warnings.warn(
                        f"key '{format_key(field.key)}': a tensor of dtype={_dtype_name(dtype)}, shape={tuple(rows)} "
                        f"per row is stored as {field.describe()} (cast without loss; warned once per key)",
                        CastWarning,
                        stacklevel=4 + batch_dims,  # the caller of add() / of add_batch()
                    )
        return pairs, (1 if batch_dims == 0 else max(n, 0))

    def _python_number(self, field: Field, value: bool | int | float) -> bool | int | float | torch.Tensor:
        """A Python number as the column holds it, or :class:`SchemaError` (a single row only)."""
        dtype = field.dtype
        kind = type(value).__name__
        if field.shape.numel() != 1:
            raise SchemaError(self._mismatch(field, f"a Python {kind}"))
        if isinstance(value, bool):
            return value
        if dtype == torch.bool:  # same_kind: int -> bool is unsafe
            raise SchemaError(self._mismatch(field, f"a Python {kind}"))
        if isinstance(value, float):
            if not (dtype.is_floating_point or dtype.is_complex):
                raise SchemaError(self._mismatch(field, "a Python float"))
            limit = torch.finfo(real_part(dtype)).max
            if not -limit <= value <= limit:  # torch refuses to write these; round like a tensor cast
                cast = torch.tensor(value, dtype=torch.float64).to(dtype)
                if math.isfinite(value) and not bool(torch.isfinite(cast)):  # inf and nan fit; 2**200 does not
                    raise SchemaError(
                        self._mismatch(
                            field, f"the float {value}, beyond {_dtype_name(dtype)}'s range (it would become inf)"
                        )
                    )
                return cast
            return value
        if not int_fits(value, dtype):  # else the write fails half-way, or rounds the int
            raise SchemaError(self._mismatch(field, f"the int {value}, which {_dtype_name(dtype)} cannot hold exactly"))
        if not -(2**63) <= value < 2**63:  # torch writes ints through int64; an exact float beyond it (2**100)
            return float(value)
        return value

    def _convert(self, field: Field, tensor: torch.Tensor, is_tensor: bool) -> torch.Tensor:
        """``tensor`` in the stored dtype (the same object when it already is), or :class:`SchemaError`."""
        rule = cast_rule(tensor.dtype, field.dtype)
        if rule == SAME:
            return tensor
        what = "a tensor" if is_tensor else "a value"
        if rule == REFUSED:
            raise SchemaError(
                self._mismatch(field, f"{what} of dtype {_dtype_name(tensor.dtype)} (cannot be cast safely)")
            )
        tensor = tensor.detach()
        if rule == UNCHECKED:
            narrowed = tensor.to(field.dtype)
            if narrows(tensor.dtype, field.dtype):
                bad = first_overflow(tensor, narrowed)
                if bad is not None:
                    raise SchemaError(
                        self._mismatch(
                            field,
                            f"{what} of dtype {_dtype_name(tensor.dtype)} holding {bad}, "
                            f"beyond {_dtype_name(field.dtype)}'s range (it would become inf)",
                        )
                    )
            return narrowed
        cast, bad = first_inexact(tensor, field.dtype)
        if cast is None:
            raise SchemaError(
                self._mismatch(
                    field,
                    f"{what} of dtype {_dtype_name(tensor.dtype)} holding {bad}, "
                    f"which {_dtype_name(field.dtype)} cannot hold exactly",
                )
            )
        return cast

    def stored_keys(self, fields: Any, name: str = "fields") -> list[Key]:
        """``fields`` (a key or an iterable of keys; ``("reward",)`` means ``"reward"``) as stored keys.

        Raises:
            InvalidArgumentError: ``fields`` is not a key or keys. SchemaError: a key is not stored.
        """
        keys = as_keys(fields, name)
        for key in keys:
            if key not in self.by_key:
                stored = [f.key for f in self.fields]
                raise SchemaError(f"{name}: {key!r} is not stored; stored keys: {stored}")
        return keys

    def check_batch_rows(self, values: dict[Key, torch.Tensor], batch_dims: int) -> None:
        if batch_dims == 1:
            sizes = {format_key(k): v.shape[0] for k, v in values.items()}
            if len(set(sizes.values())) > 1:
                raise SchemaError(f"every key of a batch needs the same number of rows, got {sizes}")

    def _mismatch(self, field: Field, got: str) -> str:
        return f"key '{format_key(field.key)}': the buffer stores {field.describe()} per row, the write has {got}"


def as_keys(fields: Any, name: str = "fields") -> list[Key]:
    """``fields`` (a key or an iterable of keys; ``("reward",)`` means ``"reward"``) as a list of keys,
    whatever a schema stores: checked before a buffer's state is.

    Raises:
        InvalidArgumentError: naming ``name``: not a key (a ``str`` or a tuple of ``str``) or keys.
    """
    if isinstance(fields, (str, tuple)):
        keys = [fields]
    elif isinstance(fields, Iterable) and not isinstance(fields, (bytes, Mapping)):
        keys = list(fields)
    else:
        raise InvalidArgumentError(f"{name} must be a key or a list of keys, got {fields!r}")
    keys = [k[0] if isinstance(k, tuple) and len(k) == 1 else k for k in keys]
    for key in keys:
        if not (isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(p, str) for p in key))):
            raise InvalidArgumentError(f"{name} must be keys (a str or a tuple of str), got {key!r} among them")
    return keys


def require_mapping(data: object, method: str) -> None:
    """Raise if ``data`` is not a TensorDict or a mapping (the two accepted input types)."""
    if not isinstance(data, (TensorDictBase, Mapping)):
        raise InvalidArgumentError(
            f"{method}() takes a TensorDict or a mapping of key -> value, got {type(data).__name__}"
        )
