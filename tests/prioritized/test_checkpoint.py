"""PrioritizedReplayBuffer checkpoints: priorities survive save(data=True)/load, and damage is refused.

The reference for "survives" is the original buffer itself: after a load, the next prioritized batches
(their ``index`` and ``weight``), priority updates and new rows behave exactly as in the buffer that
was saved.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.cli import commands as cli
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError
from tests.support import assert_same, data_folder, edit_manifest, fill_rows, full_snapshot, round_trip_in_fresh_process

REPO = Path(__file__).resolve().parents[2]
PRIORITY_FILE = "extra-prioritized.priority.bin"

# (capacity, rows added): empty, part-filled, exactly full, wrapped once, wrapped many times, one slot.
SIZES = [(8, 0), (8, 5), (8, 8), (8, 13), (8, 35), (1, 3)]


def make(tmp_path: Path, capacity: int, n: int, seed: int = 7, **kwargs: Any) -> PrioritizedReplayBuffer:
    """A prioritized buffer with ``n`` rows added, priorities updated halfway and again at the end.

    The rows added after the first update get that update's max priority, and with ``n > capacity``
    some of them overwrite slots whose priorities were updated: every way a priority is set is covered.
    """
    kwargs.setdefault("alpha", 0.7)
    kwargs.setdefault("beta", 0.5)
    rb = PrioritizedReplayBuffer("cpu", "cpu", capacity, seed=seed, storage_dir=tmp_path / "storage", **kwargs)
    gen = torch.Generator().manual_seed(seed)
    half = n // 2
    fill_rows(rb, half)
    if half:
        rb.update_priority(torch.arange(len(rb)), torch.rand(len(rb), generator=gen, dtype=torch.float64) * 4)
    fill_rows(rb, n - half, first=half)
    if n:
        slots = torch.randint(len(rb), (3,), generator=gen)
        rb.update_priority(slots, torch.rand(3, generator=gen, dtype=torch.float64) * 2)
    return rb


def priority_snapshot(rb: PrioritizedReplayBuffer) -> dict[str, Any]:
    """Rows, counters and generator (``full_snapshot``), plus the raw priorities and the settings."""
    return {
        **full_snapshot(rb),
        "priority": rb.priority_state()["priority"],
        "max_priority": rb.max_priority,
        "settings": (rb.alpha, rb.beta, rb.eps),
    }


def next_draws(rb: PrioritizedReplayBuffer) -> dict[str, Any]:
    """What the buffer gives next: batches, then an update, a new row, and batches again."""
    out: dict[str, Any] = {}
    for i in range(3):
        batch = rb.sample_batch(16)
        out[f"batch{i}"] = (batch["index"], batch["weight"], batch["step"])
    rb.update_priority(out["batch0"][0], torch.linspace(0.1, 9.0, 16, dtype=torch.float64))
    fill_rows(rb, 1, first=1000)
    for i in range(3, 5):
        batch = rb.sample_batch(16)
        out[f"batch{i}"] = (batch["index"], batch["weight"], batch["step"])
    out["priority"] = rb.priority_state()["priority"]
    return out


def load_into(tmp_path: Path, path: Path, capacity: int, **kwargs: Any) -> PrioritizedReplayBuffer:
    """A new prioritized buffer (other seed, the saved settings unless given) that loads ``path``."""
    kwargs = {"alpha": 0.7, "beta": 0.5, **kwargs}
    rb = PrioritizedReplayBuffer("cpu", "cpu", capacity, seed=999, storage_dir=tmp_path / "storage", **kwargs)
    rb.load(path)
    return rb


# ---------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize(("capacity", "n"), SIZES)
def test_round_trip_restores_priorities_and_next_samples(tmp_path: Path, capacity: int, n: int) -> None:
    original = make(tmp_path, capacity, n)
    path = tmp_path / "run"
    original.save(path, data=True)
    before = priority_snapshot(original)

    loaded = load_into(tmp_path, path, capacity)
    built = PrioritizedReplayBuffer.from_checkpoint(path, storage_dir=tmp_path / "storage")
    assert isinstance(built, PrioritizedReplayBuffer)
    assert_same(priority_snapshot(loaded), before)
    assert_same(priority_snapshot(built), before)
    if n:
        expected = next_draws(original)
        assert_same(next_draws(loaded), expected)
        assert_same(next_draws(built), expected)


def test_round_trip_in_a_fresh_process(tmp_path: Path) -> None:
    """Saved here, loaded by a new Python process: same rows, priorities and next prioritized batches."""
    buffers = {f"{capacity}-{n}": make(tmp_path, capacity, n, seed=capacity * 100 + n) for capacity, n in SIZES}
    round_trip_in_fresh_process(
        tmp_path,
        buffers,
        helpers="tests.prioritized.test_checkpoint",
        snapshot_name="priority_snapshot",
        next_draws_fn=next_draws,
        snapshot_fn=priority_snapshot,
        cls_name="PrioritizedReplayBuffer",
    )


def test_load_keeps_the_buffers_settings_from_checkpoint_takes_the_saved_ones(tmp_path: Path) -> None:
    original = make(tmp_path, 8, 13, alpha=0.9, beta=0.3, eps=1e-3)
    original.beta = 0.45  # annealed: the value at save time is what is saved
    path = tmp_path / "run"
    original.save(path, data=True)

    own = load_into(tmp_path, path, 8, alpha=0.5, beta=0.8, eps=0.01)
    assert (own.alpha, own.beta, own.eps) == (0.5, 0.8, 0.01)
    assert torch.equal(own.priorities(), original.priorities()) and own.max_priority == original.max_priority

    built = PrioritizedReplayBuffer.from_checkpoint(path, storage_dir=tmp_path / "storage")
    assert (built.alpha, built.beta, built.eps) == (0.9, 0.45, 1e-3)
    given = PrioritizedReplayBuffer.from_checkpoint(path, beta=1.0, storage_dir=tmp_path / "storage")
    assert (given.alpha, given.beta, given.eps) == (0.9, 1.0, 1e-3)


def test_checkpoint_layout(tmp_path: Path) -> None:
    """Priorities are a raw float64 file in slot order; the scalars are plain JSON in the manifest."""
    rb = make(tmp_path, 8, 13)
    rb.save(tmp_path / "run", data=True)
    folder = Path(data_folder(tmp_path / "run"))
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format_version"] == 1  # older readers ignore "extras" and load the rows
    [array] = manifest["extras"]["arrays"]
    assert {k: array[k] for k in ("name", "shape", "dtype", "file", "bytes")} == {
        "name": "prioritized.priority",
        "shape": [8],
        "dtype": "float64",
        "file": PRIORITY_FILE,
        "bytes": 64,
    }
    assert manifest["extras"]["values"] == {
        "prioritized.max_priority": rb.max_priority,
        "prioritized.alpha": 0.7,
        "prioritized.beta": 0.5,
        "prioritized.eps": 1e-6,
    }
    raw = torch.frombuffer(bytearray((folder / PRIORITY_FILE).read_bytes()), dtype=torch.float64)
    assert torch.equal(raw, rb.priorities())

    plain = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path / "storage")
    fill_rows(plain, 3)
    plain.save(tmp_path / "plain", data=True)  # a plain buffer's checkpoint is as before: no extras
    assert "extras" not in json.loads(Path(data_folder(tmp_path / "plain"), "manifest.json").read_text())
    assert not [name for name in os.listdir(data_folder(tmp_path / "plain")) if name.startswith("extra")]


# ---------------------------------------------------------------------------------------------- cross loads
def test_prioritized_checkpoint_into_a_plain_buffer(tmp_path: Path) -> None:
    original = make(tmp_path, 8, 13)
    original.save(tmp_path / "run", data=True)
    expected = full_snapshot(original)

    plain = ReplayBuffer("cpu", "cpu", 8, storage_dir=tmp_path / "storage")
    plain.load(tmp_path / "run")
    built = ReplayBuffer.from_checkpoint(tmp_path / "run", storage_dir=tmp_path / "storage")
    for rb in (plain, built):
        assert type(rb) is ReplayBuffer
        assert_same(full_snapshot(rb), expected)
        keys = list(rb.sample_batch(4).keys())
        assert "weight" not in keys and "index" in keys  # uniform draws: the priorities are ignored


def test_plain_checkpoint_into_a_prioritized_buffer_gives_uniform_priorities(tmp_path: Path) -> None:
    plain = ReplayBuffer("cpu", "cpu", 8, seed=3, storage_dir=tmp_path / "storage")
    fill_rows(plain, 13)
    plain.save(tmp_path / "plain", data=True)

    holding = make(tmp_path, 8, 13)  # priorities and max_priority of its own: replaced
    assert holding.max_priority > 1.0
    holding.load(tmp_path / "plain")
    built = PrioritizedReplayBuffer.from_checkpoint(tmp_path / "plain", storage_dir=tmp_path / "storage")
    assert (built.alpha, built.beta, built.eps) == (0.6, 0.4, 1e-6)  # the constructor's defaults
    for rb in (holding, built):
        assert_same(full_snapshot(rb), full_snapshot(plain))
        assert rb.priorities().tolist() == [1.0] * 8 and rb.max_priority == 1.0
        assert bool((rb.sample_batch(32)["weight"] == 1.0).all())


def test_metadata_only_checkpoint_keeps_uniform_priorities(tmp_path: Path) -> None:
    original = make(tmp_path, 8, 13)
    original.save(tmp_path / "counters")  # ObjectRL's save: three ints, no priorities
    assert sorted(torch.load(tmp_path / "counters.metadata", weights_only=True)) == [
        "buffer_size", "data_size", "format", "format_version", "metadata_crc32", "pointer",
    ]  # fmt: skip
    holding = make(tmp_path, 8, 13, seed=2)
    holding.load(tmp_path / "counters")
    assert holding.priorities().tolist() == [1.0] * 8 and holding.max_priority == 1.0


# ---------------------------------------------------------------------------------------------- damage
@pytest.fixture
def saved(tmp_path: Path) -> Path:
    make(tmp_path, 8, 13).save(tmp_path / "run", data=True)
    return tmp_path / "run"


def make_target(tmp_path: Path) -> PrioritizedReplayBuffer:
    """The buffer a bad load is tried on: other rows and priorities of the same capacity and schema."""
    return make(tmp_path, 8, 11, seed=5, alpha=0.8)


@pytest.fixture
def target(tmp_path: Path) -> PrioritizedReplayBuffer:
    return make_target(tmp_path)


def refused(rb: PrioritizedReplayBuffer, path: Path, error: type[Exception], *patterns: str, **load: Any) -> None:
    """``rb.load(path)`` raises ``error`` naming each pattern; ``rb`` (priorities included) unchanged.

    ``rb`` must be as :func:`make_target` built it (this check draws from it, so use it once).
    """
    before = priority_snapshot(rb)
    with pytest.raises(error) as info:
        rb.load(path, **load)
    for pattern in patterns:
        assert pattern in str(info.value), str(info.value)
    assert_same(priority_snapshot(rb), before)
    # Its sampling index too: it draws what an untouched twin draws.
    assert_same(next_draws(rb), next_draws(make_target(path.parent / "twin")))


def test_corrupted_priority_file_is_refused_and_changes_nothing(
    saved: Path, target: PrioritizedReplayBuffer, capsys: pytest.CaptureFixture[str]
) -> None:
    priority_file = Path(data_folder(saved), PRIORITY_FILE)
    data = bytearray(priority_file.read_bytes())
    data[3] ^= 0x10  # a low mantissa bit of slot 0: still a valid, positive priority
    priority_file.write_bytes(bytes(data))

    refused(target, saved, CheckpointError, str(priority_file), "checksum mismatch")
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        PrioritizedReplayBuffer.from_checkpoint(saved, storage_dir=target.storage_dir)
    assert cli.main(["verify", str(saved)]) == 1
    assert PRIORITY_FILE in capsys.readouterr().err


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")], ids=["negative", "nan", "inf"])
def test_invalid_priorities_are_refused_without_checksums_too(
    saved: Path, target: PrioritizedReplayBuffer, value: float
) -> None:
    priority_file = Path(data_folder(saved), PRIORITY_FILE)
    priorities = torch.frombuffer(bytearray(priority_file.read_bytes()), dtype=torch.float64).clone()
    priorities[4] = value
    priority_file.write_bytes(priorities.numpy().tobytes())
    refused(target, saved, CheckpointError, str(priority_file), "negative or non-finite", verify=False)


def test_truncated_or_missing_priority_file(saved: Path, tmp_path: Path) -> None:
    priority_file = Path(data_folder(saved), PRIORITY_FILE)
    priority_file.write_bytes(priority_file.read_bytes()[:-8])
    refused(make_target(tmp_path), saved, CheckpointError, str(priority_file), "truncated")
    priority_file.unlink()
    refused(make_target(tmp_path), saved, CheckpointNotFoundError, str(priority_file), "missing")


def _array(m: dict[str, Any]) -> dict[str, Any]:
    return m["extras"]["arrays"][0]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: _array(m).update(shape=[2, 4]), "float64 [8]"),
        (lambda m: _array(m).update(dtype="float32", shape=[16]), "float64 [8]"),
        (lambda m: _array(m).update(bytes=65), "records 65 bytes"),
        (lambda m: _array(m).update(file="../../run.metadata"), "bad file name"),
        (lambda m: _array(m).update(name="../x"), "bad extra name"),
        (lambda m: m["extras"]["arrays"].append(dict(_array(m))), "appears twice"),
        (lambda m: m["extras"]["values"].pop("prioritized.max_priority"), "prioritized.max_priority"),
        (lambda m: m["extras"]["values"].update({"prioritized.max_priority": "big"}), "prioritized.max_priority"),
        (lambda m: m["extras"]["values"].update({"prioritized.max_priority": -2.0}), "prioritized.max_priority"),
        (lambda m: m["extras"]["values"].update({"x": [1]}), "extra value 'x'"),
        (lambda m: m["extras"].update(values=[]), "'extras.values' must be an object"),
        (lambda m: m.update(extras=3), "'extras' must be an object"),
    ],
)
def test_inconsistent_extras_in_the_manifest(
    saved: Path, target: PrioritizedReplayBuffer, change: Callable[[dict[str, Any]], None], problem: str
) -> None:
    edit_manifest(saved, change)
    refused(target, saved, CheckpointError, data_folder(saved), problem)


def test_bad_saved_settings_are_refused_by_from_checkpoint(saved: Path, tmp_path: Path) -> None:
    edit_manifest(saved, lambda m: m["extras"]["values"].update({"prioritized.beta": 1.5}))
    with pytest.raises(CheckpointError, match=r"manifest.json' holds a bad saved setting: beta must be .* got 1.5"):
        PrioritizedReplayBuffer.from_checkpoint(saved, storage_dir=tmp_path / "storage")
    # A given beta replaces the saved one, and load() into a buffer uses the buffer's own settings.
    rb = PrioritizedReplayBuffer.from_checkpoint(saved, beta=0.5, storage_dir=tmp_path / "storage")
    assert rb.beta == 0.5 and len(rb) == 8
    assert load_into(tmp_path, saved, 8).beta == 0.5


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("saved_on", "loaded_on"), [("cpu", "cuda"), ("cuda", "cpu"), ("cuda", "cuda")])
def test_priorities_move_between_storing_devices(tmp_path: Path, saved_on: str, loaded_on: str) -> None:
    rb = PrioritizedReplayBuffer("cuda", saved_on, 8, seed=3, alpha=0.7, storage_dir=tmp_path / "storage")
    fill_rows(rb, 13)
    rb.update_priority(torch.arange(8), torch.linspace(0.5, 4.0, 8, dtype=torch.float64))
    rb.save(tmp_path / "run", data=True)
    loaded = PrioritizedReplayBuffer.from_checkpoint(tmp_path / "run", storing_device=loaded_on, storage_dir=tmp_path)
    assert loaded.storing_device.type == loaded_on and loaded.priorities().device.type == loaded_on
    assert torch.equal(loaded.priorities().cpu(), rb.priorities().cpu()) and loaded.max_priority == rb.max_priority
    if saved_on == loaded_on:  # the generator state is restored only on the same device type
        x, y = rb.sample_batch(64), loaded.sample_batch(64)
        assert torch.equal(x["index"].cpu(), y["index"].cpu()) and torch.equal(x["weight"].cpu(), y["weight"].cpu())
