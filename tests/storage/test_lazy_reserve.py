"""RAM-backed storage reserves rows lazily: reset() and the first write after it cost in proportion to the
rows written, not the capacity, and a reservation is reused across resets of the same schema.

What a user relies on, read from the files themselves (``st_blocks``: bytes the file system allocated):
a 1,000,000-row buffer that holds 2,048 rows holds about 2,048 rows of RAM; no row is written outside
the reserved prefix (so a full ``/dev/shm`` never kills the process with SIGBUS); a growth that fails
moves the rows written so far to the temp folder, with a warning, and loses nothing.
"""

from __future__ import annotations

import errno
import os
import pathlib
import tempfile

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.storage import placement

CAPACITY = 1_000_000
WIDTH = 8  # float32[8]: 32 bytes per row, 32 MB for the whole column
FULL_BYTES = CAPACITY * WIDTH * 4


@pytest.fixture
def fake_shm(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A stand-in for /dev/shm with plenty of room, and a private temp folder for fallbacks."""
    shm = tmp_path / "shm"
    shm.mkdir()
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(placement, "SHM_DIR", str(shm))
    monkeypatch.setattr(placement, "ram_room", lambda folder=placement.SHM_DIR: 1 << 40)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return shm


def batch(start: int, n: int) -> dict[str, torch.Tensor]:
    """``n`` rows identified by ``step`` = start .. start+n-1."""
    steps = torch.arange(start, start + n)
    return {"x": steps[:, None].float().expand(n, WIDTH).contiguous(), "step": steps}


def allocated(rb: ReplayBuffer, name: str = "x") -> int:
    """Bytes the file system holds for one column file of ``rb``."""
    assert rb.storage_folder is not None
    return os.stat(os.path.join(rb.storage_folder, f"{name}.memmap")).st_blocks * 512


def steps(rb: ReplayBuffer) -> list[int]:
    return rb.sample_all()["step"].tolist()


def test_a_large_buffer_reserves_in_proportion_to_the_rows_written(fake_shm: pathlib.Path) -> None:
    with ReplayBuffer("cpu", "cpu", CAPACITY) as rb:
        rb.add_batch(batch(0, 2048))
        assert pathlib.Path(rb.storage_folder).parent == fake_shm  # placed by the whole buffer's size
        assert 2048 * WIDTH * 4 <= allocated(rb) <= FULL_BYTES // 8
        for i in range(2048, 2048 + 70_000, 1000):  # growth through both write paths
            rb.add_batch(batch(i, 999))
            rb.add({"x": torch.full((WIDTH,), float(i + 999)), "step": i + 999})
        written = 2048 + 70_000
        assert written * WIDTH * 4 <= allocated(rb) <= 4 * written * WIDTH * 4 + (2 << 20)
        assert steps(rb) == list(range(written))
        assert torch.equal(rb.sample_all()["x"][:, 0], torch.arange(written).float())


def test_single_adds_grow_the_reservation_and_keep_every_row(fake_shm: pathlib.Path) -> None:
    with ReplayBuffer("cpu", "cpu", CAPACITY) as rb:
        for i in range(40_000):
            rb.add({"x": torch.full((WIDTH,), float(i)), "step": i})
        assert 40_000 * WIDTH * 4 <= allocated(rb) <= FULL_BYTES // 8
        assert steps(rb) == list(range(40_000))


def test_reset_keeps_the_files_and_reservation_for_the_same_schema(fake_shm: pathlib.Path) -> None:
    with ReplayBuffer("cpu", "cpu", CAPACITY) as rb:
        rb.add_batch(batch(0, 2048))
        folder = rb.storage_folder
        reserved = allocated(rb)
        fd = os.open(os.path.join(folder, "x.memmap"), os.O_RDONLY)
        try:
            rb.reset()
            assert len(rb) == 0 and rb.schema is None
            rb.add_batch(batch(5000, 2048))
            assert rb.storage_folder == folder
            assert os.fstat(fd).st_nlink == 1  # the same file is still in use: nothing was reallocated
            assert allocated(rb) == reserved
        finally:
            os.close(fd)
        assert steps(rb) == list(range(5000, 7048))


def test_a_different_schema_after_reset_reallocates(fake_shm: pathlib.Path) -> None:
    with ReplayBuffer("cpu", "cpu", CAPACITY) as rb:
        rb.add_batch(batch(0, 2048))
        folder = rb.storage_folder
        rb.reset()
        rb.add_batch({**batch(0, 100), "extra": torch.ones(100)})
        files = sorted(f for f in os.listdir(folder) if f.endswith(".memmap"))
        assert files == ["extra.memmap", "step.memmap", "x.memmap"]
        assert rb.sample_all()["extra"].tolist() == [1.0] * 100
        assert allocated(rb) <= FULL_BYTES // 8


def test_a_failed_growth_moves_the_rows_to_the_temp_folder(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReplayBuffer("cpu", "cpu", CAPACITY) as rb:
        rb.add_batch(batch(0, 2048))
        first = rb.storage_folder

        def full(ranges: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(placement, "reserve", full)  # another process filled /dev/shm
        with pytest.warns(RuntimeWarning, match="storage_dir="):
            rb.add_batch(batch(2048, 200_000))
        assert pathlib.Path(rb.storage_folder).parent == pathlib.Path(tempfile.gettempdir())
        assert not os.path.exists(first) and os.listdir(fake_shm) == []
        assert steps(rb) == list(range(202_048))
        rb.add({"x": torch.zeros(WIDTH), "step": -1})
        assert steps(rb)[-2:] == [202_047, -1]


def test_a_checkpoint_load_reserves_only_the_rows_it_holds(fake_shm: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with ReplayBuffer("cpu", "cpu", CAPACITY, seed=0, storage_dir=tmp_path / "disk") as rb:
        rb.add_batch(batch(0, 3000))
        rb.save(tmp_path / "ck", data=True)
    with ReplayBuffer.from_checkpoint(tmp_path / "ck") as loaded:
        assert pathlib.Path(loaded.storage_folder).parent == fake_shm
        assert 3000 * WIDTH * 4 <= allocated(loaded) <= FULL_BYTES // 8
        assert steps(loaded) == list(range(3000))
        loaded.add_batch(batch(3000, 50_000))
        assert steps(loaded) == list(range(53_000))
