"""Writes that cast or reshape without loss are stored (issue 9); every other write changes nothing (issue 10).

The rule (``objectrl_buffer.core.schema``): a value is stored when its dtype casts into the column's dtype
by ``torch.can_cast`` and, from an integer or bool source, every value survives the cast exactly; and
when its per-row shape differs from the column's only by dimensions of size 1.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.errors import CastWarning, SchemaError
from tests.support import assert_unchanged, snapshot

I64 = torch.int64


def buffer(first_x: Any, *, fast: bool = True, capacity: int = 2) -> ReplayBuffer:
    """A full buffer of ``capacity`` rows: ``other`` (float32 ()) written before ``x`` (schema of ``first_x``)."""
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=0)
    for i in range(capacity):
        x = first_x + i if isinstance(first_x, torch.Tensor) and first_x.dtype != torch.bool else first_x
        rb.add({"other": float(i), "x": x})
    if not fast:
        rb.engine.storage.fast = None
    return rb


def batch_of(value: Any, n: int = 3) -> Any:
    """``n`` copies of one row's value, stacked on a new leading dimension."""
    if isinstance(value, torch.Tensor):
        return torch.stack([value] * n)
    return np.stack([np.asarray(value)] * n)


# (first write of "x", a later value, what the column must hold for it)
ACCEPTED = {
    "dqn: int64 [1] into float32 ()": (torch.tensor(0.5), torch.tensor([3]), torch.tensor(3.0)),
    "float32 () into float32 [1]": (torch.zeros(1), torch.tensor(2.5), torch.tensor([2.5])),
    "float32 [1, 3] into float32 [3]": (torch.zeros(3), torch.ones(1, 3), torch.ones(3)),
    "float32 [3, 1] into float32 [1, 3]": (torch.zeros(1, 3), torch.arange(3.0).reshape(3, 1), torch.arange(3.0)[None]),
    "float64 into float32": (torch.zeros(2), torch.tensor([0.1, -2.0], dtype=torch.float64), torch.tensor([0.1, -2.0])),
    "int64 into int32 in range": (
        torch.zeros(2, dtype=torch.int32),
        torch.tensor([-(2**31), 2**31 - 1]),
        torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32),
    ),
    "int32 into int64": (torch.tensor(0), torch.tensor(-7, dtype=torch.int32), torch.tensor(-7)),
    "uint8 into int64": (torch.tensor(0), torch.tensor(255, dtype=torch.uint8), torch.tensor(255)),
    "bool into float32": (torch.tensor(0.0), torch.tensor(True), torch.tensor(1.0)),
    "int64 2**24 into float32": (torch.tensor(0.0), torch.tensor(2**24), torch.tensor(float(2**24))),
    "int64 2**40 into float32 (exact)": (torch.tensor(0.0), torch.tensor(2**40), torch.tensor(float(2**40))),
    "int64 into float64": (
        torch.tensor(0.0, dtype=torch.float64),
        torch.tensor(2**53),
        torch.tensor(float(2**53), dtype=torch.float64),
    ),
    "numpy int64 [1] into float32 ()": (torch.tensor(0.0), np.array([7]), torch.tensor(7.0)),
    "numpy float32 () into float32 [1]": (torch.zeros(1), np.float32(1.5), torch.tensor([1.5])),
    "numpy int64 into int32 in range": (
        torch.tensor(0, dtype=torch.int32),
        np.int64(-5),
        torch.tensor(-5, dtype=torch.int32),
    ),
    "python int into float32 [1]": (torch.zeros(1), 2**24, torch.tensor([float(2**24)])),
    "python int 2**100 into float64 (exact)": (
        torch.tensor(0.0, dtype=torch.float64),
        2**100,
        torch.tensor(2.0**100, dtype=torch.float64),
    ),
    "python bool into int64 [1, 1]": (torch.zeros(1, 1, dtype=I64), True, torch.ones(1, 1, dtype=I64)),
    "python float inf into float32 stays inf": (torch.tensor(0.0), float("inf"), torch.tensor(float("inf"))),
    "numpy float64 -inf into float16 stays -inf": (
        torch.zeros(2, dtype=torch.float16),
        np.array([-np.inf, 1.0]),
        torch.tensor([-np.inf, 1.0], dtype=torch.float16),
    ),
    "float32 into complex64": (
        torch.zeros(1, dtype=torch.complex64),
        torch.tensor([1.5]),
        torch.tensor([1.5 + 0j], dtype=torch.complex64),
    ),
}

