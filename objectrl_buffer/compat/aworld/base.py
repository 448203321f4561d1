"""``aworld.replay_buffer.base``: the rows, the buffer, storages, samplers and converters, as
:mod:`objectrl_buffer.tasks` provides them (AWorld's names are ours)."""

from objectrl_buffer.tasks import (
    Converter,
    DataRow,
    DefaultConverter,
    Experience,
    ExpMeta,
    InMemoryStorage,
    RandomTaskSample,
    ReplayBuffer,
    Sampler,
    Storage,
    TaskSampler,
)

from .query_filter import QueryCondition, QueryFilter

__all__ = [
    "ReplayBuffer",
    "DataRow",
    "ExpMeta",
    "Experience",
    "Storage",
    "InMemoryStorage",
    "Sampler",
    "TaskSampler",
    "RandomTaskSample",
    "Converter",
    "DefaultConverter",
    "QueryCondition",
    "QueryFilter",
]
