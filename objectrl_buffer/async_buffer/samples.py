"""Samples in and batches out: splitting a put/amend into per-sample tensors, the key schema, and gathering.

A sample is a mapping ``key -> tensor`` plus its integer ``ids``. A key holds per-sample tensors of one dtype
and one trailing shape (``shape[1:]``); their first dimension (a sequence length) may differ between samples.
Gathered batches stack keys whose samples share a shape and return the others as jagged nested tensors.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from objectrl_buffer.async_buffer.consumer import IDS
from objectrl_buffer.core.schema import without_data
from objectrl_buffer.errors import InvalidArgumentError, SchemaError

__all__ = ["KeySpec", "Parsed", "parse_samples", "check_schema", "gather"]


@dataclass(frozen=True)
class KeySpec:
    """What every sample's tensor of one key looks like: ``dtype``, ``ndim`` and ``trailing`` (``shape[1:]``)."""

    dtype: torch.dtype
    ndim: int
    trailing: tuple[int, ...]

    @staticmethod
    def of(t: torch.Tensor) -> KeySpec:
        return KeySpec(t.dtype, t.dim(), tuple(t.shape[1:]))

    def describe(self) -> str:
        shape = "()" if self.ndim == 0 else "(L, " + ", ".join(map(str, self.trailing)) + ")"
        return f"{str(self.dtype).removeprefix('torch.')} {shape}".replace(", )", ")")


@dataclass
class Parsed:
    """A put or amend split per sample: ``ids[i]`` and ``payloads[i]`` (key -> tensor, without ``ids``)."""

    ids: list[int]
    payloads: list[dict[str, torch.Tensor]]
    same_keys: bool  # every sample has the same keys (a TensorDict): presence is one row for all


_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def _as_id(value: Any, where: str) -> int:
    if type(value) is int:  # the common case, first: puts are per-sample Python work
        return value
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype not in _INT_DTYPES or without_data(value) is not None:
            raise InvalidArgumentError(f"{where}: 'ids' must be an integer, got a {value.dtype} tensor {value!r}")
        return int(value.item())
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise InvalidArgumentError(f"{where}: 'ids' must be an integer, got {value!r}")