# (first write of "x", a later value that must be refused, what the message says)
REFUSED = {
    "float32 1.0 into int64": (torch.tensor(0), torch.tensor(1.0), "float32"),
    "float32 [1] into int64 ()": (torch.tensor(0), torch.tensor([1.0]), "float32"),
    "numpy float64 1.0 into int64": (torch.tensor(0), np.float64(1.0), "float"),  # a Python float subclass
    "python float into int64": (torch.tensor(0), 1.0, "float"),
    "int64 into bool": (torch.tensor(False), torch.tensor(1), "int64"),
    "uint8 into bool": (torch.tensor(False), torch.tensor(1, dtype=torch.uint8), "uint8"),
    "float32 into bool": (torch.tensor(False), torch.tensor(1.0), "float32"),
    "python int into bool": (torch.tensor(False), 1, "int"),
    "complex64 into float32": (torch.tensor(0.0), torch.tensor(1 + 0j, dtype=torch.complex64), "complex64"),
    "[2] into [3]": (torch.zeros(3), torch.zeros(2), r"shape=\(2,\)"),
    "[3] into ()": (torch.tensor(0.0), torch.zeros(3), r"shape=\(3,\)"),
    "[3, 2] into [2, 3]": (torch.zeros(2, 3), torch.zeros(3, 2), r"shape=\(3, 2\)"),
    "[] numel 0 into ()": (torch.tensor(0.0), torch.zeros(0), r"shape=\(0,\)"),
    "python float into [3]": (torch.zeros(3), 1.0, "Python float"),
    "int64 2**24+1 into float32": (torch.tensor(0.0), torch.tensor(2**24 + 1), str(2**24 + 1)),
    "numpy int64 2**24+1 into float32": (torch.tensor(0.0), np.array([2**24 + 1]), str(2**24 + 1)),
    "python int 2**24+1 into float32": (torch.tensor(0.0), 2**24 + 1, str(2**24 + 1)),
    "python int 10**400 into float32": (torch.tensor(0.0), 10**400, "int"),
    "python float beyond float32": (torch.tensor(0.0), 1e300, "1e[+]300.*beyond float32's range"),
    "int64 min into float16 (overflow)": (
        torch.tensor(0.0, dtype=torch.float16),
        torch.tensor(-(2**63)),
        "-9223372036854775808",
    ),
    "int64 2**40 into int32": (torch.tensor(0, dtype=torch.int32), torch.tensor(2**40), str(2**40)),
    "numpy int64 2**40 into int32": (torch.tensor(0, dtype=torch.int32), np.int64(2**40), str(2**40)),
    "numpy int64 2**40+5 array into int32": (torch.zeros(1, dtype=torch.int32), np.array([2**40 + 5]), str(2**40 + 5)),
    "python int 2**40 into int32": (torch.tensor(0, dtype=torch.int32), 2**40, str(2**40)),
    "-1 into uint8": (torch.tensor(0, dtype=torch.uint8), torch.tensor(-1), "-1"),
    "numpy -1 into uint8": (torch.tensor(0, dtype=torch.uint8), np.array(-1), "-1"),
    "meta tensor": (torch.tensor(0.0), torch.tensor(1.0, device="meta"), "meta"),
}


def stored_x(rb: ReplayBuffer, slot: int) -> torch.Tensor:
    return rb.sample_by_index([slot])["x"][0]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
@pytest.mark.parametrize("case", ACCEPTED, ids=str)
def test_lossless_cast_or_reshape_is_stored(case: str, fast: bool) -> None:
    first, value, expected = ACCEPTED[case]
    rb = buffer(first, fast=fast)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CastWarning)
        rb.add({"other": 9.0, "x": value})
    got = stored_x(rb, 0)
    assert got.dtype == first.dtype and got.shape == first.shape
    assert torch.equal(got, expected)
    assert rb.sample_by_index([0])["other"].item() == 9.0
    if isinstance(value, (torch.Tensor, np.ndarray)):  # the same rule per row of a batch
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CastWarning)
            rb.add_batch({"other": np.arange(3.0), "x": batch_of(value)})
        for slot in range(2):
            assert torch.equal(stored_x(rb, slot), expected)
    rb.close()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
