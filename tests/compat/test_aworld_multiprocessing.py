"""AWorld's multi-processing test and README pattern on ``objectrl_buffer.compat.aworld``, imports changed only:
a ``MultiProcMemoryStorage`` on a Manager's dict, list and lock, handed to 4 writer processes and a reader
process that samples the tasks of one agent. The processes share the rows (before: 0 rows read, silently), both
when the storage is handed to them and when each process builds its own from the Manager's proxies; and the rows
stored are the rows aworld 0.2.6's own storage holds after the same writes."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import pytest

from objectrl_buffer.compat.aworld.base import DataRow, Experience, ExpMeta, ReplayBuffer
from objectrl_buffer.compat.aworld.query_filter import QueryBuilder
from objectrl_buffer.compat.aworld.storage.multi_proc_mem import MultiProcMemoryStorage
from tests.support import deadline

CTX = multiprocessing.get_context("fork")  # AWorld's spawn: the slow case below
SLOW = pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="set RUN_SLOW=1")


def write_processing(replay_buffer: Any, task_id: str, errors: Any) -> None:
    """AWorld's writer: 10 rows of one task, agents agent_1..agent_10, one ``store`` each (no sleep here)."""
    for i in range(10):
        try:
            replay_buffer.store(
                DataRow(
                    exp_meta=ExpMeta(task_id=task_id, task_name=task_id, agent_id=f"agent_{i + 1}", step=i,
                                     execute_time=time.time()),
                    exp_data=Experience(state={"obs": i}, actions=[{"tool": "noop"}]),
                )
            )  # fmt: skip
        except Exception as exc:  # AWorld's writer logs and goes on; the test counts
            errors.append(repr(exc))


def read_processing_by_agent(replay_buffer: Any, agent_id: str, seen: Any) -> None:
    """AWorld's reader: ``sample_task`` of the tasks one agent stepped in, until it has read 4 tasks."""
    stop = time.monotonic() + 20
    while time.monotonic() < stop:
        query_condition = QueryBuilder().eq("exp_meta.agent_id", agent_id).build()
        data = replay_buffer.sample_task(query_condition=query_condition, batch_size=4)
        seen[:] = [[(r.exp_meta.task_id, r.exp_meta.step) for r in task] for task in data]
        if len(data) == 4:
            return
        time.sleep(0.01)


def write_own(data_dict: Any, fifo_queue: Any, lock: Any, task_id: str, errors: Any) -> None:
    storage = MultiProcMemoryStorage(data_dict=data_dict, fifo_queue=fifo_queue, lock=lock, max_capacity=10000)
    write_processing(ReplayBuffer(storage=storage), task_id, errors)


def read_own(data_dict: Any, fifo_queue: Any, lock: Any, agent_id: str, seen: Any) -> None:
    storage = MultiProcMemoryStorage(data_dict=data_dict, fifo_queue=fifo_queue, lock=lock, max_capacity=10000)
    read_processing_by_agent(ReplayBuffer(storage=storage), agent_id, seen)


def _run(ctx: Any, handed: bool) -> tuple[list[str], list[Any], set[tuple[str, int]]]:
    with ctx.Manager() as manager:
        data_dict, fifo_queue, lock = manager.dict(), manager.list(), manager.Lock()
        errors, seen = manager.list(), manager.list()
        replay_buffer = ReplayBuffer(
            storage=MultiProcMemoryStorage(data_dict=data_dict, fifo_queue=fifo_queue, lock=lock, max_capacity=10000)
        )
        if handed:  # the README: the buffer handed to the processes
            targets = [(write_processing, (replay_buffer, f"task_{i}", errors)) for i in range(1, 5)]
            targets.append((read_processing_by_agent, (replay_buffer, "agent_3", seen)))
        else:  # each process builds its storage from the Manager's proxies
            shared = (data_dict, fifo_queue, lock)
            targets = [(write_own, (*shared, f"task_{i}", errors)) for i in range(1, 5)]
            targets.append((read_own, (*shared, "agent_3", seen)))
        processes = [ctx.Process(target=t, args=a) for t, a in targets]
        for p in processes:
            p.start()
        for p in processes:
            p.join()
        assert [p.exitcode for p in processes] == [0] * 5, (list(errors), list(seen))
        stored = {(r.exp_meta.task_id, r.exp_meta.step) for r in replay_buffer.storage.get_all()}
        return list(errors), list(seen), stored


@pytest.mark.parametrize("handed", [True, False], ids=["storage-handed", "storage-per-process"])
def test_writers_and_a_reader_share_the_rows(handed: bool) -> None:
    with deadline(60):
        errors, seen, stored = _run(CTX, handed)
    assert errors == []
    assert sorted(task[0][0] for task in seen) == ["task_1", "task_2", "task_3", "task_4"], (seen, stored)  # before: []
    assert all([step for _, step in task] == list(range(10)) for task in seen)  # whole tasks, by step
    assert stored == {(f"task_{t}", s) for t in range(1, 5) for s in range(10)}


@pytest.mark.slow
@SLOW
def test_aworlds_spawn_pattern() -> None:
    errors, seen, stored = _run(multiprocessing.get_context("spawn"), handed=True)
    assert errors == [] and len(seen) == 4 and len(stored) == 40
