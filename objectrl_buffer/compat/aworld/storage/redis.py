"""``aworld.replay_buffer.storage.redis``: ``RedisStorage(host, port, db, password, key_prefix, ...)`` over
:class:`~objectrl_buffer.tasks.storage.redis.RedisTaskStorage` (needs the ``redis`` extra; no RediSearch
module: queries run on each process's mirror of the rows, with the in-memory storage's semantics)."""

from __future__ import annotations

from objectrl_buffer.tasks.storage.redis import RedisTaskStorage, redis_url

__all__ = ["RedisStorage"]

UNBOUNDED = 2**62
"""AWorld's Redis storage never evicts: the capacity ``RedisStorage`` opens its keys with by default."""


class RedisStorage(RedisTaskStorage):
    """AWorld's ``RedisStorage`` arguments over :class:`RedisTaskStorage`.

    ``index_name`` and ``recreate_idx_if_exists`` are accepted and not used (there is no RediSearch index to
    make). ``max_capacity`` (not in AWorld) bounds the rows like the other storages; by default nothing is
    evicted, as in AWorld.
    """

    def __init__(
        self,
        host: str = "localhost",
        port: int = 6379,
        db: int = 0,
        password: str | None = None,
        key_prefix: str = "AWORLD:RB:",
        index_name: str = "idx:AWORLD:RB",
        recreate_idx_if_exists: bool = False,
        *,
        max_capacity: int = UNBOUNDED,
    ) -> None:
        super().__init__(max_capacity, url=redis_url(host, port, db, password), key_prefix=key_prefix)
