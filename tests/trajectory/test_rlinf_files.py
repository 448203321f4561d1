"""The folders on disk as RLinf 0.3.0 writes and reads them (issue 26): done flags with their epoch rows,
merge ids of ten ranks or more, folders left as they are when opened, partial checkpoints said aloud, and
RLinf's own reader (from its wheel) reading every folder we write as we do. The merge command's progress bar."""

from __future__ import annotations

import dataclasses
import fcntl
import importlib.util
import io
import json
import os
import pty
import select
import struct
import sys
import termios
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer.cli import main
from objectrl_buffer.errors import PartialCheckpointWarning
from objectrl_buffer.trajectory import Trajectory, TrajectoryReplayBuffer, merge_rank_folders, split_folder
from tests.trajectory.common import marked
from tests.trajectory.test_files import rlinf, write_with_rlinf

DONE = ("dones", "terminations", "truncations")


def rollout(m: int, T: int = 4, epochs: int = 2) -> Trajectory:
    """Trajectory ``m`` with all three done-like fields of ``T + epochs`` rows, every row's flags distinct
    enough that dropping or moving an epoch-first row changes them."""
    flags = torch.arange((T + epochs) * 2).reshape(T + epochs, 2)
    return dataclasses.replace(
        marked(m, T, epochs=epochs),
        terminations=(flags + m) % 3 == 0,
        truncations=(flags + m) % 4 == 1,
    )


def payloads(folder: Path) -> dict[str, dict[str, Any]]:
    return {p.name: torch.load(p, weights_only=True) for p in sorted(folder.glob("trajectory_*.pt"))}


