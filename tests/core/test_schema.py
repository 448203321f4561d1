"""schema: inference from a first write, checks of later writes, the dtype rule, nested keys, 'index'."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer.core.schema import INDEX_KEY, Field, Schema, format_key, leaves, require_mapping
from objectrl_buffer.errors import InvalidArgumentError, SchemaError
from tests.support import objectrl_batch, objectrl_transition


def test_infer_from_an_objectrl_transition() -> None:
    schema, values = Schema.infer(objectrl_transition(2), batch_dims=0)
    by_key = {f.key: (tuple(f.shape), f.dtype) for f in schema.fields}
    assert by_key == {
        "state": ((4,), torch.float32),
        "action": ((2,), torch.float32),
        "reward": ((), torch.float32),
        "next_state": ((4,), torch.float32),
        "terminated": ((), torch.float32),
        "truncated": ((), torch.float32),
        "step": ((), torch.int64),
    }
    assert set(values) == set(by_key) and values["step"].item() == 2


def test_infer_from_a_mapping_of_numbers_arrays_and_nesting() -> None:
    readonly = np.zeros(3, dtype=np.float32)
    readonly.flags.writeable = False
    data = {"obs": {"pixels": np.zeros((2, 2), np.uint8), "vec": readonly}, "r": 1.0, "n": 3, "d": True, "index": 9}
    schema, values = Schema.infer(data, batch_dims=0)
    got = {f.key: (tuple(f.shape), f.dtype) for f in schema.fields}
    assert got == {
        ("obs", "pixels"): ((2, 2), torch.uint8),
        ("obs", "vec"): ((3,), torch.float32),
        "r": ((), torch.float32),
        "n": ((), torch.int64),
        "d": ((), torch.bool),
    }
    assert INDEX_KEY not in values
    assert values[("obs", "vec")].tolist() == [0, 0, 0]


def test_infer_a_batch_uses_the_row_shape() -> None:
    schema, values = Schema.infer(objectrl_batch(0, 5), batch_dims=1)
    assert schema.by_key["state"].shape == (4,) and schema.by_key["reward"].shape == ()
    assert values["state"].shape == (5, 4)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"a": torch.zeros(3), "b": torch.zeros(2)}, "same number of rows"),
        ({"a": torch.zeros(3), "b": 1.0}, "'b'.*leading batch dimension"),
        ({}, "at least one key"),
        ({"index": torch.arange(3)}, "at least one key"),
    ],
)
def test_infer_refuses_bad_batches(data: dict[str, Any], match: str) -> None:
    with pytest.raises(SchemaError, match=match):
        Schema.infer(data, batch_dims=1)


def test_row_bytes_equality_and_repr() -> None:
    a = Schema([Field("x", torch.Size([3]), torch.float32), Field(("o", "p"), torch.Size([2, 2]), torch.uint8)])
    b = Schema([Field("x", torch.Size([3]), torch.float32), Field(("o", "p"), torch.Size([2, 2]), torch.uint8)])
    assert a.fields[0].row_bytes == 12 and a.row_bytes == 16
    assert a == b and hash(a) == hash(b)
    assert a != Schema([Field("x", torch.Size([3]), torch.float64)])
    assert "o.p: shape=(2, 2), dtype=uint8" in repr(a)


def test_format_key_and_leaves() -> None:
    assert format_key("state") == "state" and format_key(("obs", "pixels")) == "obs.pixels"
    td = TensorDict({"a": torch.zeros(1), "n": {"b": torch.ones(1), "index": torch.ones(1)}, "index": torch.ones(1)})
    assert sorted(map(str, (k for k, _ in leaves(td)))) == sorted(["a", str(("n", "b")), str(("n", "index"))])


def test_require_mapping() -> None:
    require_mapping({}, "add")
    require_mapping(TensorDict(), "add")
    with pytest.raises(InvalidArgumentError, match=r"add\(\) takes a TensorDict or a mapping.*list"):
        require_mapping([1], "add")


# ---------------------------------------------------------------- check
@pytest.fixture
def schema() -> Schema:
    return Schema.infer({"x": torch.zeros(2), "n": 0, "done": False, "u8": np.zeros(2, np.uint8)}, batch_dims=0)[0]


def test_check_returns_pairs_in_any_key_order(schema: Schema) -> None:
    pairs, n = schema.check({"done": True, "u8": np.ones(2, np.uint8), "n": 5, "x": torch.ones(2)}, batch_dims=0)
    assert n == 1
    assert {f.key: v for f, v in pairs}["n"] == 5
    assert {f.key for f, _ in pairs} == {"x", "n", "done", "u8"}


@pytest.mark.parametrize(
    ("changes", "ok"),
    [
        ({"x": np.ones(2, np.float64)}, True),  # float64 -> float32: same kind
        ({"x": [1, 2]}, True),  # a list of ints into floats
        ({"x": 1.0}, False),  # a number for a vector
        ({"n": 2.0}, False),  # float -> int
        ({"n": np.int32(2)}, True),
        ({"n": np.float64(2.0)}, False),
        ({"n": True}, True),  # bool -> int is safe
        ({"done": 1}, False),  # int -> bool is not
        ({"done": np.bool_(True)}, True),
        ({"u8": np.ones(2, np.int64)}, True),  # int64 -> uint8: same kind
        ({"u8": np.ones(2, np.float32)}, False),
        ({"x": torch.ones(2, dtype=torch.float64)}, True),  # tensors too cast when nothing is lost
        ({"n": torch.tensor(2, dtype=torch.int32)}, True),
        ({"n": torch.tensor(2.0)}, False),  # float -> int, even 2.0
        ({"x": torch.ones(2, dtype=torch.complex64)}, False),  # complex -> real
        ({"x": torch.ones(1, 2)}, True),  # differs by a size-1 dimension
        ({"x": torch.ones(2, 1)}, True),
        ({"x": torch.ones(3)}, False),
    ],
)
def test_dtype_and_shape_rule_for_a_row(schema: Schema, changes: dict[str, Any], ok: bool) -> None:
    data: dict[str, Any] = {"x": torch.zeros(2), "n": 0, "done": False, "u8": np.zeros(2, np.uint8), **changes}
    if ok:
        schema.check(data, batch_dims=0)
    else:
        key = next(iter(changes))
        with pytest.raises(SchemaError, match=f"key '{key}'"):
            schema.check(data, batch_dims=0)


def test_check_batch_counts_rows(schema: Schema) -> None:
    batch = {
        "x": torch.zeros(6, 2),
        "n": np.arange(6),
        "done": torch.zeros(6, dtype=torch.bool),
        "u8": np.zeros((6, 2)),
    }
    with pytest.raises(SchemaError, match=r"'u8'.*cannot be cast"):  # float64 array into uint8
        schema.check(batch, batch_dims=1)
    batch["u8"] = np.zeros((6, 2), np.uint8)
    assert schema.check(batch, batch_dims=1)[1] == 6
    empty = {k: v[:0] for k, v in batch.items()}
    assert schema.check(empty, batch_dims=1)[1] == 0


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"extra": 1}, "'extra' is not in the stored schema"),
        ({"x": None}, r"missing key\(s\) \['x'\]"),
        ({"n": np.arange(7)}, "'n' has 7 rows but an earlier key has 6"),
        ({"x": torch.zeros(6, 3)}, r"'x'.*batch shape=\(6, 3\)"),
    ],
)
def test_check_batch_errors(schema: Schema, changes: dict[str, Any], match: str) -> None:
    batch: dict[str, Any] = {
        "x": torch.zeros(6, 2),
        "n": np.arange(6),
        "done": np.zeros(6, bool),
        "u8": np.zeros((6, 2), np.uint8),
    }
    for key, value in changes.items():
        if value is None:
            del batch[key]
        else:
            batch[key] = value
    with pytest.raises(SchemaError, match=match):
        schema.check(batch, batch_dims=1)


def test_check_ignores_index(schema: Schema) -> None:
    pairs, _ = schema.check({"x": torch.zeros(2), "n": 0, "done": False, "u8": [0, 0], "index": 7}, batch_dims=0)
    assert len(pairs) == 4


@pytest.mark.parametrize("first", [True, False])
def test_non_numeric_value_raises_schema_error_naming_the_key(first: bool) -> None:
    from objectrl_buffer import ReplayBuffer

    rb = ReplayBuffer("cpu", "cpu", 4)
    if not first:
        rb.add({"state": torch.zeros(2), "note": 1})
    with pytest.raises(SchemaError, match="note"):
        rb.add({"state": torch.zeros(2), "note": "abc"})
    assert len(rb) == (0 if first else 1)
    rb.close()


# ---------------------------------------------------------------- the dtype a first write gives a float number
REWARD_FORMS = {
    "python float": lambda v: v,
    "numpy float64 scalar": np.float64,
    "0-d float64 array": lambda v: np.array(v, dtype=np.float64),
    "1-element list": lambda v: [v],
}


@pytest.mark.parametrize("form", list(REWARD_FORMS))
def test_a_float_reward_is_stored_in_torchs_default_dtype_whatever_its_form(form: str) -> None:
    schema, values = Schema.infer({"reward": REWARD_FORMS[form](0.1)}, batch_dims=0)
    assert schema.fields[0].dtype == torch.float32 and values["reward"].dtype == torch.float32
    assert values["reward"].reshape(()).item() == torch.tensor(0.1).item()  # rounded as a Python float is


@pytest.mark.parametrize(
    "batch", [[0.1, 0.2], np.array([0.1, 0.2]), [np.float64(0.1), np.float64(0.2)]], ids=["list", "array", "scalars"]
)
def test_a_batch_of_float_rewards_is_stored_as_single_ones_are(batch: Any) -> None:
    schema, _ = Schema.infer({"reward": batch}, batch_dims=1)
    assert schema.fields[0].dtype == torch.float32


def test_arrays_and_tensors_keep_their_dtype() -> None:
    write = {
        "obs": np.zeros(3),  # float64 observations (MuJoCo) stay float64: the caller decides
        "pixels": np.zeros((2, 2), dtype=np.uint8),
        "r16": np.float16(0.5),
        "exact": torch.tensor(0.1, dtype=torch.float64),
        "n": np.int64(3),
    }
    schema, _ = Schema.infer(write, batch_dims=0)
    assert {f.key: f.dtype for f in schema.fields} == {
        "obs": torch.float64,
        "pixels": torch.uint8,
        "r16": torch.float16,
        "exact": torch.float64,
        "n": torch.int64,
    }


def test_numbers_follow_torchs_default_dtype_when_it_is_changed() -> None:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for value in (0.1, np.float64(0.1), np.array(0.1)):
            assert Schema.infer({"reward": value}, batch_dims=0)[0].fields[0].dtype == torch.float64
    finally:
        torch.set_default_dtype(old)
