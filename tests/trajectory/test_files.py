"""The RLinf folder: background persistence, checkpoints, sharded loads, folders written by rlinf 0.3.0 itself."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer.errors import CheckpointError
from tests.support import tree
from tests.trajectory.common import marked

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "rlinf030"
ROOT = Path(__file__).resolve().parents[2]


def rlinf() -> Any:
    """rlinf 0.3.0's module from its wheel, or a skip when it cannot be had (offline)."""
    from benchmarks import rlinf_peer

    try:
        return rlinf_peer.load(download=not os.environ.get("OBJECTRL_BUFFER_NO_DOWNLOAD"))
    except rlinf_peer.Unavailable as exc:
        pytest.skip(str(exc))


def write_with_rlinf(module: Any, folder: str, n: int = 3) -> None:
    """What tests/fixtures/rlinf030 was made with: rlinf 0.3.0 auto-saving ``n`` marker trajectories."""
    upstream = module.TrajectoryReplayBuffer(seed=5, auto_save=True, auto_save_path=folder, sample_window_size=0)
    upstream.add_trajectories([marked(m, epochs=2) for m in range(n)])
    upstream.close()


def test_before_the_first_add_the_folder_already_loads(make: Any, tmp_path: Path) -> None:
    make(seed=0, storage_dir=str(tmp_path), save_trajectories=True)
    fresh = make(seed=0)
    fresh.load_checkpoint(str(tmp_path))
    assert len(fresh) == 0


def test_flushed_folder_has_rlinf_names_keys_and_index(make: Any, tmp_path: Path) -> None:
    rb = make(seed=3, storage_dir=str(tmp_path), save_trajectories=True)
    rb.add_trajectories([marked(m, epochs=2) for m in range(3)])
    rb.flush()
    names = ["metadata.json", "trajectory_0_w0_0.pt", "trajectory_1_w1_0.pt", "trajectory_2_w2_0.pt"]
    assert sorted(os.listdir(tmp_path)) == [*names, "trajectory_index.json"]
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert meta == {
        "storage_dir": str(tmp_path), "storage_format": "pt", "trajectory_format": "pt", "size": 3,
        "total_samples": 24, "trajectory_counter": 3, "seed": 3,
    }  # fmt: skip
    index = json.loads((tmp_path / "trajectory_index.json").read_text())
    assert index["trajectory_id_list"] == [0, 1, 2]
    info = index["trajectory_index"]["1"]
    checksum = {"bytes": info.pop("bytes"), "crc32": info.pop("crc32")}  # ours, beside RLinf's keys
    assert info == {
        "num_samples": 8, "trajectory_id": 1, "max_episode_length": 4, "shape": [4, 2], "model_weights_id": "w1_0",
    }  # fmt: skip
    blob = (tmp_path / "trajectory_1_w1_0.pt").read_bytes()
    assert checksum == {"bytes": len(blob), "crc32": f"{zlib.crc32(blob):08x}"}
    payload = torch.load(tmp_path / "trajectory_1_w1_0.pt", weights_only=True)
    assert payload["model_weights_id"] == "w1_0" and payload["max_episode_length"] == 4
    assert torch.equal(payload["curr_obs"]["state"], torch.full((4, 2, 3), 1.0))
    assert payload["rewards"].shape == (4, 2) and payload["dones"].shape == (6, 2)  # T + E rows, as RLinf writes


def test_a_fresh_process_loading_the_folder_samples_identical_data(make: Any, tmp_path: Path) -> None:
    rb = make(seed=11, storage_dir=str(tmp_path / "buf"), save_trajectories=True, sample_window_size=2)
    rb.add_trajectories([marked(m, T=3 + m) for m in range(4)])
    rb.flush()
    reference = make(seed=11, sample_window_size=2)  # same seed, same adds: the draws the folder must give
    reference.add_trajectories([marked(m, T=3 + m) for m in range(4)])
    expected = reference.sample(40)
    code = (
        "import sys, torch\nfrom objectrl_buffer.trajectory import TrajectoryReplayBuffer\n"
        "rb = TrajectoryReplayBuffer(seed=99, sample_window_size=2)\nrb.load_checkpoint(sys.argv[1])\n"
        "torch.save(rb.sample(40).to_dict(), sys.argv[2])\n"
    )
    out = tmp_path / "sample.pt"
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "buf"), str(out)], cwd=ROOT, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    got = torch.load(out, weights_only=True)
    assert torch.equal(got["actions"], expected["actions"]) and torch.equal(
        got["curr_obs"]["state"], expected["curr_obs", "state"]
    )