def leaves(batch: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a nested dict (RLinf's batch) or TensorDict (ours), by dotted name."""
    out = {}
    for key, value in batch.items() if isinstance(batch, dict) else batch.to_dict().items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ---------------------------------------------------------------------- item 1: T + E done rows
def test_done_fields_are_written_with_their_epoch_rows_as_rlinf_writes_them(tmp_path: Path) -> None:
    module = rlinf()
    trajectories = [rollout(m, T=4 + 2 * m) for m in range(3)]
    upstream = module.TrajectoryReplayBuffer(seed=5, auto_save=True, auto_save_path=str(tmp_path / "up"))
    upstream.add_trajectories(trajectories)
    upstream.close()
    ours = TrajectoryReplayBuffer(seed=5, save_trajectories=True, storage_dir=str(tmp_path / "ours"))
    ours.add_trajectories(trajectories)
    ours.save_checkpoint(str(tmp_path / "saved"))  # a checkpoint elsewhere writes them the same way
    ours.flush()
    again = TrajectoryReplayBuffer(seed=5, sample_window_size=0)
    again.load_checkpoint(str(tmp_path / "up"))  # RLinf's folder loaded, then saved by us: rows kept
    again.save_checkpoint(str(tmp_path / "resaved"))
    theirs = payloads(tmp_path / "up")
    assert len(theirs) == 3
    for name in ("ours", "saved", "resaved"):
        mine = payloads(tmp_path / name)
        assert sorted(mine) == sorted(theirs), name
        for file, payload in theirs.items():
            for field in DONE:
                assert payload[field].shape[0] == payload["rewards"].shape[0] + 2, (name, file, field)
                assert torch.equal(mine[file][field], payload[field]), (name, file, field)
    # our reads still align them: the same samples as a buffer that never wrote a file
    plain = TrajectoryReplayBuffer(seed=5, sample_window_size=0)
    plain.add_trajectories(trajectories)
    loaded = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    loaded.load_checkpoint(str(tmp_path / "resaved"))
    a, b = loaded.sample(64), plain.sample(64)  # 36 transitions in all: 36 drawn
    for field in DONE:
        assert torch.equal(a[field], b[field]) and a[field].shape == (36,)
    assert bool(a["terminations"].any()) and not bool(a["terminations"].all())
    for rb in (ours, again, plain, loaded):
        rb.close()


# ---------------------------------------------------------------------- item 2: merge ids of 10+ ranks
def test_merging_eleven_ranks_numbers_ids_as_rlinf_toolkit(tmp_path: Path) -> None:
    """RLinf's toolkit sorts ``rank_*`` names as text (rank_10 before rank_2) and renumbers in (original id,
    rank) order: with two trajectories per rank, id 0 of each rank first, in that rank order."""
    for rank in range(11):
        rb = TrajectoryReplayBuffer(seed=rank, sample_window_size=0)
        rb.add_trajectories([marked(100 * rank), marked(100 * rank + 1)])
        rb.save_checkpoint(str(tmp_path / "src" / f"rank_{rank}"))
        rb.close()
    assert merge_rank_folders(tmp_path / "src", tmp_path / "out") == 22
    text_order = sorted(range(11), key=lambda r: f"rank_{r}")  # 0, 1, 10, 2, 3, ...
    expected = [100 * r + k for k in (0, 1) for r in text_order]
    index = json.loads((tmp_path / "out" / "trajectory_index.json").read_text())
    got = [
        int(torch.load(tmp_path / "out" / f"trajectory_{i}_{index['trajectory_index'][str(i)]['model_weights_id']}.pt",
                       weights_only=True)["rewards"][0, 0])
        for i in index["trajectory_id_list"]
    ]  # fmt: skip
    assert got == expected and expected[:3] == [0, 100, 1000]


# ---------------------------------------------------------------------- item 3: opening rewrites nothing
def stamp(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        name: ((folder / name).read_bytes(), (folder / name).stat().st_mtime_ns)
        for name in ("metadata.json", "trajectory_index.json")
    }


@pytest.mark.parametrize("writer", ["rlinf", "ours"])
def test_opening_or_loading_a_folder_rewrites_nothing(tmp_path: Path, writer: str) -> None:
    folder = tmp_path / "buf"
    if writer == "rlinf":
        write_with_rlinf(rlinf(), str(folder))
    else:
        rb = TrajectoryReplayBuffer(seed=5, save_trajectories=True, storage_dir=str(folder))
        rb.add_trajectories([marked(m) for m in range(3)])
        rb.close()
    before = stamp(folder)
    rb = TrajectoryReplayBuffer(seed=0, save_trajectories=True, storage_dir=str(folder))  # resumes from it
    rb.load_checkpoint(str(folder))  # its own folder
    rb.save_checkpoint(str(folder))  # into its own folder: a flush
    rb.flush()
    assert rb.trajectory_ids == [0, 1, 2] and rb.num_added == 3
    rb.close()
    reader = TrajectoryReplayBuffer(seed=0, capacity=8)  # keeps one: the folder is still not touched
    reader.load_checkpoint(str(folder))
    reader.close()
    assert stamp(folder) == before
    rb = TrajectoryReplayBuffer(seed=0, save_trajectories=True, storage_dir=str(folder))
    rb.add_trajectories([marked(3)])  # asked: an add rewrites the index and the metadata
    rb.close()
    assert json.loads((folder / "metadata.json").read_text())["size"] == 4


# ---------------------------------------------------------------------- item 4: partial checkpoints
def test_a_window_checkpoint_warns_and_says_what_it_holds(tmp_path: Path) -> None:
    rb = TrajectoryReplayBuffer(seed=1, sample_window_size=2)  # no saving, no capacity: keeps its window
    rb.add_trajectories([marked(m, T=3 + m) for m in range(5)])
    with pytest.warns(PartialCheckpointWarning, match=r"newest 2 of the 5 trajectories added .* save_trajectories"):
        rb.save_checkpoint(str(tmp_path / "ckpt"))
    meta = json.loads((tmp_path / "ckpt" / "metadata.json").read_text())
    assert (meta["size"], meta["total_samples"], meta["num_added"]) == (2, 26, 5)
    assert "newest 2 of the 5" in meta["kept"]
    back = TrajectoryReplayBuffer(seed=0, sample_window_size=2)
    back.load_checkpoint(str(tmp_path / "ckpt"))
    assert back.trajectory_ids == [3, 4] and back.num_added == 5 and back.is_ready(5) and not back.is_ready(6)
    rb.close()
    back.close()


def _window(tmp: Path) -> str:
    rb = TrajectoryReplayBuffer(seed=1, sample_window_size=2)
    rb.add_trajectories([rollout(m, T=2 + 2 * m) for m in range(5)])
    with pytest.warns(PartialCheckpointWarning):
        rb.save_checkpoint(str(tmp / "f"))
    rb.close()
    return str(tmp / "f")


def _writer_evicting(tmp: Path) -> str:
    rb = TrajectoryReplayBuffer(seed=2, save_trajectories=True, storage_dir=str(tmp / "f"), capacity=30)
    for m in range(6):
        rb.add_trajectories([rollout(m, T=2 + 2 * (m % 3))])
    rb.close()
    return str(tmp / "f")


def _capacity_checkpoint(tmp: Path) -> str:
    rb = TrajectoryReplayBuffer(seed=3, capacity=25, sample_window_size=0)
    rb.add_trajectories([rollout(m, T=4) for m in range(5)])
    rb.save_checkpoint(str(tmp / "f"))
    rb.close()
    return str(tmp / "f")


def _resumed_smaller(tmp: Path) -> str:
    rb = TrajectoryReplayBuffer(seed=4, save_trajectories=True, storage_dir=str(tmp / "f"))
    rb.add_trajectories([rollout(m, T=2 + 2 * m) for m in range(4)])
    rb.close()
    rb = TrajectoryReplayBuffer(seed=4, save_trajectories=True, storage_dir=str(tmp / "f"), capacity=24)
    rb.add_trajectories([rollout(9, T=4)])  # the trajectories it could not keep leave the index now
    rb.close()
    return str(tmp / "f")


def _pickle_writer(tmp: Path) -> str:
    rb = TrajectoryReplayBuffer(seed=8, save_trajectories=True, storage_dir=str(tmp / "f"), storage_format="pkl")
    rb.add_trajectories([rollout(m, T=2 + 2 * m) for m in range(3)])
    rb.close()
    return str(tmp / "f")


def _cleared(tmp: Path) -> str:
    rb = TrajectoryReplayBuffer(seed=5, save_trajectories=True, storage_dir=str(tmp / "f"))
    rb.add_trajectories([rollout(m) for m in range(3)])
    rb.clear()
    rb.add_trajectories([rollout(7, T=6)])  # id 0 again
    rb.close()
    return str(tmp / "f")


def _merged_and_split(tmp: Path, part: str) -> str:
    for rank in range(3):
        rb = TrajectoryReplayBuffer(seed=6 + rank, sample_window_size=0)
        rb.add_trajectories([rollout(10 * rank + m, T=2 + 2 * m) for m in range(2 + rank)])
        rb.save_checkpoint(str(tmp / "src" / f"rank_{rank}"))
        rb.close()
    merge_rank_folders(tmp / "src", tmp / "merged")
    if part == "merged":
        return str(tmp / "merged")
    split_folder(tmp / "merged", tmp / "head", 4, move=True)
    return str(tmp / ("head" if part == "head" else "merged"))  # the 4 split off, or the rest (index rewritten)


CONFIGS: dict[str, Callable[[Path], str]] = {
    "window checkpoint": _window,
    "writer evicting by capacity": _writer_evicting,
    "capacity checkpoint": _capacity_checkpoint,
    "resumed with a smaller capacity": _resumed_smaller,
    "cleared then added": _cleared,
    "pickle files": _pickle_writer,
    "merged ranks": lambda tmp: _merged_and_split(tmp, "merged"),
    "split head": lambda tmp: _merged_and_split(tmp, "head"),
    "split rest": lambda tmp: _merged_and_split(tmp, "rest"),
}


def same_draws(ours: TrajectoryReplayBuffer, theirs: Any, where: str) -> None:
    """Both generators were seeded from the folder: the same draws give the same rows, every field."""
    if ours.total_samples == 0:  # a rank's empty share: both refuse alike
        for rb in (ours, theirs):
            with pytest.raises(RuntimeError, match="Cannot sample from an empty buffer"):
                rb.sample(97)
        return
    a, b = leaves(ours.sample(97)), leaves(theirs.sample(97))
    assert sorted(a) == sorted(b), where
    for key in a:
        assert torch.equal(a[key], b[key]), (where, key)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_rlinf_reads_every_folder_we_write_as_we_do(tmp_path: Path, config: str) -> None:
    """rlinf 0.3.0's own loader (from its wheel) on our folders: the same trajectory count, transition count
    and ids as ours, the same rows for the same draws (both seed their generator from the folder), and the
    same shares of a sharded load."""
    module = rlinf()
    folder = CONFIGS[config](tmp_path)
    ours = TrajectoryReplayBuffer(seed=0, sample_window_size=0, allow_pickle=True)
    ours.load_checkpoint(folder)

    def upstream() -> Any:  # a fresh one per load: rlinf's window cache survives a load_checkpoint
        made = module.TrajectoryReplayBuffer(
            seed=0, sample_window_size=0, cache_size=64, auto_save=True, auto_save_path=str(tmp_path / "unused")
        )
        opened.append(made)
        return made

    opened: list[Any] = []
    theirs = upstream()
    theirs.load_checkpoint(folder)
    index = json.loads((Path(folder) / "trajectory_index.json").read_text())
    assert ours.trajectory_ids == index["trajectory_id_list"]  # RLinf takes that list as it is
    assert theirs.get_stats()["num_trajectories"] == len(ours) and theirs.total_samples == ours.total_samples
    same_draws(ours, theirs, config)
    for rank in range(2):  # the same shares: counts, and rows for the same draws
        mine = TrajectoryReplayBuffer(seed=0, sample_window_size=0, allow_pickle=True)
        mine.load_checkpoint(folder, True, rank, 2)
        theirs = upstream()
        theirs.load_checkpoint(folder, True, rank, 2)
        assert (len(theirs), theirs.total_samples) == (len(mine), mine.total_samples)
        same_draws(mine, theirs, f"{config}, rank {rank}")
        mine.close()
    for made in opened:
        made.close()
    ours.close()


# ---------------------------------------------------------------------- item 5: the merge's progress bar
@pytest.fixture
def two_ranks(tmp_path: Path) -> Path:
    for rank in range(2):
        rb = TrajectoryReplayBuffer(seed=rank, sample_window_size=0)
        rb.add_trajectories([marked(m, image=True) for m in range(3)])
        rb.save_checkpoint(str(tmp_path / "src" / f"rank_{rank}"))
        rb.close()
    return tmp_path / "src"


def merge_on_a_terminal(source: Path, target: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the merge command with stderr on a pseudo-terminal (as a user's shell gives it); what it showed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a width
    terminal = os.fdopen(slave, "w", buffering=1)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(sys, "stderr", terminal)
    try:
        assert main(["trajectories", "merge", "--source-path", str(source), "--save-path", str(target)]) == 0
        terminal.flush()
        shown = b""
        while select.select([master], [], [], 0)[0]:
            shown += os.read(master, 1 << 16)
    finally:
        terminal.close()
        os.close(master)
    return shown.decode(errors="replace")


def test_merge_shows_a_progress_bar_on_a_terminal(
    two_ranks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    text = merge_on_a_terminal(two_ranks, tmp_path / "o", monkeypatch)
    assert "copying trajectories" in text and "100%" in text, text
    assert "copied 6 trajectories" in capsys.readouterr().out


def test_merge_on_a_terminal_without_tqdm_says_why_there_is_no_bar(
    two_ranks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tqdm" else real(name, *a))
    text = merge_on_a_terminal(two_ranks, tmp_path / "o", monkeypatch)
    assert "no progress bar: tqdm is not installed" in text and "copying trajectories" not in text


def test_merge_shows_no_progress_bar_when_piped(
    two_ranks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CI", raising=False)
    piped = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", piped)
    assert main(["trajectories", "merge", "--source-path", str(two_ranks), "--save-path", str(tmp_path / "o")]) == 0
    assert piped.getvalue() == ""
    out = capsys.readouterr().out
    assert "copied 6 trajectories" in out and "copying" not in out