@pytest.mark.parametrize("case", REFUSED, ids=str)
def test_lossy_or_meaning_changing_write_is_refused_and_changes_nothing(case: str, fast: bool) -> None:
    first, value, says = REFUSED[case]
    rb = buffer(first, fast=fast)
    before = snapshot(rb)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CastWarning)  # a refused write warns about nothing
        with pytest.raises(SchemaError, match=f"key 'x'.*{says}"):
            rb.add({"other": 99.0, "x": value})
        assert_unchanged(rb, before)
        if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim >= 0 and case != "meta tensor":
            with pytest.raises(SchemaError, match="key 'x'"):
                rb.add_batch({"other": np.full(3, 99.0), "x": batch_of(value)})
            assert_unchanged(rb, before)
    rb.close()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "checked"])
def test_issue10_torn_rows(fast: bool) -> None:
    """The campaign's findings: each write used to store ``a`` and then fail on ``b``."""
    rb = ReplayBuffer("cpu", "cpu", 2, seed=0)
    rb.add({"a": 0.0, "b": 0.0})
    rb.add({"a": 1.0, "b": 1.0})
    if not fast:
        rb.engine.storage.fast = None
    before = snapshot(rb)
    for bad in (10**400, torch.tensor(5.0, device="meta")):
        with pytest.raises(SchemaError, match="key 'b'"):
            rb.add({"a": 99.0, "b": bad})
        assert_unchanged(rb, before)
    rb.close()

    rb = ReplayBuffer("cpu", "cpu", 2, seed=0)
    rb.add({"a": 0.0, "b": np.int32(0)})
    rb.add({"a": 1.0, "b": np.int32(1)})
    if not fast:
        rb.engine.storage.fast = None
    before = snapshot(rb)
    with pytest.raises(SchemaError, match="key 'b'"):
        rb.add({"a": 99.0, "b": np.int64(2**40)})
    assert_unchanged(rb, before)
    with pytest.raises(SchemaError, match=r"key 'b'.*1099511627781"):  # used to store 5 (wraparound)
        rb.add_batch({"a": np.array([99.0]), "b": np.array([2**40 + 5])})
    assert_unchanged(rb, before)
    rb.close()


def test_a_refused_numpy_dtype_stays_refused_on_the_fast_path() -> None:
    """The fast path caches its verdict per NumPy dtype; a cached "no" once read as "yes" (truncating 2.7 to 2)."""
    rb = buffer(torch.zeros(2, dtype=I64))
    before = snapshot(rb)
    for _ in range(2):
        with pytest.raises(SchemaError, match=r"key 'x'.*float64"):
            rb.add({"other": 99.0, "x": np.array([2.7, 3.5])})
        with pytest.raises(SchemaError, match=r"key 'x'.*float64"):
            rb.add_batch({"other": np.array([99.0]), "x": np.array([[2.7, 3.5]])})
        assert_unchanged(rb, before)
    rb.close()


def test_meta_tensor_in_a_first_write_is_refused() -> None:
    rb = ReplayBuffer("cpu", "cpu", 2, seed=0)
    with pytest.raises(SchemaError, match=r"key 'b'.*meta"):
        rb.add({"a": 1.0, "b": torch.tensor(5.0, device="meta")})
    assert rb.schema is None and len(rb) == 0
    rb.add({"a": 1.0, "b": 2.0})  # still usable
    assert rb.sample_all()["b"].tolist() == [2.0]
    rb.close()


# ---------------------------------------------------------------- CastWarning
def test_a_tensor_cast_or_reshape_warns_once_per_key_per_buffer() -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, seed=0)
    rb.add({"action": torch.tensor(0.5), "obs": torch.zeros(3)})
    with pytest.warns(CastWarning) as record:
        rb.add({"action": torch.tensor([1]), "obs": torch.zeros(3)})
        rb.add({"action": torch.tensor([2]), "obs": torch.zeros(3)})
        rb.add_batch({"action": torch.tensor([[3], [4]]), "obs": torch.zeros(2, 3)})
        rb.add({"action": torch.tensor(5.0), "obs": torch.zeros(1, 3)})  # another key: its own warning
        rb.reset()
        rb.add({"action": torch.tensor(0.5), "obs": torch.zeros(3)})
        rb.add({"action": torch.tensor([1]), "obs": torch.zeros(3)})  # warned before the reset: once per buffer
    assert [str(w.message).split(":")[0] for w in record] == ["key 'action'", "key 'obs'"]
    assert "a tensor of dtype=int64, shape=(1,) per row is stored as shape=(), dtype=float32" in str(record[0].message)
    assert "dtype=float32, shape=(1, 3) per row is stored as shape=(3,), dtype=float32" in str(record[1].message)
    assert all(w.filename == __file__ for w in record)  # points at the caller's line
    assert issubclass(CastWarning, UserWarning)
    rb.close()


