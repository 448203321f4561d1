"""Issue 27, the trajectory room: no file an index names is ever overwritten, files carry checksums in our index,
hostile folders (links, FIFOs, repeated ids, compressed archives, damaged content) are refused with a
CheckpointError naming the file, and opening a folder never rewrites its index.

Whatever could block forever (a FIFO) runs under a deadline.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import zipfile
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer.cli import main
from objectrl_buffer.errors import CheckpointError, InvalidArgumentError
from objectrl_buffer.trajectory import Trajectory, TrajectoryReplayBuffer, files, merge_rank_folders
from tests.support import deadline, tree
from tests.trajectory.common import marked

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="FIFOs, O_NOFOLLOW, SIGALRM: Linux")


def same_name(m: int, T: int = 4) -> Trajectory:
    """Marker trajectory ``m`` whose file name depends on its id only (one model_weights_id for all)."""
    return replace(marked(m, T=T), model_weights_id="w")


def named_by_index(folder: str) -> set[str]:
    """Real paths of the trajectory files the index on disk in ``folder`` names now."""
    path = os.path.join(folder, files.INDEX)
    if not os.path.exists(path):
        return set()
    index = json.loads(Path(path).read_text())
    return {
        os.path.realpath(os.path.join(folder, files.file_name(int(i), info["model_weights_id"], "pt")))
        for i, info in index["trajectory_index"].items()
    }


def watch_overwrites(monkeypatch: pytest.MonkeyPatch, folder: str) -> list[str]:
    """Record every trajectory file written while the index on disk in ``folder`` names it."""
    overwritten: list[str] = []
    real = files.write_payload

    def write_payload(path: str, *args: Any, **kwargs: Any) -> Any:
        if os.path.realpath(path) in named_by_index(folder):
            overwritten.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(files, "write_payload", write_payload)
    return overwritten


def markers(rb: TrajectoryReplayBuffer, folder: Path | str) -> dict[int, float]:
    """Trajectory id -> marker of each file ``folder``'s index names, read from the file; checked to be what
    the buffer ``rb`` (loaded from it) holds: the same ids and markers, every row consistent."""
    index = json.loads(Path(folder, files.INDEX).read_text())
    out = {}
    for tid in index["trajectory_id_list"]:
        info = index["trajectory_index"][str(tid)]
        payload = torch.load(Path(folder, files.file_name(tid, info["model_weights_id"], "pt")), weights_only=True)
        out[tid] = float(payload["rewards"][0, 0])
    assert rb.trajectory_ids == list(out)
    if out:
        batch = rb.sample(4096)
        assert torch.equal(batch["actions"].squeeze(-1).long() // 1000, batch["rewards"].long())
        assert set(batch["rewards"].tolist()) <= set(out.values())
    return out


def loaded(folder: Path | str, **kwargs: Any) -> TrajectoryReplayBuffer:
    rb = TrajectoryReplayBuffer(seed=0, sample_window_size=0, **kwargs)
    rb.load_checkpoint(str(folder))
    return rb


def rechecksum(folder: Path) -> None:
    """Make the index's sizes and checksums match the regular files now in ``folder`` (a hostile writer's)."""
    path = folder / files.INDEX
    index = json.loads(path.read_text())
    for tid, info in index["trajectory_index"].items():
        file = folder / files.file_name(int(tid), info["model_weights_id"], "pt")
        if file.is_file() and not file.is_symlink():
            blob = file.read_bytes()
            info.update(bytes=len(blob), crc32=f"{zlib.crc32(blob):08x}")
    path.write_text(json.dumps(index))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A checkpoint of 3 marker trajectories (ids 0..2, markers 0..2) at ``<tmp>/ck``."""
    rb = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    rb.add_trajectories([marked(m) for m in range(3)])
    rb.save_checkpoint(str(tmp_path / "ck"))
    rb.close()
    return tmp_path / "ck"


