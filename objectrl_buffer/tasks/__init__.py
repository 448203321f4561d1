"""The task/agent experience buffer (AWorld's replay buffer): rows grouped by task and agent, a query builder
compiled to tensor masks, whole-task sampling and FIFO eviction, writers in many processes.

``from objectrl_buffer.tasks import ReplayBuffer, DataRow, ExpMeta, Experience`` runs AWorld's README examples.
"""

from objectrl_buffer.errors import QueryError

from .buffer import TaskReplayBuffer
from .query_filter import QueryBuilder, QueryCondition, QueryFilter, compile_query
from .rows import DataRow, Experience, ExpMeta
from .samplers import Converter, DefaultConverter, RandomTaskSample, Sampler, TaskSampler, TensorDictConverter
from .storage import InMemoryStorage, MultiProcMemoryStorage, SharedTaskStorage, Storage

ReplayBuffer = TaskReplayBuffer
"""AWorld's name of :class:`TaskReplayBuffer`."""

__all__ = [
    "TaskReplayBuffer",
    "ReplayBuffer",
    "ExpMeta",
    "Experience",
    "DataRow",
    "QueryBuilder",
    "QueryCondition",
    "QueryFilter",
    "QueryError",
    "compile_query",
    "Storage",
    "InMemoryStorage",
    "SharedTaskStorage",
    "MultiProcMemoryStorage",
    "Sampler",
    "TaskSampler",
    "RandomTaskSample",
    "Converter",
    "DefaultConverter",
    "TensorDictConverter",
]
