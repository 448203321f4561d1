"""Checkpoints of compact pixel buffers (``next_of``/``frame_stack``): saved compact, loaded into either form.

A full checkpoint (or state dict) of a compact buffer holds its other keys as ordinary columns, and the
frames, the side pool and the per-row links as extra arrays under ``"compact.*"`` (the extra-state format
of :mod:`~objectrl_buffer.checkpoint.extras`): its size is about the unique frames, not a stack per row.
Only the frames written so far and the rows held are saved.

:func:`convert` makes what a load read fit the buffer that adopts it, before anything of the buffer changes:

* compact checkpoint -> compact buffer with the same claims: the saved frames and links are adopted;
* compact checkpoint -> plain buffer (or other claims): every row is rebuilt (bit for bit) into a plain
  storage (and then, for other claims, written into a new compact one);
* plain checkpoint (every checkpoint written before compact storage existed) -> compact buffer: the rows
  are written oldest first into a new compact storage, which checks the claims on them: rows that break
  them are refused with a ``CheckpointError`` naming the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import torch

from objectrl_buffer.checkpoint.extras import own
from objectrl_buffer.checkpoint.generations import Restored
from objectrl_buffer.checkpoint.manifest import ExtraValue
from objectrl_buffer.core.schema import Field, Schema
from objectrl_buffer.errors import CheckpointError, SchemaError
from objectrl_buffer.storage.compact import CompactSpec, CompactStorage
from objectrl_buffer.storage.table import TransitionStorage

__all__ = ["NAME", "CompactSettings", "saved_state", "convert", "settings"]

#: The owner prefix of a compact checkpoint's extra arrays and values.
NAME = "compact"


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"bad dtype {name!r} in a compact checkpoint")
    return dtype


def saved_state(storage: CompactStorage, rows: int) -> tuple[dict[str, torch.Tensor], dict[str, ExtraValue]]:
    """The ``"compact.*"`` extra arrays and values of ``storage`` (``rows``: the rows held, slots ``0 ..
    rows-1``); references where possible, nothing written."""
    schema = storage.schema
    assert schema is not None
    streams = list(storage.streams.values())
    fields = [
        {"key": f.key, "shape": list(f.shape), "dtype": str(f.dtype).removeprefix("torch."), "at": i}
        for i, f in enumerate(schema.fields)
        if f.key in storage.virtual
    ]
    spec = {"next_of": dict(storage.spec.next_of), "frame_stack": dict(storage.spec.frame_stack)}
    arrays: dict[str, torch.Tensor] = {"step": storage.step[:rows], "last_ended": storage.last_ended}
    values: dict[str, ExtraValue] = {
        "steps": storage.steps,
        "spec": json.dumps(spec, sort_keys=True),
        "fields": json.dumps(fields),
        "streams": json.dumps([s.key for s in streams]),
    }
    written = min(storage.steps + 1, streams[0].span if streams else 0) * storage.num_envs
    for i, s in enumerate(streams):
        pool, last_steps, tail = s.pool.state()
        arrays.update(
            {
                f"{i}.frames": s.flat[:written],
                f"{i}.anchor": s.anchor[:rows],
                f"{i}.distance": s.distance[:rows],
                f"{i}.next_link": s.next_link[:rows],
                f"{i}.carry_id": s.carry_id,
                f"{i}.carry_step": s.carry_step,
                f"{i}.pool": pool,
                f"{i}.pool_last": torch.tensor(last_steps, dtype=torch.int64),
            }
        )
        values[f"{i}.pool_tail"] = tail
    return {f"{NAME}.{k}": v for k, v in arrays.items()}, {f"{NAME}.{k}": v for k, v in values.items()}


def settings(values: Mapping[str, ExtraValue]) -> dict[str, Any]:
    """``next_of``/``frame_stack`` of a compact checkpoint's values (``from_checkpoint`` builds the buffer
    with them), or nothing for a plain checkpoint."""
    raw = values.get("spec")
    if not isinstance(raw, str):
        return {}
    spec = json.loads(raw)
    return {"next_of": spec["next_of"] or None, "frame_stack": spec["frame_stack"] or None}


class CompactSettings:
    """For ``from_checkpoint`` (a buffer class's ``extra_state_types``): a compact checkpoint's claims
    become the new buffer's ``next_of``/``frame_stack`` unless given."""

    name = NAME

    @staticmethod
    def settings(values: Mapping[str, ExtraValue], folder: str | None) -> dict[str, Any]:
        return settings(values)


def _adopt_saved(
    table: TransitionStorage, arrays: Mapping[str, torch.Tensor], values: Mapping[str, ExtraValue], make: Any
) -> CompactStorage:
    """A compact storage (built by ``make(spec)``) holding the saved frames and links over ``table``."""
    spec_raw = values["spec"]
    assert isinstance(spec_raw, str)
    raw = json.loads(spec_raw)
    spec = CompactSpec.build(raw["next_of"], raw["frame_stack"])
    assert spec is not None and table.schema is not None
    fields = list(table.schema.fields)
    fields_raw = values["fields"]
    assert isinstance(fields_raw, str)
    for f in json.loads(fields_raw):
        fields.insert(f["at"], Field(f["key"], torch.Size(f["shape"]), _dtype(f["dtype"])))
    schema = Schema(fields)
    storage: CompactStorage = make(spec)
    storage.initialize(schema, {f.key: torch.zeros(f.shape, dtype=f.dtype) for f in fields}, table=table)
    device = storage.device
    rows = arrays["step"].shape[0]
    storage.step[:rows] = arrays["step"].to(device)
    storage.last_ended.copy_(arrays["last_ended"].to(device))
    steps = values["steps"]
    assert isinstance(steps, int)
    storage.steps = steps
    streams_raw = values["streams"]
    assert isinstance(streams_raw, str)
    for i, key in enumerate(json.loads(streams_raw)):
        s = storage.streams[key]
        frames = arrays[f"{i}.frames"]
        s.frames.reserve_rows(frames.shape[0])
        s.flat[: frames.shape[0]] = frames.to(device)
        for name in ("anchor", "distance", "next_link"):
            getattr(s, name)[:rows] = arrays[f"{i}.{name}"].to(device)
        s.carry_id.copy_(arrays[f"{i}.carry_id"].to(device))
        s.carry_step.copy_(arrays[f"{i}.carry_step"].to(device))
        tail = values[f"{i}.pool_tail"]
        assert isinstance(tail, int)
        s.pool.restore(arrays[f"{i}.pool"].to(device), arrays[f"{i}.pool_last"].tolist(), tail)
    return storage


def _plain(storage: CompactStorage, rows: int, directory: Any) -> TransitionStorage:
    """Every row of ``storage`` (slots ``0 .. rows-1``) rebuilt into a plain storage."""
    schema = storage.schema
    assert schema is not None
    plain = TransitionStorage(storage.capacity, storage.device, directory)
    plain.initialize(schema, {f.key: torch.zeros(f.shape, dtype=f.dtype) for f in schema.fields})
    values = storage.gather(torch.arange(rows, device=storage.device))
    plain.write_rows(0, [(f, values[f.key]) for f in schema.fields], first=0, n=rows)
    return plain


def _compact(plain: TransitionStorage, restored: Restored, make: Any, spec: CompactSpec) -> CompactStorage:
    """The rows ``plain`` holds, written oldest first into a new compact storage (which checks them)."""
    schema = plain.schema
    assert schema is not None
    storage: CompactStorage = make(spec)
    storage.initialize(schema, {f.key: torch.zeros(f.shape, dtype=f.dtype) for f in schema.fields})
    capacity, held = restored.buffer_size, restored.data_size - restored.phantom
    oldest = (restored.pointer - held) % capacity
    order = (torch.arange(held) + oldest) % capacity
    try:
        pairs = [(f, plain.columns[f.key].index_select(0, order.to(plain.device))) for f in schema.fields]
        storage.write_rows(oldest, pairs, first=0, n=held)
    except SchemaError as exc:
        storage.close()
        raise CheckpointError(f"'{restored.source}' cannot be loaded into this compact buffer: {exc}") from None
    return storage


def convert(restored: Restored, target: CompactSpec | None, make: Any, directory: Any) -> Restored:
    """``restored`` with its storage in the form of the buffer adopting it (see the module docs).

    ``target``: that buffer's claims (``None``: a plain buffer); ``make(spec)``: a new empty compact
    storage of the buffer's capacity, device and envs. The storage ``restored`` held is closed when replaced.

    Raises:
        CheckpointError: naming the checkpoint, a plain checkpoint's rows break the buffer's claims.
    """
    table = restored.storage
    if table is None or table.schema is None:
        return restored
    arrays = own(NAME, restored.extra_arrays)
    values = own(NAME, restored.extra_values)
    if not arrays and target is None:
        return restored
    rows = restored.data_size
    made: list[Any] = []
    try:
        if arrays:
            saved = _adopt_saved(table, arrays, values, make)
            made.append(saved)
            if target is not None and saved.spec == target:
                return dataclasses.replace(restored, storage=saved)  # type: ignore[arg-type]
            plain = _plain(saved, rows, directory)
            made.append(plain)
            if target is None:
                saved.close()
                return dataclasses.replace(restored, storage=plain)
            result = _compact(plain, restored, make, target)
            saved.close()
            plain.close()
        else:
            assert target is not None
            result = _compact(table, restored, make, target)
            table.close()
    except BaseException:
        for storage in made:
            storage.close()
        raise
    return dataclasses.replace(restored, storage=result)  # type: ignore[arg-type]
