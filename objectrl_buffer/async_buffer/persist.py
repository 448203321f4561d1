"""Saving and loading an AsyncSequenceBuffer: every entry not yet freed, its keys, birth and read bits.

One file, written atomically (:func:`~objectrl_buffer.checkpoint.io.atomic_write`): a magic line, the length
and crc32 of a JSON header, the header (consumers, ``max_size``, the key schema, payload length and crc32),
then the tensors, written by ``torch.save`` and read back with ``weights_only=True`` (never unpickled).
Per key, the samples holding it are packed into one ``values`` tensor (concatenated along the sequence
dimension) with their ``lengths`` and a ``present`` mask over the saved entries; a key of
:class:`~objectrl_buffer.async_buffer.sequences.Sequences` adds ``counts`` (sequences per entry) and
``seqlens`` (all lengths, flat), and a metadata-only key has no ``values``. Int ids are int64 tensors; str
ids (the only other ids a file holds) are JSON lists in the header. Files without these fields (written
before them) load as before.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from objectrl_buffer.async_buffer.consumer import IDS
from objectrl_buffer.async_buffer.samples import KeySpec, Kind, Value
from objectrl_buffer.async_buffer.sequences import Sequences
from objectrl_buffer.checkpoint.io import atomic_write, open_regular, readinto_exact
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError, InvalidArgumentError

__all__ = ["pack", "unpack", "Unpacked", "save_file", "load_file"]

MAGIC = b"objectrl_buffer async_buffer\n"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<QI")  # header length, header crc32
_MAX_HEADER = 64 << 20
_KINDS: dict[str, Kind] = {"tensor": "tensor", "sequences": "sequences", "lengths": "lengths"}


def pack(
    *,
    max_size: int,
    consumers: list[list[Any]],
    slots: torch.Tensor,
    ids: list[Hashable],
    birth: torch.Tensor,
    read: torch.Tensor,
    payloads: list[dict[str, Value]],
    schema: dict[str, KeySpec],
    last_birth: int,
    consumed: list[Hashable],
    int_ids: bool,
) -> dict[str, Any]:
    """``{"header": JSON values, "tensors": name -> CPU tensor}``; ``payloads[i]`` is the entry in ``slots[i]``.

    Raises:
        InvalidArgumentError: ids that are neither ints nor str (a file holds no other ids).
    """
    keys = sorted(schema)
    tensors: dict[str, torch.Tensor] = {"slots": slots.clone(), "birth": birth.clone(), "read": read.clone()}
    id_lists: dict[str, list[Hashable]] = {}
    if int_ids:
        tensors["ids"] = torch.tensor(ids, dtype=torch.int64)
        tensors["consumed"] = torch.tensor(consumed, dtype=torch.int64)
    else:
        bad = [i for i in [*ids, *consumed] if type(i) is not str]
        if bad:
            raise InvalidArgumentError(f"save: ids {bad[:5]!r} cannot be saved: a checkpoint holds int or str ids only")
        id_lists = {"ids": ids, "consumed": consumed}
    for i, key in enumerate(keys):
        spec = schema[key]
        tensors[f"key{i}.present"] = torch.tensor([key in p for p in payloads], dtype=torch.bool)
        if spec.kind != "tensor":
            seqs: list[Sequences] = [p[key] for p in payloads if key in p]  # type: ignore[misc]
            tensors[f"key{i}.counts"] = torch.tensor([len(q.seqlens) for q in seqs], dtype=torch.int64)
            tensors[f"key{i}.seqlens"] = torch.tensor([n for q in seqs for n in q.seqlens], dtype=torch.int64)
            if spec.kind == "lengths":
                continue
            parts = [q.data.cpu() for q in seqs]  # type: ignore[union-attr]
        else:
            parts = [p[key].cpu() for p in payloads if key in p]  # type: ignore[union-attr]
        if spec.ndim == 0:
            tensors[f"key{i}.values"] = torch.stack(parts) if parts else torch.empty(0, dtype=spec.dtype)
        else:
            empty = torch.empty((0, *spec.trailing), dtype=spec.dtype)
            tensors[f"key{i}.values"] = torch.cat(parts) if parts else empty
            tensors[f"key{i}.lengths"] = torch.tensor([t.shape[0] for t in parts], dtype=torch.int64)
    header = {
        "format": "objectrl_buffer.async_buffer",
        "version": FORMAT_VERSION,
        "max_size": max_size,
        "consumers": consumers,
        "keys": [
            [k, str(schema[k].dtype).removeprefix("torch."), schema[k].ndim, list(schema[k].trailing)]
            + ([schema[k].kind] if schema[k].kind != "tensor" else [])
            for k in keys
        ],
        "size": len(payloads),
        "last_birth": last_birth,
        **({"str_ids": id_lists} if id_lists else {}),
    }
    return {"header": header, "tensors": tensors}


def save_file(state: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``state`` (from :func:`pack`) to ``path`` atomically, the header and the tensors each with a crc32."""
    stream = io.BytesIO()
    torch.save(state["tensors"], stream)
    payload = stream.getbuffer()
    header = dict(state["header"], payload_nbytes=len(payload), payload_crc32=zlib.crc32(payload))
    head = json.dumps(header).encode()

    def write(f: Any) -> None:
        f.write(MAGIC)
        f.write(_PREFIX.pack(len(head), zlib.crc32(head)))
        f.write(head)
        f.write(payload)

    atomic_write(os.fspath(path), write)


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and verify a file written by :func:`save_file`: ``{"header": ..., "tensors": ...}``.

    Raises:
        CheckpointNotFoundError: ``path`` does not exist.
        CheckpointError: not such a file, truncated, a checksum that differs, or tensors that do not load.
    """
    source = os.fspath(path)
    try:
        fd = open_regular(source)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"async buffer checkpoint '{source}' does not exist") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read '{source}': {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "rb", buffering=0) as f:
            total = os.fstat(f.fileno()).st_size
            fixed = bytearray(len(MAGIC) + _PREFIX.size)
            readinto_exact(f, memoryview(fixed), source)
            if bytes(fixed[: len(MAGIC)]) != MAGIC:
                raise CheckpointError(f"'{source}' is not an async buffer checkpoint (no magic line)")
            head_len, head_crc = _PREFIX.unpack(fixed[len(MAGIC) :])
            if head_len > min(_MAX_HEADER, total):
                raise CheckpointError(f"'{source}': header length {head_len} exceeds the file")
            head = bytearray(head_len)
            readinto_exact(f, memoryview(head), source)
            if zlib.crc32(head) != head_crc:
                raise CheckpointError(f"'{source}': the header's crc32 differs: the file is corrupt")
            try:
                header = json.loads(head)
                nbytes, crc = int(header["payload_nbytes"]), int(header["payload_crc32"])
            except (ValueError, KeyError, TypeError, RecursionError) as exc:
                raise CheckpointError(f"'{source}': the header is not valid: {exc}") from None
            if not isinstance(header, dict) or len(fixed) + head_len + nbytes != total:
                raise CheckpointError(f"'{source}' is {total} bytes, its header describes another size: truncated?")
            payload = bytearray(nbytes)
            readinto_exact(f, memoryview(payload), source)
    except OSError as exc:
        raise CheckpointError(f"cannot read '{source}': {exc.strerror or exc}") from exc
    if zlib.crc32(payload) != crc:
        raise CheckpointError(f"'{source}': the tensors' crc32 differs: the file is corrupt")
    try:
        tensors = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refuses anything but tensors and plain containers
        raise CheckpointError(f"'{source}': the tensors do not load: {exc}") from exc
    return {"header": header, "tensors": tensors}


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise CheckpointError(f"async buffer state does not fit: {problem}")


def _tensor(tensors: dict[str, Any], name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    t = tensors.get(name)
    _require(isinstance(t, torch.Tensor) and not t.is_nested, f"tensor '{name}' is missing")
    assert isinstance(t, torch.Tensor)
    _require(
        t.dtype == dtype and tuple(t.shape) == shape,
        f"tensor '{name}' is {t.dtype} {list(t.shape)}, expected {dtype} {list(shape)}",
    )
    return t


def _schema(raw: Any) -> dict[str, KeySpec]:
    _require(isinstance(raw, list), "header 'keys' is not a list")
    schema = {}
    for item in raw:
        ok = isinstance(item, list) and len(item) in (4, 5) and isinstance(item[0], str) and isinstance(item[1], str)
        _require(ok and isinstance(item[2], int) and isinstance(item[3], list), f"header key entry {item!r}")
        kind = item[4] if len(item) == 5 else "tensor"
        _require(kind in _KINDS, f"key '{item[0]}' has an unknown kind {kind!r}")
        dtype = getattr(torch, item[1], None)
        _require(isinstance(dtype, torch.dtype), f"key '{item[0]}' has an unknown dtype {item[1]!r}")
        trailing = tuple(item[3])
        _require(
            all(isinstance(d, int) and d >= 0 for d in trailing)
            and item[2] == len(trailing) + (item[2] > 0)
            and item[2] >= 0,
            f"key '{item[0]}' has a bad shape {item[2:]}",
        )
        assert isinstance(dtype, torch.dtype)
        schema[item[0]] = KeySpec(dtype, item[2], trailing, _KINDS[kind])
    _require(IDS not in schema, "'ids' is stored as a key")
    return schema


@dataclass
class Unpacked:
    """A checked state: ``payloads[i]`` (on the storing device) goes to ``slots[i]``."""

    slots: torch.Tensor
    ids: list[Hashable]
    birth: torch.Tensor
    read: torch.Tensor
    payloads: list[dict[str, Value]]
    schema: dict[str, KeySpec]
    last_birth: int
    consumed: list[Hashable]
    int_ids: bool


def unpack(
    state: dict[str, Any], *, max_size: int, consumers: list[list[Any]], storing_device: torch.device
) -> Unpacked:
    """Check ``state`` in full against a buffer of ``max_size`` and ``consumers``; return what to restore.

    Raises:
        CheckpointError: other consumers or ``max_size``, or tensors inconsistent with the header.
    """
    header, tensors = state.get("header"), state.get("tensors")
    _require(isinstance(header, dict) and isinstance(tensors, dict), "expected {'header': ..., 'tensors': ...}")
    assert isinstance(header, dict) and isinstance(tensors, dict)
    _require(
        header.get("format") == "objectrl_buffer.async_buffer" and header.get("version") == FORMAT_VERSION,
        f"format {header.get('format')!r} version {header.get('version')!r}",
    )
    _require(
        header.get("max_size") == max_size,
        f"saved with max_size {header.get('max_size')}, this buffer has max_size {max_size}",
    )
    _require(
        header.get("consumers") == consumers,
        f"saved with consumers {header.get('consumers')}, this buffer has {consumers}",
    )
    n, last_birth = header.get("size"), header.get("last_birth")
    _require(isinstance(n, int) and 0 <= n <= max_size and isinstance(last_birth, int), "size / last_birth")
    assert isinstance(n, int) and isinstance(last_birth, int)
    schema = _schema(header.get("keys"))
    slots = _tensor(tensors, "slots", torch.int64, (n,))
    birth = _tensor(tensors, "birth", torch.int64, (n,))
    read = _tensor(tensors, "read", torch.bool, (n, len(consumers)))
    ids, consumed = _ids(header, tensors, n)
    _require(bool(((slots >= 0) & (slots < max_size)).all()) and slots.unique().numel() == n, "slots")
    _require(len(set(ids)) == n and -1 not in ids, "ids are not unique")
    _require(bool((birth <= last_birth).all()), "a birth time is after last_birth")
    _require(not bool(read.all(1).any()) if n else True, "an entry read by every consumer")
    payloads: list[dict[str, Value]] = [{} for _ in range(n)]
    for i, (key, spec) in enumerate(schema.items()):
        present = _tensor(tensors, f"key{i}.present", torch.bool, (n,))
        held = int(present.sum())
        rows = present.nonzero().squeeze(1).tolist()
        if spec.kind != "tensor":
            _sequences(tensors, i, key, spec, held, rows, payloads, storing_device)
            continue
        if spec.ndim == 0:
            parts = _tensor(tensors, f"key{i}.values", spec.dtype, (held,)).unbind(0)
        else:
            lengths = _tensor(tensors, f"key{i}.lengths", torch.int64, (held,))
            _require(bool((lengths >= 0).all()), f"key '{key}' has negative lengths")
            values = _tensor(tensors, f"key{i}.values", spec.dtype, (int(lengths.sum()), *spec.trailing))
            parts = values.split(lengths.tolist())
        for row, part in zip(rows, parts, strict=True):
            payloads[row][key] = part.to(storing_device)
    return Unpacked(slots, ids, birth, read, payloads, schema, last_birth, consumed, "str_ids" not in header)


def _ids(header: dict[str, Any], tensors: dict[str, Any], n: int) -> tuple[list[Hashable], list[Hashable]]:
    """The stored ids ``[n]`` and the consumed ids: int64 tensors, or the header's str lists."""
    lists = header.get("str_ids")
    if lists is None:
        ids = _tensor(tensors, "ids", torch.int64, (n,))
        consumed = tensors.get("consumed")
        _require(
            isinstance(consumed, torch.Tensor) and consumed.dtype == torch.int64 and consumed.dim() == 1,
            "tensor 'consumed' is missing or not int64 [k]",
        )
        assert isinstance(consumed, torch.Tensor)
        return ids.tolist(), consumed.tolist()
    ok = isinstance(lists, dict) and all(
        isinstance(lists.get(k), list) and all(type(i) is str for i in lists[k]) for k in ("ids", "consumed")
    )
    _require(ok and len(lists["ids"]) == n, "header 'str_ids' is not {'ids': [n str], 'consumed': [str]}")
    return list(lists["ids"]), list(lists["consumed"])


