"""The CPU fast paths of add/add_batch/reads behave exactly like the full (checked) paths.

Reference model: a second buffer whose fast writer is switched off, so every write goes through
``Schema.check``. Same ops on both must give the same outcome (same exception class or none) and the
same stored rows. Plus the contract the fast paths must keep: samples never alias storage, reads see
the writes made just before, nothing is written when a write is rejected.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.errors import CastWarning, InvalidArgumentError, SchemaError

CAP = 7


def first_row() -> dict:
    return {"state": torch.zeros(3), "action": 0, "flag": False, "reward": 0.0}


def slow(rb: ReplayBuffer, method: str, data: object) -> None:
    """``rb.<method>(data)`` with the fast writer off: the full checked path."""
    rb.engine.storage.fast = None
    try:
        getattr(rb, method)(data)
    finally:
        rb.engine.storage.fast = None


def state(rb: ReplayBuffer) -> tuple:
    rows = rb.sample_all() if len(rb) else None
    return rb.pointer, rb.data_size, None if rows is None else {k: rows[k].clone() for k in list(rows.keys())}


def same_state(a: ReplayBuffer, b: ReplayBuffer) -> None:
    pa, sa, ra = state(a)
    pb, sb, rb_ = state(b)
    assert (pa, sa) == (pb, sb)
    if ra is not None:
        assert ra.keys() == rb_.keys()
        for key in ra:
            assert ra[key].dtype == rb_[key].dtype, key
            torch.testing.assert_close(ra[key], rb_[key], rtol=0, atol=0, equal_nan=True, msg=key)


# one value of each key in many forms: right, castable, wrong dtype, wrong shape, odd types
finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)
STATE = st.one_of(
    st.lists(finite, min_size=3, max_size=3).map(lambda v: torch.tensor(v, dtype=torch.float32)),
    st.lists(finite, min_size=3, max_size=3).map(lambda v: np.array(v, dtype=np.float64)),
    st.lists(finite, min_size=3, max_size=3).map(lambda v: np.array(v, dtype=np.float32)),
    st.lists(st.integers(-5, 5), min_size=3, max_size=3).map(lambda v: np.array(v, dtype=np.int32)),
    st.lists(finite, min_size=3, max_size=3).map(lambda v: torch.tensor(v, dtype=torch.float64)),
    st.lists(finite, min_size=2, max_size=4).map(lambda v: torch.tensor(v, dtype=torch.float32)),
    st.just(torch.zeros(2, 3)[:, 1]),  # non-contiguous, wrong shape
    st.just(torch.arange(9.0).reshape(3, 3)[:, 1]),  # non-contiguous, right shape
    finite,
)
ACTION = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(2**63, 2**70),  # does not fit int64
    st.integers(-3, 3).map(lambda v: torch.tensor(v)),
    st.integers(-3, 3).map(lambda v: np.int64(v)),
    st.integers(-3, 3).map(lambda v: np.int32(v)),
    st.booleans(),
    finite,
    st.just(torch.tensor(1.5)),
)
FLAG = st.one_of(st.booleans(), st.integers(0, 3), finite, st.just(torch.tensor(True)), st.just(np.bool_(True)))
REWARD = st.one_of(
    finite,
    st.integers(-10, 10),
    st.integers(2**24 - 2, 2**24 + 2),  # float32 holds them exactly only up to 2**24
    st.booleans(),
    finite.map(np.float32),
    finite.map(np.float64),
    st.sampled_from([math.inf, -math.inf, math.nan, 1e39, -1e39]),  # beyond float32's range: refused
    finite.map(lambda v: torch.tensor(v, dtype=torch.float32)),  # ObjectRL's TensorDict holds 0-d tensors
    finite.map(lambda v: torch.tensor(v, dtype=torch.float64)),
    finite.map(lambda v: torch.tensor([v], dtype=torch.float32)),  # [1] into a () column: a cast
    st.just(torch.tensor(1.0, requires_grad=True)),
)


@st.composite
def row(draw: st.DrawFn) -> object:
    data = {"state": draw(STATE), "action": draw(ACTION), "flag": draw(FLAG), "reward": draw(REWARD)}
    mutation = draw(st.sampled_from(["none", "none", "none", "missing", "extra", "index", "td"]))
    if mutation == "missing":
        del data["reward"]
    elif mutation == "extra":
        data["other"] = 1.0
    elif mutation == "index":
        data["index"] = 3
    elif mutation == "td":
        try:
            return TensorDict(data)
        except Exception:
            return data
    return data


@st.composite
def batch(draw: st.DrawFn) -> object:
    n = draw(st.integers(0, 2 * CAP + 1))
    m = draw(st.sampled_from([n, n, n, n + 1]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 1000)))
    data: dict[str, object] = {
        "state": torch.randn(n, 3, generator=g),
        "action": torch.randint(-5, 5, (m,), generator=g),
        "flag": torch.rand(n, generator=g) < 0.5,
        "reward": torch.randn(n, generator=g),
    }
    forms = ["tensor", "numpy", "float64", "td", "wrong_dtype", "wrong_shape", "missing", "index", "index_missing"]
    form = draw(st.sampled_from(forms))
    if form == "numpy":
        data = {k: v.numpy() for k, v in data.items()}  # type: ignore[union-attr]
    elif form == "float64":
        data["state"] = data["state"].double().numpy()  # type: ignore[union-attr]
    elif form == "td" and m == n:
        return TensorDict(data, batch_size=[n])
    elif form == "wrong_dtype":
        data["reward"] = data["reward"].double()  # type: ignore[union-attr]
    elif form == "wrong_shape":
        data["state"] = torch.zeros(n, 4)
    elif form == "missing":
        del data["flag"]
    elif form in ("index", "index_missing"):  # a sample written back carries "index": ignored
        data["index"] = torch.arange(draw(st.integers(0, n + 1)))
        if form == "index_missing":
            del data["reward"]
    return data


OPS = st.lists(st.one_of(row().map(lambda r: ("add", r)), batch().map(lambda b: ("add_batch", b))), max_size=25)


def outcome(fn: object) -> type[BaseException] | None:
    try:
        fn()  # type: ignore[operator]
    except Exception as exc:
        return type(exc)
    return None


@pytest.mark.filterwarnings("ignore::objectrl_buffer.errors.CastWarning")  # tensors of other dtypes are cast
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_fast_path_matches_checked_path(ops: list[tuple[str, object]]) -> None:
    fast = ReplayBuffer("cpu", "cpu", CAP, seed=0)
    ref = ReplayBuffer("cpu", "cpu", CAP, seed=0)
    fast.add(first_row())
    slow(ref, "add", first_row())
    assert fast.engine.storage.fast is not None
    for method, data in ops:
        got = outcome(lambda method=method, data=data: getattr(fast, method)(data))
        want = outcome(lambda method=method, data=data: slow(ref, method, data))
        assert got == want, (method, data)
        same_state(fast, ref)
    fast.close()
    ref.close()


@pytest.fixture
def rb() -> ReplayBuffer:
    buf = ReplayBuffer("cpu", "cpu", 50, seed=1)
    for i in range(30):
        buf.add({"state": torch.full((3,), float(i)), "action": i, "flag": i % 2 == 0, "reward": 0.5 * i})
    yield buf
    buf.close()


def test_fast_path_is_taken_for_plain_inputs(rb: ReplayBuffer, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("checked path used")

    monkeypatch.setattr(rb.engine.storage.schema, "check", refuse)
    rb.add({"state": np.ones(3, np.float32), "action": 1, "flag": True, "reward": 1.0})
    rb.add(TensorDict({"state": torch.ones(3), "action": 1, "flag": True, "reward": 1.0}))
    rb.add_batch({"state": torch.ones(4, 3), "action": torch.ones(4, dtype=torch.int64),
                  "flag": torch.ones(4, dtype=torch.bool), "reward": torch.ones(4)})  # fmt: skip
    rb.add_batch(rb.sample_batch(5))  # carries "index"
    rb.add(rb.sample_by_index(3)[0])
    assert len(rb) == 42


@pytest.mark.parametrize(
    "read",
    [
        lambda rb: rb.sample_batch(16),
        lambda rb: rb.sample_by_index([0, 3, 3, 29]),
        lambda rb: rb.sample_by_index_fields(range(5), ["state", "reward"]),
        lambda rb: rb.sample_all(),
        lambda rb: next(iter(rb.create_epoch_iterator(8))),
        lambda rb: next(iter(rb.create_epoch_iterator(8, shuffle=True))),
    ],
)
def test_samples_never_alias_storage(rb: ReplayBuffer, read: object) -> None:
    before = rb.sample_all()
    sample = read(rb)  # type: ignore[operator]
    for key in list(sample.keys()):
        sample[key].fill_(True if sample[key].dtype == torch.bool else 99)
    after = rb.sample_all()
    for key in list(before.keys()):
        assert torch.equal(before[key], after[key]), key


@pytest.mark.parametrize("form", ["dict", "numpy", "td"])
def test_reads_see_the_write_made_just_before(rb: ReplayBuffer, form: str) -> None:
    row = {"state": torch.tensor([1.0, 2.0, 3.0]), "action": 7, "flag": True, "reward": -2.5}
    data: object = row
    if form == "numpy":
        data = {**row, "state": row["state"].numpy()}
    elif form == "td":
        data = TensorDict(row)
    rb.add(data)
    got = rb.sample_by_index([rb.pointer - 1])
    assert got["state"].tolist() == [[1.0, 2.0, 3.0]]
    assert got["action"].tolist() == [7] and got["flag"].tolist() == [True] and got["reward"].tolist() == [-2.5]
    rb.add_batch({"state": torch.zeros(2, 3), "action": torch.tensor([8, 9]), "flag": torch.tensor([False, True]),
                  "reward": torch.tensor([0.25, 0.5])})  # fmt: skip
    assert rb.sample_by_index([rb.pointer - 2, rb.pointer - 1])["action"].tolist() == [8, 9]


def test_rejected_write_changes_nothing(rb: ReplayBuffer) -> None:
    before = state(rb)
    bad_rows = [
        {"state": torch.ones(3), "action": 2**70, "flag": True, "reward": 1.0},  # int64 overflow
        {"state": torch.ones(3), "action": 1, "flag": True, "reward": 1.0, "extra": 1},
        {"state": torch.ones(3, dtype=torch.complex64), "action": 1, "flag": True, "reward": 1.0},
        {"state": torch.full((3,), 2**24 + 1), "action": 1, "flag": True, "reward": 1.0},  # inexact in float32
        {"state": torch.ones(3), "action": 1.5, "flag": True, "reward": 1.0},
        {"state": torch.ones(3), "action": 1, "flag": True, "reward": 10**400},  # used to tear the row
    ]
    for bad in bad_rows:
        with pytest.raises(SchemaError):
            rb.add(bad)
        now = state(rb)
        assert now[:2] == before[:2]
        assert all(torch.equal(now[2][k], before[2][k]) for k in before[2])


def test_tensor_that_requires_grad_is_stored_as_data(rb: ReplayBuffer) -> None:
    rb.add({"state": torch.ones(3, requires_grad=True) * 2, "action": 1, "flag": True, "reward": 1.0})
    assert rb.sample_by_index([rb.pointer - 1])["state"].tolist() == [[2.0, 2.0, 2.0]]
    assert not any(column.requires_grad for column in rb.engine.storage.columns.values())


def test_batched_tensordict_in_add_still_rejected(rb: ReplayBuffer) -> None:
    td = TensorDict({"state": torch.ones(2, 3), "action": torch.ones(2, dtype=torch.int64),
                     "flag": torch.ones(2, dtype=torch.bool), "reward": torch.ones(2)}, batch_size=[2])  # fmt: skip
    with pytest.raises(InvalidArgumentError):
        rb.add(td)


@pytest.mark.parametrize("shuffle", [False, True])
def test_epoch_reads_match_indexed_reads(rb: ReplayBuffer, shuffle: bool) -> None:
    seen = []
    for part in rb.create_epoch_iterator(7, shuffle=shuffle):
        ref = rb.sample_by_index(part["index"])
        for key in list(ref.keys()):
            assert torch.equal(part[key], ref[key]), key
        seen += part["index"].tolist()
    assert (sorted(seen) if shuffle else seen) == list(range(len(rb)))  # slot order without shuffle


def test_wide_rows_go_through_pwrite_and_read_back_exactly(tmp_path) -> None:
    """Atari-sized rows are written with os.pwrite into the memmap file; reads through the mapping see them."""
    import os

    from objectrl_buffer.storage.fast_write import WIDE_ROW_BYTES

    capacity = 7
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=0, storage_dir=tmp_path)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(40, 4, 84, 84), dtype=np.uint8)
    assert frames[0].nbytes >= WIDE_ROW_BYTES
    reference: list = [None] * capacity  # slot -> (frame id, step)
    pointer = 0

    def single(i: int, as_tensor: bool) -> None:
        nonlocal pointer
        frame = torch.from_numpy(frames[i]) if as_tensor else frames[i]
        rb.add({"state": frame, "small": np.float32(i), "step": i})
        reference[pointer] = i
        pointer = (pointer + 1) % capacity

    for i in range(5):
        single(i, as_tensor=i % 2 == 0)
    fast = rb.engine.storage.fast
    assert fast is not None and set(fast.fds) == {"state"}  # the wide path is in use
    ids = np.arange(5, 16)  # 11 rows into capacity 7: wraps and keeps the newest 7
    rb.add_batch({"state": frames[ids], "small": ids.astype(np.float32), "step": ids})
    for i in ids:
        reference[pointer] = int(i)
        pointer = (pointer + 1) % capacity
    for i in range(16, 25):
        single(i, as_tensor=False)
    got = rb.sample_by_index(range(capacity))
    for slot, i in enumerate(reference):
        assert np.array_equal(got["state"][slot].numpy(), frames[i]), slot
        assert got["step"][slot].item() == i
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        rb.reset()
        single(0, as_tensor=False)
    assert len(os.listdir("/proc/self/fd")) == fds  # the wide columns' files are closed on reset
    rb.close()


def test_one_element_tensors_take_the_fast_path_once_their_cast_was_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    """ObjectRL's DQN: float32 () warm-up actions, then int64 [1] policy actions on every step. After the first
    such write (checked path, CastWarning), the same cast is stored by the fast path, by the same rules."""
    rb = ReplayBuffer("cpu", "cpu", 8, seed=0)
    rb.add({"action": torch.tensor(0.5), "step": 0})
    with pytest.warns(CastWarning, match="action"):
        rb.add({"action": torch.tensor([3]), "step": 1})

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the checked path was taken")

    monkeypatch.setattr(rb.engine.storage.schema, "check", refuse)
    rb.add({"action": torch.tensor([7]), "step": 2})  # fast path now
    rb.add({"action": torch.tensor([True]), "step": 3})  # bool -> float32: lossless
    assert rb.sample_all()["action"].tolist() == [0.5, 3.0, 7.0, 1.0]
    for value in (torch.tensor([2**25 + 1]), torch.tensor([1.5], dtype=torch.float64).to(torch.complex64)):
        with pytest.raises(AssertionError, match="checked path"):  # not exact / not real: the checked path decides
            rb.add({"action": value, "step": 4})
    assert len(rb) == 4


@pytest.mark.parametrize("key", ['a"b', "x\ny", "return", "v0", "items", "{i}", "\\"])
def test_any_key_name_is_stored_as_data_never_as_code(key: str) -> None:
    """The per-step writer is compiled per schema: a key is a value there, whatever its characters."""
    rb = ReplayBuffer("cpu", "cpu", 4, seed=0)
    rb.add({key: torch.ones(2), "v1": 2.0})
    rb.add({key: np.full(2, 3.0, dtype=np.float32), "v1": 4.0})
    rows = rb.sample_all()
    assert torch.equal(rows[key], torch.tensor([[1.0, 1.0], [3.0, 3.0]]))
    assert rows["v1"].tolist() == [2.0, 4.0]
