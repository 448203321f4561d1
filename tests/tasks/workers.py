"""Child-process bodies for the shared-storage tests (module level, so ``spawn`` children can import them)."""

from __future__ import annotations

import time
from typing import Any

from objectrl_buffer.tasks import DataRow, Experience, ExpMeta, QueryBuilder, TaskReplayBuffer


def step_row(writer: int, task: int, step: int, pad: int = 0) -> DataRow:
    task_id = f"w{writer}-t{task}"
    return DataRow(
        ExpMeta(task_id, f"name{task % 3}", f"agent{writer}", step, float(step)),
        Experience(state={"task": task_id, "step": step, "pad": "x" * pad}, reward_t=float(step)),
    )


def consistent(row: DataRow) -> bool:
    """Every field of a row written by :func:`step_row` agrees with the others."""
    meta, data = row.exp_meta, row.exp_data
    return (
        data.state["task"] == meta.task_id
        and data.state["step"] == meta.step == meta.execute_time == data.reward_t
        and meta.agent_id == "agent" + meta.task_id[1 : meta.task_id.index("-")]
    )


def write_tasks(rb: TaskReplayBuffer, writer: int, tasks: int, steps: int, batch: bool) -> None:
    for t in range(tasks):
        rows = [step_row(writer, t, s) for s in range(steps)]
        if batch:
            rb.store_batch(rows)
        else:
            for r in rows:
                rb.store(r)


def read_while_writing(rb: TaskReplayBuffer, expected: int, out: Any) -> None:
    """Reader: sample and query until every row is there; report rows seen inconsistent (must be 0)."""
    bad = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for rows in rb.sample_task(batch_size=4):
            bad += sum(not consistent(r) for r in rows)
        rb.storage.size(QueryBuilder().gte("step", 5).build())
        if len(rb) >= expected:
            break
        time.sleep(0.01)
    out.put((bad, len(rb)))


def store_forever(rb: TaskReplayBuffer, writer: int, ready: Any) -> None:
    """Store batches of fat rows until killed."""
    ready.set()
    t = 0
    while True:
        rb.store_batch([step_row(writer, t, s, pad=20000) for s in range(8)])
        t += 1
