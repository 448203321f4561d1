"""AWorld's own documented calls on ``objectrl_buffer.compat.aworld``, imports changed only: its README's writing,
reading and query-builder examples, its tests/replay_buffer scripts' call patterns (buffer, query builder,
query filter, Redis storage), and every module path of ``aworld.replay_buffer`` that AWorld code imports.
Where aworld 0.2.6's wheel is available, the same calls run on it and give the same query dicts and rows."""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from objectrl_buffer.compat.aworld import DataRow, Experience, ExpMeta, ReplayBuffer
from objectrl_buffer.compat.aworld.base import DefaultConverter, RandomTaskSample
from objectrl_buffer.compat.aworld.query_filter import QueryBuilder, QueryFilter


@dataclass
class Observation:  # stand-ins for aworld.core.common's pydantic models (AWorld's agents' payloads)
    content: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ActionModel:
    tool_name: str = "noop"
    params: dict[str, Any] = field(default_factory=dict)


def _upstream() -> dict[str, Any]:
    try:
        from benchmarks.aworld_upstream import Unavailable, load
    except ImportError:  # pragma: no cover
        pytest.skip("benchmarks/ not importable")
    try:
        return load()
    except Unavailable as exc:
        pytest.skip(str(exc))


UPSTREAM_NAMES = {
    "": ["ReplayBuffer", "DataRow", "ExpMeta", "Experience"],
    ".base": ["ReplayBuffer", "DataRow", "ExpMeta", "Experience", "Storage", "InMemoryStorage", "Sampler",
              "TaskSampler", "RandomTaskSample", "Converter", "DefaultConverter", "QueryCondition", "QueryFilter"],
    ".query_filter": ["QueryBuilder", "QueryFilter", "QueryCondition"],
    ".storage.multi_proc_mem": ["MultiProcMemoryStorage"],
    ".storage.redis": ["RedisStorage"],
}  # fmt: skip


@pytest.mark.parametrize("module", list(UPSTREAM_NAMES))
def test_every_module_path_aworld_code_imports(module: str) -> None:
    if module == ".storage.redis":
        pytest.importorskip("redis")
    found = importlib.import_module("objectrl_buffer.compat.aworld" + module)
    assert [n for n in UPSTREAM_NAMES[module] if not hasattr(found, n)] == []


def _row(task_id: str, agent_id: str, step: int) -> DataRow:
    return DataRow(
        exp_meta=ExpMeta(task_id=task_id, task_name="default_task_name", agent_id=agent_id, step=step,
                         execute_time=time.time() + step),
        exp_data=Experience(state=Observation(), actions=[ActionModel()]),
    )  # fmt: skip


def test_readme_writing_and_reading() -> None:
    replay_buffer = ReplayBuffer()
    data = DataRow(
        exp_meta=ExpMeta(task_id="task_1", task_name="my_task", agent_id="agent_1", step=1, execute_time=time.time()),
        exp_data=Experience(state=Observation(), action=ActionModel()),  # the README's action=, no pre_agent
    )
    replay_buffer.store(data)
    query_condition = QueryBuilder().eq("exp_meta.task_name", "my_task").build()
    sampled = replay_buffer.sample(
        sampler=RandomTaskSample(), query_condition=query_condition, converter=DefaultConverter(), batch_size=1000
    )
    assert list(sampled) == ["task_1"] and sampled["task_1"][0].exp_data.actions == [
        {"tool_name": "noop", "params": {}}
    ]
    query = QueryBuilder().eq("exp_meta.task_id", "task_1").build()
    assert [[r.id for r in t] for t in replay_buffer.sample_task(query_condition=query, batch_size=10)] == [[data.id]]
    query = QueryBuilder().eq("exp_meta.agent_id", "agent_1").build()
    assert len(replay_buffer.sample_task(query_condition=query, batch_size=5)) == 1


def test_buffer_scripts_calls_whole_tasks_by_step() -> None:
    """tests/replay_buffer/buffer.py: 5 tasks x 10 steps, then ``sample_task`` by task and by agent."""
    buffer = ReplayBuffer()
    for task in range(5):
        for i in range(10):
            buffer.store(_row(f"task_{task}", f"agent_{i + 1}", i + 1))
    assert len(buffer) == 50  # AWorld 0.2.6: 100, each row counted twice
    query = QueryBuilder().eq("exp_meta.task_id", "task_1").build()
    datas = buffer.sample_task(
        query_condition=query, sampler=RandomTaskSample(), converter=DefaultConverter(), batch_size=2
    )  # AWorld 0.2.6: TypeError "unhashable type: 'DataRow'" when fewer tasks match than batch_size
    assert [[r.exp_meta.step for r in t] for t in datas] == [list(range(1, 11))]
    query = QueryBuilder().eq("exp_meta.agent_id", "agent_5").build()
    datas = buffer.sample_task(
        query_condition=query, sampler=RandomTaskSample(), converter=DefaultConverter(), batch_size=2
    )
    assert len(datas) == 2 and all(len(t) == 10 for t in datas)  # whole tasks, as AWorld returns them


