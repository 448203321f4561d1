"""Fixtures of the task-buffer tests: a real ``redis-server`` (see :mod:`tests.tasks.redis_server`)."""

from tests.tasks.redis_server import key_prefix, redis_server

__all__ = ["key_prefix", "redis_server"]
