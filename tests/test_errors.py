"""Every documented error: its class, the builtin it subclasses, a message naming the problem, and no change."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer, errors
from objectrl_buffer.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    EmptyBufferError,
    InvalidArgumentError,
    ReplayBufferError,
    SchemaError,
    SlotIndexError,
)
from tests.support import assert_unchanged, fill, objectrl_batch, objectrl_transition, snapshot

Factory = Callable[..., ReplayBuffer]


def raises_unchanged(rb: ReplayBuffer, exc: type[Exception], builtin: type[Exception], match: str, call: Any) -> None:
    """``call()`` raises ``exc`` (a ``builtin`` and a ReplayBufferError) matching ``match``; ``rb`` is unchanged."""
    before = snapshot(rb)
    with pytest.raises(exc, match=match) as info:
        call()
    assert isinstance(info.value, builtin)
    assert isinstance(info.value, ReplayBufferError)
    assert_unchanged(rb, before)


def test_error_hierarchy() -> None:
    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.SchemaError, ValueError)
    assert issubclass(errors.EmptyBufferError, RuntimeError)
    assert issubclass(errors.SlotIndexError, IndexError)
    assert issubclass(errors.StaleIteratorError, RuntimeError)
    assert issubclass(errors.CheckpointError, RuntimeError)
    assert issubclass(errors.CheckpointNotFoundError, errors.CheckpointError)
    assert issubclass(errors.CheckpointNotFoundError, FileNotFoundError)
    assert issubclass(errors.CastWarning, UserWarning)
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, UserWarning if name.endswith("Warning") else errors.ReplayBufferError), name


# ---------------------------------------------------------------- sizes
BAD_SIZES = [0, -1, -10, 2.5, 10.0, "10", None, True, torch.tensor([3, 4])]


@pytest.mark.parametrize("size", BAD_SIZES, ids=repr)
def test_constructor_refuses_bad_buffer_size(tmp_path: pathlib.Path, size: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="buffer_size") as info:
        ReplayBuffer("cpu", "cpu", size, storage_dir=tmp_path)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("size", [s for s in BAD_SIZES if s is not None], ids=repr)
def test_reset_refuses_bad_size(wrapped: ReplayBuffer, size: Any) -> None:
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "buffer_size", lambda: wrapped.reset(size))
    fill(wrapped, [99])  # still usable
    assert wrapped.pointer == 6


@pytest.mark.parametrize("k", [0, -1, 2.5, "4", True])
def test_sample_batch_refuses_bad_k(wrapped: ReplayBuffer, k: Any) -> None:
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "batch_size", lambda: wrapped.sample_batch(k))
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "batch_size", lambda: wrapped.sample_random(k))


@pytest.mark.parametrize(
    "call",
    [
        lambda rb: rb.create_epoch_iterator(0),
        lambda rb: rb.create_epoch_iterator(4, n_epochs=0),
        lambda rb: rb.calculate_num_batches(0),
        lambda rb: rb.get_steps_and_iterator(2, 10, 0),
    ],
    ids=["epoch-bs", "epoch-n", "num-batches", "steps"],
)
def test_epoch_helpers_refuse_bad_sizes(wrapped: ReplayBuffer, call: Callable[[ReplayBuffer], Any]) -> None:
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "batch_size|n_epochs", lambda: call(wrapped))


# ---------------------------------------------------------------- empty buffer
@pytest.mark.parametrize(
    "call",
    [
        lambda rb: rb.sample_batch(4),
        lambda rb: rb.sample_random(4),
        lambda rb: rb.sample_all(),
        lambda rb: rb.create_epoch_iterator(4),
        lambda rb: rb.get_steps_and_iterator(1, 10, 4),
        lambda rb: rb.get_next_batch(4),
    ],
    ids=["sample_batch", "sample_random", "sample_all", "epoch", "steps", "next_batch"],
)
@pytest.mark.parametrize("history", ["fresh", "after-reset"])
def test_reading_an_empty_buffer(rb: ReplayBuffer, call: Callable[[ReplayBuffer], Any], history: str) -> None:
    if history == "after-reset":
        fill(rb, range(5))
        rb.reset()
    raises_unchanged(rb, EmptyBufferError, RuntimeError, "empty", lambda: call(rb))


# ---------------------------------------------------------------- indices
@pytest.mark.parametrize(
    ("indices", "named"),
    [([10], "10"), ([0, 3, 11], "11"), ([-1], "-1"), (torch.tensor([2, -5]), "-5"), (range(8, 12), "11"), (10, "10")],
)
def test_out_of_range_indices(wrapped: ReplayBuffer, indices: Any, named: str) -> None:
    match = rf"index {named} is out of range"
    raises_unchanged(wrapped, SlotIndexError, IndexError, match, lambda: wrapped.sample_by_index(indices))
    raises_unchanged(
        wrapped, SlotIndexError, IndexError, match, lambda: wrapped.sample_by_index_fields(indices, ["state"])
    )


def test_indices_beyond_len_before_the_wrap(rb: ReplayBuffer) -> None:
    fill(rb, range(4))
    raises_unchanged(rb, SlotIndexError, IndexError, "out of range", lambda: rb.sample_by_index([4]))


def test_any_index_of_an_empty_buffer(rb: ReplayBuffer) -> None:
    raises_unchanged(rb, SlotIndexError, IndexError, "out of range", lambda: rb.sample_by_index([0]))


@pytest.mark.parametrize(
    "indices",
    [
        torch.tensor([0.0, 1.0]),
        torch.tensor([True, False]),
        torch.tensor([1 + 0j]),
        ["a"],
        [[0, 1], [2]],
        [0.9, 2.7],  # was read as slots 0 and 2
        [True, True],  # was read as slot 1 twice
        True,
        1.0,
        [1, 2.0],
        [1 + 0j],
        np.array([0.5]),
        np.array([True]),
    ],
)
def test_non_integer_indices(wrapped: ReplayBuffer, indices: Any) -> None:
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "indices", lambda: wrapped.sample_by_index(indices))


def test_unknown_field(wrapped: ReplayBuffer) -> None:
    raises_unchanged(
        wrapped, SchemaError, ValueError, "'nope' is not stored", lambda: wrapped.sample_by_index_fields([0], ["nope"])
    )


# ---------------------------------------------------------------- wrong rank / type of write
def test_add_of_a_batched_tensordict(wrapped: ReplayBuffer, rb: ReplayBuffer) -> None:
    for buffer in (wrapped, rb):  # with a schema and before any
        raises_unchanged(
            buffer, InvalidArgumentError, ValueError, r"add_batch\(\)", lambda b=buffer: b.add(objectrl_batch(0, 2))
        )
        raises_unchanged(
            buffer, InvalidArgumentError, ValueError, "batch_size", lambda b=buffer: b.add(objectrl_batch(0, 1))
        )


@pytest.mark.parametrize("batch", [objectrl_transition(0), objectrl_batch(0, 4).reshape(2, 2)], ids=["0-d", "2-d"])
def test_add_batch_of_a_non_1d_tensordict(wrapped: ReplayBuffer, batch: TensorDict) -> None:
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "batch_size", lambda: wrapped.add_batch(batch))


@pytest.mark.parametrize("value", [torch.zeros(3), [1, 2], "state", 3.0])
def test_writes_that_are_not_mappings(wrapped: ReplayBuffer, value: Any) -> None:
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "mapping", lambda: wrapped.add(value))
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "mapping", lambda: wrapped.add_batch(value))


# ---------------------------------------------------------------- schema mismatches
def _edit(td: TensorDict, **changes: Any) -> dict[str, Any]:
    """A plain dict of ``td`` with keys replaced (value ``None`` drops the key)."""
    out: dict[str, Any] = dict(td.items())
    for key, value in changes.items():
        if value is None:
            del out[key]
        else:
            out[key] = value
    return out


ROW = objectrl_transition(50)
BATCH = objectrl_batch(50, 4)
ROW_CASES = {
    "missing": (_edit(ROW, reward=None), "reward.*missing|missing key.*reward"),
    "extra": (_edit(ROW, bonus=torch.tensor(1.0)), "'bonus' is not in the stored schema"),
    "shape": (_edit(ROW, state=torch.zeros(5)), r"'state'.*shape=\(4,\).*shape=\(5,\)"),
    "dtype-tensor": (_edit(ROW, state=torch.zeros(4, dtype=torch.complex64)), "'state'.*complex64"),
    "float-tensor-into-int": (_edit(ROW, step=torch.tensor(3.0)), "'step'.*float32"),
    "int-tensor-inexact": (_edit(ROW, reward=torch.tensor(2**24 + 1)), "'reward'.*16777217"),
    "unsafe-cast": (_edit(ROW, step=np.float32(3.0)), "'step'.*int64"),
    "unsafe-cast-array": (_edit(ROW, step=np.array(3.5)), "'step'.*cannot be cast"),
    "python-float-into-int": (_edit(ROW, step=3.0), "'step'.*Python float"),
    "number-for-vector": (_edit(ROW, state=1.0), "'state'.*Python float"),
}
BATCH_CASES = {
    "missing": (_edit(BATCH, reward=None), "missing key.*reward"),
    "extra": (_edit(BATCH, bonus=torch.ones(4)), "'bonus' is not in the stored schema"),
    "shape": (_edit(BATCH, state=torch.zeros(4, 5)), r"'state'.*batch shape=\(4, 5\)"),
    "dtype-tensor": (_edit(BATCH, reward=torch.zeros(4, dtype=torch.complex64)), "'reward'.*complex64"),
    "int-array-inexact": (_edit(BATCH, reward=np.full(4, 2**24 + 1)), "'reward'.*16777217"),
    "unsafe-cast": (_edit(BATCH, step=np.linspace(0, 1, 4)), "'step'.*cannot be cast"),
    "no-batch-dim": (_edit(BATCH, reward=1.0), "'reward'.*batch shape=\\(\\)"),
    "rows-disagree": (_edit(BATCH, step=torch.arange(5)), "'step' has 5 rows but an earlier key has 4"),
}


@pytest.mark.parametrize("case", ROW_CASES, ids=str)
def test_add_that_does_not_fit_the_schema(wrapped: ReplayBuffer, case: str) -> None:
    data, match = ROW_CASES[case]
    raises_unchanged(wrapped, SchemaError, ValueError, match, lambda: wrapped.add(data))
    # As a TensorDict the numbers become tensors: the message still names the key (and says why).
    key = match.split(".*")[0]
    as_td = TensorDict(data, batch_size=[])
    raises_unchanged(
        wrapped, SchemaError, ValueError, f"{key}.*(missing|not in|shape|dtype)", lambda: wrapped.add(as_td)
    )


@pytest.mark.parametrize("case", BATCH_CASES, ids=str)
def test_add_batch_that_does_not_fit_the_schema(wrapped: ReplayBuffer, case: str) -> None:
    data, match = BATCH_CASES[case]
    # every slot of the full buffer is visible, so the snapshot shows that no row was overwritten
    raises_unchanged(wrapped, SchemaError, ValueError, match, lambda: wrapped.add_batch(data))


def test_python_int_into_a_bool_column(rb: ReplayBuffer) -> None:
    rb.add({"done": True, "x": 1.0})
    raises_unchanged(rb, SchemaError, ValueError, "'done'.*bool.*Python int", lambda: rb.add({"done": 2, "x": 1.0}))


@pytest.mark.parametrize("bad_key_position", ["first", "middle", "last"])
def test_schema_error_midway_through_a_batch_stores_nothing(wrapped: ReplayBuffer, bad_key_position: str) -> None:
    good = dict(objectrl_batch(100, 6).items())
    keys = list(good)
    bad_at = {"first": 0, "middle": len(keys) // 2, "last": len(keys) - 1}[bad_key_position]
    bad_key = keys[bad_at]
    data = {
        k: (v.to(torch.complex64) if v.dtype == torch.float32 else v.to(torch.float32)) if k == bad_key else v
        for k, v in good.items()
    }
    raises_unchanged(wrapped, SchemaError, ValueError, f"'{bad_key}'", lambda: wrapped.add_batch(data))


def test_first_write_with_rows_disagreeing(rb: ReplayBuffer) -> None:
    data = {"a": torch.zeros(3), "b": torch.zeros(4)}
    raises_unchanged(rb, SchemaError, ValueError, "same number of rows", lambda: rb.add_batch(data))
    assert rb.schema is None
    raises_unchanged(rb, SchemaError, ValueError, "leading batch dimension", lambda: rb.add_batch({"a": 1.0}))
    raises_unchanged(rb, SchemaError, ValueError, "at least one key", lambda: rb.add({}))
    raises_unchanged(rb, SchemaError, ValueError, "at least one key", lambda: rb.add({"index": 3}))
    rb.add_batch({"a": torch.zeros(3), "b": torch.zeros(3)})  # still usable, the schema is free
    assert len(rb) == 3


# ---------------------------------------------------------------- save / load
def test_load_of_a_missing_checkpoint(wrapped: ReplayBuffer, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "nothing-here"
    raises_unchanged(
        wrapped, CheckpointNotFoundError, FileNotFoundError, "nothing-here.metadata", lambda: wrapped.load(target)
    )
    assert isinstance(CheckpointNotFoundError("x"), CheckpointError)


def test_load_of_a_capacity_that_does_not_fit_the_data(
    wrapped: ReplayBuffer, make_buffer: Factory, tmp_path: pathlib.Path
) -> None:
    other = make_buffer(4)
    fill(other, range(2))
    other.save(tmp_path / "small")
    raises_unchanged(
        wrapped,
        CheckpointError,
        RuntimeError,
        "small.metadata.*buffer_size 4",
        lambda: wrapped.load(tmp_path / "small"),
    )


def test_load_of_a_corrupt_file(wrapped: ReplayBuffer, tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad.metadata").write_bytes(b"\x00garbage" * 8)
    raises_unchanged(wrapped, CheckpointError, RuntimeError, "bad.metadata", lambda: wrapped.load(tmp_path / "bad"))


def test_save_into_a_missing_folder(wrapped: ReplayBuffer, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "no" / "such" / "dir" / "b"
    raises_unchanged(wrapped, CheckpointError, RuntimeError, "b.metadata", lambda: wrapped.save(target))


def test_bad_sizes_beyond_int64(wrapped: ReplayBuffer, tmp_path: pathlib.Path) -> None:
    """2**70 was accepted as a capacity (then add raised TypeError) and reached torch as a batch size."""
    with pytest.raises(InvalidArgumentError, match="buffer_size"):
        ReplayBuffer("cpu", "cpu", 2**70, storage_dir=tmp_path)
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "buffer_size", lambda: wrapped.reset(2**70))
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "batch_size", lambda: wrapped.sample_batch(2**70))
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "recent", lambda: wrapped.sample_batch(2, recent=2**70))
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, "num_slices", lambda: wrapped.sample_slices(2**70, 1))


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda rb: rb.sample_batch(2, n_step=True), "n_step"),
        (lambda rb: rb.sample_batch(2, n_step=2.0), "n_step"),
        (lambda rb: rb.sample_batch(2, n_step=2, gamma=True), "gamma"),
        (lambda rb: rb.sample_batch(2, n_step=2, gamma=float("nan")), "gamma"),
        (lambda rb: rb.sample_by_index_fields([0], None), "fields"),
        (lambda rb: rb.sample_by_index_fields([0], 5), "fields"),
        (lambda rb: rb.sample_slices(1, 2, done_key=5), "done_key"),
        (lambda rb: rb.get_steps_and_iterator("1", 10, 2), "n_epochs"),
        (lambda rb: rb.get_steps_and_iterator(1, "10", 2), "max_iter"),
        (lambda rb: rb.get_steps_and_iterator(1, 10, "2"), "batch_size"),
        (lambda rb: rb.get_steps_and_iterator(0, 10, 2, recent="3"), "recent"),
        (lambda rb: rb.get_steps_and_iterator(0, 10, "2"), "batch_size"),  # was accepted without epochs
        (lambda rb: rb.get_steps_and_iterator(torch.tensor([1, 2]), 10, 2), "n_epochs"),  # was a TypeError
        (lambda rb: rb.sample_slices(1, 2, done_key=(5,)), "done_key"),  # was a TypeError from str.join
        (lambda rb: rb.sample_by_index_fields([0], [("state", 5)]), "fields"),
    ],
    ids=[
        "n_step-bool", "n_step-float", "gamma-bool", "gamma-nan", "fields-None", "fields-int", "done_key",
        "n_epochs", "max_iter", "batch_size", "recent", "batch_size-no-epochs", "n_epochs-tensor", "done_key-tuple",
        "fields-tuple",
    ],
)  # fmt: skip
def test_wrong_types_name_the_argument(
    wrapped: ReplayBuffer, rb: ReplayBuffer, call: Callable[[ReplayBuffer], Any], named: str
) -> None:
    raises_unchanged(wrapped, InvalidArgumentError, ValueError, named, lambda: call(wrapped))
    # on an empty buffer too: the argument is wrong whatever the buffer holds (not EmptyBufferError)
    if "index" not in named:
        raises_unchanged(rb, InvalidArgumentError, ValueError, named, lambda: call(rb))


# ---------------------------------------------------------------- constructor arguments
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_sb3_argument_order_is_explained(cls: type[ReplayBuffer]) -> None:
    with pytest.raises(InvalidArgumentError, match=r"device must be .*got 100000.*ReplayBuffer\(device, storing"):
        cls(100_000, "cpu", "cpu")


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize(
    ("device", "storing_device", "match"),
    [
        ("gpu", "cpu", r"device must be .*got 'gpu'.*did you mean 'cuda'"),
        ("cpu", "GPU", r"storing_device must be .*got 'GPU'.*did you mean 'cuda'"),
        ("CPU", "cpu", r"device .*got 'CPU'.*did you mean 'cpu'"),
        ("cpu", None, r"storing_device must be .*got None"),
        (0, "cpu", r"device must be .*got 0"),
        ("cpu", "meta", r"storing_device .*'meta' holds no data"),
        ("meta", "cpu", r"device .*'meta' holds no data"),
    ],
)
def test_bad_devices(cls: type[ReplayBuffer], device: Any, storing_device: Any, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        cls(device, storing_device, 10)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize("where", ["device", "storing_device"])
def test_cuda_without_cuda_is_refused_at_construction(cls: type[ReplayBuffer], where: str) -> None:
    """device='cuda' used to be accepted, then the first sample failed to pin memory."""
    devices = {"device": "cpu", "storing_device": "cpu", where: "cuda"}
    with pytest.raises(InvalidArgumentError, match=rf"{where} .*'cuda'.*CUDA is not available"):
        cls(devices["device"], devices["storing_device"], 10)


def test_cuda_ordinal_beyond_the_devices_is_refused() -> None:
    ordinal = torch.cuda.device_count() if torch.cuda.is_available() else 0  # one past the last
    with pytest.raises(InvalidArgumentError, match=f"storing_device .*'cuda:{ordinal}'"):
        ReplayBuffer("cpu", f"cuda:{ordinal}", 10)


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize("seed", ["1", 1.5, 2**64, -(2**63) - 1, True, [1]])
def test_bad_seed(cls: type[ReplayBuffer], seed: Any, tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidArgumentError, match="seed"):
        cls("cpu", "cpu", 10, seed=seed, storage_dir=tmp_path)


@pytest.mark.parametrize("seed", [0, -1, 2**64 - 1, -(2**63), np.int64(7)])
def test_seeds_torch_takes(seed: Any, tmp_path: pathlib.Path) -> None:
    with ReplayBuffer("cpu", "cpu", 10, seed=seed, storage_dir=tmp_path) as rb:
        fill(rb, range(3))
        rb.sample_batch(2)


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_storage_dir_that_is_a_file(cls: type[ReplayBuffer], tmp_path: pathlib.Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for storage_dir in (a_file, a_file / "below"):
        with pytest.raises(InvalidArgumentError, match=f"storage_dir .*'{a_file}' is a file"):
            cls("cpu", "cpu", 10, storage_dir=storage_dir)
    assert a_file.read_text() == ""


@pytest.mark.parametrize("storage_dir", ["", b"/tmp", 5])
def test_storage_dir_of_the_wrong_kind(storage_dir: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="storage_dir"):
        ReplayBuffer("cpu", "cpu", 10, storage_dir=storage_dir)


# ---------------------------------------------------------------- checkpoint paths
BAD_PATHS = ["", 5, None, b"buffer", 3.0, ["buffer"], "folder/"]


@pytest.fixture
def in_empty_cwd(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A fresh, empty current directory (``save("")`` used to write ``.metadata`` there)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize("path", BAD_PATHS, ids=repr)
@pytest.mark.parametrize("data", [False, True])
def test_save_refuses_bad_paths(cls: type[ReplayBuffer], path: Any, data: bool, in_empty_cwd: pathlib.Path) -> None:
    (in_empty_cwd / "folder").mkdir()
    rb = cls("cpu", "cpu", 10, seed=0, storage_dir=in_empty_cwd.parent / "storage")
    fill(rb, range(4))
    raises_unchanged(rb, InvalidArgumentError, ValueError, "path", lambda: rb.save(path, data=data))
    assert sorted(p.name for p in in_empty_cwd.rglob("*")) == ["folder"]  # nothing written anywhere
    rb.close()


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize("path", BAD_PATHS, ids=repr)
def test_load_refuses_bad_paths(cls: type[ReplayBuffer], path: Any, in_empty_cwd: pathlib.Path) -> None:
    rb = cls("cpu", "cpu", 10, seed=0, storage_dir=in_empty_cwd.parent / "storage")
    fill(rb, range(4))
    (in_empty_cwd / ".metadata").write_bytes(b"")  # what save("") left behind: must not be read either
    raises_unchanged(rb, InvalidArgumentError, ValueError, "path", lambda: rb.load(path))
    with pytest.raises(InvalidArgumentError, match="path"):
        cls.from_checkpoint(path)
    rb.close()
