"""The bytes of a stored task row, for other processes (``SharedTaskStorage``) and checkpoints: a u32 length
of a JSON header, the header (id, meta, payload with each tensor replaced by a marker), then the raw bytes of
each tensor in order. Plain JSON and raw bytes, never pickle; :func:`decode_row` checks everything it reads
(a forged file raises ValueError, allocating no more than the row's own bytes)."""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from typing import Any

import torch

from .rows import DataRow, Experience, ExpMeta

__all__ = ["encode_row", "decode_row"]

_TENSOR, _DICT = "$tensor", "$dict"  # markers in the encoded JSON; a user dict holding one is wrapped in $dict
_MAX_DIM = 2**62


def _pack(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {_TENSOR: [len(tensors) - 1, str(value.dtype).removeprefix("torch."), list(value.shape)]}
    if isinstance(value, list):
        return [_pack(v, tensors) for v in value]
    if isinstance(value, dict):
        packed = {k: _pack(v, tensors) for k, v in value.items()}
        return {_DICT: packed} if (_TENSOR in value or _DICT in value) else packed
    return value


def encode_row(row: DataRow) -> bytes:
    """The bytes of a normalised row (see :func:`normalize_row`); :func:`decode_row` gives it back."""
    tensors: list[torch.Tensor] = []
    header = {
        "id": row.id,
        "meta": row.exp_meta.to_dict(),
        "data": {f.name: _pack(getattr(row.exp_data, f.name), tensors) for f in dataclasses.fields(row.exp_data)},
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    blobs = [t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors]
    return b"".join([struct.pack("<I", len(text)), text, *blobs])


def _tensor_shape(shape: Any) -> list[int]:
    """A stored tensor's shape, checked: a list of ints in ``[0, 2**62]`` whose non-zero dims multiply to at
    most ``2**62`` (ValueError otherwise: a forged file must not reach torch with a negative or huge shape)."""
    if type(shape) is not list or not all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape):
        raise ValueError(f"a stored tensor's shape must be a list of ints in [0, 2**62], got {str(shape)[:80]}")
    if math.prod(d for d in shape if d) > _MAX_DIM:
        raise ValueError(f"a stored tensor's shape {shape} has more than 2**62 elements")
    return shape


def _unpack(value: Any, blob: memoryview, offsets: list[int]) -> Any:
    if isinstance(value, list):
        return [_unpack(v, blob, offsets) for v in value]
    if not isinstance(value, dict):
        return value
    if _DICT in value and len(value) == 1:
        if not isinstance(value[_DICT], dict):
            raise ValueError(f"a stored row's {_DICT} marker holds a {type(value[_DICT]).__name__}, not a dict")
        return {k: _unpack(v, blob, offsets) for k, v in value[_DICT].items()}
    if _TENSOR in value and len(value) == 1:
        marker = value[_TENSOR]
        if not (isinstance(marker, list) and len(marker) == 3 and isinstance(marker[1], str)):
            raise ValueError(f"a stored row has a malformed tensor marker {str(marker)[:80]}")
        dtype = getattr(torch, marker[1], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown tensor dtype {marker[1]!r} in a stored row")
        shape = _tensor_shape(marker[2])
        nbytes = math.prod(shape) * dtype.itemsize
        start = offsets[0]
        if start + nbytes > len(blob):  # checked before anything is allocated: at most the row's own bytes
            raise ValueError("a stored row is shorter than its tensors")
        offsets[0] = start + nbytes
        try:
            raw = torch.frombuffer(bytearray(blob[start : start + nbytes]), dtype=torch.uint8) if nbytes else None
            return (raw.view(dtype) if raw is not None else torch.empty(0, dtype=dtype)).reshape(shape)
        except RuntimeError as exc:  # a dtype torch cannot view bytes as (quantized, sub-byte)
            raise ValueError(f"a stored {marker[1]} tensor of shape {shape} cannot be rebuilt: {exc}") from None
    return {k: _unpack(v, blob, offsets) for k, v in value.items()}


def decode_row(payload: bytes | memoryview) -> DataRow:
    """The row :func:`encode_row` wrote. Plain JSON and raw bytes: no pickle.

    Raises:
        ValueError: malformed bytes of any kind (a forged header, nesting too deep for ``json``, a tensor
            with a negative or huge shape or past the end of the row); nothing beyond the row's size is
            allocated first.
    """
    view = memoryview(payload)
    if len(view) < 4:
        raise ValueError("a stored row is shorter than its header")
    (length,) = struct.unpack_from("<I", view)
    if 4 + length > len(view):
        raise ValueError("a stored row is shorter than its header")
    try:
        header = json.loads(bytes(view[4 : 4 + length]))
        if not (isinstance(header, dict) and isinstance(header.get("data"), dict)):
            raise ValueError("a stored row's header is not a dict with a 'data' dict")
        offsets = [0]
        tail = view[4 + length :]
        data = {k: _unpack(v, tail, offsets) for k, v in header["data"].items()}
        meta = header.get("meta")
        if not isinstance(meta, dict):
            raise ValueError("a stored row's header has no 'meta' dict")
        return DataRow(ExpMeta(**meta), Experience(**data), header.get("id"))  # type: ignore[arg-type]
    except RecursionError:
        raise ValueError("a stored row is nested too deep") from None
    except TypeError as exc:  # ExpMeta/Experience of missing or unknown fields
        raise ValueError(f"a stored row has malformed fields: {exc}") from None
