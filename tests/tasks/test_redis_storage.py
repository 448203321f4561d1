"""RedisTaskStorage against a real redis-server started for these tests: the same rows and query results as the
in-memory storage and the reference model (evictions included), rows shared by connections and processes,
a log that stays bounded, and refusals that name what is wrong."""

from __future__ import annotations

import multiprocessing
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("redis")

import redis

from objectrl_buffer.errors import BufferUnavailable, CheckpointError, InvalidArgumentError
from objectrl_buffer.tasks import DataRow, Experience, ExpMeta, InMemoryStorage, QueryBuilder, TaskReplayBuffer
from objectrl_buffer.tasks.storage.redis import RedisTaskStorage
from tests.support import deadline
from tests.tasks import redis_server as server
from tests.tasks.reference import check
from tests.tasks.test_query_masks import random_query, random_row
from tests.tasks.workers import step_row, write_tasks


def _ids(rows: list[Any]) -> list[str]:
    return [r.id for r in rows]


def test_same_rows_and_queries_as_the_in_memory_storage(redis_server: str, key_prefix: str) -> None:
    rng = random.Random(5)
    ours = RedisTaskStorage(120, url=redis_server, key_prefix=key_prefix)
    other = RedisTaskStorage(120, url=redis_server, key_prefix=key_prefix)  # another connection, same keys
    memory = InMemoryStorage(120)
    i = 0
    for batch in range(25):  # ~200 rows into 120: whole tasks evicted along the way
        rows = [random_row(rng, i + k) for k in range(rng.randint(1, 15))]
        i += len(rows)
        (ours if batch % 2 else other).add_batch(rows)
        memory.add_batch(rows)
    held = memory.get_all()
    assert 0 < len(held) <= 120 and i > 120
    for storage in (ours, other):
        assert _ids(storage.get_all()) == _ids(held)
        assert storage.matching_task_ids() == memory.matching_task_ids()
    for _ in range(40):
        cond = random_query(rng).build()
        expected = [r.id for r in held if check(r, cond)]
        assert _ids(ours.get_all(cond)) == expected == _ids(memory.get_all(cond)), cond
        assert ours.size(cond) == len(expected)
        assert _ids(other.get_paginated(2, 3, cond)) == expected[3:6]
        assert ours.matching_task_ids(cond) == memory.matching_task_ids(cond)
    task_ids = [*memory.matching_task_ids()[:3], "missing"]
    assert {t: _ids(r) for t, r in ours.get_bacth_by_task_ids(task_ids).items()} == {
        t: _ids(r) for t, r in memory.get_batch_by_task_ids(task_ids).items()
    }
    assert ours.get_all()[0].exp_data.state == held[0].exp_data.state
    clone = pickle.loads(pickle.dumps(ours))  # what spawn and forkserver children get
    assert _ids(clone.get_all()) == _ids(held)


def test_processes_share_rows_and_capacity(redis_server: str, key_prefix: str) -> None:
    rb = TaskReplayBuffer(RedisTaskStorage(50, url=redis_server, key_prefix=key_prefix))
    rb.store(step_row(9, 0, 0))
    ctx = multiprocessing.get_context("fork")
    with deadline(30):
        children = [ctx.Process(target=write_tasks, args=(rb, w, 4, 10, w == 0)) for w in range(2)]
        for p in children:
            p.start()
        for p in children:
            p.join()
    assert [p.exitcode for p in children] == [0, 0]
    assert len(rb) == 50  # 81 rows stored by 3 processes, whole oldest tasks evicted down to the capacity
    counts: dict[str, int] = {}
    for r in rb.storage.get_all():
        counts[r.exp_meta.task_id] = counts.get(r.exp_meta.task_id, 0) + 1
    assert set(counts.values()) == {10}
    tasks = rb.sample_task(query_condition=QueryBuilder().eq("agent_id", "agent1").build(), batch_size=10)
    assert all([r.exp_meta.step for r in t] == list(range(10)) for t in tasks) and tasks


def test_the_log_stays_bounded_and_a_late_reader_catches_up(redis_server: str, key_prefix: str) -> None:
    late = RedisTaskStorage(20, url=redis_server, key_prefix=key_prefix)
    assert late.size() == 0
    writer = RedisTaskStorage(20, url=redis_server, key_prefix=key_prefix)
    for t in range(1100):
        writer.add(step_row(0, t, 0))
    assert redis.Redis.from_url(redis_server).llen(key_prefix + "log") <= 1024 + 20 + 1
    assert _ids(late.get_all()) == _ids(writer.get_all())
    assert [r.exp_meta.task_id for r in late.get_all()] == [f"w0-t{t}" for t in range(1080, 1100)]


def test_clear_save_and_load(redis_server: str, key_prefix: str, tmp_path: Path) -> None:
    rb = TaskReplayBuffer(RedisTaskStorage(100, url=redis_server, key_prefix=key_prefix))
    write_tasks(rb, 0, 3, 5, True)
    rb.save(tmp_path / "ckpt")
    other = RedisTaskStorage(100, url=redis_server, key_prefix=key_prefix)
    rb.storage.clear()
    assert len(rb) == 0 and other.size() == 0
    rb.load(tmp_path / "ckpt")
    assert other.size() == 15 and other.get_by_task_id("w0-t1")[0].exp_data.state["task"] == "w0-t1"


def test_refusals_name_what_is_wrong(redis_server: str, key_prefix: str) -> None:
    storage = RedisTaskStorage(10, url=redis_server, key_prefix=key_prefix)
    storage.add(step_row(0, 0, 0))
    with pytest.raises(InvalidArgumentError, match="max_capacity=10, not max_capacity=11"):
        RedisTaskStorage(11, url=redis_server, key_prefix=key_prefix)
    with pytest.raises(InvalidArgumentError, match="url"):
        RedisTaskStorage(10, url="http://nowhere")
    with pytest.raises(InvalidArgumentError, match=r"exp_meta\.step"):
        storage.add_batch([step_row(0, 1, 0), DataRow(ExpMeta("t", "n", "a", "1", 0.0), Experience())])
    with pytest.raises(InvalidArgumentError, match="more than"):
        storage.add_batch([step_row(0, 2, s) for s in range(11)])  # one task alone over the capacity
    assert storage.size() == 1  # nothing stored
    redis.Redis.from_url(redis_server).rpush(key_prefix + "log", b"\x07garbage")
    with pytest.raises(CheckpointError, match="log' record 1"):
        RedisTaskStorage(10, url=redis_server, key_prefix=key_prefix).size()
    port = server.free_port()
    with pytest.raises(BufferUnavailable, match=f"127.0.0.1:{port}"):
        RedisTaskStorage(10, url=f"redis://:secret@127.0.0.1:{port}/0")


def test_without_redis_server_skips_unless_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(server.shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        server.start_server(tmp_path)
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="redis-server is not installed"):
        server.start_server(tmp_path)
