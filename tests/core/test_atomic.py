"""Lock-free 64-bit atomics on shared memory: the same results as a plain counter, none lost across processes,
and the lock-based path of ``SharedSlots`` still right where they are switched off."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer.core import atomic
from objectrl_buffer.core.shared_counter import SharedSlots

OFF = os.environ.get("OBJECTRL_BUFFER_NO_ATOMICS", "") not in ("", "0")
needs_atomics = pytest.mark.skipif(
    atomic.load(torch.zeros(1, dtype=torch.int64).data_ptr()) is None,
    reason="no lock-free atomics here (or switched off)",
)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(-(2**40), 2**40)),
        st.tuples(st.just("cas"), st.integers(-5, 5), st.integers(-(2**40), 2**40)),
    ),
    max_size=40,
)


@needs_atomics
@settings(max_examples=100, deadline=None)
@given(start=st.integers(-(2**40), 2**40), program=ops)
def test_fetch_add_and_compare_exchange_match_a_plain_counter(start: int, program: list[tuple[Any, ...]]) -> None:
    words = torch.tensor([7, start, 9], dtype=torch.int64)  # neighbours must stay untouched
    counter = atomic.load(words.data_ptr() + 8)
    assert counter is not None
    value = start
    for op in program:
        if op[0] == "add":
            assert counter.fetch_add(op[1]) == value
            value += op[1]
        else:
            expected = value + op[1]  # sometimes equal (delta 0), mostly not
            assert counter.compare_exchange(expected, op[2]) == (expected == value)
            value = op[2] if expected == value else value
        assert words.tolist() == [7, value, 9]


def test_a_misaligned_address_is_refused() -> None:
    library_there = atomic.load(torch.zeros(1, dtype=torch.int64).data_ptr())
    if library_there is None:
        pytest.skip("no lock-free atomics here")
    with pytest.raises(ValueError, match="not 8-byte aligned"):
        atomic.load(torch.zeros(2, dtype=torch.int64).data_ptr() + 4)


def add_ones(path: str, times: int, out: str) -> None:
    words = torch.from_file(path, shared=True, size=1, dtype=torch.int64)
    counter = atomic.load(words.data_ptr())
    assert counter is not None
    np.save(out, np.array([counter.fetch_add(1) for _ in range(times)], dtype=np.int64))


@needs_atomics
def test_processes_adding_at_once_lose_no_increment(tmp_path: Any) -> None:
    path = str(tmp_path / "word")
    with open(path, "wb") as f:
        f.write(bytes(8))
    ctx = mp.get_context("fork")
    outs = [str(tmp_path / f"out{i}.npy") for i in range(2)]
    procs = [ctx.Process(target=add_ones, args=(path, 30_000, out)) for out in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    seen = np.sort(np.concatenate([np.load(out) for out in outs]))
    assert np.array_equal(seen, np.arange(60_000))  # every value handed out exactly once
    assert torch.from_file(path, shared=True, size=1, dtype=torch.int64).item() == 60_000


def test_slots_take_the_lock_path_when_atomics_are_switched_off(tmp_path: Any) -> None:
    slots = SharedSlots(str(tmp_path / "slots"), 4, create=True)
    if OFF:
        assert slots.counter is None
        return
    # the whole SharedSlots suite again, in a process whose children inherit the switch
    env = {**os.environ, "OBJECTRL_BUFFER_NO_ATOMICS": "1"}
    tests = os.path.join(os.path.dirname(__file__), "test_shared_counter.py")
    this = f"{__file__}::test_slots_take_the_lock_path_when_atomics_are_switched_off"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests, this]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
