"""SharedBuffer writers lapping the ring: a writer still copying its row when ``capacity`` more rows have been
reserved shares its slot with a newer writer. No sample, ``rows()`` snapshot or prioritized draw may ever
serve a row mixed from two writes (issue 27).

Every row is one value: ``fill`` (64 KiB of int64) holds ``writer * 10**9 + seq`` everywhere, and the
``writer``/``seq`` fields say which; a mixed row shows as a non-uniform ``fill`` or a ``fill`` that
disagrees with its fields.

The deterministic tests force a lap: the writing handle's row copier (``buffer.fast``, the object every
``add``/``add_batch`` copies through) is replaced by :class:`SlowCopy`, which copies the first half of
``fill``, lets a second handle lap the ring, then copies the rest: the very interleaving of a writer
preempted inside its copy on a busy machine. The realistic test runs 4 writer processes on a 64-slot ring
(a longer one, and a 1,024-slot ring, with ``RUN_SLOW=1``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from objectrl_buffer.core.ring import Ring
from objectrl_buffer.core.schema import Schema
from objectrl_buffer.distributed import SharedBuffer
from objectrl_buffer.distributed.shared_prioritized import SharedPrioritizedBuffer
from objectrl_buffer.errors import EmptyBufferError

SLOW = os.environ.get("RUN_SLOW") == "1"
WIDTH = 8192  # int64s: 64 KiB rows


def row(writer: int, seq: int) -> dict[str, Any]:
    return {"writer": writer, "seq": seq, "fill": torch.full((WIDTH,), writer * 10**9 + seq, dtype=torch.int64)}


def rows_of(writer: int, seqs: range) -> dict[str, torch.Tensor]:
    s = torch.tensor(list(seqs), dtype=torch.int64)
    return {
        "writer": torch.full((len(s),), writer, dtype=torch.int64),
        "seq": s,
        "fill": (writer * 10**9 + s).unsqueeze(1).expand(len(s), WIDTH).contiguous(),
    }


def schema() -> Schema:
    return Schema.infer({k: torch.as_tensor(v).unsqueeze(0) for k, v in row(0, 0).items()}, batch_dims=1)[0]


def torn(batch: Any) -> int:
    """How many rows of ``batch`` are not one write's."""
    fill = batch["fill"]
    tag = (batch["writer"] * 10**9 + batch["seq"]).unsqueeze(1)
    return int((fill != tag).any(1).sum())


