"""MultiProcMemoryStorage built on one Manager().dict() in several processes (each building its own, as AWorld's
code may) shares the rows: the dict records the folder and every storage attaches to it."""

from __future__ import annotations

import gc
import multiprocessing
import os
from typing import Any

import pytest

from objectrl_buffer.errors import InvalidArgumentError
from objectrl_buffer.tasks import QueryBuilder, TaskReplayBuffer
from objectrl_buffer.tasks.storage.multi_proc_mem import FOLDER_KEY, MultiProcMemoryStorage
from tests.support import deadline
from tests.tasks.workers import step_row

CTX = multiprocessing.get_context("fork")  # fast children; AWorld's spawn pattern: tests/compat/test_aworld*.py


def _write_own(data_dict: Any, fifo_queue: Any, lock: Any, writer: int) -> None:
    storage = MultiProcMemoryStorage(data_dict=data_dict, fifo_queue=fifo_queue, lock=lock, max_capacity=100)
    TaskReplayBuffer(storage).store_batch([step_row(writer, 0, s) for s in range(5)])


def test_storages_built_in_each_process_from_one_manager_dict_share_rows() -> None:
    with deadline(30), CTX.Manager() as manager:
        shared = (manager.dict(), manager.list(), manager.Lock())
        children = [CTX.Process(target=_write_own, args=(*shared, w)) for w in range(3)]
        for p in children:
            p.start()
        for p in children:
            p.join()
        assert [p.exitcode for p in children] == [0, 0, 0]
        rb = TaskReplayBuffer(MultiProcMemoryStorage(*shared, max_capacity=100))
        assert len(rb) == 15  # before: 0, each process had rows of its own
        assert rb.storage.size(QueryBuilder().eq("agent_id", "agent1").build()) == 5
        folder = shared[0][FOLDER_KEY]
        assert rb.storage.path == folder
        rb.storage.close()
    del rb, shared, manager
    gc.collect()
    assert not os.path.exists(folder)  # made by a child, tied to the Manager by the storage built here


def test_a_folder_made_here_lives_as_long_as_the_manager() -> None:
    manager = CTX.Manager()
    data_dict = manager.dict()
    storage = MultiProcMemoryStorage(data_dict, manager.list(), manager.Lock(), max_capacity=10)
    storage.add(step_row(0, 0, 0))
    folder = storage.path
    del storage
    gc.collect()
    assert os.path.isdir(folder)  # another process may still attach through data_dict
    again = MultiProcMemoryStorage(data_dict, None, None, max_capacity=10)
    assert again.size() == 1
    again.close()
    manager.shutdown()
    del manager, data_dict, again
    gc.collect()
    assert not os.path.exists(folder)


def test_mismatches_are_refused_naming_the_argument(tmp_path: Any) -> None:
    data_dict: dict[str, Any] = {}
    first = MultiProcMemoryStorage(data_dict, [], None, max_capacity=10)
    with pytest.raises(InvalidArgumentError, match="max_capacity=10, not max_capacity=20"):
        MultiProcMemoryStorage(data_dict, [], None, max_capacity=20)
    with pytest.raises(InvalidArgumentError, match="path="):
        MultiProcMemoryStorage(data_dict, [], None, max_capacity=10, path=tmp_path / "other")
    with pytest.raises(InvalidArgumentError, match="data_dict must be a dict"):
        MultiProcMemoryStorage([1], [], None)
    with pytest.raises(InvalidArgumentError, match="must be a folder path"):
        MultiProcMemoryStorage({FOLDER_KEY: 3}, [], None)
    assert data_dict[FOLDER_KEY] == first.path
