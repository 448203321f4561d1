"""``aworld.replay_buffer.query_filter``: ``QueryBuilder`` (the same ``build()`` dicts) and ``QueryFilter``
(``check_condition(row)``, ``filter(rows)``), with the semantics of our storages' queries."""

from objectrl_buffer.tasks.query_filter import (
    BaseCondition,
    LogicalCondition,
    QueryBuilder,
    QueryCondition,
    QueryFilter,
)

__all__ = ["QueryBuilder", "QueryFilter", "QueryCondition", "BaseCondition", "LogicalCondition"]