class SlowCopy:
    """Stands in for a handle's row copier (``SharedBuffer.fast``): copies the first half of ``fill``, calls
    ``mid()`` (another handle laps the ring there), copies the rest, then calls ``after()`` (the row is
    fully copied but not yet published)."""

    def __init__(self, buffer: SharedBuffer, mid: Callable[[], None], after: Callable[[], None]) -> None:
        self.buffer, self.mid, self.after = buffer, mid, after

    def _copy(self, values: dict[str, torch.Tensor], slots: list[int]) -> None:
        cols = self.buffer.columns
        mid, after = self.mid, self.after
        self.mid = self.after = lambda: None  # only the first copy is slow (writes of ``mid`` pass straight)
        for i, slot in enumerate(slots):
            cols["fill"][slot, : WIDTH // 2] = values["fill"][i, : WIDTH // 2]
        mid()
        for i, slot in enumerate(slots):
            cols["fill"][slot, WIDTH // 2 :] = values["fill"][i, WIDTH // 2 :]
            cols["writer"][slot] = values["writer"][i]
            cols["seq"][slot] = values["seq"][i]
        after()

    def write_row(self, transition: dict[str, Any], slot: int, warned: Any) -> bool:
        self._copy({k: torch.as_tensor(v).unsqueeze(0) for k, v in transition.items()}, [slot])
        return True

    def write_batch(self, batch: dict[str, torch.Tensor], ring: Ring) -> int:
        n = int(batch["seq"].shape[0])
        self._copy(batch, [(ring.pointer + i) % ring.capacity for i in range(n)])
        return ring.pointer


def check_served(reader: SharedBuffer, seen: list[int]) -> None:
    """Everything ``reader`` serves now is whole: samples, the ``rows()`` snapshot (also in env groups)."""
    try:
        batch = reader.sample_batch(256)
    except EmptyBufferError:
        batch = None
    if batch is not None:
        seen.append(torn(batch))
    seen.append(torn(reader.rows()))
    seen.append(torn(reader.rows(2)))


@pytest.mark.parametrize("kind", [SharedBuffer, SharedPrioritizedBuffer])
@pytest.mark.parametrize("batch", [False, True])
def test_a_lapped_writer_never_gets_a_mixed_row_served(kind: type[SharedBuffer], batch: bool) -> None:
    capacity = 16
    with kind.create(schema(), capacity, seed=0) as slow:
        lapper = pickle.loads(pickle.dumps(slow))  # another writer (a second handle on the same files)
        reader = pickle.loads(pickle.dumps(slow))
        lapper.add_batch(rows_of(1, range(capacity)))  # a full ring of clean rows
        seen: list[int] = []

        def lap() -> None:  # the slow writer is preempted inside its copy: the lapper writes a whole lap
            for seq in range(capacity, 3 * capacity):
                lapper.add(row(1, seq))
            check_served(reader, seen)

        slow.fast = SlowCopy(slow, lap, lambda: check_served(reader, seen))  # type: ignore[assignment]
        if batch:
            slow.add_batch(rows_of(0, range(3)))
        else:
            slow.add(row(0, 0))
        check_served(reader, seen)  # published (or not): still nothing mixed
        assert seen and sum(seen) == 0, seen
        # the lapped slot is never served until rewritten; a clean rewrite makes it servable again
        served = reader.rows()
        assert torn(served) == 0 and len(served) == capacity - (3 if batch else 1) == reader.committed()
        lapper.add_batch(rows_of(2, range(capacity)))
        served = reader.rows()
        assert torn(served) == 0 and len(served) == capacity
        assert torn(reader.sample_batch(512)) == 0
        lapper.close()
        reader.close()


def test_a_lapped_writer_leaves_its_slot_unserved_and_the_newer_ticket_never_loses() -> None:
    """The slow writer's older row is never published over the newer one: the slot holds no servable row
    until a writer rewrites it (not a stale row at a newer slot number)."""
    with SharedBuffer.create(schema(), 8, seed=0) as slow:
        lapper = pickle.loads(pickle.dumps(slow))

        def lap() -> None:
            lapper.add_batch(rows_of(1, range(8)))

        slow.fast = SlowCopy(slow, lap, lambda: None)  # type: ignore[assignment]
        seq = slow.add(row(0, 0))
        slot = seq % 8
        generation = int(slow.slots.generations(torch.tensor([slot]))[0])
        assert generation != seq + 1  # the older row is not published over the newer ticket's
        assert not bool(slow.servable(torch.tensor([slot]))[0])  # nor is the newer row it may be mixed into
        held = slow.rows()
        assert slot not in held["index"].tolist() and set(held["writer"].tolist()) == {1}
        lapper.close()


def test_a_writer_thread_lapped_by_another_thread_of_the_same_handle() -> None:
    """Threads of one handle each list their own write in flight: a thread lapping another's copy does not
    hide it."""
    with SharedBuffer.create(schema(), 8, seed=0) as buffer:
        reader = pickle.loads(pickle.dumps(buffer))
        buffer.add_batch(rows_of(1, range(8)))
        seen: list[int] = []

        def lap() -> None:  # another thread, the same handle, writes a lap while this one is inside its copy
            other = threading.Thread(target=lambda: [buffer.add(row(1, seq)) for seq in range(8, 24)])
            other.start()
            other.join()

        buffer.fast = SlowCopy(buffer, lap, lambda: check_served(reader, seen))  # type: ignore[assignment]
        buffer.add(row(0, 0))
        check_served(reader, seen)
        assert seen and sum(seen) == 0, seen
        reader.close()


def test_a_copy_stopped_by_an_exception_after_a_lap_leaves_no_mixed_row() -> None:
    with SharedBuffer.create(schema(), 8, seed=0) as buffer:
        lapper = pickle.loads(pickle.dumps(buffer))
        buffer.add_batch(rows_of(1, range(8)))

        def fail() -> None:
            raise KeyboardInterrupt

        buffer.fast = SlowCopy(buffer, lambda: lapper.add_batch(rows_of(1, range(8, 16))), fail)  # type: ignore[assignment]
        with pytest.raises(KeyboardInterrupt):
            buffer.add(row(0, 0))
        assert torn(buffer.rows()) == 0 and torn(buffer.sample_batch(256)) == 0
        assert len(buffer.rows()) == 7  # its slot: not served until rewritten
        lapper.close()


def kill_mid_copy(buffer: SharedBuffer, flag: str) -> None:
    """A writer process that starts its copy and is killed inside it."""

    def hang() -> None:
        open(flag, "w").close()
        time.sleep(60)

    buffer.fast = SlowCopy(buffer, hang, lambda: None)  # type: ignore[assignment]
    buffer.add(row(9, 0))


def test_a_writer_killed_inside_its_copy_blocks_its_slot_only_until_rewritten(tmp_path: Any) -> None:
    with SharedBuffer.create(schema(), 8, seed=0) as buffer:
        buffer.add_batch(rows_of(1, range(8)))
        flag = str(tmp_path / "flag")
        proc = mp.get_context("fork").Process(target=kill_mid_copy, args=(buffer, flag))
        proc.start()
        while not os.path.exists(flag):
            time.sleep(0.005)
        buffer.add_batch(rows_of(1, range(8, 16)))  # laps the dead writer's slot while it is still alive
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert len(buffer.rows()) == 7 and torn(buffer.sample_batch(256)) == 0  # its slot: not served
        buffer.add_batch(rows_of(1, range(16, 24)))  # rewritten after its death: served again
        assert len(buffer.rows()) == 8 and torn(buffer.sample_batch(256)) == 0


# ---------------------------------------------------------------------------------------- realistic runs
def big_writer(buffer: SharedBuffer, writer: int, seconds: float, batch: int) -> None:
    torch.set_num_threads(1)
    seq, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        if batch > 1:
            buffer.add_batch(rows_of(writer, range(seq, seq + batch)))
            seq += batch
        else:
            buffer.add(row(writer, seq))
            seq += 1


def run_writers(capacity: int, seconds: float, writers: int = 4, batch: int = 1) -> tuple[int, int]:
    """``writers`` fork processes write for ``seconds`` while this one samples; (torn rows served, rows
    checked)."""
    torch.set_num_threads(1)
    with SharedBuffer.create(schema(), capacity, seed=0) as buffer:
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=big_writer, args=(buffer, w, seconds, batch)) for w in range(writers)]
        for p in procs:
            p.start()
        bad = checked = 0
        while any(p.is_alive() for p in procs):
            try:
                got = buffer.sample_batch(capacity)
            except EmptyBufferError:
                continue
            bad += torn(got)
            checked += capacity
        for p in procs:
            p.join()
            assert p.exitcode == 0
        got = buffer.sample_batch(256)
        bad += torn(got) + torn(buffer.rows())
        return bad, checked