def refused(folder: Path, *patterns: str) -> None:
    """Loading ``folder`` raises CheckpointError naming each pattern, and the buffer holding one trajectory
    keeps it, untouched."""
    rb = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    rb.add_trajectories([marked(9)])
    before = (rb.trajectory_ids, rb.total_samples, rb.generator.get_state())
    try:
        with deadline(10), pytest.raises(CheckpointError) as info:
            rb.load_checkpoint(str(folder))
        for pattern in patterns:
            assert pattern in str(info.value), str(info.value)
        assert (rb.trajectory_ids, rb.total_samples) == before[:2]
        assert torch.equal(rb.generator.get_state(), before[2])
        assert set(rb.sample(16)["rewards"].tolist()) == {9.0}
    finally:
        rb.close()


# ---------------------------------------------------------------------------------------------- overwrites
def test_after_clear_no_file_the_published_index_names_is_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer is held in an index rewrite naming ids 0..3 while the buffer clears and adds ids 0..2 again
    (same file names): those files must not be rewritten while that index names them."""
    folder = str(tmp_path / "buf")
    rb = TrajectoryReplayBuffer(seed=0, storage_dir=folder, save_trajectories=True, sample_window_size=0)
    try:
        rb.add_trajectories([same_name(m) for m in range(3)])
        rb.flush()
        overwritten = watch_overwrites(monkeypatch, folder)
        gate, held = threading.Event(), threading.Event()
        real_index = files.write_index

        def write_index(*args: Any, **kwargs: Any) -> None:
            if not gate.is_set():
                held.set()
                gate.wait(10)
            real_index(*args, **kwargs)

        monkeypatch.setattr(files, "write_index", write_index)
        rb.add_trajectories([same_name(3)])
        assert held.wait(10)
        rb.clear()
        rb.add_trajectories([same_name(m) for m in (100, 101, 102)])
        gate.set()
        rb.flush()
        assert overwritten == []
        again = loaded(folder)
        assert markers(again, folder) == {0: 100.0, 1: 101.0, 2: 102.0}
        again.close()
    finally:
        rb.close()


def test_save_checkpoint_over_another_runs_checkpoint_replaces_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ck"
    old = TrajectoryReplayBuffer(seed=1, sample_window_size=0)
    old.add_trajectories([same_name(m) for m in range(4)])
    old.save_checkpoint(str(path))
    (path / "notes.txt").write_text("the user's")
    new = TrajectoryReplayBuffer(seed=2, sample_window_size=0)
    new.add_trajectories([same_name(m) for m in (100, 101)])  # ids 0, 1: the names of the old 0, 1
    overwritten = watch_overwrites(monkeypatch, str(path))
    new.save_checkpoint(str(path))
    assert overwritten == []
    again = loaded(path)
    assert markers(again, path) == {0: 100.0, 1: 101.0} and again.seed == 2
    assert sorted(os.listdir(path)) == [
        "metadata.json", "notes.txt", "trajectory_0_w.pt", "trajectory_1_w.pt", "trajectory_index.json",
    ]  # fmt: skip
    assert (path / "notes.txt").read_text() == "the user's"
    assert os.listdir(tmp_path) == ["ck"]  # no temp folder left beside it
    for rb in (old, new, again):
        rb.close()


def test_without_rename_exchange_a_save_over_a_checkpoint_still_replaces_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objectrl_buffer.trajectory import checkpoint

    monkeypatch.setattr(checkpoint, "exchange", lambda a, b: False)  # a filesystem without RENAME_EXCHANGE
    path = tmp_path / "ck"
    for markers_ in ([0, 1, 2], [100, 101]):
        rb = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
        rb.add_trajectories([same_name(m) for m in markers_])
        rb.save_checkpoint(str(path))
        rb.close()
    again = loaded(path)
    assert markers(again, path) == {0: 100.0, 1: 101.0}
    assert os.listdir(tmp_path) == ["ck"]
    again.close()


def test_a_save_over_a_checkpoint_holding_a_folder_is_refused_and_changes_nothing(saved: Path) -> None:
    (saved / "mine").mkdir()
    before = tree(saved)
    rb = TrajectoryReplayBuffer(seed=0)
    rb.add_trajectories([marked(7)])
    with pytest.raises(InvalidArgumentError, match="mine"):
        rb.save_checkpoint(str(saved))
    assert tree(saved) == before and os.listdir(saved.parent) == ["ck"]
    rb.close()


@linux_only
def test_a_save_through_a_symlinked_folder_replaces_the_folder_it_names(saved: Path, tmp_path: Path) -> None:
    os.symlink(saved, tmp_path / "link")
    rb = TrajectoryReplayBuffer(seed=0)
    rb.add_trajectories([marked(7)])
    rb.save_checkpoint(str(tmp_path / "link"))
    rb.close()
    assert (tmp_path / "link").is_symlink()
    again = loaded(saved)
    assert markers(again, saved) == {0: 7.0}
    again.close()


@pytest.mark.parametrize("path", ["", b"x", 3])
def test_save_and_load_need_a_folder_path(make: Any, path: Any) -> None:
    rb = make(seed=0)
    rb.add_trajectories([marked(0)])
    with pytest.raises(InvalidArgumentError, match="save_path"):
        rb.save_checkpoint(path)
    with pytest.raises(InvalidArgumentError, match="load_path"):
        rb.load_checkpoint(path)
    assert rb.trajectory_ids == [0]


# ---------------------------------------------------------------------------------------------- checksums
def test_a_flipped_bit_in_a_tensor_is_refused_naming_the_file(saved: Path) -> None:
    file = saved / "trajectory_1_w1_0.pt"
    blob = bytearray(file.read_bytes())
    one = torch.tensor([1.0]).numpy().tobytes()  # rewards of marker 1: eight float32 1.0 in a row
    at = bytes(blob).index(one * 8)
    blob[at + 3] ^= 0x7F  # 1.0 -> 4.0 (0x3f800000 -> 0x40800000)
    file.write_bytes(bytes(blob))
    refused(saved, "trajectory_1_w1_0.pt", "crc32")


def test_a_file_of_another_size_than_its_entry_is_refused(saved: Path) -> None:
    with open(saved / "trajectory_2_w2_0.pt", "ab") as f:
        f.write(b"\0")
    refused(saved, "trajectory_2_w2_0.pt", "bytes")


def test_merge_checks_and_records_checksums(saved: Path, tmp_path: Path) -> None:
    ranks = tmp_path / "src"
    ranks.mkdir()
    os.rename(saved, ranks / "rank_0")
    merge_rank_folders(ranks, tmp_path / "merged")
    index = json.loads((tmp_path / "merged" / files.INDEX).read_text())
    blob = (tmp_path / "merged" / "trajectory_0_w0_0.pt").read_bytes()
    assert index["trajectory_index"]["0"]["crc32"] == f"{zlib.crc32(blob):08x}"
    file = ranks / "rank_0" / "trajectory_2_w2_0.pt"
    blob = bytearray(file.read_bytes())
    blob[-100] ^= 1
    file.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=r"trajectory_2_w2_0\.pt"):
        merge_rank_folders(ranks, tmp_path / "merged2")
    assert not (tmp_path / "merged2").exists()


# ---------------------------------------------------------------------------------------------- links, FIFOs
@linux_only
def test_a_fifo_in_place_of_a_trajectory_file_is_refused_not_waited_on(saved: Path) -> None:
    file = saved / "trajectory_1_w1_0.pt"
    file.unlink()
    os.mkfifo(file)
    refused(saved, "trajectory_1_w1_0.pt", "FIFO")


@linux_only
def test_a_fifo_found_by_the_name_fallback_is_refused(saved: Path) -> None:
    (saved / "trajectory_1_w1_0.pt").unlink()
    os.mkfifo(saved / "trajectory_1_other.pt")  # what the trajectory_1_*.pt fallback finds
    refused(saved, "trajectory_1_other.pt", "FIFO")


@linux_only
def test_a_trajectory_file_symlinked_out_of_the_folder_is_refused(saved: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.pt"
    os.rename(saved / "trajectory_0_w0_0.pt", outside)
    os.symlink(outside, saved / "trajectory_0_w0_0.pt")
    rechecksum(saved)
    refused(saved, "trajectory_0_w0_0.pt", "symbolic link")


@linux_only
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_merge_refuses_a_symlinked_or_special_file(
    saved: Path, tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ranks = tmp_path / "src"
    ranks.mkdir()
    os.rename(saved, ranks / "rank_0")
    file = ranks / "rank_0" / "trajectory_0_w0_0.pt"
    if kind == "symlink":
        outside = tmp_path / "secret.pt"
        os.rename(file, outside)
        os.symlink(outside, file)
    else:
        file.unlink()
        os.mkfifo(file)
    with deadline(10), pytest.raises(CheckpointError, match=r"trajectory_0_w0_0\.pt"):
        merge_rank_folders(ranks, tmp_path / "merged")
    assert not (tmp_path / "merged").exists()
    with deadline(10):
        assert main(["trajectories", "merge", "--source-path", str(ranks), "--save-path", str(tmp_path / "m")]) == 1
    assert "FAILED" in capsys.readouterr().err and not (tmp_path / "m").exists()


# ---------------------------------------------------------------------------------------------- amplification
def test_an_index_listing_one_id_many_times_is_refused(saved: Path) -> None:
    path = saved / files.INDEX
    index = json.loads(path.read_text())
    index["trajectory_id_list"] = [0] * 50
    path.write_text(json.dumps(index))
    refused(saved, "trajectory id 0 is listed more than once")


def test_a_compressed_archive_is_refused_before_torch_inflates_it(saved: Path) -> None:
    file = saved / "trajectory_2_w2_0.pt"
    payload = torch.load(file, weights_only=True)
    payload["junk"] = torch.zeros(1 << 22)  # 16 MiB of zeros, ~16 KiB deflated; not [T, B]: RLinf skips it
    plain = io.BytesIO()
    torch.save(payload, plain)
    source = zipfile.ZipFile(io.BytesIO(plain.getvalue()))
    with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member in source.infolist():
            archive.writestr(member.filename, source.read(member.filename))
    assert file.stat().st_size < 1 << 20
    rechecksum(saved)
    refused(saved, "trajectory_2_w2_0.pt", "unpacks to")


# ---------------------------------------------------------------------------------------------- error classes
@pytest.mark.parametrize("content", ["list", "bad field", "other schema"])
def test_damaged_content_is_a_checkpoint_error_naming_the_file(saved: Path, content: str) -> None:
    file = saved / "trajectory_1_w1_0.pt"
    payload = torch.load(file, weights_only=True)
    if content == "list":
        payload = [1, 2, 3]
    elif content == "bad field":
        payload["max_episode_length"] = "long"
    else:
        payload["curr_obs"]["state"] = torch.zeros(4, 2, 5)  # 5 values a row where the others have 3
    torch.save(payload, file)
    rechecksum(saved)
    refused(saved, "trajectory_1_w1_0.pt")


@pytest.mark.parametrize("which", ["device", "storing_device"])
def test_an_unknown_device_is_an_invalid_argument_naming_it(which: str) -> None:
    with pytest.raises(InvalidArgumentError, match=which):
        TrajectoryReplayBuffer(seed=0, **{which: "bogus"})


def test_reopening_a_folder_with_a_smaller_capacity_leaves_its_index_alone(tmp_path: Path) -> None:
    folder = tmp_path / "buf"
    rb = TrajectoryReplayBuffer(seed=0, storage_dir=str(folder), save_trajectories=True)
    rb.add_trajectories([marked(m) for m in range(10)])  # 8 transitions each
    rb.close()
    before = tree(folder)
    small = TrajectoryReplayBuffer(seed=0, storage_dir=str(folder), save_trajectories=True, capacity=16)
    assert small.trajectory_ids == [8, 9]
    small.flush()
    small.close()
    assert tree(folder) == before  # opened and closed: nothing rewritten
    again = loaded(folder)
    assert again.trajectory_ids == list(range(10))
    again.close()
    small = TrajectoryReplayBuffer(seed=0, storage_dir=str(folder), save_trajectories=True, capacity=16)
    small.add_trajectories([marked(10)])  # asked: the folder now follows what the buffer keeps
    small.close()
    again = loaded(folder)
    assert markers(again, folder) == {9: 9.0, 10: 10.0}
    assert sorted(p.name for p in folder.glob("*.pt")) == ["trajectory_10_w10_0.pt", "trajectory_9_w9_0.pt"]
    again.close()
