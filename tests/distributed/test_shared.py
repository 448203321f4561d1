"""SharedBuffer: many processes write one buffer while another samples it. Every row is self-checking (each
field encodes its writer and sequence number), so a torn row, a lost row or a wrong counter shows."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import time
from typing import Any

import pytest
import torch

from objectrl_buffer.distributed import SharedBuffer, share
from objectrl_buffer.errors import EmptyBufferError, InvalidArgumentError, SchemaError
from tests.support import rows

SLOW = os.environ.get("RUN_SLOW") == "1"
SLOW_ONLY = [pytest.mark.slow, pytest.mark.skipif(not SLOW, reason="minutes of writing: set RUN_SLOW=1")]


def tagged(writer: int, seqs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows whose every field is a function of ``(writer, seq)``."""
    n = seqs.numel()
    tag = writer * 1_000_000 + seqs
    return {
        "writer": torch.full((n,), writer, dtype=torch.int64),
        "seq": seqs.clone(),
        "obs": tag.unsqueeze(1).to(torch.float64) + torch.arange(8, dtype=torch.float64),
        "frame": ((tag.unsqueeze(1) * 7 + torch.arange(16)) % 251).to(torch.uint8),
    }


def assert_consistent(batch: Any) -> None:
    expected = tagged(0, batch["seq"])  # rebuild every field from (writer, seq)
    tag = batch["writer"] * 1_000_000 + batch["seq"]
    assert torch.equal(batch["obs"], tag.unsqueeze(1).to(torch.float64) + torch.arange(8, dtype=torch.float64))
    assert torch.equal(batch["frame"], ((tag.unsqueeze(1) * 7 + torch.arange(16)) % 251).to(torch.uint8))
    assert expected["seq"].shape == batch["seq"].shape


def write_rows(buffer: SharedBuffer, writer: int, n: int) -> None:
    """A writer process: batches of 50 with single adds in between."""
    seq = 0
    while seq < n:
        if seq % 500 == 0:
            buffer.add({k: v[0] for k, v in tagged(writer, torch.tensor([seq])).items()})
            seq += 1
            continue
        k = min(50, n - seq)
        buffer.add_batch(tagged(writer, torch.arange(seq, seq + k)))
        seq += k


def hang_mid_write(buffer: SharedBuffer, flag: str) -> None:
    """A writer that reserves 5 slots, starts writing them, and never finishes."""
    start = buffer.slots.reserve(5)
    slots = torch.arange(start, start + 5) % buffer.capacity
    buffer.slots.begin(slots)
    buffer.columns["seq"][slots] = -7  # half a row: other fields untouched
    open(flag, "w").close()
    time.sleep(60)


def hold_the_lock(buffer: SharedBuffer, flag: str) -> None:
    with buffer.slots.lock:
        open(flag, "w").close()
        time.sleep(60)


def schema_buffer(capacity: int) -> SharedBuffer:
    from objectrl_buffer.core.schema import Schema

    schema, _ = Schema.infer(tagged(0, torch.arange(1)), batch_dims=1)
    return SharedBuffer.create(schema, capacity, seed=0)


@pytest.mark.parametrize(
    ("method", "writers", "per_writer"),
    # a spawn child imports torch afresh (seconds on a busy machine): 1 in CI, the 4 x 100k with RUN_SLOW
    [
        ("fork", 4, 5_000),
        ("spawn", 1, 1_000),
        pytest.param("spawn", 4, 100_000, marks=SLOW_ONLY),
        pytest.param("fork", 4, 100_000, marks=SLOW_ONLY),
    ],
)
def test_writers_in_child_processes_while_the_parent_samples(method: str, writers: int, per_writer: int) -> None:
    with schema_buffer(writers * per_writer) as buffer:
        ctx = mp.get_context(method)
        procs = [ctx.Process(target=write_rows, args=(buffer, w, per_writer)) for w in range(writers)]
        for p in procs:
            p.start()
        sampled = 0
        while any(p.is_alive() for p in procs):
            try:
                batch = buffer.sample_batch(64)
            except EmptyBufferError:
                time.sleep(0.01)
                continue
            assert_consistent(batch)
            sampled += 1
        for p in procs:
            p.join()
            assert p.exitcode == 0
        assert buffer.reserved == writers * per_writer == len(buffer) == buffer.committed()
        seen = set(zip(buffer.columns["writer"].tolist(), buffer.columns["seq"].tolist(), strict=True))
        assert seen == {(w, s) for w in range(writers) for s in range(per_writer)}  # nothing lost, none twice
        assert_consistent({k: v for k, v in buffer.columns.items()})


