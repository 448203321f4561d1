"""save/load: a fresh process gets equal rows, payloads, FIFO order and query results; a corrupt or missing
checkpoint raises CheckpointError naming the path and leaves the buffer as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from objectrl_buffer.errors import CheckpointError, CheckpointNotFoundError, InvalidArgumentError
from objectrl_buffer.tasks import InMemoryStorage, QueryBuilder, SharedTaskStorage, TaskReplayBuffer
from tests.tasks.workers import step_row

REPO = Path(__file__).resolve().parents[2]
QUERY = QueryBuilder().gte("step", 3).and_().nested(QueryBuilder().eq("task_name", "name1").or_().is_null("v_t"))


def filled(storage: object = None) -> TaskReplayBuffer:
    rb = TaskReplayBuffer(storage or InMemoryStorage(max_capacity=60))  # type: ignore[arg-type]
    for t in range(8):
        rows = [step_row(t % 3, t, s) for s in range(10)]
        rows[0].exp_data.state["frame"] = torch.arange(6, dtype=torch.int16).reshape(2, 3) + t
        rb.store_batch(rows)  # 80 rows into 60: tasks 0 and 1 evicted
    return rb


def summary(rb: TaskReplayBuffer) -> str:
    rows = [r.to_dict() for r in rb.storage.get_all()]
    for r in rows:
        frame = r["exp_data"]["state"].get("frame")
        if frame is not None:
            r["exp_data"]["state"]["frame"] = [str(frame.dtype), frame.tolist()]
    return json.dumps({"rows": rows, "query": [r.id for r in rb.storage.get_all(QUERY.build())]}, sort_keys=True)


def test_round_trip_in_a_fresh_process(tmp_path: Path) -> None:
    rb = filled()
    rb.save(tmp_path / "ckpt")
    rb.save(tmp_path / "ckpt")  # saving over a checkpoint replaces it and leaves no stale files
    assert len(os.listdir(tmp_path / "ckpt")) == 4
    (tmp_path / "expected.json").write_text(summary(rb))
    child = textwrap.dedent(
        f"""
        import sys
        from objectrl_buffer.tasks import InMemoryStorage, TaskReplayBuffer
        from tests.tasks.test_persist import summary, step_row
        rb = TaskReplayBuffer(InMemoryStorage(max_capacity=60))
        rb.load({str(tmp_path / "ckpt")!r})
        open({str(tmp_path / "got.json")!r}, "w").write(summary(rb))
        rb.store(step_row(0, 99, 0))  # FIFO order survived: task 2 (the oldest) goes first
        assert "w2-t2" not in {{r.exp_meta.task_id for r in rb.storage.get_all()}}
        """
    )
    result = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "got.json").read_text() == (tmp_path / "expected.json").read_text()


def test_shared_storage_saves_and_loads(tmp_path: Path) -> None:
    rb = filled(SharedTaskStorage(max_capacity=60, path=tmp_path / "shared"))
    rb.save(tmp_path / "ckpt")
    other = TaskReplayBuffer(SharedTaskStorage(max_capacity=60, path=tmp_path / "other"))
    other.store(step_row(0, 50, 0))
    other.load(tmp_path / "ckpt")
    assert summary(other) == summary(rb)


def test_corrupt_or_missing_checkpoints_change_nothing(tmp_path: Path) -> None:
    rb = filled()
    rb.save(tmp_path / "ckpt")
    target = TaskReplayBuffer(InMemoryStorage(max_capacity=60))
    target.store(step_row(0, 0, 0))
    before = summary(target)
    with pytest.raises(CheckpointNotFoundError, match="nowhere"):
        target.load(tmp_path / "nowhere")
    small = TaskReplayBuffer(InMemoryStorage(max_capacity=10))
    with pytest.raises(InvalidArgumentError, match="max_capacity=10"):
        small.load(tmp_path / "ckpt")
    rows_file = next(p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("rows."))
    data = bytearray(rows_file.read_bytes())
    data[100] ^= 0xFF
    rows_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="crc32"):
        target.load(tmp_path / "ckpt")
    assert summary(target) == before
