"""``objectrl-buffer`` on what is not a ReplayBuffer checkpoint: the other rooms' checkpoints are described
(what, counts, what reads them), ``clean`` refuses a folder that does not exist, and ``trajectories merge``
says why it writes RLinf's misspelled ``trajector_index.json`` (issue 24)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from objectrl_buffer.async_buffer import AsyncSequenceBuffer
from objectrl_buffer.cli import commands as cli
from objectrl_buffer.tasks import InMemoryStorage, TaskReplayBuffer
from objectrl_buffer.trajectory import TrajectoryReplayBuffer
from tests.async_buffer.helpers import make, run, seq
from tests.trajectory.common import marked


def call(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def fields(out: str) -> dict[str, str]:
    return {line[:12].strip(): line[12:].strip() for line in out.splitlines()}


def write_trajectories(folder: Path, markers: list[int]) -> None:
    rb = TrajectoryReplayBuffer(seed=0)
    rb.add_trajectories([marked(m) for m in markers])
    rb.save_checkpoint(str(folder))
    rb.close()


def test_inspect_a_trajectory_folder_says_what_it_is_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_trajectories(tmp_path / "rollouts", [0, 1, 2])
    code, out, err = call(capsys, "inspect", str(tmp_path / "rollouts"))
    assert code == 0 and err == ""
    info = fields(out)
    assert "RLinf trajectory buffer folder" in info["kind"] and info["trajectories"] == "3"
    assert "trajectories sample --load-path" in info["read with"]
    code, out, _ = call(capsys, "inspect", "--json", str(tmp_path / "rollouts"))
    described = json.loads(out)
    assert described["kind"] == "trajectory folder" and described["trajectories"] == 3
    assert described["transitions"] > 0 and described["format"] == "pt"


def test_inspect_rank_folders_points_at_merge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trajectories(tmp_path / "src" / "rank_0", [0])
    write_trajectories(tmp_path / "src" / "rank_1", [1])
    code, out, _ = call(capsys, "inspect", str(tmp_path / "src"))
    assert code == 0
    assert fields(out)["ranks"] == "2" and "trajectories merge --source-path" in fields(out)["read with"]


def test_inspect_an_async_checkpoint_counts_entries_and_consumers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    buf: AsyncSequenceBuffer = make(16)
    run(buf.put_batch([seq(i) for i in range(5)]))
    buf.save(tmp_path / "buf.ckpt")
    code, out, err = call(capsys, "inspect", "--json", str(tmp_path / "buf.ckpt"))
    assert code == 0 and err == ""
    info = json.loads(out)
    assert info["kind"] == "async buffer checkpoint"
    assert (info["entries"], info["max_size"]) == (5, 16)
    assert info["consumers"] == [c.name for c in buf.consumers]
    code, out, err = call(capsys, "verify", str(tmp_path / "buf.ckpt"))
    assert code == 1 and "AsyncSequenceBuffer checkpoint" in err and "inspect" in err


def test_inspect_a_task_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    TaskReplayBuffer(InMemoryStorage(max_capacity=10)).save(tmp_path / "tasks")
    code, out, _ = call(capsys, "inspect", str(tmp_path / "tasks"))
    assert code == 0 and "TaskReplayBuffer checkpoint" in fields(out)["kind"] and fields(out)["rows"] == "0"


def test_inspect_of_nothing_still_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    code, _, err = call(capsys, "inspect", str(tmp_path / "empty"))
    assert code == 1 and "no buffer checkpoint" in err


@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "remove"])
def test_clean_of_a_missing_folder_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dry_run: list[str]
) -> None:
    missing = str(tmp_path / "nonexistent")
    code, out, err = call(capsys, "clean", *dry_run, str(tmp_path), missing)
    assert code == 1 and out == ""
    assert missing in err and "no such folder" in err


def test_merge_says_why_it_writes_the_misspelled_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_trajectories(tmp_path / "src" / "rank_0", [0])
    code, out, _ = call(capsys, "trajectories", "merge", "--source-path", str(tmp_path / "src"), "--save-path",
                        str(tmp_path / "dst"))  # fmt: skip
    assert code == 0 and (tmp_path / "dst" / "trajector_index.json").exists()
    assert "trajector_index.json" in out and "RLinf" in out
    with pytest.raises(SystemExit):
        cli.main(["trajectories", "merge", "--help"])
    assert "misspelled name trajector_index.json" in " ".join(capsys.readouterr().out.split())
