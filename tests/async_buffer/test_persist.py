"""Saving and loading an AsyncSequenceBuffer: consumers continue exactly where they stopped, even in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from objectrl_buffer.async_buffer import AsyncSequenceBuffer, Consumer
from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError
from tests.async_buffer.helpers import assert_unchanged, bounded, make, reward, run, seq, snapshot, two_consumers

ROOT = Path(__file__).resolve().parents[2]


def _mid_stream() -> tuple[AsyncSequenceBuffer, dict[str, list[int]]]:
    """20 sequences put, 12 amended, actor_train read 6, ref_logp read 8: a buffer mid-stream."""
    buf = make(32, consumers=two_consumers(3, 4))
    seen: dict[str, list[int]] = {"actor_train": [], "ref_logp": []}

    async def go() -> None:
        await buf.put_batch([seq(i) for i in range(20)], birth_times=list(range(100, 80, -1)))  # reversed
        await buf.amend_batch(list(range(12)), [reward(i) for i in range(12)])
        for name, times in (("actor_train", 2), ("ref_logp", 2)):
            for _ in range(times):
                seen[name] += (await bounded(buf.get_batch(name)))[1]["ids"].tolist()

    run(go())
    buf.check_invariants()
    return buf, seen


def test_round_trip_keeps_slots_read_bits_and_birth_order(tmp_path: Path) -> None:
    buf, _ = _mid_stream()
    buf.save(tmp_path / "buf.ckpt")
    loaded = make(32, consumers=two_consumers(3, 4))
    loaded.load(tmp_path / "buf.ckpt")
    loaded.check_invariants()
    assert snapshot(loaded)["state"].keys() == snapshot(buf)["state"].keys()
    assert_unchanged(loaded, snapshot(buf))
    assert loaded.consumed_ids() == buf.consumed_ids()

    async def finish(b: AsyncSequenceBuffer) -> dict[str, list[int]]:
        await b.amend_batch(list(range(12, 20)), [reward(i) for i in range(12, 20)])  # slot numbers kept
        out = {}
        for name, n in (("actor_train", 3), ("ref_logp", 4)):
            out[name] = []
            while b.ready(name) >= n:
                out[name] += (await bounded(b.get_batch(name)))[1]["ids"].tolist()
        return out

    assert run(finish(loaded)) == run(finish(buf))  # the same reads, in the same order


def test_finish_the_stream_in_a_fresh_process(tmp_path: Path) -> None:
    buf, seen = _mid_stream()
    path = tmp_path / "buf.ckpt"
    buf.save(path)
    script = f"""
import asyncio, json, sys, torch
sys.path.insert(0, {str(ROOT)!r})
from tests.async_buffer.helpers import make, two_consumers, reward, seq
buf = make(32, consumers=two_consumers(3, 4))
buf.load({str(path)!r})
buf.check_invariants()
seen = {{"actor_train": [], "ref_logp": []}}
read_before = {json.dumps({k: len(v) for k, v in seen.items()})}
async def go():
    await buf.put_batch([seq(i) for i in range(20, 24)])
    await buf.amend_batch(list(range(12, 20)), [reward(i) for i in range(12, 20)])
    await buf.amend_batch(list(range(20, 24)), [reward(i) for i in range(20, 24)])
    for name, n in (("actor_train", 3), ("ref_logp", 4)):
        while read_before[name] + len(seen[name]) + n <= 24:
            seen[name] += (await asyncio.wait_for(buf.get_batch(name), 5))[1]["ids"].tolist()
            buf.check_invariants()
asyncio.run(asyncio.wait_for(go(), 20))
print(json.dumps({{"seen": seen, "size": buf.size, "consumed": buf.consumed_ids()}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    after = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("actor_train", "ref_logp"):
        ids = seen[name] + after["seen"][name]
        assert sorted(ids) == list(range(24)), name  # every id exactly once per consumer, none lost
    # Birth order held across the restart: the reversed births of 0..19 come out 19, 18, ..., then 20..23.
    assert seen["ref_logp"] + after["seen"]["ref_logp"] == [*range(19, -1, -1), 20, 21, 22, 23]
    assert after["size"] == 0 and sorted(after["consumed"]) == list(range(24))


def test_load_refuses_another_buffer_and_changes_nothing(tmp_path: Path) -> None:
    buf, _ = _mid_stream()
    path = tmp_path / "buf.ckpt"
    buf.save(path)
    other = make(32, consumers=[Consumer("actor_train", ("tokens",), 3), Consumer("ref_logp", ("tokens",), 4)])
    other.put_batch_nowait([seq(99)])
    before = snapshot(other)
    with pytest.raises(CheckpointError, match="consumers"):
        other.load(path)
    assert_unchanged(other, before)
    smaller = make(16, consumers=two_consumers(3, 4))
    with pytest.raises(CheckpointError, match="max_size 32"):
        smaller.load(path)
    with pytest.raises(CheckpointNotFoundError):
        smaller.load(tmp_path / "missing.ckpt")


@pytest.mark.parametrize("where", ["magic", "header", "payload", "truncate"])
def test_corrupt_files_are_refused(tmp_path: Path, where: str) -> None:
    buf, _ = _mid_stream()
    path = tmp_path / "buf.ckpt"
    buf.save(path)
    data = bytearray(path.read_bytes())
    if where == "magic":
        data[0] ^= 1
    elif where == "header":
        data[60] ^= 1
    elif where == "payload":
        data[-100] ^= 1
    else:
        data = data[:-10]
    path.write_bytes(bytes(data))
    target = make(32, consumers=two_consumers(3, 4))
    before = snapshot(target)
    with pytest.raises(CheckpointError):
        target.load(path)
    assert_unchanged(target, before)


def test_save_is_atomic_and_never_pickles(tmp_path: Path, monkeypatch: Any) -> None:
    buf, _ = _mid_stream()
    path = tmp_path / "buf.ckpt"
    buf.save(path)
    assert os.listdir(tmp_path) == ["buf.ckpt"]  # no temp file left
    loads: list[Any] = []
    real = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        loads.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    make(32, consumers=two_consumers(3, 4)).load(path)
    assert loads == [True]


def test_state_dict_round_trip_of_an_empty_buffer() -> None:
    buf = make()
    state = buf.state_dict()
    other = make()
    other.load_state_dict(state)
    other.check_invariants()
    assert other.size == 0