def _sequences(
    tensors: dict[str, Any],
    i: int,
    key: str,
    spec: KeySpec,
    held: int,
    rows: list[int],
    payloads: list[dict[str, Value]],
    storing_device: torch.device,
) -> None:
    """Restore key ``i`` of :class:`Sequences` into ``payloads[rows[j]]``."""
    counts = _tensor(tensors, f"key{i}.counts", torch.int64, (held,))
    _require(bool((counts >= 1).all()), f"key '{key}' has an entry without sequences")
    seqlens = _tensor(tensors, f"key{i}.seqlens", torch.int64, (int(counts.sum()),))
    _require(bool((seqlens >= 0).all()), f"key '{key}' has negative sequence lengths")
    per_entry = seqlens.split(counts.tolist())
    if spec.kind == "lengths":
        for row, lengths in zip(rows, per_entry, strict=True):
            payloads[row][key] = Sequences(lengths.tolist())
        return
    totals = [int(x.sum()) for x in per_entry]
    lengths = _tensor(tensors, f"key{i}.lengths", torch.int64, (held,))
    _require(lengths.tolist() == totals, f"key '{key}': data lengths differ from the sums of its seqlens")
    values = _tensor(tensors, f"key{i}.values", spec.dtype, (sum(totals), *spec.trailing))
    for row, lens, part in zip(rows, per_entry, values.split(totals), strict=True):
        payloads[row][key] = Sequences(lens.tolist(), part.to(storing_device))
