"""RowStore writes: fresh RAM-backed rows go through ``os.pwrite`` (no page faults), and nothing else changes."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer.core.schema import Schema
from objectrl_buffer.storage import placement
from objectrl_buffer.trajectory.rows import RowStore


def rows_of(m: int, n: int) -> dict[Any, torch.Tensor]:
    """``n`` rows that tell trajectory ``m`` and the row apart, in a few dtypes and a nested key."""
    r = torch.arange(n)
    return {
        "a": (m * 1000 + r).float(),
        "img": (m * 7 + r).remainder(256).to(torch.uint8)[:, None, None].expand(n, 3, 5).contiguous(),
        ("obs", "flag"): (r + m).remainder(2).bool(),
    }


def store(capacity: int | None, chunk_rows: int | None) -> RowStore:
    return RowStore(capacity, torch.device("cpu"), chunk_rows)


def append(rows: RowStore, m: int, n: int) -> int:
    schema, pairs, k = rows.prepare(rows_of(m, n), rows.schema)
    if rows.ring is not None:
        while rows.free < k:
            rows.drop_oldest(k)  # test trajectories all have k rows
    return rows.append(schema, pairs, k)


def assert_rows(rows: RowStore, first: int, m: int, n: int) -> None:
    got, want = rows.read(first, n), rows_of(m, n)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


def lazy(rows: RowStore) -> bool:
    """Whether the chunks are RAM-backed (placement's default when there is room), so reserved lazily."""
    folder = rows.chunks[0].folder if rows.chunks else None
    return folder is not None and placement.is_tmpfs(folder)


@pytest.mark.parametrize("capacity,chunk_rows", [(None, 64), (72, None)])
def test_rows_read_back_across_chunks_and_wraps(capacity: int | None, chunk_rows: int | None) -> None:
    rows = store(capacity, chunk_rows)
    try:
        firsts = [append(rows, m, 24) for m in range(7)]  # unbounded: straddles chunks; ring: wraps twice
        kept = range(7) if capacity is None else range(4, 7)
        for m in kept:
            assert_rows(rows, firsts[m], m, 24)
    finally:
        rows.close()


def test_fresh_rows_are_written_with_pwrite_and_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.pwrite

    def spy(fd: int, data: Any, offset: int) -> int:
        calls.append(offset)
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", spy)
    rows = store(None, 64)
    try:
        append(rows, 0, 40)
        if not lazy(rows):
            pytest.skip("storage not RAM-backed here (no reservation to skip)")
        assert calls, "fresh rows of RAM-backed storage are written with os.pwrite"
        assert rows.chunks[0].reserved == 40  # exactly the rows written: pwrite allocated their pages
        append(rows, 1, 40)  # 24 rows end chunk 0, 16 start chunk 1
        assert rows.chunks[0].reserved == 64 and rows.chunks[1].reserved == 16
        assert_rows(rows, 0, 0, 40)
        assert_rows(rows, 40, 1, 40)
    finally:
        rows.close()


@pytest.mark.parametrize("capacity", [None])
def test_a_full_file_system_falls_back_without_touching_stored_rows(
    monkeypatch: pytest.MonkeyPatch, capacity: int | None
) -> None:
    rows = store(capacity, 64 if capacity is None else None)
    try:
        append(rows, 0, 24)
        if not lazy(rows):
            pytest.skip("storage not RAM-backed here")
        real = os.pwrite
        count = [0]

        def full(fd: int, data: Any, offset: int) -> int:  # the first block lands half, then ENOSPC
            count[0] += 1
            if count[0] == 1:
                return real(fd, memoryview(data)[: len(memoryview(data)) // 2], offset)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full)
        second = append(rows, 1, 24)  # falls back to reserving and writing through the mapping
        assert count[0] >= 2
        monkeypatch.setattr(os, "pwrite", real)
        assert_rows(rows, 0, 0, 24)
        assert_rows(rows, second, 1, 24)
        assert rows.chunks[0].reserved >= 48
    finally:
        rows.close()


def test_chunk_placement_is_what_placement_decides() -> None:
    rows = store(None, 64)
    try:
        append(rows, 0, 8)
        schema = rows.schema
        assert isinstance(schema, Schema)
        folder = rows.chunks[0].folder
        assert folder is not None
        assert os.path.dirname(folder) == placement.default_parent(schema.row_bytes * 64)
    finally:
        rows.close()


def test_write_fresh_is_off_unless_asked() -> None:
    """Only trajectory chunks (unbounded and ring) take the pwrite path; other storages write as before."""
    from objectrl_buffer.storage.table import TransitionStorage

    plain = TransitionStorage(8, torch.device("cpu"))
    rows = store(None, 64)
    try:
        append(rows, 0, 8)
        ring = store(16, None)
        append(ring, 0, 8)
        assert not plain.write_fresh and rows.chunks[0].write_fresh and ring.chunks[0].write_fresh
        ring.close()
    finally:
        plain.close()
        rows.close()


def test_a_rings_first_pass_is_pwritten_and_its_next_pass_maps_exactly_the_rows_it_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ring's fresh slots are written like an unbounded chunk's (pwrite, reserved as written: no growth
    stall); when it wraps, each write first maps the slots it is about to store into, and no others."""
    from objectrl_buffer.storage import table

    written: list[int] = []
    real_pwrite = os.pwrite

    def spy_pwrite(fd: int, data: Any, offset: int) -> int:
        written.append(len(memoryview(data)))
        return real_pwrite(fd, data, offset)

    mapped: list[int] = []
    real_populate = table.populate_write

    def spy_populate(flat: torch.Tensor) -> bool:
        mapped.append(flat.numel())
        return real_populate(flat)

    monkeypatch.setattr(os, "pwrite", spy_pwrite)
    monkeypatch.setattr(table, "populate_write", spy_populate)
    rows = store(72, None)
    try:
        for m in range(3):
            append(rows, m, 24)
        if not lazy(rows):
            pytest.skip("storage not RAM-backed here")
        schema = rows.schema
        assert schema is not None
        assert sum(written) == 72 * schema.row_bytes and not mapped  # the first pass: pwrite only
        assert rows.chunks[0].reserved == 72
        written.clear()
        append(rows, 3, 24)  # the wrap: slots 0..23 again, mapped then stored
        assert not written and sum(mapped) == 24 * schema.row_bytes
        mapped.clear()
        append(rows, 4, 24)
        assert sum(mapped) == 24 * schema.row_bytes
        for m, first in [(2, 48), (3, 72), (4, 96)]:
            assert_rows(rows, first, m, 24)
    finally:
        rows.close()


@settings(max_examples=20, deadline=None)
@given(st.integers(8, 80), st.lists(st.integers(1, 40), min_size=1, max_size=12))
def test_a_ring_keeps_the_newest_rows_whatever_the_sizes(capacity: int, sizes: list[int]) -> None:
    """Against a list of the trajectories kept: writes that wrap in two pieces, land past the rows mapped
    so far, or fill the ring exactly, all read back; evicted rows are gone from the count only."""
    rows = store(capacity, None)
    kept: list[tuple[int, int, int]] = []  # (trajectory, first address, rows), oldest first
    try:
        for m, n in enumerate(sizes):
            if n > capacity:
                continue
            schema, pairs, k = rows.prepare(rows_of(m, n), rows.schema)
            while rows.free < k:
                _, _, old = kept.pop(0)
                rows.drop_oldest(old)
            kept.append((m, rows.append(schema, pairs, k), k))
            for j, first, length in kept:
                assert_rows(rows, first, j, length)
    finally:
        rows.close()


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 4),
    st.lists(st.integers(1, 50), min_size=1, max_size=25),
    st.booleans(),
    st.lists(st.integers(0, 10**6), min_size=1, max_size=30),
)
def test_chunks_whose_rows_were_all_dropped_are_reused_and_memory_stays_bounded(
    keep: int, sizes: list[int], in_memory: bool, picks: list[int]
) -> None:
    """Chunked rows with the oldest trajectories dropped (a buffer keeping its window), against a list of
    the kept ones: every kept row reads back (whole, and gathered by address across chunks) after each
    add, a chunk left with no kept row is reused as the next one (at most one spare), and the chunks held
    never exceed what the kept rows span plus one."""
    rows = RowStore(None, torch.device("cpu"), 16, in_memory=in_memory)
    kept: list[tuple[int, int, int]] = []  # (trajectory, first address, rows), oldest first
    reused = 0
    try:
        for m, n in enumerate(sizes):
            schema, pairs, k = rows.prepare(rows_of(m, n), rows.schema)
            while len(kept) >= keep:
                _, _, old = kept.pop(0)
                rows.drop_oldest(old)
            spare, before = rows.spare, {id(c) for c in rows.chunks}
            kept.append((m, rows.append(schema, pairs, k), k))
            new_chunks = [c for c in rows.chunks if id(c) not in before]
            if spare is not None and new_chunks:
                assert new_chunks[0] is spare, "the spare is the next chunk"
                reused += 1
            assert rows.spare is None or all(rows.spare is not c for c in rows.chunks)
            for j, first, length in kept:
                assert_rows(rows, first, j, length)
            live = sum(length for _, _, length in kept)
            assert len(rows.chunks) <= -(-live // 16) + 1
            assert rows.chunks[0].capacity == 16 and rows.base * 16 <= kept[0][1]
        addresses = [a for _, first, length in kept for a in range(first, first + length)]
        chosen = [addresses[p % len(addresses)] for p in picks]
        got = rows.gather(torch.tensor(chosen, dtype=torch.int64))
        for key in got:
            want = []
            for a in chosen:
                m, first, _ = next(t for t in kept if t[1] <= a < t[1] + t[2])
                want.append(rows_of(m, a - first + 1)[key][a - first])
            assert torch.equal(got[key], torch.stack(want)), key
        total_rows = sum(sizes)
        if total_rows > 3 * 16 * (keep * 50 // 16 + 2):  # far more rows than the kept ones ever span
            assert reused > 0, "a chunk whose rows were all dropped is reused"
    finally:
        rows.close()
    assert rows.chunks == [] and rows.spare is None and rows.closed


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 6 * 24 - 1), min_size=1, max_size=40))
def test_gathers_over_many_chunks_match_a_reference_in_the_callers_order(picks: list[int]) -> None:
    """Addresses spread over several chunks, repeated and in any order, come back row for row in that order."""
    rows = store(None, 40)
    try:
        firsts = [append(rows, m, 24) for m in range(6)]  # 144 rows over 4 chunks of 40
        got = rows.gather(torch.tensor(picks, dtype=torch.int64))
        for key in got:
            want = torch.stack([rows_of(a // 24, 24)[key][a % 24] for a in picks])
            assert torch.equal(got[key], want), key
        assert firsts == [0, 24, 48, 72, 96, 120]
    finally:
        rows.close()


def test_a_gather_over_several_chunks_allocates_only_its_output() -> None:
    """After the first call, a multi-chunk gather allocates the arrays it returns and nothing as large
    (no per-call scratch, no buffered copy): transient arrays the size of the output cost a page fault
    per page on every call where the allocator hands their pages back to the system."""
    import tracemalloc

    rows = store(None, 40)
    try:
        for m in range(6):
            append(rows, m, 24)  # 144 rows over 4 chunks
        picks = torch.arange(143, -1, -1).repeat(20)  # every chunk, in reverse, 2,880 rows
        rows.gather(picks)  # the first call may size what it keeps
        tracemalloc.start()
        try:
            got = rows.gather(picks)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        output = sum(v.numel() * v.element_size() for v in got.values())
        assert peak < 1.2 * output, (peak, output)
    finally:
        rows.close()


@pytest.mark.parametrize("capacity,chunk_rows", [(None, 40), (60, None)])
def test_reading_a_trajectory_across_pieces_copies_it_and_keeps_nothing(
    capacity: int | None, chunk_rows: int | None
) -> None:
    """A trajectory that straddles two chunks (or wraps a ring) reads back as copies, piece by piece:
    no gather scratch the size of a trajectory stays allocated afterwards (the saving writer reads
    every trajectory this way)."""
    rows = store(capacity, chunk_rows)
    try:
        firsts = [append(rows, m, 24) for m in range(3)]  # the second straddles 40, the third wraps at 60
        for m in (1, 2):
            got = rows.read(firsts[m], 24)
            assert rows.scratch == {}
            for value in got.values():
                value.zero_()  # copies: the stored rows do not change
            assert_rows(rows, firsts[m], m, 24)
    finally:
        rows.close()


def test_a_gather_keeps_no_scratch_above_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose per-chunk rows exceed SCRATCH_BYTES is gathered right and leaves nothing kept."""
    from objectrl_buffer.trajectory import rows as rows_module

    monkeypatch.setattr(rows_module, "SCRATCH_BYTES", 0)
    rows = store(None, 40)
    try:
        for m in range(6):
            append(rows, m, 24)
        picks = [143, 0, 70, 41, 5, 100]
        got = rows.gather(torch.tensor(picks))
        assert rows.scratch == {}
        for key in got:
            want = torch.stack([rows_of(a // 24, 24)[key][a % 24] for a in picks])
            assert torch.equal(got[key], want), key
    finally:
        rows.close()
