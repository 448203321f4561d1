"""Samples in and batches out: splitting a put/amend into per-sample tensors, the key schema, and gathering.

A sample is a mapping ``key -> tensor`` plus its ``ids`` (an int64, or any other hashable such as a str). A key
holds per-sample tensors of one dtype and one trailing shape (``shape[1:]``); their first dimension (a
sequence length) may differ between samples. A key may instead hold :class:`~objectrl_buffer.async_buffer.
sequences.Sequences` (several sequences per sample, or only their lengths): its first write decides which.
Gathered batches stack keys whose samples share a shape and return the others as jagged nested tensors.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase

from objectrl_buffer.async_buffer.consumer import IDS
from objectrl_buffer.async_buffer.sequences import SEQLENS, Sequences
from objectrl_buffer.core.schema import without_data
from objectrl_buffer.errors import InvalidArgumentError, SchemaError
from objectrl_buffer.storage.torchrl_compat import jagged_view, new_tensordict

__all__ = ["KeySpec", "Parsed", "Value", "parse_samples", "check_schema", "gather"]

#: What a sample holds under a key: one sequence (a tensor), or several / only their lengths.
Value: TypeAlias = "torch.Tensor | Sequences"
#: ``tensor``: one tensor per sample; ``sequences``: :class:`Sequences` with data; ``lengths``: metadata only.
Kind = Literal["tensor", "sequences", "lengths"]


@dataclass(frozen=True)
class KeySpec:
    """What every sample's value of one key looks like: ``kind``, and for data its ``dtype``, ``ndim`` and
    ``trailing`` (``shape[1:]``); a ``lengths`` key (metadata only) records int64 ``()``."""

    dtype: torch.dtype
    ndim: int
    trailing: tuple[int, ...]
    kind: Kind = "tensor"

    @staticmethod
    def of(t: Value) -> KeySpec:
        if isinstance(t, Sequences):
            if t.data is None:
                return KeySpec(torch.int64, 0, (), "lengths")
            return KeySpec(t.data.dtype, t.data.dim(), tuple(t.data.shape[1:]), "sequences")
        return KeySpec(t.dtype, t.dim(), tuple(t.shape[1:]))

    def describe(self) -> str:
        if self.kind == "lengths":
            return "sequence lengths only (Sequences without data)"
        shape = "()" if self.ndim == 0 else "(L, " + ", ".join(map(str, self.trailing)) + ")"
        text = f"{str(self.dtype).removeprefix('torch.')} {shape}".replace(", )", ")")
        return f"Sequences of {text}" if self.kind == "sequences" else text


@dataclass
class Parsed:
    """A put or amend split per sample: ``ids[i]`` and ``payloads[i]`` (key -> value, without ``ids``)."""

    ids: list[Hashable]
    payloads: list[dict[str, Value]]
    same_keys: bool  # every sample has the same keys (a TensorDict): presence is one row for all


_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def _as_id(value: Any, where: str) -> Hashable:
    if type(value) is int or type(value) is str:  # the common cases, first: puts are per-sample Python work
        return value
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype not in _INT_DTYPES or without_data(value) is not None:
            raise InvalidArgumentError(f"{where}: 'ids' must be an integer, got a {value.dtype} tensor {value!r}")
        return int(value.item())
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if not isinstance(value, (bool, float, complex, np.generic, np.ndarray)) and value is not None:
        try:
            hash(value)
        except TypeError:
            pass
        else:
            return value
    raise InvalidArgumentError(
        f"{where}: 'ids' must be an integer or another hashable such as a str (not a bool, float or None), "
        f"got {value!r}"
    )


def _tensor(value: Any, key: str, where: str, device: torch.device) -> Value:
    """``value`` as a tensor (or :class:`Sequences`) on ``device``: a tensor already there is kept, not copied."""
    if (
        type(value) is torch.Tensor
        and value.layout == torch.strided
        and not value.requires_grad
        and value.device == device
    ):
        return value  # the common case, first
    if isinstance(value, Sequences):
        return value.to(device)
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return Sequences.from_nested(value).to(device)
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
        ids: list[Hashable] = []
        if n:
            raw = samples.get(IDS)
            if not isinstance(raw, torch.Tensor):  # non-tensor ids (str): a NonTensorStack, or a list
                listed = raw.tolist() if hasattr(raw, "tolist") else raw
                values = listed if isinstance(listed, list) and len(listed) == n else [listed] * n
                ids = [_as_id(v, f"samples[{i}]") for i, v in enumerate(values)]
                columns = {k: _split_column(samples.get(k), k, n, device) for k in keys if k != IDS}
                by_sample: list[dict[str, Value]] = [{k: parts[i] for k, parts in columns.items()} for i in range(n)]
                return Parsed(ids, by_sample, True)
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
        td_payloads: list[dict[str, Value]] = [{k: parts[i] for k, parts in columns.items()} for i in range(n)]
        return Parsed(ids, td_payloads, True)
    if isinstance(samples, (str, bytes, Mapping)) or not isinstance(samples, Sequence):
        raise InvalidArgumentError(
            f"samples must be a list of mappings or a TensorDict of batch size [n], got {type(samples).__name__}"
        )
    ids = []
    payloads: list[dict[str, Value]] = []
    on_cpu = device.type == "cpu"
    for i, sample in enumerate(samples):
        if type(sample) is dict and IDS in sample:  # the common case: no message strings, no ABC checks
            try:
                payload = {
                    k: v
                    if type(v) is torch.Tensor
                    and v.layout == torch.strided
                    and not v.requires_grad
                    and (v.is_cpu if on_cpu else v.device == device)
                    else _tensor(v, k, "", device)
                    for k, v in sample.items()
                    if k != IDS
                }
                sample_id = sample[IDS]
                ids.append(sample_id if type(sample_id) is int or type(sample_id) is str else _as_id(sample_id, ""))
            except (InvalidArgumentError, SchemaError):
                pass  # redone below, for a message that names the sample
            else:
                payloads.append(payload)
                continue
        where = f"samples[{i}]"
        if not isinstance(sample, (Mapping, TensorDictBase)):
            raise InvalidArgumentError(f"{where} must be a mapping of key -> tensor, got {type(sample).__name__}")
        if IDS not in sample.keys():  # noqa: SIM118 (a TensorDict refuses `in`)
            raise InvalidArgumentError(f"{where}: every sample needs an integer 'ids' key")
        ids.append(_as_id(sample[IDS], where))
        payloads.append({k: _tensor(v, k, where, device) for k, v in sample.items() if k != IDS})
    return Parsed(ids, payloads, False)


def check_schema(payloads: list[dict[str, Value]], schema: Mapping[str, KeySpec]) -> dict[str, KeySpec]:
    """Check every tensor against ``schema`` (fixed by the first write of each key); return the new keys' specs.

    Raises:
        SchemaError: naming the key, what the buffer stores and what the write brought.
    """
    new: dict[str, KeySpec] = {}
    known = dict(schema)
    for i, payload in enumerate(payloads):
        for key, t in payload.items():
            spec = known.get(key)
            if spec is None:
                if key == SEQLENS:
                    raise SchemaError(
                        f"samples[{i}]: key '{SEQLENS}' is reserved (a batch's lengths of Sequences keys)"
                    )
                new[key] = known[key] = KeySpec.of(t)
                continue
            if (  # the common case, first
                type(t) is torch.Tensor
                and spec.kind == "tensor"
                and t.dtype == spec.dtype
                and t.dim() == spec.ndim
                and (spec.ndim <= 1 or t.shape[1:] == spec.trailing)
            ):
                continue
            if isinstance(t, Sequences) or spec.kind != "tensor":
                if KeySpec.of(t) != spec:
                    raise SchemaError(
                        f"samples[{i}]: key '{key}' holds {spec.describe()} per sample, got {KeySpec.of(t).describe()}"
                    )
            elif t.dtype != spec.dtype or t.dim() != spec.ndim or (spec.ndim > 1 and t.shape[1:] != spec.trailing):
                raise SchemaError(
                    f"samples[{i}]: key '{key}' holds {spec.describe()} per sample, got "
                    f"{KeySpec.of(t).describe()} (shape {list(t.shape)})"
                )
    return new


def _column(parts: list[torch.Tensor], spec: KeySpec, device: torch.device) -> torch.Tensor:
    """One key of a batch: stacked ``[n, ...]`` when all samples share a shape, else jagged ``[n, j, ...]``."""
    if spec.ndim == 0:
        return _on(torch.stack(parts), device)
    lengths = [t.shape[0] for t in parts]
    if min(lengths) == max(lengths):
        return _on(torch.stack(parts), device)
    values = _on(torch.cat(parts), device)
    offsets = _on(torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64), device)
    # min/max seqlen cached on the tensor: to_padded_tensor pads to the longest, not to the packed total.
    return jagged(values, offsets, min(lengths), max(lengths))


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if t.device == device else t.to(device)


def jagged(values: torch.Tensor, offsets: torch.Tensor, min_seqlen: int, max_seqlen: int) -> torch.Tensor:
    """``torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=, max_seqlen=)``, ~10x cheaper.

    The public call goes through a view op's dispatch (~150 us a batch on CPU, the largest share of a
    ``get_batch`` in AReaL's pipeline, issue 26); the jagged tensor class built directly from the same
    values, offsets and cached min/max lengths is the same tensor (not a view of ``values``, which
    ``gather`` builds fresh anyway). A torch without those internals gets the public call.
    """
    fast = jagged_view(values, offsets, min_seqlen, max_seqlen)
    if fast is not None:
        return fast
    quiet_fx_tracing_notice()
    return torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=min_seqlen, max_seqlen=max_seqlen)


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


def _sequences_columns(
    parts: list[Sequences], key: str, spec: KeySpec, device: torch.device, out: dict[str, Any], lengths: dict[str, Any]
) -> None:
    """A :class:`Sequences` key of a batch: its packed data in ``out[key]`` (unless metadata only), and each
    entry's lengths in ``lengths[key]`` (int64 ``[n, k]``, or jagged ``[n, j]``)."""
    lengths[key] = _column([torch.tensor(p.seqlens, dtype=torch.int64) for p in parts], _LENGTHS, device)
    if spec.kind == "sequences":
        data = [p.data for p in parts]
        out[key] = _column(data, spec, device)  # type: ignore[arg-type]  # a sequences key always holds data


