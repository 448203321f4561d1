"""Issue 27, the trajectory room, an outside review: a symlinked rank folder is never followed (``--move``
emptied the folder it pointed to), a file whose fields do not match the load's schema is refused naming it
and the field (a wrongly shaped field was dropped), a live writer's folder is not swapped away by another
buffer's save, and index ids must be JSON integers (``true`` loaded as id 1).
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer.cli import main
from objectrl_buffer.errors import CheckpointError, InvalidArgumentError
from objectrl_buffer.trajectory import TrajectoryReplayBuffer, files, merge_rank_folders, split_folder
from tests.support import deadline, tree
from tests.trajectory.common import marked

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="symlinks, FIFOs, flock: Linux")


def save(folder: Path, markers: range, **kwargs: Any) -> None:
    rb = TrajectoryReplayBuffer(seed=0, sample_window_size=0, **kwargs)
    rb.add_trajectories([marked(m) for m in markers])
    rb.save_checkpoint(str(folder))
    rb.close()


def rechecksum(folder: Path) -> None:
    """Make the index's sizes and checksums match the files now in ``folder`` (a hostile writer's)."""
    path = folder / files.INDEX
    index = json.loads(path.read_text())
    for tid, info in index["trajectory_index"].items():
        blob = (folder / files.file_name(int(tid), info["model_weights_id"], "pt")).read_bytes()
        info.update(bytes=len(blob), crc32=f"{zlib.crc32(blob):08x}")
    path.write_text(json.dumps(index))


def refused(folder: Path, *patterns: str) -> None:
    """Loading ``folder`` raises CheckpointError naming each pattern; the buffer keeps what it held."""
    rb = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    rb.add_trajectories([marked(9)])
    state = rb.generator.get_state()
    try:
        with deadline(10), pytest.raises(CheckpointError) as info:
            rb.load_checkpoint(str(folder))
        for pattern in patterns:
            assert pattern in str(info.value), str(info.value)
        assert (rb.trajectory_ids, rb.total_samples) == ([0], 8)
        assert torch.equal(rb.generator.get_state(), state)
        assert set(rb.sample(16)["rewards"].tolist()) == {9.0}
    finally:
        rb.close()


# ------------------------------------------------------------------------------------- 1: symlinked rank folders
@linux_only
@pytest.mark.parametrize("move", [False, True])
def test_merge_refuses_a_rank_folder_that_is_a_symlink_out_of_the_source(tmp_path: Path, move: bool) -> None:
    source = tmp_path / "ranks"
    save(source / "rank_0", range(2))
    save(tmp_path / "outside", range(5, 7))
    (source / "rank_1").symlink_to(tmp_path / "outside")
    before = tree(tmp_path)
    with pytest.raises(CheckpointError, match="rank_1' is a symbolic link"):
        merge_rank_folders(str(source), str(tmp_path / "merged"), move=move)
    assert tree(tmp_path) == before and not (tmp_path / "merged").exists()  # nothing copied, nothing moved
    argv = ["trajectories", "merge", "--source-path", str(source), "--save-path", str(tmp_path / "m2")]
    assert main([*argv, "--move"] if move else argv) == 1
    assert tree(tmp_path) == before and sorted(os.listdir(tmp_path / "outside"))[0] == files.METADATA


@linux_only
def test_merge_refuses_a_rank_entry_that_is_a_fifo(tmp_path: Path) -> None:
    source = tmp_path / "ranks"
    save(source / "rank_0", range(2))
    os.mkfifo(source / "rank_1")
    with deadline(10), pytest.raises(CheckpointError, match="rank_1' is a FIFO"):
        merge_rank_folders(str(source), str(tmp_path / "merged"), move=True)
    assert len(os.listdir(source / "rank_0")) == 4 and not (tmp_path / "merged").exists()


@linux_only
def test_split_move_never_removes_a_symlinked_trajectory_file_target(tmp_path: Path) -> None:
    source = tmp_path / "ck"
    save(source, range(3))
    outside = tmp_path / "outside.pt"
    file = source / "trajectory_0_w0_0.pt"
    file.rename(outside)
    file.symlink_to(outside)
    with pytest.raises(CheckpointError, match=r"trajectory_0_w0_0\.pt"):
        split_folder(str(source), str(tmp_path / "part"), 2, move=True)
    assert outside.is_file() and file.is_symlink() and not (tmp_path / "part").exists()


# ------------------------------------------------------------------------------ 2: fields that miss the schema
@pytest.fixture
def saved(tmp_path: Path) -> Path:
    save(tmp_path / "ck", range(2))
    return tmp_path / "ck"


def damage(folder: Path, trajectory_id: int, change: Any) -> str:
    name = f"trajectory_{trajectory_id}_w{trajectory_id}_0.pt"
    payload = torch.load(folder / name, weights_only=True)
    change(payload)
    torch.save(payload, folder / name)
    rechecksum(folder)
    return name


def wrong_shape(payload: dict[str, Any]) -> None:
    payload["actions"] = torch.zeros(3, 3, 3)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (wrong_shape, "actions"),
        (lambda p: p.update(actions=torch.zeros(4, 2, 2)), "actions"),  # 2 values a row, the others 1
        (lambda p: p.update(rewards=p["rewards"].double()), "rewards"),  # another dtype: no silent cast
        (lambda p: p.pop("actions"), "actions"),
        (lambda p: p.update(actions=[1, 2, 3]), "actions"),  # a field of Trajectory holding no tensor
        (lambda p: p["curr_obs"].update(extra=torch.zeros(4, 2)), "curr_obs.extra"),
    ],
    ids=["wrong-T-B", "row-shape", "dtype", "missing", "not-a-tensor", "extra"],
)
def test_a_damaged_file_with_a_valid_checksum_is_refused_naming_it_and_the_field(
    saved: Path, change: Any, field: str
) -> None:
    """The first file damaged: the error names it (not the intact second file), and the field."""
    name = damage(saved, 0, change)
    refused(saved, name, field)


def test_a_later_file_missing_a_field_is_refused_naming_it(saved: Path) -> None:
    """A key of a dict field; a tensor field RLinf left out (``versions``...) loads with a presence mask
    (tests/compat/test_rlinf.py)."""
    name = damage(saved, 1, lambda p: p["curr_obs"].pop("state"))
    refused(saved, name, "curr_obs.state", "trajectory_0_w0_0.pt")


def test_a_folder_holding_only_a_wrongly_shaped_file_is_refused(saved: Path) -> None:
    name = damage(saved, 0, wrong_shape)
    index = json.loads((saved / files.INDEX).read_text())
    del index["trajectory_index"]["1"]
    index["trajectory_id_list"] = [0]
    (saved / files.INDEX).write_text(json.dumps(index))
    refused(saved, name, "actions")


def test_an_unknown_non_tensor_value_in_a_file_is_still_skipped(saved: Path) -> None:
    """What RLinf's sampler ignores (a value under a name its Trajectory has no field for) still loads."""
    damage(saved, 0, lambda p: p.update(note="made by hand", step=7))
    rb = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    rb.load_checkpoint(str(saved))
    assert rb.trajectory_ids == [0, 1] and set(rb.sample(64).keys()) >= {"actions", "rewards"}
    rb.close()


