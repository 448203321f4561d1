"""``objectrl-buffer clean`` sweeps every kind of file the library leaves in /dev/shm or the temp folder: a
shared rate limiter's counter file, a shared buffer's folder and a task storage's temporary folder left by a
killed process, never one a live process uses (issue 26). Storage folders (owner locks): tests/storage."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from objectrl_buffer.cli.commands import main
from objectrl_buffer.distributed import SharedBuffer
from objectrl_buffer.flow import RateLimiter
from objectrl_buffer.storage import shm_files
from objectrl_buffer.tasks.storage.shared import SharedTaskStorage

ROOT = Path(__file__).resolve().parents[2]
# A child that makes two of each kind in the folder argv[1] (its temp folder too: TMPDIR), as a run does, uses
# them, then dies by SIGKILL.
CHILD = """
import functools, os, signal, sys
import torch
from objectrl_buffer.core.schema import Field, Schema
from objectrl_buffer.distributed import SharedBuffer
from objectrl_buffer.flow import RateLimiter
from objectrl_buffer.storage import shm_files
from objectrl_buffer.tasks.storage.shared import SharedTaskStorage

shm_files.new_file = functools.partial(shm_files.new_file, sys.argv[1])  # a limiter's share() puts it there
held = []
for _ in range(2):
    limiter = RateLimiter(1.0, 1, 0.0, 10.0)
    print("limiter", limiter.share(), flush=True)
    limiter.insert(3)
    schema = Schema([Field("state", torch.Size([2]), torch.float32)])
    shared = SharedBuffer.create(schema, 8, folder=sys.argv[1])  # what share(rb) makes in /dev/shm
    shared.add_batch({"state": torch.full((3, 2), 7.0)})
    print("shared", shared.folder, flush=True)
    tasks = SharedTaskStorage(10)  # path=None: in the temp folder
    print("tasks", tasks.path, flush=True)
    held += [limiter, shared, tasks]
os.kill(os.getpid(), signal.SIGKILL)
"""
SLOW = pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="a second child process (~3 s); RUN_SLOW=1")


@dataclass
class Left:
    """What a killed run left in ``parent``: per kind, one path nobody uses and one this live process took
    over (``users``: the handles that use those)."""

    parent: str
    orphans: list[str]
    adopted: list[str]
    users: list[Any]


@pytest.fixture(scope="module", params=["shm", pytest.param("disk", marks=[pytest.mark.slow, SLOW])])
def left(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Left]:
    """A folder of its own in /dev/shm (tmpfs) or on the temp folder's file system, holding what a child
    process killed by SIGKILL left: two counter files, two shared-buffer folders, two task folders."""
    if request.param == "disk":
        parent = str(tmp_path_factory.mktemp("disk"))
    elif os.path.isdir("/dev/shm"):
        parent = f"/dev/shm/objectrl-test-{uuid.uuid4().hex}"
        os.mkdir(parent)
    else:
        pytest.skip("no /dev/shm")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": parent}
    done = subprocess.run([sys.executable, "-c", CHILD, parent], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == -9, done.stderr
    made: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        kind, path = line.split()
        made.setdefault(kind, []).append(path)
    assert sorted(made) == ["limiter", "shared", "tasks"] and all(len(paths) == 2 for paths in made.values())
    prefixes = {"limiter": "objectrl-limiter-", "shared": "objectrl-shared-", "tasks": "objectrl-tasks-"}
    for kind, paths in made.items():
        assert all(os.path.dirname(p) == parent and os.path.basename(p).startswith(prefixes[kind]) for p in paths)
        assert all(os.path.exists(p) for p in paths)  # SIGKILL ran no cleanup
    # their creator is dead, but this live process takes the second of each over
    limiter = RateLimiter(1.0, 1, 0.0, 10.0)
    limiter.use_counters(made["limiter"][1])
    shared = SharedBuffer(made["shared"][1])
    tasks = SharedTaskStorage(10, path=made["tasks"][1])
    assert limiter.inserts == 3 and shared.committed() == 3
    yield Left(parent, [p[0] for p in made.values()], [p[1] for p in made.values()], [limiter, shared, tasks])
    shared.close()
    tasks.close()
    shutil.rmtree(parent, ignore_errors=True)


def test_what_a_killed_process_left_is_listed_then_removed(left: Left, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clean", "--dry-run", left.parent]) == 0
    out = capsys.readouterr().out
    assert all(path in out and os.path.exists(path) for path in left.orphans), out
    assert "would remove 3 entries" in out
    assert not any(path in out for path in left.adopted)
    assert main(["clean", left.parent]) == 0
    out = capsys.readouterr().out
    assert all(path in out and not os.path.exists(path) for path in left.orphans), out
    assert not any(path in out or not os.path.exists(path) for path in left.adopted)


def test_what_a_live_process_uses_or_makes_is_kept(left: Left, capsys: pytest.CaptureFixture[str]) -> None:
    own_fd, own = shm_files.new_file(left.parent)  # this live process made them (not used yet: a share() under way)
    os.close(own_fd)
    own_folders = [
        shm_files.new_folder(prefix, left.parent) for prefix in (shm_files.SHARED_PREFIX, shm_files.TASKS_PREFIX)
    ]
    for argv in (["clean", "--dry-run", left.parent], ["clean", left.parent]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert not any(os.path.basename(path) in out for path in [*left.adopted, own, *own_folders]), out
    assert all(os.path.exists(path) for path in [*left.adopted, own, *own_folders])
    limiter, shared, tasks = left.users  # still theirs, in the files
    inserts = limiter.inserts
    assert limiter.try_insert(1) and limiter.inserts == inserts + 1
    assert shared.sample_batch(4)["state"].eq(7.0).all()
    tasks.close()  # a folder nobody holds open any more (its creator is dead): now it goes
    assert main(["clean", left.parent]) == 0
    assert left.adopted[2] in capsys.readouterr().out and not os.path.exists(left.adopted[2])
    os.unlink(own)
    for folder in own_folders:
        os.rmdir(folder)


def test_a_folder_a_process_holds_open_is_kept(tmp_path: Path) -> None:
    """A task folder is used through open descriptors, not mappings: they keep it (the creator pid is gone)."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder = tmp_path / f"{shm_files.TASKS_PREFIX}{int(dead.stdout)}-abcdefgh"
    folder.mkdir()
    fd = os.open(folder / "rows.data", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        assert shm_files.find_orphans(str(tmp_path)) == []
    finally:
        os.close(fd)
    assert [orphan.path for orphan in shm_files.find_orphans(str(tmp_path))] == [str(folder)]
