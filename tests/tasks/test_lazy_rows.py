"""Rows are kept as JSON text until first read (no Python objects per row at store time), and what comes back
is exactly the general path's JSON form: subclasses of str/int/float as the plain type, dict keys converted
as ``json`` converts them, the 64-level nesting limit unchanged; a row read twice is the same object."""

from __future__ import annotations

import enum
import gc
import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer.tasks import DataRow, Experience, ExpMeta, InMemoryStorage, QueryBuilder, TaskReplayBuffer, rows

from .test_fast_path import a_row, payloads, same


class Name(str):
    pass


class Level(enum.IntEnum):
    HIGH = 3


def stored(*data: DataRow) -> list[DataRow]:
    storage = InMemoryStorage(100)
    storage.add_batch(list(data))
    return storage.get_all()


@settings(max_examples=60, deadline=None)
@given(
    state=payloads(native_only=False),
    actions=payloads(native_only=True),
    messages=payloads(native_only=False),
    reward=st.one_of(st.none(), st.floats(), st.integers(), payloads(native_only=True)),
)
def test_rows_read_back_equal_the_general_path(state: Any, actions: Any, messages: Any, reward: Any) -> None:
    row = a_row(1, state, actions, reward, messages)
    (got,) = stored(row)
    assert same(got, rows.normalize_row(row)[0])


def test_subclasses_come_back_as_their_plain_json_types() -> None:
    state = {"name": Name("x"), "level": Level.HIGH, "f": np.float64(0.25), "flag": True, "big": 2**70}
    (got,) = stored(a_row(0, state, [Name("y")], None, None))
    assert same(got.exp_data.state, {"name": "x", "level": 3, "f": 0.25, "flag": True, "big": 2**70})
    assert same(got.exp_data.actions, ["y"])
    general = rows.normalize_row(a_row(0, state, None, None, None))[0]
    assert same(general.exp_data.state, got.exp_data.state)


def test_dict_keys_are_converted_as_json_converts_them() -> None:
    state = {2: "a", 1.5: "b", True: "c", None: "d", Name("k"): "e", math.inf: "f"}
    want = {"2": "a", "1.5": "b", "true": "c", "null": "d", "k": "e", "Infinity": "f"}
    (got,) = stored(a_row(0, state, None, None, None))
    assert same(got.exp_data.state, want)
    assert same(rows.normalize_row(a_row(0, state, None, None, None))[0].exp_data.state, want)
    with pytest.raises(TypeError, match=r"exp_data\.state"):
        stored(a_row(0, {(1, 2): "tuple key"}, None, None, None))


def nest(levels: int, leaf: Any = "[{") -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def test_nesting_limit_is_unchanged_whatever_the_strings_hold() -> None:
    (got,) = stored(a_row(0, nest(65), nest(3, "[[[[" * 40), None, None))  # 65 containers: the most there was
    assert got.exp_data.state == nest(65) and got.exp_data.actions == nest(3, "[[[[" * 40)
    storage = InMemoryStorage(10)
    with pytest.raises(TypeError, match="nested more than"):
        storage.add_batch([a_row(0, None, None, None, None), a_row(1, nest(66), None, None, None)])
    assert storage.size() == 0


def test_store_keeps_no_python_objects_per_row_until_read() -> None:
    data = [a_row(i, {"obs": f"o{i}"}, [{"tool": "search", "args": {"q": i}}], 0.5, None) for i in range(3000)]
    storage = InMemoryStorage(5000)
    gc.collect()
    before = len(gc.get_objects())
    storage.add_batch(data)
    gc.collect()
    assert len(gc.get_objects()) - before < 100  # was 5 tracked objects per row (3 dataclasses, list, dict)
    assert storage.size(QueryBuilder().eq("agent_id", "agent_1").build()) == 750  # queries need no rows
    first = storage.get_all()
    assert same(first, [rows.normalize_row(r)[0] for r in data])
    assert all(a is b for a, b in zip(first, storage.get_all(), strict=True))  # built once, then the same object


def test_ids_types_and_tensors_survive_and_ids_are_generated_once() -> None:
    meta = ExpMeta("t", "n", "a", 2, 1.5, "p")
    plain = DataRow(meta, Experience({"k": [1, 2.5, None]}, action="go", reward_t=1), id="given")
    no_id = DataRow(ExpMeta("t", "n", "a", 3, 2, None), Experience(), id=None)  # type: ignore[arg-type]
    tensor = DataRow(ExpMeta("t", "n", "a", 4, 3.0), Experience(torch.arange(3)))
    rb = TaskReplayBuffer()
    rb.store_batch([plain, no_id, tensor])
    a, b, c = rb.storage.get_all()
    assert same(a, plain) and a is not plain
    assert type(b.exp_meta.step) is int and type(b.exp_meta.execute_time) is int
    assert isinstance(b.id, str) and len(b.id) == 36 and rb.storage.get_all()[1].id == b.id
    assert torch.equal(c.exp_data.state, torch.arange(3))
    (task,) = rb.sample_task(batch_size=4)
    assert [r.id for r in task] == ["given", b.id, tensor.id]