def _tensor(value: Any, key: str, where: str, device: torch.device) -> torch.Tensor:
    """``value`` as a tensor on ``device``: a tensor already there is kept as it is (not copied)."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            raise SchemaError(f"{where}: key '{key}' is a nested tensor; give one sample's tensor per mapping")
        problem = without_data(value)
        if problem is not None:
            raise SchemaError(f"{where}: key '{key}': a tensor {problem} cannot be stored")
        if type(value) is torch.Tensor and value.device == device and not value.requires_grad:
            return value
        return value.detach().to(device)
    if isinstance(value, (Mapping, TensorDictBase)):
        raise SchemaError(f"{where}: key '{key}' holds a mapping; keys must hold tensors (no nested keys)")
    try:
        return torch.tensor(value, device=device)  # copies: never aliases a NumPy array
    except (TypeError, ValueError, RuntimeError) as exc:
        raise SchemaError(f"{where}: key '{key}' cannot become a tensor: {exc}") from None


def _split_column(value: Any, key: str, n: int, device: torch.device) -> list[torch.Tensor] | tuple[torch.Tensor, ...]:
    if isinstance(value, TensorDictBase):
        raise SchemaError(f"samples: key '{key}' holds a TensorDict; keys must hold tensors (no nested keys)")
    problem = without_data(value.values() if value.is_nested else value)
    if problem is not None:
        raise SchemaError(f"samples: key '{key}': a tensor {problem} cannot be stored")
    value = value.detach().to(device)
    parts = value.unbind() if value.is_nested else value.unbind(0)
    if len(parts) != n:
        raise SchemaError(f"samples: key '{key}' has {len(parts)} samples, the batch has {n}")
    return parts


def parse_samples(samples: Any, device: torch.device) -> Parsed:
    """Split ``samples`` (a list of mappings, or a TensorDict of batch size ``[n]``) per sample on ``device``.

    Tensors already on ``device`` are kept, not copied (the buffer holds them as given).

    Raises:
        InvalidArgumentError: not a list/TensorDict, a TensorDict of another rank, a missing or non-integer ``ids``.
        SchemaError: a value that is not a tensor (or convertible), nested keys.
    """
    if isinstance(samples, TensorDictBase):
        if samples.batch_dims != 1:
            raise InvalidArgumentError(
                f"samples: a TensorDict must have batch size [n], got {list(samples.batch_size)}"
            )
        n = samples.batch_size[0]
        keys = list(samples.keys())
        if n and IDS not in keys:
            raise InvalidArgumentError("samples: every sample needs an integer 'ids' key")
        ids: list[int] = []
        if n:
            raw = samples.get(IDS)
            if raw.dim() == 2 and raw.shape[1] == 1:
                raw = raw[:, 0]
            problem = without_data(raw)
            if raw.is_nested or raw.dim() != 1 or raw.dtype not in _INT_DTYPES or problem is not None:
                raise InvalidArgumentError(
                    f"samples: 'ids' must hold one integer per sample, got {raw.dtype} of shape {list(raw.shape)}"
                    + (f", a tensor {problem}" if problem else "")
                )
            ids = raw.tolist()
        columns = {k: _split_column(samples.get(k), k, n, device) for k in keys if k != IDS}
        payloads = [{k: parts[i] for k, parts in columns.items()} for i in range(n)]
        return Parsed(ids, payloads, True)
    if isinstance(samples, (str, bytes, Mapping)) or not isinstance(samples, Sequence):
        raise InvalidArgumentError(
            f"samples must be a list of mappings or a TensorDict of batch size [n], got {type(samples).__name__}"
        )
    ids, payloads = [], []
    for i, sample in enumerate(samples):
        where = f"samples[{i}]"
        if not isinstance(sample, (Mapping, TensorDictBase)):
            raise InvalidArgumentError(f"{where} must be a mapping of key -> tensor, got {type(sample).__name__}")
        if IDS not in sample.keys():  # noqa: SIM118 (a TensorDict refuses `in`)
            raise InvalidArgumentError(f"{where}: every sample needs an integer 'ids' key")
        ids.append(_as_id(sample[IDS], where))
        payloads.append({k: _tensor(v, k, where, device) for k, v in sample.items() if k != IDS})
    return Parsed(ids, payloads, False)


def check_schema(payloads: list[dict[str, torch.Tensor]], schema: Mapping[str, KeySpec]) -> dict[str, KeySpec]:
    """Check every tensor against ``schema`` (fixed by the first write of each key); return the new keys' specs.

    Raises:
        SchemaError: naming the key, what the buffer stores and what the write brought.
    """
    new: dict[str, KeySpec] = {}
    for i, payload in enumerate(payloads):
        for key, t in payload.items():
            spec = schema.get(key) or new.get(key)
            if spec is None:
                new[key] = KeySpec.of(t)
            elif t.dtype != spec.dtype or t.dim() != spec.ndim or (spec.ndim > 1 and t.shape[1:] != spec.trailing):
                raise SchemaError(
                    f"samples[{i}]: key '{key}' holds {spec.describe()} per sample, got "
                    f"{KeySpec.of(t).describe()} (shape {list(t.shape)})"
                )
    return new


def _column(parts: list[torch.Tensor], spec: KeySpec, device: torch.device) -> torch.Tensor:
    """One key of a batch: stacked ``[n, ...]`` when all samples share a shape, else jagged ``[n, j, ...]``."""
    if spec.ndim == 0:
        return torch.stack(parts).to(device)
    lengths = [t.shape[0] for t in parts]
    if min(lengths) == max(lengths):
        return torch.stack(parts).to(device)
    values = torch.cat(parts).to(device)
    offsets = torch.zeros(len(parts) + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor(lengths), 0, out=offsets[1:])
    # min/max seqlen cached on the tensor: to_padded_tensor pads to the longest, not to the packed total.
    quiet_fx_tracing_notice()
    return torch.nested.nested_tensor_from_jagged(
        values, offsets.to(device), min_seqlen=min(lengths), max_seqlen=max(lengths)
    )


#: The start of the line torch.fx logs once per process when its deprecated ``is_fx_tracing()`` is first called.
FX_TRACING_NOTICE = "is_fx_tracing will return true"


class _DropFxTracingNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(FX_TRACING_NOTICE)


@functools.cache
def quiet_fx_tracing_notice() -> None:
    """Keep torch's ``W... is_fx_tracing will return true ...`` line off the user's terminal.

    ``torch.nested.nested_tensor_from_jagged`` (our jagged batches) calls torch.fx's deprecated
    ``is_fx_tracing()``, whose first call per process logs that notice, meant for code that traces (torch
    2.6+). The notice is printed by a cached function: calling it once here, with only that message
    filtered out of its logger, leaves nothing to print later. Every other record of the logger passes;
    a torch without that function is left alone."""
    try:
        from torch.fx import _symbolic_trace

        notice = _symbolic_trace.is_fx_tracing_warning
    except (ImportError, AttributeError):
        return
    logger = logging.getLogger(_symbolic_trace.__name__)
    drop = _DropFxTracingNotice()
    logger.addFilter(drop)
    try:
        notice()
    finally:
        logger.removeFilter(drop)


def gather(
    ids: torch.Tensor,
    payloads: list[dict[str, torch.Tensor]],
    keys: Sequence[str],
    schema: Mapping[str, KeySpec],
    device: torch.device,
) -> TensorDict:
    """A TensorDict of batch size ``[n]`` on ``device``: ``ids`` (int64) and ``keys`` (fresh copies, never views)."""
    out = {IDS: ids.to(device, copy=True)}
    for key in keys:
        if key != IDS:
            out[key] = _column([p[key] for p in payloads], schema[key], device)
    return TensorDict(out, batch_size=[len(payloads)], device=device)
