"""Folders of killed processes are removed (at the next first allocation, or by ``objectrl-buffer clean``),
those of live processes never are, and a buffer on disk needs nothing from /dev/shm (no semaphores)."""

from __future__ import annotations

import errno
import multiprocessing.synchronize
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from objectrl_buffer import ReplayBuffer, cli
from objectrl_buffer.cli import commands
from objectrl_buffer.storage import folders

REPO = Path(__file__).resolve().parents[2]

#: A child that makes a buffer in the parent folder argv[1], writes a row, reports its folder and waits.
CHILD = textwrap.dedent(
    """
    import sys, time, torch
    from objectrl_buffer import ReplayBuffer
    rb = ReplayBuffer("cpu", "cpu", 1000, storage_dir=sys.argv[1])
    rb.add({"x": torch.ones(256), "step": 0})
    print(rb.storage_folder, flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def start_children(
    parent: Path, n: int, started: list[subprocess.Popen[str]]
) -> list[tuple[subprocess.Popen[str], Path]]:
    """``n`` live child processes, each owning a buffer folder in ``parent``, started together (each
    spends seconds importing torch); returns each with its folder."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(parent)], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(n)
    ]
    started += procs
    out = []
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line, "the child did not report its folder"
        folder = Path(line)
        assert folder.parent == parent and folder.is_dir()
        out.append((proc, folder))
    return out


def test_the_next_buffer_removes_a_killed_process_folder(tmp_path: Path, children: list) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    (killed, dead), (_, alive) = start_children(parent, 2, children)
    killed.send_signal(signal.SIGKILL)  # no cleanup runs
    killed.wait()
    assert dead.is_dir()  # leaked, as any killed process leaks it
    with ReplayBuffer("cpu", "cpu", 10, storage_dir=parent) as rb:
        rb.add({"x": torch.zeros(2)})
        assert not dead.exists()  # its owner is gone: removed
        assert alive.is_dir() and (alive / "x.memmap").exists()  # a live process's folder is kept
        assert Path(rb.storage_folder).is_dir()
    assert alive.is_dir()


def test_a_folder_without_an_owner_lock_is_never_removed(tmp_path: Path) -> None:
    foreign = tmp_path / f"{folders.PREFIX}made-by-someone-else"
    foreign.mkdir()
    (foreign / "data").write_bytes(b"x")
    with ReplayBuffer("cpu", "cpu", 10, storage_dir=tmp_path) as rb:
        rb.add({"x": torch.zeros(2)})
    assert (foreign / "data").exists()


def left_behind(parent: Path, nbytes: int = 300_000) -> Path:
    """A folder as a killed process leaves it: a lock file that names a pid, held by nobody."""
    folder = parent / f"{folders.PREFIX}dead"
    folder.mkdir()
    (folder / folders.LOCK_NAME).write_text("999999999\n")
    (folder / "x.memmap").write_bytes(b"\1" * nbytes)
    return folder


def test_clean_dry_run_lists_and_keeps_then_clean_removes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead = left_behind(tmp_path)
    alive, lock = folders.make_owned(str(tmp_path))  # owned by this (live) process
    try:
        assert cli.main(["clean", "--dry-run", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert str(dead) in out and alive not in out and "would remove" in out
        held = folders.folder_bytes(str(dead))  # the bytes it holds (allocated blocks)
        assert held >= 300_000 and f"{dead} ({commands.human_bytes(held)}, pid 999999999, gone)" in out
        assert dead.is_dir() and os.path.isdir(alive)  # nothing removed
        assert cli.main(["clean", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert str(dead) in out and "removed" in out
        assert not dead.exists() and os.path.isdir(alive)
        assert cli.main(["clean", str(tmp_path)]) == 0
        assert "nothing to remove" in capsys.readouterr().out
    finally:
        os.close(lock)


def test_clean_as_a_command(tmp_path: Path) -> None:
    dead = left_behind(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(
        [sys.executable, "-m", "objectrl_buffer", "clean", str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert str(dead) in result.stdout and not dead.exists()


def test_a_buffer_on_disk_needs_no_semaphore_in_dev_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full /dev/shm refuses new POSIX semaphores (multiprocessing.Value's lock); nothing here may need one."""

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(multiprocessing.synchronize.SemLock, "__init__", full)
    rb = ReplayBuffer("cpu", "cpu", 10, seed=0, storage_dir=tmp_path / "disk")
    for i in range(12):
        rb.add({"x": torch.full((2,), float(i)), "step": i})
    assert len(rb.memory) == 10 and rb.sample_batch(4)["step"].shape == (4,)
    rb.reset()
    rb.add_batch({"x": torch.zeros(3, 2), "step": torch.arange(3)})
    rb.save(tmp_path / "ck", data=True)
    loaded = ReplayBuffer.from_checkpoint(tmp_path / "ck", storage_dir=tmp_path / "disk")
    assert loaded.sample_all()["step"].tolist() == [0, 1, 2]
    rb.close()
    loaded.close()
