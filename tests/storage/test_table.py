"""storage: allocation on first write, column writes/gathers, release/resize/close and the private folder."""

from __future__ import annotations

import os
import pathlib

import pytest
import torch
from tensordict import TensorDict

from objectrl_buffer.core.schema import Schema
from objectrl_buffer.storage.folders import LOCK_NAME
from objectrl_buffer.storage.table import TransitionStorage, make_tensordict

CPU = torch.device("cpu")


def init(storage: TransitionStorage, row: dict) -> Schema:
    schema, values = Schema.infer(row, batch_dims=0)
    storage.initialize(schema, values)
    return schema


def column_pairs(storage: TransitionStorage, values: dict) -> list:
    assert storage.schema is not None
    return [(storage.schema.by_key[k], v) for k, v in values.items()]


@pytest.fixture
def storage(tmp_path: pathlib.Path) -> TransitionStorage:
    st = TransitionStorage(5, CPU, tmp_path)
    yield st
    st.close()


def test_folder_is_private_and_lazy(storage: TransitionStorage, tmp_path: pathlib.Path) -> None:
    assert storage.folder is not None and pathlib.Path(storage.folder).parent == tmp_path
    assert os.listdir(storage.folder) == [LOCK_NAME]  # held by this process (see objectrl_buffer.storage.folders)
    assert not storage.initialized and storage.nbytes == 0
    init(storage, {"x": torch.zeros(3), "n": 1})
    assert storage.initialized
    assert storage.nbytes == 5 * (3 * 4 + 8)
    assert len(os.listdir(storage.folder)) >= 2
    assert storage.columns["x"].shape == (5, 3) and storage.columns["n"].dtype == torch.int64
    assert type(storage.columns["x"]) is torch.Tensor


def test_write_and_gather(storage: TransitionStorage) -> None:
    init(storage, {"x": torch.zeros(2), "n": 0})
    for slot in range(5):
        storage.write(slot, column_pairs(storage, {"x": torch.full((2,), float(slot)), "n": slot * 10}))
    out = storage.gather(torch.tensor([4, 0, 4]))
    assert out["x"][:, 0].tolist() == [4, 0, 4] and out["n"].tolist() == [40, 0, 40]
    only = storage.gather(torch.tensor([1]), ["n"])
    assert list(only) == ["n"] and only["n"].tolist() == [10]


def test_gather_returns_copies(storage: TransitionStorage) -> None:
    init(storage, {"x": torch.zeros(2)})
    out = storage.gather(torch.arange(5))
    out["x"].fill_(9.0)
    assert storage.columns["x"].sum().item() == 0.0
    assert out["x"].untyped_storage().data_ptr() != storage.columns["x"].untyped_storage().data_ptr()


@pytest.mark.parametrize(("start", "first", "n"), [(0, 0, 5), (3, 0, 4), (4, 2, 3), (2, 0, 1)])
def test_write_rows_wraps_around(storage: TransitionStorage, start: int, first: int, n: int) -> None:
    init(storage, {"n": 0})
    values = torch.arange(100, 110)
    storage.write_rows(start, column_pairs(storage, {"n": values}), first=first, n=n)
    expected = [0] * 5
    for i in range(n):
        expected[(start + i) % 5] = 100 + first + i
    assert storage.columns["n"].tolist() == expected


def test_release_keeps_files_for_the_same_schema_and_frees_them_for_another(storage: TransitionStorage) -> None:
    init(storage, {"x": torch.zeros(3), "n": 1})
    folder = storage.folder
    assert folder is not None
    storage.write(4, column_pairs(storage, {"x": torch.ones(3), "n": 7}))
    storage.release()
    kept = sorted(f for f in os.listdir(folder) if f.endswith(".memmap"))
    assert not storage.initialized and storage.columns == {} and kept == ["n.memmap", "x.memmap"]
    init(storage, {"x": torch.zeros(3), "n": 1})  # same schema: the kept columns come back
    assert storage.columns["n"][4].item() == 7
    storage.release()
    init(storage, {"y": torch.zeros(2, dtype=torch.float64)})
    assert list(storage.columns) == ["y"] and storage.columns["y"].shape == (5, 2)
    assert sorted(f for f in os.listdir(folder) if f.endswith(".memmap")) == ["y.memmap"]


def test_resize_reuses_the_folder(storage: TransitionStorage) -> None:
    init(storage, {"x": torch.zeros(3)})
    folder = storage.folder
    storage.resize(8)
    assert storage.capacity == 8 and not storage.initialized and storage.folder == folder
    init(storage, {"x": torch.zeros(3)})
    assert storage.columns["x"].shape == (8, 3)


def test_close_removes_the_folder(tmp_path: pathlib.Path) -> None:
    st = TransitionStorage(3, CPU, tmp_path / "nested" / "dir")  # parents are created
    init(st, {"x": torch.zeros(1)})
    st.close()
    assert os.listdir(tmp_path / "nested" / "dir") == []
    st.close()  # idempotent


def test_make_tensordict_builds_nested_keys() -> None:
    td = make_tensordict({"a": torch.zeros(2), ("o", "p"): torch.ones(2, 3)}, torch.Size([2]), CPU)
    assert isinstance(td, TensorDict) and td.batch_size == (2,)
    assert td["o", "p"].shape == (2, 3) and td["a"].shape == (2,)


@pytest.mark.parametrize("in_memory", [False, True])
@pytest.mark.parametrize("lazy", ["conj", "neg"])
def test_write_rows_stores_lazy_conjugate_and_negative_views_resolved(in_memory: bool, lazy: str) -> None:
    """Batched rows are stored through NumPy where they can be; torch's lazy conj/neg views cannot be seen
    by NumPy, so they are resolved by torch instead (the values stored are the resolved ones)."""
    z = torch.randn(3, 2, dtype=torch.complex64)
    value = z.conj() if lazy == "conj" else z.conj().imag  # .imag of a conj view: a float view with the neg bit
    assert value.is_conj() or value.is_neg()
    storage = TransitionStorage(8, torch.device("cpu"), in_memory=in_memory)
    schema, _ = Schema.infer({"z": value}, 1)
    storage.initialize(schema, {"z": value[0].resolve_conj().resolve_neg()})
    try:
        for lo in (0, 6):  # the second write wraps
            storage.write_rows(lo, [(schema.fields[0], value)], 0, 3)
            got = storage.gather(torch.arange(lo, lo + 3).remainder(8))["z"]
            assert torch.equal(got, value.resolve_conj().resolve_neg())
    finally:
        storage.close()


def test_an_in_memory_storage_takes_no_directory(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="in_memory"):
        TransitionStorage(8, torch.device("cpu"), tmp_path, in_memory=True)
    storage = TransitionStorage(8, torch.device("cpu"), in_memory=True)
    schema, _ = Schema.infer({"x": torch.zeros(2, 3)}, 1)
    storage.initialize(schema, {"x": torch.zeros(3)})
    assert storage.folder is None and not list(tmp_path.iterdir())
    storage.close()