def test_no_warning_for_numpy_and_python_numbers() -> None:
    rb = ReplayBuffer("cpu", "cpu", 8, seed=0)
    rb.add({"obs": np.zeros(3, np.float32), "reward": 0.0, "n": np.int32(1)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.add({"obs": np.ones(3), "reward": 1, "n": np.int64(2)})  # float64, int, int64: the gymnasium forms
        rb.add_batch({"obs": np.ones((2, 3)), "reward": np.arange(2), "n": np.arange(2)})
        rb.add({"obs": torch.ones(3), "reward": 2.0, "n": np.int32(3)})  # exact: no warning either
    assert rb.sample_all()["n"].tolist() == [1, 2, 0, 1, 3]
    rb.close()


def test_exact_tensors_still_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    rb = buffer(torch.zeros(3))
    calls = []
    real = rb.engine.storage.schema.check

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(rb.engine.storage.schema, "check", spy)
    rb.add({"other": 1.0, "x": torch.ones(3)})
    rb.add_batch({"other": torch.ones(2), "x": torch.ones(2, 3)})
    assert calls == []
    with pytest.warns(CastWarning):
        rb.add({"other": 1.0, "x": torch.ones(1, 3, dtype=torch.float64)})  # a cast: the checked path
    assert len(calls) == 1
    rb.close()


# ---------------------------------------------------------------- property: against a list of rows
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]
SHAPES = [(), (1,), (3,), (1, 3), (2, 1)]


def _np(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def reference_accepts(src: np.dtype, dst: np.dtype, values: np.ndarray) -> bool:
    """The rule in NumPy terms, value by value: only casts that lose nothing but float rounding."""
    if dst == src:
        return True
    if dst.kind == "b":
        return False
    if src.kind == "f":  # a finite value must stay finite in the column (as torch casts it)
        if dst.kind != "f":
            return False
        source = torch.from_numpy(np.array(values))
        narrowed = source.to(torch.from_numpy(np.empty(0, dst)).dtype)
        return not bool((torch.isfinite(source) & ~torch.isfinite(narrowed)).any())
    for v in values.ravel().tolist():  # an integer or bool source: every value must come back exactly
        if dst.kind in "iu":
            info = np.iinfo(dst)
            if not info.min <= v <= info.max:
                return False
        else:
            with np.errstate(over="ignore"):
                f = np.array(v).astype(dst)
            if not np.isfinite(f) or int(f) != v:
                return False
    return True


def cast(array: np.ndarray, dtype: torch.dtype) -> Any:
    """``array`` as a column of ``dtype`` holds it; a pair of candidates where NumPy and torch round differently."""
    with np.errstate(over="ignore"):
        by_numpy = array.astype(_np(dtype))
    if array.dtype == np.float64 and dtype == torch.float16:
        return by_numpy, torch.from_numpy(np.array(array)).to(dtype).numpy()
    return by_numpy


def same_meaning(written: tuple[int, ...], stored: tuple[int, ...]) -> bool:
    return [d for d in written if d != 1] == [d for d in stored if d != 1]


@st.composite
def value_of(draw: st.DrawFn, dtype: torch.dtype, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape))
    if dtype == torch.bool:
        return np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool).reshape(shape)
    if dtype.is_floating_point:
        floats = st.one_of(st.floats(-1e6, 1e6), st.sampled_from([1e300, -1e300, 65504.0, 2.0**24 + 1, 0.1]))
        with np.errstate(over="ignore"):  # 1e300 in float16/float32: inf
            return np.array(draw(st.lists(floats, min_size=n, max_size=n))).astype(_np(dtype)).reshape(shape)
    info = torch.iinfo(dtype)
    edges = [v for v in (2**24 + 1, 2**40 + 5, -1, int(info.min), int(info.max)) if info.min <= v <= info.max]
    ints = st.one_of(st.integers(max(-3, info.min), 3), st.integers(info.min, info.max), st.sampled_from(edges))
    return np.array(draw(st.lists(ints, min_size=n, max_size=n)), dtype=_np(dtype)).reshape(shape)