# ------------------------------------------------------------------------------------ 3: a live writer's folder
def test_a_save_into_another_live_writers_folder_is_refused(tmp_path: Path) -> None:
    live = tmp_path / "live"
    writer = TrajectoryReplayBuffer(seed=0, storage_dir=str(live), save_trajectories=True, sample_window_size=0)
    writer.add_trajectories([marked(m) for m in range(3)])
    writer.flush()
    other = TrajectoryReplayBuffer(seed=1, sample_window_size=0)
    other.add_trajectories([marked(7)])
    before = tree(live)
    with pytest.raises(InvalidArgumentError, match="live"):
        other.save_checkpoint(str(live))
    assert tree(live) == before
    writer.save_checkpoint(str(live))  # its own storage_dir: a flush, as before
    writer.add_trajectories([marked(m) for m in range(3, 5)])
    writer.close()
    reloaded = TrajectoryReplayBuffer(seed=0)
    reloaded.load_checkpoint(str(live))
    assert reloaded.trajectory_ids == [0, 1, 2, 3, 4]
    other.save_checkpoint(str(live))  # the writer closed: the folder is free to replace
    reloaded.load_checkpoint(str(live))
    assert reloaded.trajectory_ids == [0]
    reloaded.close()
    other.close()


# ----------------------------------------------------------------------------------------- 4: ids are integers
@pytest.mark.parametrize("bad", [True, 1.0, "1"], ids=["bool", "float", "str"])
def test_an_index_id_that_is_no_json_integer_is_refused(saved: Path, bad: Any) -> None:
    path = saved / files.INDEX
    index = json.loads(path.read_text())
    index["trajectory_id_list"] = [0, bad]
    path.write_text(json.dumps(index))
    refused(saved, str(path), "not a JSON integer")
