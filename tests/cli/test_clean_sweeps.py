"""``objectrl-buffer clean`` sweeps every kind of file the library leaves in /dev/shm or the temp folder:
a shared rate limiter's counter file left by a killed process too, never one a live process uses (issue 26)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from objectrl_buffer.cli.commands import main
from objectrl_buffer.flow import RateLimiter
from objectrl_buffer.storage import shm_files

ROOT = Path(__file__).resolve().parents[2]
# A child that shares two limiters (their counter files in the folder argv[1]), counts, then dies by SIGKILL.
CHILD = """
import functools, os, signal, sys
from objectrl_buffer.storage import shm_files
shm_files.new_file = functools.partial(shm_files.new_file, sys.argv[1])
from objectrl_buffer.flow import RateLimiter
limiters = [RateLimiter(1.0, 1, 0.0, 10.0) for _ in range(2)]
for limiter in limiters:
    path = limiter.share()
    limiter.insert(3)
    print(path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
SLOW = pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="a second child process (~2 s); RUN_SLOW=1")


@pytest.fixture(scope="module", params=["shm", pytest.param("disk", marks=[pytest.mark.slow, SLOW])])
def left(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, str, RateLimiter]]:
    """A folder of its own in /dev/shm (tmpfs) or on the temp folder's file system; in it, the counter file a
    child process killed by SIGKILL left, and the limiter of this (live) process that took over its other one."""
    if request.param == "disk":
        folder = str(tmp_path_factory.mktemp("disk"))
    elif os.path.isdir("/dev/shm"):
        folder = f"/dev/shm/objectrl-test-{uuid.uuid4().hex}"
        os.mkdir(folder)
    else:
        pytest.skip("no /dev/shm")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD, folder], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == -9, done.stderr
    paths = done.stdout.split()
    assert len(paths) == 2 and all(os.path.dirname(p) == folder for p in paths)
    assert all(os.path.basename(p).startswith("objectrl-limiter-") for p in paths)
    assert all(os.path.exists(p) for p in paths)  # SIGKILL ran no cleanup
    adopted = RateLimiter(1.0, 1, 0.0, 10.0)
    adopted.use_counters(paths[1])  # its creator is dead, but this live process maps it
    assert adopted.inserts == 3
    yield folder, paths[0], paths[1], adopted
    shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_processs_limiter_file_is_listed_and_removed(
    left: tuple[str, str, str, RateLimiter], capsys: pytest.CaptureFixture[str]
) -> None:
    parent, path, live, _ = left
    assert main(["clean", "--dry-run", parent]) == 0
    out = capsys.readouterr().out
    assert path in out and "would remove" in out and os.path.exists(path)
    assert live not in out
    assert main(["clean", parent]) == 0
    out = capsys.readouterr().out
    assert path in out and not os.path.exists(path)
    assert live not in out and os.path.exists(live)


def test_a_live_processs_limiter_file_is_kept(
    left: tuple[str, str, str, RateLimiter], capsys: pytest.CaptureFixture[str]
) -> None:
    parent, _, orphan, adopted = left  # the creator of orphan is dead, but this live process maps it
    own_fd, own = shm_files.new_file(parent)  # this live process made it (not mapped yet: a share() under way)
    os.close(own_fd)
    for argv in (["clean", "--dry-run", parent], ["clean", parent]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert orphan not in out and own not in out and os.path.basename(own) not in out
    assert os.path.exists(orphan) and os.path.exists(own)
    inserts = adopted.inserts
    assert adopted.try_insert(1) and adopted.inserts == inserts + 1  # still its counters, in the file
    os.unlink(own)