@st.composite
def write(draw: st.DrawFn, schema: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> tuple[str, dict, int]:
    method = draw(st.sampled_from(["add", "add_batch"]))
    rows = 1 if method == "add" else draw(st.integers(0, 3))
    data: dict[str, Any] = {}
    for key, (dtype, shape) in schema.items():
        src = draw(st.sampled_from([dtype, dtype, *DTYPES]))
        row_shape = draw(st.sampled_from([shape, shape, *SHAPES]))
        full = row_shape if method == "add" else (rows, *row_shape)
        array = draw(value_of(src, full))
        forms = ["tensor", "numpy", "python"] if method == "add" and not row_shape else ["tensor", "numpy"]
        form = draw(st.sampled_from(forms))
        data[key] = torch.from_numpy(array) if form == "tensor" else array.item() if form == "python" else array
    return method, data, rows


def raw(rb: ReplayBuffer) -> tuple:
    """Every stored byte and the counters."""
    columns = rb.engine.storage.columns
    return rb.pointer, rb.data_size, {k: c.view(torch.uint8).clone() for k, c in columns.items()}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_writes_against_a_list_of_rows(data: st.DataObject) -> None:
    keys = data.draw(st.integers(1, 3))
    schema = {f"k{i}": (data.draw(st.sampled_from(DTYPES)), data.draw(st.sampled_from(SHAPES))) for i in range(keys)}
    capacity = data.draw(st.integers(1, 4))
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=0)
    rb.add({k: torch.zeros(shape, dtype=dtype) for k, (dtype, shape) in schema.items()})
    if data.draw(st.booleans()):
        rb.engine.storage.fast = None  # the checked path only
    # the reference: the row stored in each slot (None: never written), and the ring pointer
    slots: list[dict[str, np.ndarray] | None] = [None] * capacity
    slots[0] = {k: np.zeros(shape, _np(d)) for k, (d, shape) in schema.items()}
    pointer = 1 % capacity
    for _ in range(data.draw(st.integers(1, 6))):
        method, values, n = data.draw(write(schema))
        accept = True
        for key, value in values.items():
            dtype, shape = schema[key]
            array = np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value)
            if isinstance(value, float):
                array = array.astype(np.float64)
            written = array.shape if method == "add" else array.shape[1:]
            if not same_meaning(written, shape) or not reference_accepts(array.dtype, _np(dtype), array):
                accept = False
        before = raw(rb)
        event(f"{method} {'accepted' if accept else 'refused'}")
        if accept:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                getattr(rb, method)(values)
            for r in range(n):
                row = {}
                for key, value in values.items():
                    dtype, shape = schema[key]
                    array = np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value)
                    one = array if method == "add" else array[r]
                    stored = cast(one, dtype)
                    row[key] = (
                        tuple(c.reshape(shape) for c in stored) if isinstance(stored, tuple) else stored.reshape(shape)
                    )
                if n - r <= capacity:
                    slots[pointer] = row
                pointer = (pointer + 1) % capacity
        else:
            with pytest.raises(SchemaError), warnings.catch_warnings():
                warnings.simplefilter("error", CastWarning)
                getattr(rb, method)(values)
            after = raw(rb)
            assert after[:2] == before[:2]
            assert all(torch.equal(after[2][k], before[2][k]) for k in before[2])
        assert rb.pointer == pointer
        assert rb.data_size == sum(s is not None for s in slots)
        got = rb.sample_by_index(range(rb.data_size))
        for slot in range(rb.data_size):
            for key in schema:
                want = slots[slot][key]
                if isinstance(want, tuple):  # float64 -> float16: NumPy rounds once, torch via float32
                    assert any(np.array_equal(got[key][slot].numpy(), w) for w in want), (slot, key)
                else:
                    assert np.array_equal(got[key][slot].numpy(), want), (slot, key)
    rb.close()