def _readme_queries(builder: Any) -> list[Any]:
    """The README's and tests/replay_buffer/query_builder.py's shapes."""
    return [
        builder().eq("exp_meta.task_id", "123").build(),
        builder().eq("exp_meta.task_id", "123").and_().eq("exp_meta.agent_id", "456").build(),
        builder()
        .eq("exp_meta.task_id", "123")
        .and_()
        .nested(builder().eq("exp_meta.agent_id", "111").or_().eq("exp_meta.agent_id", "222"))
        .build(),
        builder()
        .eq("task_id", "123")
        .and_()
        .eq("agent_id", "111")
        .or_()
        .nested(builder().eq("task_id", "456").and_().eq("agent_id", "222"))
        .build(),
    ]


def test_query_builder_shapes_as_aworld_builds_them() -> None:
    ours = _readme_queries(QueryBuilder)
    assert ours[2] == {
        "and_": [
            {"field": "exp_meta.task_id", "value": "123", "op": "eq"},
            {"or_": [{"field": "exp_meta.agent_id", "value": "111", "op": "eq"},
                     {"field": "exp_meta.agent_id", "value": "222", "op": "eq"}]},
        ]
    }  # fmt: skip
    assert ours == _readme_queries(_upstream()["query_filter"].QueryBuilder)


def test_query_filter_script() -> None:
    """tests/replay_buffer/query_filter.py's ``filter()``: AWorld's only asserts."""
    row = DataRow(
        exp_meta=ExpMeta(task_id="task_1", task_name="default_task_name", agent_id="agent_1", step=1,
                         execute_time=time.time()),
        exp_data=Experience(state=Observation(), action=[ActionModel()]),
    )  # fmt: skip
    assert QueryFilter(QueryBuilder().eq("exp_meta.task_id", "task_1").build()).check_condition(row)
    assert not QueryFilter(QueryBuilder().eq("exp_meta.task_id", "task_2").build()).check_condition(row)
    query = QueryBuilder().eq("exp_meta.task_id", "task_1").and_().eq("exp_meta.agent_id", "agent_2").build()
    assert not QueryFilter(query).check_condition(row)


def test_same_rows_as_aworlds_in_memory_storage() -> None:
    up = _upstream()
    their_storage = up["base"].InMemoryStorage(max_capacity=10_000)
    theirs = up["base"].ReplayBuffer(storage=their_storage)
    ours = ReplayBuffer()
    names = ("task_id", "task_name", "agent_id", "step", "execute_time", "pre_agent")
    for task in range(5):
        for i in range(10):
            row = _row(f"task_{task}", f"agent_{i % 4}", i)
            ours.store(row)
            meta = up["base"].ExpMeta(*(getattr(row.exp_meta, f) for f in names))
            theirs.store(up["base"].DataRow(meta, row.exp_data, row.id))
    queries = [
        *_readme_queries(QueryBuilder)[:2],
        QueryBuilder().eq("exp_meta.agent_id", "agent_1").and_().gte("exp_meta.step", 5).build(),
        QueryBuilder().in_("exp_meta.task_id", ["task_1", "task_3"]).or_().lt("exp_meta.step", 2).build(),
    ]
    for query in queries:
        expected = [r.id for r in their_storage.get_all(query)]
        assert [r.id for r in ours.storage.get_all(query)] == list(dict.fromkeys(expected))  # theirs: each twice


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    pytest.importorskip("redis")
    from tests.tasks.redis_server import start_server, stop_server

    process, url = start_server(tmp_path_factory.mktemp("redis"))
    yield int(url.rsplit(":", 1)[1].split("/")[0])
    stop_server(process)


def test_storage_redis_script(redis_port: int, tmp_path: Path) -> None:
    """tests/replay_buffer/storage_redis.py: clear, add_batch of 5 tasks x 5 agents x 5 steps, a nested query
    read with get_all and get_paginated; then shared with a second storage on the same server."""
    from objectrl_buffer.compat.aworld.storage.redis import RedisStorage

    storage = RedisStorage(host="127.0.0.1", port=redis_port, recreate_idx_if_exists=False)
    storage.clear()
    rows = [_row(f"task_{t + 1}", f"agent_{a + 1}", s + 1) for t in range(5) for a in range(5) for s in range(5)]
    storage.add_batch(rows)
    query_condition = (
        QueryBuilder()
        .eq("exp_meta.task_id", "task_1")
        .and_()
        .eq("exp_meta.agent_id", "agent_1")
        .or_()
        .nested(
            QueryBuilder()
            .eq("exp_meta.task_id", "task_4")
            .and_()
            .eq("exp_meta.agent_id", "agent_3")
            .and_()
            .gt("exp_meta.step", 4)
        )
        .build()
    )
    got = storage.get_all(query_condition)
    expected = QueryFilter(query_condition).filter(rows)  # AWorld's RediSearch: gt 4 would also take step 4
    assert [r.id for r in got] == [r.id for r in expected] and len(expected) == 6
    page = storage.get_paginated(page=2, page_size=2, query_condition=query_condition)
    assert [r.id for r in page] == [r.id for r in expected[2:4]]
    other = RedisStorage(host="127.0.0.1", port=redis_port)
    assert other.size() == 125 and ReplayBuffer(storage=other).sample_task(query_condition=query_condition)