_LENGTHS = KeySpec(torch.int64, 1, ())


def _ids_column(ids: list[Hashable] | torch.Tensor, int_ids: bool, device: torch.device) -> Any:
    if isinstance(ids, torch.Tensor):
        return ids.to(device, torch.int64, copy=True)
    return torch.tensor(ids, dtype=torch.int64, device=device) if int_ids else NonTensorStack.from_list(ids)


def gather(
    ids: list[Hashable] | torch.Tensor,
    payloads: list[dict[str, Value]],
    keys: Sequence[str],
    schema: Mapping[str, KeySpec],
    device: torch.device,
    int_ids: bool = True,
) -> TensorDict:
    """A TensorDict of batch size ``[n]`` on ``device``: ``ids`` and ``keys`` (fresh copies, never views).

    ``ids`` is int64 ``[n]`` when the buffer's ids are ints (``int_ids``), else a ``NonTensorStack`` of them.
    A :class:`Sequences` key adds its lengths under ``("seqlens", key)``; a metadata-only key only those.
    """
    n = len(payloads)
    out: dict[str, Any] = {IDS: _ids_column(ids, int_ids, device)}
    lengths: dict[str, Any] = {}
    for key in keys:
        if key == IDS:
            continue
        spec = schema[key]
        if spec.kind == "tensor":
            out[key] = _column([p[key] for p in payloads], spec, device)  # type: ignore[misc]
        else:
            _sequences_columns([p[key] for p in payloads], key, spec, device, out, lengths)  # type: ignore[misc]
    size = torch.Size([n])
    if lengths:  # every value was just built here with batch size [n] on device: no need to check them again
        out[SEQLENS] = new_tensordict(lengths, size, device, nested=False)
    return new_tensordict(out, size, device, nested=False)