def test_the_recorded_rlinf_030_folder_loads(make: Any) -> None:
    rb = make(seed=0, sample_window_size=0)
    rb.load_checkpoint(str(FIXTURE))
    assert rb.trajectory_ids == [0, 1, 2] and rb.total_samples == 24 and rb.seed == 5
    batch = rb.sample(24)
    assert set(batch["rewards"].long().tolist()) <= {0, 1, 2}
    assert torch.equal(batch["next_obs", "state"][:, 0], batch["rewards"] + 0.5)
    assert not bool(batch["dones"].any())  # the epochs' first rows (True) were dropped


def test_a_folder_written_by_rlinf_030_loads_and_samples_as_rlinf_does(make: Any, tmp_path: Path) -> None:
    module = rlinf()
    write_with_rlinf(module, str(tmp_path / "up"), n=5)
    ours = make(seed=0, sample_window_size=3)
    ours.load_checkpoint(str(tmp_path / "up"))
    theirs = module.TrajectoryReplayBuffer(seed=0, sample_window_size=3, enable_cache=True, cache_size=5)
    theirs.load_checkpoint(str(tmp_path / "up"))
    a, b = ours.sample(30), theirs.sample(30)  # both re-seeded from the folder (5), same draws
    for key in ("actions", "rewards", "dones", "prev_logprobs"):
        assert torch.equal(a[key], b[key]), key
    assert torch.equal(a["curr_obs", "state"], b["curr_obs"]["state"])
    theirs.close()


def test_rlinf_030_loads_a_folder_we_wrote(make: Any, tmp_path: Path) -> None:
    module = rlinf()
    rb = make(seed=4, storage_dir=str(tmp_path), save_trajectories=True, sample_window_size=3)
    rb.add_trajectories([marked(m) for m in range(5)])
    rb.flush()
    theirs = module.TrajectoryReplayBuffer(seed=0, sample_window_size=3)  # window 0 would break its cache
    theirs.load_checkpoint(str(tmp_path))
    assert torch.equal(theirs.sample(24)["actions"], rb.sample(24)["actions"])
    theirs.close()


def test_sharded_loads_give_contiguous_shares_remainder_low(make: Any, tmp_path: Path) -> None:
    rb = make(seed=0)
    rb.add_trajectories([marked(m) for m in range(10)])
    rb.save_checkpoint(str(tmp_path))  # without save_trajectories: still a complete folder
    shards = []
    for rank in range(3):
        part = make(seed=0, sample_window_size=0)
        part.load_checkpoint(str(tmp_path), is_distributed=True, local_rank=rank, world_size=3)
        shards.append(part.trajectory_ids)
        assert set(part.sample(500)["rewards"].long().tolist()) == set(part.trajectory_ids)
    assert shards == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    part.add_trajectories([marked(10)])
    assert part.trajectory_ids[-1] == 10  # the counter follows the largest loaded id
    for bad_rank, size in ((3, 3), (-1, 3)):
        with pytest.raises(ValueError, match=r"local_rank .* must be in range"):
            part.load_checkpoint(str(tmp_path), True, bad_rank, size)


def test_missing_files_raise_naming_them_and_leave_the_buffer_as_it_was(make: Any, tmp_path: Path) -> None:
    src = make(seed=0)
    src.add_trajectories([marked(m) for m in range(4)])
    src.save_checkpoint(str(tmp_path))
    os.unlink(tmp_path / "trajectory_2_w2_0.pt")
    rb = make(seed=0)
    rb.add_trajectories([marked(9)])
    with pytest.raises(FileNotFoundError, match=r"trajectory_2_w2_0\.pt"):
        rb.load_checkpoint(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="Metadata not found"):
        rb.load_checkpoint(str(tmp_path / "nowhere"))
    assert rb.trajectory_ids == [0] and rb.sample(3)["rewards"].tolist() == [9.0] * 3


def test_pickle_files_need_allow_pickle(make: Any, tmp_path: Path) -> None:
    rb = make(seed=0, storage_dir=str(tmp_path), save_trajectories=True, storage_format="pkl")
    rb.add_trajectories([marked(m) for m in range(2)])
    rb.flush()
    with open(tmp_path / "trajectory_0_w0_0.pkl", "rb") as f:
        assert pickle.load(f)["rewards"].shape == (4, 2)
    with pytest.raises(CheckpointError, match="allow_pickle=True"):
        make(seed=0).load_checkpoint(str(tmp_path))
    trusting = make(seed=0, allow_pickle=True, sample_window_size=0)
    trusting.load_checkpoint(str(tmp_path))
    assert trusting.trajectory_ids == [0, 1]


