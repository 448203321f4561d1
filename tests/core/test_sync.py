"""core.sync.lock_file: an exclusive flock that other threads and processes wait on, removed when released."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from objectrl_buffer.core.sync import lock_file
from tests.support import deadline

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock, FIFOs, SIGALRM: Linux")


def test_the_lock_file_exists_while_held_and_a_leftover_is_taken_over(tmp_path: Path) -> None:
    path = str(tmp_path / "x.lock")
    Path(path).write_text("left by a holder that was killed")
    with lock_file(path):
        assert os.path.isfile(path)
    assert not os.path.exists(path)


def test_threads_of_one_process_take_turns(tmp_path: Path) -> None:
    path, inside, overlaps = str(tmp_path / "x.lock"), [0], []

    def work() -> None:
        for _ in range(50):
            with lock_file(path):
                inside[0] += 1
                overlaps.append(inside[0])
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    with deadline(60):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert overlaps == [1] * 200 and not os.path.exists(path)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "folder"])
def test_anything_but_a_regular_file_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x.lock"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.mkdir()
    with deadline(30), pytest.raises(OSError), lock_file(str(path)):
        pass
    assert not (tmp_path / "elsewhere").exists()
