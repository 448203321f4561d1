"""Default placement of CPU storage: /dev/shm when the buffer fits (pages reserved), the temp dir otherwise."""

from __future__ import annotations

import errno
import os
import pathlib
import tempfile

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.errors import ClosedBufferError
from objectrl_buffer.storage import placement, prefault
from tests.support import fill, steps_of


@pytest.fixture
def fake_shm(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A stand-in for /dev/shm whose room the test sets through ``placement.ram_room``."""
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(placement, "SHM_DIR", str(shm))
    return shm


def set_room(monkeypatch: pytest.MonkeyPatch, nbytes: int) -> None:
    monkeypatch.setattr(placement, "ram_room", lambda folder=placement.SHM_DIR: nbytes)


def row(step: int) -> dict:
    """A 1008-byte row (``state`` float32[250], ``step`` int64) identified by ``step``."""
    return {"state": torch.full((250,), float(step)), "step": step}


def test_default_buffer_that_fits_goes_to_shm_with_its_pages_reserved(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_room(monkeypatch, 1 << 30)
    with ReplayBuffer("cpu", "cpu", 1000) as rb:
        assert rb.storage_folder is None  # chosen at the first write, when the row size is known
        rb.add(row(0))
        folder = rb.storage_folder
        assert folder is not None and pathlib.Path(folder).parent == fake_shm
        files = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".memmap")]
        assert len(files) == 2
        for path in files:  # every byte allocated now: a later write cannot find the file system full
            st = os.stat(path)
            assert st.st_size > 0 and st.st_blocks * 512 >= st.st_size
        for i in range(1, 6):
            rb.add(row(i))
        assert rb.sample_all()["step"].tolist() == list(range(6))
    assert not os.path.exists(folder)


def test_a_64_mb_shm_sends_a_larger_buffer_to_the_temp_dir(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_room(monkeypatch, 64 << 20)
    small, large = ReplayBuffer("cpu", "cpu", 1000), ReplayBuffer("cpu", "cpu", 100_000)  # 1 MB / 100 MB stored
    try:
        small.add(row(1))
        large.add(row(2))
        assert pathlib.Path(small.storage_folder).parent == fake_shm
        assert pathlib.Path(large.storage_folder).parent == pathlib.Path(tempfile.gettempdir())
        assert os.listdir(fake_shm) == [os.path.basename(small.storage_folder)]
        assert steps_of(large.sample_all()) == [2] and steps_of(small.sample_all()) == [1]
    finally:
        small.close()
        large.close()


def test_a_failed_reservation_falls_back_to_the_temp_dir_before_any_row_is_lost(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_room(monkeypatch, 1 << 30)

    def full(paths: object) -> None:
        list(paths)  # type: ignore[call-overload]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(placement, "reserve", full)
    with ReplayBuffer("cpu", "cpu", 50, seed=0) as rb:
        fill(rb, range(60))  # wraps: the first row written before the fallback must survive the move
        assert pathlib.Path(rb.storage_folder).parent == pathlib.Path(tempfile.gettempdir())
        assert os.listdir(fake_shm) == []  # the reserved-then-abandoned folder is gone
        assert steps_of(rb.sample_all()) == list(range(10, 60))


def test_the_first_row_survives_the_fallback(fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_room(monkeypatch, 1 << 30)
    monkeypatch.setattr(placement, "reserve", lambda paths: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with ReplayBuffer("cpu", "cpu", 5) as rb:
        rb.add(row(7))
        assert rb.sample_all()["step"].tolist() == [7]
        assert rb.sample_all()["state"][0, 0].item() == 7.0


def test_reset_to_a_size_that_no_longer_fits_moves_to_the_temp_dir(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_room(monkeypatch, 4 << 20)
    with ReplayBuffer("cpu", "cpu", 100) as rb:
        rb.add(row(0))
        first = rb.storage_folder
        assert pathlib.Path(first).parent == fake_shm
        rb.reset(10_000)  # 10 MB > a quarter of 4 MB
        rb.add(row(1))
        assert pathlib.Path(rb.storage_folder).parent == pathlib.Path(tempfile.gettempdir())
        assert not os.path.exists(first)
        assert steps_of(rb.sample_all()) == [1]
        rb.reset(100)
        rb.add(row(2))
        assert pathlib.Path(rb.storage_folder).parent == fake_shm
    assert os.listdir(fake_shm) == []


def test_an_explicit_storage_dir_is_used_as_given(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    set_room(monkeypatch, 1 << 30)
    with ReplayBuffer("cpu", "cpu", 10, storage_dir=tmp_path / "mine") as rb:
        assert pathlib.Path(rb.storage_folder).parent == tmp_path / "mine"  # made at construction
        rb.add(row(0))
        assert pathlib.Path(rb.storage_folder).parent == tmp_path / "mine"
    assert os.listdir(fake_shm) == []


def fixed_free_space(monkeypatch: pytest.MonkeyPatch, folder: pathlib.Path) -> int:
    """Freeze the free space statvfs reports for ``folder`` (other processes write to the same disk)."""
    real = os.statvfs
    frozen = real(folder)
    monkeypatch.setattr(os, "statvfs", lambda path: frozen if pathlib.Path(path) == folder else real(path))
    return frozen.f_bavail * frozen.f_frsize


def test_room_is_the_smaller_of_free_space_and_available_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    free = fixed_free_space(monkeypatch, tmp_path)
    monkeypatch.setattr(placement, "_mem_available", lambda: 1234)
    assert placement.ram_room(str(tmp_path)) == 1234
    monkeypatch.setattr(placement, "_mem_available", lambda: None)
    assert placement.ram_room(str(tmp_path)) == free
    assert placement.ram_room(str(tmp_path / "missing")) == 0


def test_without_shm_everything_goes_to_the_temp_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setattr(placement, "SHM_DIR", str(tmp_path / "no-such-folder"))
    assert placement.default_parent(1) == tempfile.gettempdir()
    assert placement.default_parent(0) == tempfile.gettempdir()


def test_reserve_allocates_whole_files(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.truncate(1 << 20)  # sparse
    assert os.stat(path).st_blocks * 512 < 1 << 20
    placement.reserve([str(path)])
    assert os.stat(path).st_blocks * 512 >= 1 << 20 and os.stat(path).st_size == 1 << 20
    with pytest.raises(FileNotFoundError):
        placement.reserve([str(tmp_path / "missing")])


def mapped_kib(path: str) -> int:
    """Resident KiB of this process's mappings of ``path`` (from /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps") or not prefault.populate_write(torch.empty(1 << 16, dtype=torch.uint8)),
    reason="needs Linux >= 5.14 (MADV_POPULATE_WRITE, /proc/self/smaps)",
)
def test_reserved_storage_is_mapped_up_front_and_wide_rows_skip_pwrite(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    set_room(monkeypatch, 1 << 30)
    frame = {"frame": torch.zeros(4, 84, 84, dtype=torch.uint8), "step": 0}  # a 28 KB row: "wide"
    with ReplayBuffer("cpu", "cpu", 256) as ram, ReplayBuffer("cpu", "cpu", 256, storage_dir=tmp_path / "d") as disk:
        ram.add(frame)
        disk.add(frame)
        path = os.path.join(ram.storage_folder, "frame.memmap")
        reserved = ram.engine.storage.reserved  # reserved lazily, in proportion to the rows written
        assert 1 <= reserved < 256
        assert mapped_kib(path) * 1024 >= reserved * 4 * 84 * 84 - 4096  # every reserved page mapped: no faults
        assert ram.engine.storage.fast is not None and not ram.engine.storage.fast.fds
        disk_fast = disk.engine.storage.fast
        assert disk_fast is not None and disk_fast.fds  # disk-backed: wide rows via pwrite
        for rb in (ram, disk):
            rb.add({"frame": torch.full((4, 84, 84), 9, dtype=torch.uint8), "step": 1})
            assert rb.sample_by_index([1])["frame"].unique().tolist() == [9]


def test_a_checkpoint_loads_into_reserved_storage(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    set_room(monkeypatch, 1 << 30)
    with ReplayBuffer("cpu", "cpu", 40, seed=3, storage_dir=tmp_path / "d") as rb:
        fill(rb, range(50))
        (tmp_path / "ck").mkdir()
        rb.save(tmp_path / "ck" / "buf", data=True)
        expected = rb.sample_all()
    with ReplayBuffer.from_checkpoint(tmp_path / "ck" / "buf") as loaded:
        assert pathlib.Path(loaded.storage_folder).parent == fake_shm
        assert steps_of(loaded.sample_all()) == steps_of(expected) == list(range(10, 50))
        assert torch.equal(loaded.sample_all()["state"], expected["state"])
        fill(loaded, range(50, 55))
        assert steps_of(loaded.sample_all()) == list(range(15, 55))


def fake_cgroups(root: pathlib.Path, proc: str, files: dict[str, str]) -> None:
    """A /proc/self/cgroup text and the memory files of a cgroup tree under ``root``."""
    (root / "proc").write_text(proc)
    for name, text in files.items():
        path = root / "cg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("proc", "files", "headroom"),
    [
        # cgroup v2: a container limited to 4 GiB with 1 GiB used; its parent is unlimited
        (
            "0::/box\n",
            {"box/memory.max": str(4 << 30), "box/memory.current": str(1 << 30), "memory.max": "max"},
            3 << 30,
        ),
        # v2, the parent's limit is the tighter one
        (
            "0::/a/b\n",
            {"a/b/memory.max": "max", "a/b/memory.current": "5", "a/memory.max": "1000", "a/memory.current": "400"},
            600,
        ),
        # cgroup v1 memory controller (as on this project's VMs), with "no limit" written as a huge number
        (
            "4:memory:/job\n0::/\n",
            {"memory/job/memory.limit_in_bytes": str(2 << 30), "memory/job/memory.usage_in_bytes": str(1 << 29)},
            (2 << 30) - (1 << 29),
        ),
        ("4:memory:/job\n", {"memory/job/memory.limit_in_bytes": "9223372036854771712"}, None),
        ("0::/\n", {}, None),  # no memory files: unknown
    ],
)
def test_a_container_memory_limit_bounds_the_room(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, proc: str, files: dict[str, str], headroom: int | None
) -> None:
    fake_cgroups(tmp_path, proc, files)
    monkeypatch.setattr(placement, "PROC_CGROUP", str(tmp_path / "proc"))
    monkeypatch.setattr(placement, "CGROUP_ROOT", str(tmp_path / "cg"))
    assert placement.cgroup_headroom() == headroom
    monkeypatch.setattr(placement, "_mem_available", lambda: None)
    free = fixed_free_space(monkeypatch, tmp_path)
    assert placement.ram_room(str(tmp_path)) == (free if headroom is None else min(free, headroom))


def test_a_buffer_over_a_quarter_of_the_container_limit_goes_to_disk(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    fake_cgroups(tmp_path, "0::/box\n", {"box/memory.max": str(16 << 20), "box/memory.current": "0"})
    monkeypatch.setattr(placement, "PROC_CGROUP", str(tmp_path / "proc"))
    monkeypatch.setattr(placement, "CGROUP_ROOT", str(tmp_path / "cg"))
    with ReplayBuffer("cpu", "cpu", 10_000) as rb:  # 10 MB: more than a quarter of 16 MB
        rb.add(row(0))
        assert pathlib.Path(rb.storage_folder).parent == pathlib.Path(tempfile.gettempdir())
    with ReplayBuffer("cpu", "cpu", 1000) as rb:  # 1 MB fits
        rb.add(row(0))
        assert pathlib.Path(rb.storage_folder).parent == fake_shm


def test_an_empty_column_does_not_send_the_buffer_to_disk(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_room(monkeypatch, 1 << 30)
    with ReplayBuffer("cpu", "cpu", 100) as rb:  # tensordict makes no file for a zero-width column
        rb.add({"obs": torch.ones(3), "empty": torch.zeros(0), "r": 1.0})
        assert pathlib.Path(rb.storage_folder).parent == fake_shm
        assert rb.sample_all()["obs"].tolist() == [[1.0, 1.0, 1.0]]


@pytest.mark.parametrize("text", ["garbage\n", "0::\n", "4:memory\n", "0::/caf\xe9\n", ""])
def test_odd_cgroup_files_never_break_an_add(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, text: str
) -> None:
    (tmp_path / "proc").write_bytes(text.encode("latin-1"))
    monkeypatch.setattr(placement, "PROC_CGROUP", str(tmp_path / "proc"))
    monkeypatch.setattr(placement, "CGROUP_ROOT", str(tmp_path / "cg"))
    assert placement.cgroup_headroom() is None
    with ReplayBuffer("cpu", "cpu", 10) as rb:
        rb.add(row(1))
        assert steps_of(rb.sample_all()) == [1]


def test_an_unusable_shm_falls_back_to_the_temp_dir(fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_room(monkeypatch, 1 << 30)
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(prefix: str = "", dir: str | None = None) -> str:
        if dir == str(fake_shm):
            raise OSError(errno.ENOSPC, "No space left on device (inodes)")
        return real_mkdtemp(prefix=prefix, dir=dir)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    with ReplayBuffer("cpu", "cpu", 10) as rb:
        rb.add(row(3))
        assert pathlib.Path(rb.storage_folder).parent == pathlib.Path(tempfile.gettempdir())
        assert steps_of(rb.sample_all()) == [3]


def test_a_tmpfs_temp_dir_is_reserved_too_and_warns_when_it_cannot_be(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_room(monkeypatch, 1 << 20)  # too small: the buffer goes to the temp folder...
    monkeypatch.setattr(placement, "is_tmpfs", lambda folder: True)  # ...which is a tmpfs (Fedora, Arch)
    frame = {"frame": torch.zeros(4, 84, 84, dtype=torch.uint8), "step": 0}
    with ReplayBuffer("cpu", "cpu", 100) as rb:
        rb.add(frame)
        assert pathlib.Path(rb.storage_folder).parent == pathlib.Path(tempfile.gettempdir())
        assert rb.engine.storage.fast is not None and not rb.engine.storage.fast.fds  # reserved RAM: no pwrite
    monkeypatch.setattr(placement, "reserve", lambda paths: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with ReplayBuffer("cpu", "cpu", 100) as rb, pytest.warns(RuntimeWarning, match="storage_dir"):
        rb.add(frame)
    with ReplayBuffer("cpu", "cpu", 100) as rb, pytest.warns(RuntimeWarning, match="SIGBUS"):
        rb.add(frame)
        assert rb.sample_all()["step"].tolist() == [0]


def test_a_closed_buffer_refuses_writes_and_leaves_no_folder(
    fake_shm: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_room(monkeypatch, 1 << 30)
    rb = ReplayBuffer("cpu", "cpu", 10)
    rb.add(row(0))
    folder = rb.storage_folder
    rb.close()
    assert not os.path.exists(folder)
    for write in (
        lambda: rb.add(row(1)),
        lambda: rb.add_batch({"state": torch.zeros(2, 250), "step": torch.arange(2)}),
    ):
        with pytest.raises(ClosedBufferError, match="closed"):
            write()
    assert len(rb) == 0 and os.listdir(fake_shm) == []