def test_eviction_removes_files_and_index_entries(make: Any, tmp_path: Path) -> None:
    rb = make(seed=0, storage_dir=str(tmp_path), save_trajectories=True, capacity=20)
    for m in range(5):
        rb.add_trajectories([marked(m)])  # 8 rows each: two fit
    rb.flush()
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".pt")) == [
        "trajectory_3_w3_0.pt",
        "trajectory_4_w4_0.pt",
    ]
    assert json.loads((tmp_path / "trajectory_index.json").read_text())["trajectory_id_list"] == [3, 4]


def test_a_file_evicted_then_rewritten_after_a_clear_stays(make: Any, tmp_path: Path) -> None:
    rb = make(seed=0, storage_dir=str(tmp_path), save_trajectories=True, capacity=8)
    rb.add_trajectories([marked(0), marked(1)])  # 0 is evicted: its file is doomed
    rb.clear()
    rb.add_trajectories([marked(0)])  # id 0 again, same file name
    rb.flush()
    fresh = make(seed=0)
    fresh.load_checkpoint(str(tmp_path))
    assert fresh.trajectory_ids == [0] and fresh.sample(2)["rewards"].tolist() == [0.0, 0.0]


def test_a_writer_failure_is_raised_by_flush_add_and_close(
    make: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objectrl_buffer.trajectory import files

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    rb = make(seed=0, storage_dir=str(tmp_path), save_trajectories=True)
    monkeypatch.setattr(files, "write_payload", full)
    rb.add_trajectories([marked(0)])
    with pytest.raises(CheckpointError, match="No space left"):
        rb.flush()
    with pytest.raises(CheckpointError, match="No space left"):
        rb.add_trajectories([marked(1)])
    assert rb.trajectory_ids == [0]  # the rows are stored; only the files failed
    with pytest.raises(CheckpointError, match="No space left"):
        rb.close()
    fresh = make(seed=0)
    fresh.load_checkpoint(str(tmp_path))
    assert len(fresh) == 0  # the folder still loads: it names no file that was not written


def test_a_saving_buffer_resumes_from_its_folder(make: Any, tmp_path: Path) -> None:
    rb = make(seed=0, storage_dir=str(tmp_path), save_trajectories=True)
    rb.add_trajectories([marked(m) for m in range(3)])
    rb.close()
    again = make(seed=0, storage_dir=str(tmp_path), save_trajectories=True)
    assert again.trajectory_ids == [0, 1, 2]
    again.add_trajectories([marked(3)])
    again.flush()
    assert json.loads((tmp_path / "metadata.json").read_text())["size"] == 4


def test_save_checkpoint_into_the_own_folder_is_a_flush(make: Any, tmp_path: Path) -> None:
    rb = make(seed=0, storage_dir=str(tmp_path), save_trajectories=True)
    rb.add_trajectories([marked(0)])
    rb.save_checkpoint(str(tmp_path))
    before = tree(str(tmp_path))
    assert "trajectory_0_w0_0.pt" in before
    copy = tmp_path.parent / "copy"
    rb.save_checkpoint(str(copy))
    assert sorted(os.listdir(copy)) == sorted(before)
    shutil.rmtree(copy)


@pytest.mark.parametrize("how", ["background", "save_checkpoint"])
def test_every_file_an_index_names_was_synced_before_that_index_was_written(
    make: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Files are written without an fsync each and synced in a batch, so a power cut must still find every
    file the (durable) index names: the log of fsyncs and index writes shows each named file synced first."""
    from objectrl_buffer.checkpoint import io
    from objectrl_buffer.trajectory import files

    synced: set[str] = set()
    unsynced_names: list[tuple[str, list[str]]] = []
    real_fsync, real_index = io.fsync_path, files.write_index

    def fsync(path: str) -> None:
        synced.add(os.path.realpath(path))
        real_fsync(path)

    def write_index(folder: str, entries: list[Any], fmt: str, seed: Any, **kw: Any) -> None:
        named = [
            os.path.realpath(os.path.join(folder, files.file_name(e.trajectory_id, e.model_weights_id, fmt)))
            for e in entries
        ]
        unsynced_names.append((folder, [p for p in named if p not in synced]))
        real_index(folder, entries, fmt, seed, **kw)

    monkeypatch.setattr(files, "fsync_path", fsync)
    monkeypatch.setattr(files, "write_index", write_index)
    folder = tmp_path / "out"
    if how == "background":
        rb = make(seed=0, save_trajectories=True, storage_dir=str(folder))
        for m in range(12):
            rb.add_trajectories([marked(m)])
        rb.flush()
    else:
        rb = make(seed=0, sample_window_size=0)
        rb.add_trajectories([marked(m) for m in range(12)])
        rb.save_checkpoint(str(folder))
    assert unsynced_names and all(not missing for _, missing in unsynced_names), unsynced_names
    assert len(list(folder.glob("trajectory_*.pt"))) == 12