def test_torch_multiprocessing_workers_share_it_too() -> None:
    import torch.multiprocessing as tmp

    with schema_buffer(1000) as buffer:
        procs = [tmp.get_context("fork").Process(target=write_rows, args=(buffer, w, 200)) for w in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        assert buffer.committed() == 400
        assert_consistent(buffer.sample_batch(100))


@pytest.mark.parametrize("kills", [20 if SLOW else 3])
def test_a_writer_killed_mid_write_blocks_nobody(kills: int, tmp_path: Any) -> None:
    ctx = mp.get_context("fork")
    with schema_buffer(10_000) as buffer:
        for i in range(kills):
            flag = str(tmp_path / f"flag{i}")
            target = hang_mid_write if i % 2 == 0 else hold_the_lock
            proc = ctx.Process(target=target, args=(buffer, flag))
            proc.start()
            while not os.path.exists(flag):
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            write_rows(buffer, 1, 100)  # the lock is free again, the half-written slots are skipped
            for _ in range(20):
                assert_consistent(batch := buffer.sample_batch(256))
                assert bool((batch["seq"] >= 0).all())
        dead = 5 * ((kills + 1) // 2)
        assert buffer.reserved == 100 * kills + dead
        assert buffer.committed() == 100 * kills


def test_handles_pickle_to_the_same_rows_and_the_owner_cleans_up() -> None:
    buffer = schema_buffer(100)
    other = pickle.loads(pickle.dumps(buffer))
    other.add_batch(tagged(3, torch.arange(10)))
    assert buffer.committed() == 10 and not other.owner
    other.close()
    folder = buffer.folder
    buffer.close()
    assert not os.path.exists(folder)


def test_wraparound_keeps_the_newest_rows() -> None:
    with schema_buffer(10) as buffer:
        buffer.add_batch(tagged(0, torch.arange(7)))
        buffer.add_batch(tagged(0, torch.arange(7, 32)))  # more than capacity: the newest 10 are kept
        assert sorted(buffer.columns["seq"].tolist()) == list(range(22, 32))
        assert buffer.reserved == 32 and len(buffer) == 10 and buffer.committed() == 10


@pytest.mark.parametrize("held", [10, 19])  # the refused batch's slots: one run (0, 1), or wrapping (9, 0)
def test_a_refused_batch_keeps_the_rows_at_its_slots(held: int) -> None:
    with schema_buffer(10) as buffer:
        buffer.add_batch(tagged(0, torch.arange(held)))
        before = buffer.rows()
        with pytest.raises(SchemaError):
            buffer.add_batch({**tagged(1, torch.arange(2)), "seq": torch.zeros(2, 3)})  # a bad shape
        assert buffer.reserved == held and buffer.committed() == 10
        after = buffer.rows()
        assert torch.equal(after["index"], before["index"]) and torch.equal(after["seq"], before["seq"])


def test_bad_writes_store_nothing() -> None:
    with schema_buffer(10) as buffer:
        with pytest.raises(SchemaError):
            buffer.add_batch({"writer": torch.zeros(2, dtype=torch.int64)})
        assert buffer.reserved == 0
        with pytest.raises(EmptyBufferError):
            buffer.sample_batch(1)
        with pytest.raises(InvalidArgumentError, match="batch_size"):
            buffer.sample_batch(0)


def test_share_copies_a_buffers_rows(make_buffer: Any) -> None:
    rb = make_buffer(16)
    with pytest.raises(InvalidArgumentError, match="no schema yet"):
        share(rb)
    rb.add_batch(rows(0, 20))
    with share(rb, seed=0) as shared:
        assert shared.capacity == 16 and shared.committed() == 16
        assert sorted(shared.columns["step"].tolist()) == sorted(rb.sample_all()["step"].tolist())
        assert set(shared.sample_batch(8).keys()) == {*rb.schema.by_key, "index"}


def cold_writes(buffer: SharedBuffer, out: Any) -> None:
    # a fork child of a process that ran OpenMP-parallel torch ops hangs in its next parallel op (GNU
    # OpenMP's pool does not survive fork): stay serial here, as DataLoader workers do
    torch.set_num_threads(1)

    def rows_(n: int) -> dict[str, torch.Tensor]:
        return {"frame": torch.ones(n, 4, 84, 84, dtype=torch.uint8), "reward": torch.ones(n)}

    seen = [bytes(buffer.mapped_chunks)]
    for _ in range(100):  # slots 0..99
        buffer.add({"frame": torch.ones(4, 84, 84, dtype=torch.uint8), "reward": 1.0})
    seen.append(bytes(buffer.mapped_chunks))
    buffer.add_batch(rows_(100))  # slots 100..199
    seen.append(bytes(buffer.mapped_chunks))
    buffer.add_batch(rows_(300))  # slots 200..499
    buffer.mapped_chunks[:] = bytes(len(buffer.mapped_chunks))  # as if unmapped again: see what a wrap maps
    buffer.add_batch(rows_(30))  # slots 500..511, then 0..17
    seen.append(bytes(buffer.mapped_chunks))
    out.put(seen)


def test_a_fresh_writer_maps_large_rows_a_chunk_at_a_time() -> None:
    """Rows of a page or more: a fork child maps none of the parent's shared pages at first; each write maps
    the chunks of slots it lands in (one madvise per column, not a page fault per page: the speed is in
    benchmarks/distributed_bench.py's cold rows); small rows are left to fault."""
    from objectrl_buffer.core.schema import Schema

    frame = {"frame": torch.zeros(1, 4, 84, 84, dtype=torch.uint8), "reward": torch.ones(1)}
    schema, _ = Schema.infer(frame, batch_dims=1)
    with SharedBuffer.create(schema, 512, seed=0) as buffer:
        per = buffer.chunk_rows
        assert per == (2 << 20) // (4 * 84 * 84 + 4) == 74 and len(buffer.mapped_chunks) == 7
        buffer.add_batch({k: v.expand(512, *v.shape[1:]) for k, v in frame.items()})  # the parent maps all
        assert set(buffer.mapped_chunks) == {1}
        ctx = mp.get_context("fork")
        out = ctx.SimpleQueue()
        proc = ctx.Process(target=cold_writes, args=(buffer, out))
        proc.start()
        proc.join()
        start, singles, batch, wrapped = (list(b) for b in out.get())
        assert start == [0] * 7  # the child forgot the parent's mappings (its page tables start empty)
        assert singles == [1, 1, 0, 0, 0, 0, 0]  # slots 0..99: chunks 0 and 1 (74 rows each)
        assert batch == [1, 1, 1, 0, 0, 0, 0]  # slots 100..199: chunks 1 and 2
        assert wrapped == [1, 0, 0, 0, 0, 0, 1]  # slots 500..511 and 0..17: the last chunk and the first
        assert bool((buffer.columns["frame"] == 1).all()) and buffer.reserved == 512 + 530
    assert SharedBuffer.create(tagged_schema(), 8, seed=0).chunk_rows == 0  # 121-byte rows: no mapping


def tagged_schema() -> Any:
    from objectrl_buffer.core.schema import Schema

    return Schema.infer(tagged(0, torch.arange(1)), batch_dims=1)[0]
