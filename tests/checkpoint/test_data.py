"""Full-data checkpoints: round trips (in this process and in a fresh one), format, capacity rules, immutability."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.checkpoint.generations import verify_checkpoint, wait_for_cleanup
from objectrl_buffer.checkpoint.io import interactive, progress_bar
from objectrl_buffer.checkpoint.manifest import DATA_FORMAT, DATA_FORMAT_VERSION
from objectrl_buffer.errors import CheckpointError
from tests.support import (
    SPEC,
    assert_same,
    data_folder,
    edit_manifest,
    fill_rows,
    full_snapshot,
    next_draws,
    round_trip_in_fresh_process,
    rows,
    tree,
)

REPO = Path(__file__).resolve().parents[2]

# (capacity, rows added): empty, one row, part-filled, exactly full, wrapped once, wrapped many times.
SIZES = [(8, 0), (8, 1), (8, 5), (8, 8), (8, 13), (8, 35), (1, 3)]


def make(tmp_path: Path, capacity: int, n: int, seed: int = 7, **kwargs: Any) -> ReplayBuffer:
    rb = ReplayBuffer("cpu", "cpu", capacity, seed=seed, storage_dir=tmp_path / "storage", **kwargs)
    fill_rows(rb, n)
    return rb


@pytest.mark.parametrize(("capacity", "n"), SIZES)
def test_round_trip_restores_rows_ring_and_next_samples(tmp_path: Path, capacity: int, n: int) -> None:
    original = make(tmp_path, capacity, n, shuffle=True)
    path = tmp_path / "ck" / "run"
    path.parent.mkdir()
    original.save(path, data=True)
    before = full_snapshot(original)

    loaded = ReplayBuffer("cpu", "cpu", capacity, seed=999, storage_dir=tmp_path / "storage")
    loaded.load(path)
    assert_same(full_snapshot(loaded), before)
    built = ReplayBuffer.from_checkpoint(path, storage_dir=tmp_path / "storage")
    assert_same(full_snapshot(built), before)
    if n:
        expected = next_draws(original)
        assert_same(next_draws(loaded), expected)
        assert_same(next_draws(built), expected)


def test_round_trip_in_a_fresh_process(tmp_path: Path) -> None:
    """Saved here, loaded by a new Python process: same rows, order, counters and next samples."""
    buffers = {f"{capacity}-{n}": make(tmp_path, capacity, n, seed=capacity * 100 + n) for capacity, n in SIZES}
    round_trip_in_fresh_process(
        tmp_path,
        buffers,
        helpers="tests.support",
        snapshot_name="full_snapshot",
        next_draws_fn=next_draws,
        snapshot_fn=full_snapshot,
        cls_name="ReplayBuffer",
    )


def test_every_dtype_and_nested_keys_round_trip_bit_exactly(tmp_path: Path) -> None:
    spec = {
        **SPEC,
        "half": ((3,), torch.float16),
        "brain": ((2,), torch.bfloat16),
        "i32": ((), torch.int32),
        "i16": ((2,), torch.int16),
        "i8": ((), torch.int8),
        "c64": ((2,), torch.complex64),
    }
    rb = ReplayBuffer("cpu", "cpu", 6, seed=1, storage_dir=tmp_path / "storage")
    batch = rows(0, 9, spec)
    batch["obs"] = {"pixels": batch.pop("frame"), "state": batch.pop("state")}
    rb.add_batch(batch)
    rb.save(tmp_path / "run", data=True)
    loaded = ReplayBuffer.from_checkpoint(tmp_path / "run", storage_dir=tmp_path / "storage")
    assert loaded.schema == rb.schema
    assert ("obs", "pixels") in loaded.schema.by_key
    assert_same(full_snapshot(loaded), full_snapshot(rb))


class Extra:
    """An extra state (the checkpoint/extras.py contract) holding fixed arrays and values under ``name``."""

    def __init__(self, name: str, arrays: dict[str, torch.Tensor], values: dict[str, Any]) -> None:
        self.name, self.arrays, self.values = name, arrays, values
        self.restored: Any = None

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return self.arrays, self.values

    def check(self, arrays: Any, values: Any, rows: int, source: str) -> None:
        pass

    def restore(self, arrays: Any, values: Any) -> None:
        self.restored = (dict(arrays), dict(values))


class WithExtras(ReplayBuffer):
    """A buffer with two extra states, ``a`` and ``b``, as a room would add them (composition, no hooks)."""

    ARRAYS: ClassVar[dict[str, torch.Tensor]] = {
        "a.scalar": torch.tensor(2.5, dtype=torch.float64),
        "a.flags": torch.tensor([[True, False, True], [False, False, True]]),
        "a.empty": torch.zeros(0, 3, dtype=torch.int16),
        "b.ids": torch.arange(10, dtype=torch.int64)[::2],  # a non-contiguous view is fine
        "b.half": torch.linspace(0, 1, 7, dtype=torch.bfloat16),
    }
    VALUES: ClassVar[dict[str, Any]] = {"a.count": 3, "a.rate": 1e-300, "a.on": True, "b.name": "per", "b.neg": -7.25}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("a", "b"):
            arrays = {k[2:]: v for k, v in self.ARRAYS.items() if k.startswith(f"{name}.")}
            values = {k[2:]: v for k, v in self.VALUES.items() if k.startswith(f"{name}.")}
            self.checkpoint_extras.append(Extra(name, arrays, values))

    @property
    def restored(self) -> Any:
        """What the load handed the extras, merged back under their full names (as the manifest holds them)."""
        got = [extra.restored for extra in self.checkpoint_extras]  # type: ignore[attr-defined]
        if any(g is None for g in got):
            return None
        arrays = {f"{e.name}.{k}": v for e, g in zip(self.checkpoint_extras, got, strict=True) for k, v in g[0].items()}
        values = {f"{e.name}.{k}": v for e, g in zip(self.checkpoint_extras, got, strict=True) for k, v in g[1].items()}
        return _Restored(arrays, values)


class _Restored:
    def __init__(self, arrays: dict[str, Any], values: dict[str, Any]) -> None:
        self.extra_arrays, self.extra_values = arrays, values


def test_extra_arrays_and_values_round_trip(tmp_path: Path) -> None:
    rb = WithExtras("cpu", "cpu", 8, seed=1, storage_dir=tmp_path / "storage")
    fill_rows(rb, 5)
    rb.save(tmp_path / "run", data=True)
    for verify in (True, False):
        loaded = WithExtras("cpu", "cpu", 8, storage_dir=tmp_path / "storage")
        loaded.load(tmp_path / "run", verify=verify)
        assert_same(full_snapshot(loaded), full_snapshot(rb))
        assert_same(dict(loaded.restored.extra_arrays), {k: v.contiguous() for k, v in WithExtras.ARRAYS.items()})
        assert loaded.restored.extra_values == WithExtras.VALUES
        assert all(v.device.type == "cpu" for v in loaded.restored.extra_arrays.values())
    folder = Path(data_folder(tmp_path / "run"))
    assert (folder / "extra-a.flags.bin").read_bytes() == bytes([1, 0, 1, 0, 0, 1])
    verify_checkpoint(tmp_path / "run")
    plain = ReplayBuffer.from_checkpoint(tmp_path / "run", storage_dir=tmp_path / "storage")  # ignores the extras
    assert_same(full_snapshot(plain), full_snapshot(rb))


@pytest.mark.parametrize(
    ("arrays", "values", "problem"),
    [({"../x": torch.zeros(1)}, {}, "bad extra name"), ({}, {"a.nan": float("nan")}, "finite number")],
)
def test_bad_extras_fail_the_save_and_leave_nothing(
    tmp_path: Path, arrays: dict[str, torch.Tensor], values: dict[str, Any], problem: str
) -> None:
    rb = WithExtras("cpu", "cpu", 8, seed=1, storage_dir=tmp_path / "storage")
    fill_rows(rb, 5)
    entries = {**arrays, **values}
    name = next(iter(entries)).split(".")[0]  # "../x" -> an extra named "" with key "./x": still "../x" on disk
    own = {k: v for k, v in arrays.items()}, {k: v for k, v in values.items()}
    rb.checkpoint_extras[:] = [Extra(name, {k[len(name) + 1 :]: v for k, v in own[0].items()},
                                     {k[len(name) + 1 :]: v for k, v in own[1].items()})]  # fmt: skip
    with pytest.raises(ValueError, match=problem):
        rb.save(tmp_path / "run", data=True)
    assert os.listdir(tmp_path) == ["storage"]


def test_metadata_only_save_is_unchanged_objectrl_format(tmp_path: Path) -> None:
    rb = make(tmp_path, 8, 13)
    rb.save(str(tmp_path / "run"))
    meta = torch.load(tmp_path / "run.metadata", weights_only=True)
    ring = {"buffer_size": 8, "data_size": 8, "pointer": 5}
    assert meta == {**ring, "format": "objectrl_buffer", "format_version": 1, "metadata_crc32": meta["metadata_crc32"]}
    assert sorted(os.listdir(tmp_path)) == ["run.metadata", "storage"]
    fresh = ReplayBuffer("cpu", "cpu", 3, storage_dir=tmp_path / "storage")
    with pytest.warns(RuntimeWarning, match="metadata-only checkpoint"):
        fresh.load(tmp_path / "run")  # ObjectRL semantics: counters only, capacity adopted
    assert (len(fresh), fresh.pointer, fresh.buffer_size, fresh.schema) == (8, 5, 8, None)


def test_full_save_metadata_stays_plain_torch_load_readable(tmp_path: Path) -> None:
    make(tmp_path, 8, 13).save(tmp_path / "run", data=True)
    meta = torch.load(tmp_path / "run.metadata", weights_only=True)
    assert (meta["buffer_size"], meta["data_size"], meta["pointer"]) == (8, 8, 5)
    assert all(type(meta[k]) is int for k in ("buffer_size", "data_size", "pointer", "data_manifest_crc32"))
    manifest = json.loads(Path(data_folder(tmp_path / "run"), "manifest.json").read_text())
    assert (manifest["format"], manifest["format_version"]) == (DATA_FORMAT, DATA_FORMAT_VERSION)
    assert manifest["ring"] == {"buffer_size": 8, "data_size": 8, "pointer": 5}
    assert {"torch", "library_version", "time", "host"} <= manifest["created"].keys()
    # Column files are raw little-endian rows in slot order: readable without this library.
    column = next(c for c in manifest["columns"] if c["key"] == ["step"])
    raw = Path(data_folder(tmp_path / "run"), column["file"]).read_bytes()
    steps = torch.frombuffer(bytearray(raw), dtype=torch.int64)
    expected = torch.tensor([8, 9, 10, 11, 12, 5, 6, 7]) * 1000 + len("step")  # slot s holds the newest row n = s mod 8
    assert torch.equal(steps, expected)


def test_each_save_replaces_the_generation_and_cleans_orphans(tmp_path: Path) -> None:
    rb = make(tmp_path, 8, 5)
    path = tmp_path / "run"
    orphan = tmp_path / "run.data-0123456789abcdef"  # as a killed save leaves it
    orphan.mkdir()
    (orphan / "000-state.bin").write_bytes(b"half")
    (tmp_path / "run.metadata.abcd1234.tmp").write_bytes(b"x")
    unrelated = [
        "run.data-notahexid",
        "other.data-0123456789abcdef",
        "run.database",
        "run.data-0123456789abcdef.metadata",
    ]
    for name in unrelated:
        (tmp_path / name).mkdir()
    rb.save(path, data=True)
    first = os.path.basename(data_folder(path))
    fill_rows(rb, 2, first=5)
    rb.save(path, data=True)
    wait_for_cleanup()
    second = os.path.basename(data_folder(path))
    assert first != second
    assert sorted(os.listdir(tmp_path)) == sorted([*unrelated, second, "run.metadata", "storage"])
    assert len(ReplayBuffer.from_checkpoint(path, storage_dir=tmp_path / "storage")) == 7
    rb.save(path)  # data=False: the checkpoint is metadata only now, its data folder goes
    wait_for_cleanup()
    assert sorted(os.listdir(tmp_path)) == sorted([*unrelated, "run.metadata", "storage"])


def test_loaded_buffer_never_writes_into_the_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    path = tmp_path / "ck" / "run"
    make(tmp_path, 8, 13).save(path, data=True)
    on_disk = tree(tmp_path / "ck")
    rb = ReplayBuffer.from_checkpoint(path, storage_dir=tmp_path / "storage")
    assert rb.storage_folder is not None and not rb.storage_folder.startswith(str(tmp_path / "ck"))
    fill_rows(rb, 20, first=100)
    rb.reset()
    fill_rows(rb, 3, first=200)
    rb.close()
    assert tree(tmp_path / "ck") == on_disk
    verify_checkpoint(path)


def test_capacity_and_schema_rules(tmp_path: Path) -> None:
    path = tmp_path / "run"
    make(tmp_path, 8, 13).save(path, data=True)
    saved = full_snapshot(ReplayBuffer.from_checkpoint(path, storage_dir=tmp_path / "storage"))

    holding = make(tmp_path, 5, 3)  # holds rows, another capacity: refused, unchanged
    before = full_snapshot(holding)
    with pytest.raises(CheckpointError, match=r"buffer_size 8 .* capacity 5"):
        holding.load(path)
    assert_same(full_snapshot(holding), before)

    other_schema = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path / "storage")
    other_schema.add({"obs": torch.zeros(3)})  # same capacity, other keys: refused, unchanged
    before = full_snapshot(other_schema)
    with pytest.raises(CheckpointError, match="holds Schema"):
        other_schema.load(path)
    assert_same(full_snapshot(other_schema), before)

    for empty in (ReplayBuffer("cpu", "cpu", 5, storage_dir=tmp_path / "storage"), holding, other_schema):
        empty.reset()  # an empty buffer adopts the saved capacity and schema
        empty.load(path)
        assert_same(
            {k: v for k, v in full_snapshot(empty).items() if k != "generator"},
            {k: v for k, v in saved.items() if k != "generator"},
        )

    same = make(tmp_path, 8, 2)  # same capacity and schema: contents replaced
    same.load(path)
    assert_same(full_snapshot(same)["slots"], saved["slots"])


def test_load_replaces_iterators_and_shuffle(tmp_path: Path) -> None:
    path = tmp_path / "run"
    make(tmp_path, 8, 13, shuffle=True).save(path, data=True)
    rb = make(tmp_path, 8, 4)
    it = rb.create_epoch_iterator(2)
    next(it)
    rb.load(path)
    assert rb.shuffle is True and rb.epoch_iterator is None
    with pytest.raises(RuntimeError, match="reset"):
        next(it)
    assert ReplayBuffer.from_checkpoint(path, shuffle=False, storage_dir=tmp_path / "storage").shuffle is False


def test_verify_false_skips_checksums_only(tmp_path: Path) -> None:
    path = tmp_path / "run"
    make(tmp_path, 8, 13).save(path, data=True)
    step_file = next(Path(data_folder(path)).glob("*-step.bin"))
    data = bytearray(step_file.read_bytes())
    data[0] ^= 0xFF
    step_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        ReplayBuffer.from_checkpoint(path, storage_dir=tmp_path / "storage")
    rb = ReplayBuffer.from_checkpoint(path, verify=False, storage_dir=tmp_path / "storage")
    assert int(rb.sample_by_index([0])["step"][0]) != 8 * 1000 + len("step")  # the damaged value, as asked


def test_progress_bar_only_when_interactive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rb = make(tmp_path, 8, 13)
    rb.save(tmp_path / "run", data=True)  # auto: stderr is not a terminal under pytest
    rb.load(tmp_path / "run")
    assert capsys.readouterr().err == ""
    with progress_bar(10, "x", None) as bar:
        assert not hasattr(bar, "n")  # the no-op
    with progress_bar(10, "x", True) as bar:
        assert type(bar).__name__ == "tqdm"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.delenv("CI", raising=False)
    assert interactive()
    monkeypatch.setenv("CI", "true")
    assert not interactive()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback of a machine without CUDA")
def test_checkpoint_from_a_cuda_machine_loads_on_cpu(tmp_path: Path) -> None:
    """Saved with CUDA storage elsewhere: rows load onto cpu, the generator is re-seeded with the saved seed."""
    path = tmp_path / "run"
    original = make(tmp_path, 8, 13, seed=1234)
    original.save(path, data=True)

    def as_if_cuda(m: dict[str, Any]) -> None:
        m["devices"] = {"device": "cuda:0", "storing_device": "cuda:0"}
        m["sampling"]["generator"]["device"] = "cuda"

    edit_manifest(path, as_if_cuda)
    with pytest.warns(UserWarning, match="not available here: using cpu"):
        rb = ReplayBuffer.from_checkpoint(path, storage_dir=tmp_path / "storage")
    assert rb.device.type == rb.storing_device.type == "cpu"
    assert rb.generator.initial_seed() == 1234
    assert_same(full_snapshot(rb)["slots"], full_snapshot(original)["slots"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("saved_on", "loaded_on"), [("cpu", "cuda"), ("cuda", "cpu"), ("cuda", "cuda")])
def test_load_onto_another_storing_device(tmp_path: Path, saved_on: str, loaded_on: str) -> None:
    rb = ReplayBuffer("cuda", saved_on, 8, seed=3, storage_dir=tmp_path / "storage")
    fill_rows(rb, 13)
    rb.save(tmp_path / "run", data=True)
    loaded = ReplayBuffer.from_checkpoint(tmp_path / "run", storing_device=loaded_on, storage_dir=tmp_path / "s")
    assert loaded.storing_device.type == loaded_on
    assert_same(
        {k: v for k, v in full_snapshot(loaded).items() if k != "generator"},
        {k: v for k, v in full_snapshot(rb).items() if k != "generator"},
    )
    if saved_on == loaded_on:
        assert_same(next_draws(loaded), next_draws(rb))


@pytest.mark.parametrize("method", ["save", "load", "from_checkpoint"])
def test_progress_argument_is_documented(method: str) -> None:
    """``progress=`` says what it shows and when (issue 24: it was in neither the README nor the docstrings)."""
    from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer

    for cls in (ReplayBuffer, PrioritizedReplayBuffer):
        doc = " ".join((getattr(cls, method).__doc__ or "").split())
        assert "``progress``:" in doc, f"{cls.__name__}.{method}"
    doc = " ".join((ReplayBuffer.save.__doc__ or "").split())
    for words in ("tqdm bar on stderr", "half a second", "stderr is a terminal", "``CI``", "``False``: never"):
        assert words in doc
