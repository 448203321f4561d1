"""A compact buffer in shared-memory mode (issue 25): many writer processes, rows bit for bit as written,
the shared files about one frame a row."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.distributed import become_shared, share
from objectrl_buffer.distributed.shared_compact import SharedCompactBuffer
from objectrl_buffer.errors import SchemaError
from tests.compact.streams import env_rows, steps_of

CLAIMS: dict[str, Any] = {"next_of": {"next_state": "state"}, "frame_stack": {"state": 4}}
ROWS = 150  # per writer
STEPS = 1000  # of the memory test


@functools.lru_cache(maxsize=16)
def tagged(writer: int, k: int = 4, frame: tuple[int, ...] = (2, 3), steps: int = ROWS) -> list[dict[str, Any]]:
    """Writer ``writer``'s env stream, each row carrying its ``(writer, t)`` as ``id`` (the reference key);
    larger frames get longer episodes (~20 steps)."""
    end_rate = 0.15 if frame == (2, 3) else 0.05
    rows = env_rows(steps, k, seed=100 + writer, end_rate=end_rate, frame_shape=frame)
    g = torch.Generator().manual_seed(writer)
    for t, row in enumerate(rows):
        row["id"] = torch.tensor([writer, t])
        if (row["terminated"] or row["truncated"]) and t % 2:  # an end whose next stack is not a shift
            row["next_state"] = torch.randint(0, 256, row["next_state"].shape, generator=g, dtype=torch.uint8)
    return rows


def check_rows(got: Any, frame: tuple[int, ...] = (2, 3), steps: int = ROWS) -> int:
    """Assert every row of ``got`` is bit for bit the row its ``id`` names; return how many."""
    for i in range(got.batch_size[0]):
        w, t = (int(v) for v in got["id"][i])
        ref = tagged(w, 4, frame, steps)[t]
        for key, value in ref.items():
            assert torch.equal(got[key][i], value.reshape(got[key][i].shape)), (w, t, key)
    return got.batch_size[0]


def writer(rb: Any, w: int, seed: int) -> None:
    """Writes its stream with ``add`` and ``add_batch`` at random, sampling (and checking) now and then."""
    rows = tagged(w)
    g = torch.Generator().manual_seed(seed)
    t = 1 if w == 0 else 0  # writer 0's first row was the parent's schema row
    while t < len(rows):
        n = int(torch.randint(1, 6, (1,), generator=g))
        if n == 1:
            rb.add(rows[t])
        else:
            batch = steps_of([rows], t, min(t + n, len(rows)))
            rb.add_batch(batch)
        t += n
        if t % 20 < n:
            check_rows(rb.sample_batch(8))


def test_writer_processes_rows_bit_for_bit() -> None:
    """Three writer processes interleave their streams on a shared compact ring that wraps; every row read
    (all rows, samples here and in the writers) is the row written, and every held row can be served."""
    rb = ReplayBuffer("cpu", "cpu", 128, seed=0, **CLAIMS)
    rb.add(tagged(0)[0])
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=writer, args=(rb, w, w)) for w in range(3)]
    for p in procs:
        p.start()
    reads = 0
    while any(p.is_alive() for p in procs):  # the parent samples while the writers write and lap the ring
        reads += check_rows(rb.sample_batch(16))
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert isinstance(rb.shared, SharedCompactBuffer) and len(rb) == 128
    rows = rb.shared.rows()
    assert check_rows(rows) == 128  # the margin keeps every held row's borrowed frames
    check_rows(rb.sample_batch(64))
    assert check_rows(rb.sample_all()) == 128  # a snapshot of the interleaved streams, plain rows
    rb.close()


def test_shared_files_hold_about_one_frame_a_row() -> None:
    """Page-sized stacks (4 frames of 32x32) over ~8 laps of the ring, ~20-step episodes: the shared compact
    files take well under half of a plain shared buffer's, and stay near one frame a row (the whole stacks
    of the episode starts overwritten are freed, not kept)."""
    frame = (32, 32)
    rows = tagged(0, frame=frame, steps=STEPS)
    sizes = {}
    for name, claims in (("plain", {}), ("compact", CLAIMS)):
        rb = ReplayBuffer("cpu", "cpu", 128, seed=0, **claims)
        rb.add(rows[0])
        become_shared(rb)
        for t in range(1, STEPS - 50, 25):
            rb.add_batch(steps_of([rows], t, min(t + 25, STEPS - 50)))
        for row in rows[STEPS - 50 :]:
            rb.add(row)
        sizes[name] = sum(e.stat().st_blocks * 512 for e in os.scandir(rb.shared.folder))
        if name == "compact":
            assert check_rows(rb.shared.rows(), frame, STEPS) == 128
            assert sizes[name] == rb.shared.nbytes
        rb.close()
    unique = 128 * 32 * 32
    print({name: round(size / unique, 2) for name, size in sizes.items()})
    assert sizes["compact"] < 0.4 * sizes["plain"], sizes
    assert sizes["compact"] < 3 * unique, sizes  # a frame a row and the margin's, ~k frames an episode held


def test_broken_overlap_is_refused_and_nothing_stored() -> None:
    rb = ReplayBuffer("cpu", "cpu", 64, **CLAIMS)
    rows = tagged(0)
    rb.add(rows[0])
    become_shared(rb)
    rb.add(rows[1])
    reserved = rb.shared.reserved
    bad = [dict(r) for r in rows[2:6]]
    first = next(i for i, r in enumerate(rows[1:], 1) if r["terminated"] or r["truncated"])
    assert first > 2  # rows 2.. continue row 1
    bad[1]["state"] = bad[1]["state"].clone()
    bad[1]["state"][0, 0, 0] ^= 1
    with pytest.raises(SchemaError, match="state"):
        rb.add_batch(steps_of([bad], 0, 4))
    with pytest.raises(SchemaError, match="state"):
        rb.add(bad[1])
    assert rb.shared.reserved == reserved
    rb.add_batch(steps_of([rows], 2, 6))  # the stream goes on from row 1
    assert check_rows(rb.shared.rows()) == 6
    rb.close()


def test_frame_stack_without_next_and_vector_envs() -> None:
    """``frame_stack`` alone, two envs a step (each env its stream), written by two processes."""
    envs = [[{k: v for k, v in r.items() if k != "next_state"} for r in tagged(w)] for w in (0, 1)]
    rb = ReplayBuffer("cpu", "cpu", 64, seed=0, num_envs=2, frame_stack={"state": 4})
    rb.add_batch(steps_of(envs, 0, 1))

    def child(rb: Any) -> None:
        other = [[{k: v for k, v in r.items() if k != "next_state"} for r in tagged(w)] for w in (2, 3)]
        rb.add_batch(steps_of(other, 0, 60))

    p = mp.get_context("fork").Process(target=child, args=(rb,))
    p.start()
    for t in range(1, 60):
        rb.add({k: torch.stack([envs[0][t][k], envs[1][t][k]]) for k in envs[0][0]})
    p.join(timeout=60)
    assert p.exitcode == 0
    rows = rb.shared.rows(2)
    assert rows.batch_size[0] == 64
    for i in range(64):
        w, t = (int(v) for v in rows["id"][i])
        ref = tagged(w)[t]
        assert torch.equal(rows["state"][i], ref["state"]) and torch.equal(rows["reward"][i], ref["reward"])
    rb.close()


def test_a_slow_stream_among_fast_ones_stores_its_own_frames() -> None:
    """Two handles on one folder (two streams): one adds a row for every 40 of the other; past the margin its
    rows stop borrowing from its own overwritten predecessors, and every held row is served as written."""
    probe = tagged(0)[0]
    schema_rb = ReplayBuffer("cpu", "cpu", 8, **CLAIMS)
    schema_rb.add(probe)
    fast = SharedCompactBuffer.create_compact(
        schema_rb.schema,
        48,
        next_of=CLAIMS["next_of"],
        frame_stack=CLAIMS["frame_stack"],
        end_keys=schema_rb.engine.end_keys,
        margin=16,
    )
    slow = SharedCompactBuffer(fast.folder)
    rows_fast, rows_slow = tagged(1), tagged(0)
    assert not any(bool(r["terminated"] or r["truncated"]) for r in rows_slow[:7])  # one episode
    t_fast = 0
    for t in range(7):  # 77 tickets: the slow rows held borrow from rows 33+ tickets back, past the margin
        slow.add(rows_slow[t])
        for _ in range(10):
            fast.add(rows_fast[t_fast])
            t_fast += 1
    got = fast.rows()
    assert check_rows(got) == 48
    assert {int(w) for w in got["id"][:, 0]} == {0, 1}
    slow.close()
    fast.close()


def test_prioritized_claims_shared_snapshots_read_every_stream() -> None:
    """A prioritized buffer with claims is shared with plain rows; its snapshots (``sample_all``) hold the
    interleaved streams of two writer processes as written (its own storage keeps plain rows then)."""
    rb = PrioritizedReplayBuffer("cpu", "cpu", 64, seed=0, **CLAIMS)
    rb.add(tagged(0)[0])
    ctx = mp.get_context("fork")

    def child(rb: Any, w: int) -> None:
        for row in tagged(w)[:40]:
            rb.add(row)

    procs = [ctx.Process(target=child, args=(rb, w)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert check_rows(rb.sample_all()) == 64
    check_rows(rb.sample_batch(16))
    rb.close()


def test_a_batch_longer_than_the_ring_keeps_its_newest_rows() -> None:
    rb = ReplayBuffer("cpu", "cpu", 32, **CLAIMS)
    rows = tagged(0)
    rb.add(rows[0])
    become_shared(rb)
    rb.add_batch(steps_of([rows], 1, 100))
    rb.add_batch(steps_of([rows], 100, 110))
    got = rb.shared.rows()
    assert check_rows(got) == 32 and int(got["id"][0, 1]) == 78
    rb.close()


def test_share_gives_a_compact_handle_with_the_rows() -> None:
    """``share(rb)`` of a buffer with claims: an explicit compact handle holding its rows, which a writer
    process continues as its own stream."""
    rb = ReplayBuffer("cpu", "cpu", 64, **CLAIMS)
    rows = tagged(0)
    rb.add_batch(steps_of([rows], 0, 40))
    shared = share(rb)
    assert isinstance(shared, SharedCompactBuffer)
    assert check_rows(shared.rows()) == 40

    def child(shared: SharedCompactBuffer) -> None:
        for row in tagged(1)[:30]:
            shared.add(row)

    p = mp.get_context("fork").Process(target=child, args=(shared,))
    p.start()
    p.join(timeout=60)
    assert p.exitcode == 0 and check_rows(shared.rows()) == 64
    shared.close()
    rb.close()


def test_an_array_reused_in_place_is_checked_as_it_was_written() -> None:
    """An env that refills one array in place: a row whose ``state`` is the previous row's ``next_state``
    array, changed since that row was written, does not continue what was stored and is refused."""
    rows = [{k: v.numpy() for k, v in row.items()} for row in tagged(0)[:3]]
    rb = ReplayBuffer("cpu", "cpu", 16, **CLAIMS)
    rb.add(rows[0])
    become_shared(rb)
    buf = rows[1]["next_state"].copy()
    rb.add({**rows[1], "next_state": buf})
    buf[-1] ^= 1  # the env refills the array it handed over
    with pytest.raises(SchemaError, match="state"):
        rb.add({**rows[2], "state": buf, "next_state": rows[2]["next_state"]})
    rb.add(rows[2])
    assert check_rows(rb.shared.rows()) == 3
    rb.close()


@settings(max_examples=int(os.environ.get("COMPACT_EXAMPLES", "20")), deadline=None)
@given(
    k=st.integers(1, 4),
    with_next=st.booleans(),
    capacity=st.integers(3, 40),
    margin=st.integers(0, 12),
    end_rate=st.sampled_from([0.0, 0.1, 0.4]),
    writes=st.lists(st.tuples(st.integers(0, 1), st.integers(1, 6)), min_size=1, max_size=30),
)
def test_random_writes_of_two_streams_read_as_written(
    k: int, with_next: bool, capacity: int, margin: int, end_rate: float, writes: list[tuple[int, int]]
) -> None:
    """Hypothesis: two handles (two streams) write random runs of rows; every held row reads back as written,
    whatever the stack, the claims, the ring's size and a margin too small for the streams' lag."""
    streams = [env_rows(200, k, seed=h, end_rate=end_rate) for h in (0, 1)]
    for h, rows in enumerate(streams):
        for t, row in enumerate(rows):
            row["id"] = torch.tensor([h, t])
            if not with_next:
                del row["next_state"]
    first = ReplayBuffer(
        "cpu", "cpu", 8, frame_stack={"state": k}, next_of={"next_state": "state"} if with_next else None
    )
    first.add(streams[0][0])
    handles = [
        SharedCompactBuffer.create_compact(
            first.schema,
            capacity,
            next_of={"next_state": "state"} if with_next else {},
            frame_stack={"state": k},
            end_keys=first.engine.end_keys,
            margin=margin,
        )
    ]
    handles.append(SharedCompactBuffer(handles[0].folder))
    done, written = [0, 0], []
    for h, n in writes:
        batch = steps_of([streams[h]], done[h], done[h] + n)
        if n == 1:
            handles[h].add(streams[h][done[h]])
        else:
            handles[h].add_batch(batch)
        written += [(h, t) for t in range(done[h], done[h] + n)]
        done[h] += n
    got = handles[0].rows()
    assert [tuple(int(v) for v in got["id"][i]) for i in range(got.batch_size[0])] == written[-capacity:]
    for i, (h, t) in enumerate(written[-capacity:]):
        for key, value in streams[h][t].items():
            assert torch.equal(got[key][i], value.reshape(got[key][i].shape)), (h, t, key)
    handles[1].close()
    handles[0].close()
    first.close()
