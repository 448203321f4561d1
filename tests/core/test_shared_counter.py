"""SharedSlots: the reserve counter counts every row once across processes; generations publish rows."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch

from objectrl_buffer.core.shared_counter import SharedSlots


def reserve_many(path: str, times: int, out: Any) -> None:
    slots = SharedSlots(path, 8)
    starts = [slots.reserve(3) for _ in range(times)]
    out.put(starts)


def test_reservations_from_processes_never_overlap(tmp_path: Any) -> None:
    path = str(tmp_path / "slots.bin")
    SharedSlots(path, 8, create=True)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=reserve_many, args=(path, 200, out)) for _ in range(3)]
    for p in procs:
        p.start()
    starts = sorted(s for _ in procs for s in out.get(timeout=30))
    for p in procs:
        p.join()
    assert starts == list(range(0, 3 * 200 * 3, 3))  # disjoint 3-row ranges, none lost
    assert SharedSlots(path, 8).reserved == 1800


def test_generations_publish_rows(tmp_path: Any) -> None:
    path = str(tmp_path / "slots.bin")
    slots = SharedSlots(path, 4, create=True)
    other = SharedSlots(path, 4)  # a second mapping sees the same words
    where = torch.tensor([1, 2])
    assert other.committed() == 0
    slots.commit(where, torch.tensor([10, 11]))
    assert other.generations(where).tolist() == [11, 12] and other.committed() == 2
    slots.begin(torch.tensor([2]))
    assert other.generations(where).tolist() == [11, 0]


def test_a_wrong_size_is_refused(tmp_path: Any) -> None:
    path = str(tmp_path / "slots.bin")
    SharedSlots(path, 4, create=True)
    with pytest.raises(ValueError, match="does not hold 5 slots"):
        SharedSlots(path, 5)
    with pytest.raises(FileExistsError):
        SharedSlots(path, 4, create=True)