def test_four_writer_processes_lapping_a_small_ring_never_serve_a_torn_row() -> None:
    bad, checked = run_writers(64, 1.5)
    assert checked > 0 and bad == 0, f"{bad} torn rows of {checked} served"


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="seconds of writing: set RUN_SLOW=1")
@pytest.mark.parametrize(("capacity", "batch"), [(64, 1), (1024, 1), (64, 4), (1024, 8)])
def test_four_writer_processes_lapping_longer(capacity: int, batch: int) -> None:
    bad, checked = run_writers(capacity, 15.0, batch=batch)
    assert checked > 0 and bad == 0, f"{bad} torn rows of {checked} served"


def test_rows_are_uniform_helper_sees_a_mix() -> None:
    """The check itself: a row mixed from two writes is counted."""
    mixed = rows_of(0, range(2))
    mixed["fill"][0, :10] = 5
    assert torn(mixed) == 1 and torn(rows_of(3, range(4))) == 0


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="a fresh interpreter: set RUN_SLOW=1")
def test_the_lock_path_without_atomics_too() -> None:
    """The same tests in a process whose atomics are switched off (fences and compare-and-swaps by locks)."""
    env = {**os.environ, "OBJECTRL_BUFFER_NO_ATOMICS": "1"}
    args = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k", "not lock_path"]
    assert subprocess.run(args, env=env, timeout=600).returncode == 0


def test_a_folder_made_before_the_writers_table_opens_and_serves() -> None:
    """A shared folder laid out by an earlier version (no ``writers.bin``) still opens: the table is made."""
    folder = SharedBuffer.make_folder(schema(), 8)
    os.remove(os.path.join(folder, "writers.bin"))
    with SharedBuffer(folder, seed=0, owner=True) as buffer:
        buffer.add_batch(rows_of(1, range(10)))
        assert buffer.committed() == 8 and torn(buffer.sample_batch(64)) == 0
    assert not os.path.exists(folder)
