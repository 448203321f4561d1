"""Merge of rank folders and split of one, through the library and the ``objectrl-buffer trajectories`` command."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from objectrl_buffer.cli import main
from objectrl_buffer.trajectory import TrajectoryReplayBuffer, merge_rank_folders, split_folder
from tests.support import tree
from tests.trajectory.common import marked


def write_rank(folder: Path, markers: list[int], fmt: str = "pt", seed: int = 0) -> None:
    rb = TrajectoryReplayBuffer(seed=seed, storage_format=fmt)
    rb.add_trajectories([marked(m) for m in markers])
    rb.save_checkpoint(str(folder))
    rb.close()


def loaded(folder: Path) -> TrajectoryReplayBuffer:
    rb = TrajectoryReplayBuffer(seed=0, sample_window_size=0, allow_pickle=True)
    rb.load_checkpoint(str(folder))
    return rb


@pytest.fixture
def ranks(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write_rank(src / "rank_0", [0, 1, 2], seed=7)
    write_rank(src / "rank_1", [10, 11, 12], seed=8)
    return src


def index_of(folder: Path) -> dict[str, object]:
    return json.loads((folder / "trajectory_index.json").read_text())


def markers_by_id(folder: Path) -> list[int]:
    """The marker of each trajectory of a folder, in index order (read from the files' rewards)."""
    import torch

    out = []
    for tid, info in index_of(folder)["trajectory_index"].items():  # type: ignore[union-attr]
        payload = torch.load(folder / f"trajectory_{tid}_{info['model_weights_id']}.pt", weights_only=True)
        out.append(int(payload["rewards"][0, 0]))
    return out


def test_merge_interleaves_ranks_by_original_id_and_leaves_the_source(ranks: Path, tmp_path: Path) -> None:
    before = tree(str(ranks))
    assert merge_rank_folders(ranks, tmp_path / "merged") == 6
    assert tree(str(ranks)) == before
    merged = tmp_path / "merged"
    assert index_of(merged)["trajectory_id_list"] == [0, 1, 2, 3, 4, 5]
    assert markers_by_id(merged) == [0, 10, 1, 11, 2, 12]
    assert (merged / "trajector_index.json").read_bytes() == (merged / "trajectory_index.json").read_bytes()
    meta = json.loads((merged / "metadata.json").read_text())
    assert (meta["size"], meta["total_samples"], meta["trajectory_counter"], meta["seed"]) == (6, 48, 6, 7)
    assert meta["storage_dir"] == str(merged)
    rb = loaded(merged)
    assert rb.trajectory_ids == list(range(6))
    rb.close()


def test_ranks_sort_as_text_as_rlinf_does(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_rank(src / "rank_10", [100])
    write_rank(src / "rank_2", [20])
    merge_rank_folders(src, tmp_path / "out")
    assert markers_by_id(tmp_path / "out") == [100, 20]  # rank_10 before rank_2, as RLinf's toolkit numbers them


def test_merge_move_removes_the_sources_only_at_the_end(ranks: Path, tmp_path: Path) -> None:
    merge_rank_folders(ranks, tmp_path / "merged", move=True)
    assert [f for _, _, fs in os.walk(ranks) for f in fs] == []
    assert markers_by_id(tmp_path / "merged") == [0, 10, 1, 11, 2, 12]


def test_split_takes_the_first_n_renumbered(ranks: Path, tmp_path: Path) -> None:
    one = ranks / "rank_1"
    before = tree(str(one))
    assert split_folder(one, tmp_path / "head", 2) == 2
    assert tree(str(one)) == before
    assert index_of(tmp_path / "head")["trajectory_id_list"] == [0, 1]
    assert markers_by_id(tmp_path / "head") == [10, 11]
    split_folder(one, tmp_path / "moved", 1, move=True)
    assert index_of(one)["trajectory_id_list"] == [1, 2] and markers_by_id(one) == [11, 12]


@pytest.mark.parametrize(
    "run, error, word",
    [
        (lambda src, dst: split_folder(src / "rank_0", dst, 4), ValueError, "more than the 3"),
        (lambda src, dst: split_folder(src / "rank_0", dst, 0), ValueError, "split_count"),
        (lambda src, dst: merge_rank_folders(src / "rank_0", dst), FileNotFoundError, "no rank_"),
        (lambda src, dst: merge_rank_folders(src, src / "rank_0"), ValueError, "not an empty folder"),
    ],
)
def test_errors_change_nothing_on_disk(ranks: Path, tmp_path: Path, run: object, error: type, word: str) -> None:
    before = tree(str(tmp_path))
    with pytest.raises(error, match=word):
        run(ranks, tmp_path / "dst")  # type: ignore[operator]
    assert tree(str(tmp_path)) == before and not (tmp_path / "dst").exists()


def test_mixed_formats_and_missing_files_change_nothing(ranks: Path, tmp_path: Path) -> None:
    write_rank(ranks / "rank_2", [20], fmt="pkl")
    before = tree(str(tmp_path))
    with pytest.raises(ValueError, match="mix trajectory formats"):
        merge_rank_folders(ranks, tmp_path / "dst")
    shutil.rmtree(ranks / "rank_2")
    os.unlink(ranks / "rank_1" / "trajectory_2_w12_0.pt")
    before = tree(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"trajectory_2_w12_0\.pt"):
        merge_rank_folders(ranks, tmp_path / "dst", move=True)
    assert tree(str(tmp_path)) == before and sorted(os.listdir(tmp_path)) == ["src"]


def test_cli_merge_split_and_sample(ranks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    merged, head = tmp_path / "merged", tmp_path / "head"
    assert main(["trajectories", "merge", "--source-path", str(ranks), "--save-path", str(merged), "--copy"]) == 0
    assert "copied 6 trajectories" in capsys.readouterr().out
    assert (
        main(["trajectories", "split", "--source-path", str(merged), "--save-path", str(head), "--split-count", "4"])
        == 0
    )
    assert main(["trajectories", "sample", "--load-path", str(head), "--num-chunks", "5", "--enable-cache"]) == 0
    out = capsys.readouterr().out
    assert "[sample] 5 transitions from 4 trajectories" in out and "curr_obs.state: (5, 3) float32" in out
    assert (
        main(["trajectories", "split", "--source-path", str(merged), "--save-path", str(head), "--split-count", "9"])
        == 1
    )
    assert "more than the 6 trajectories" in capsys.readouterr().err


def test_help_does_not_import_the_room(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n.startswith("objectrl_buffer.trajectory")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(SystemExit):
        main(["trajectories", "merge", "--help"])
    assert not [n for n in sys.modules if n.startswith("objectrl_buffer.trajectory")]
