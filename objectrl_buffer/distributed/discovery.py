"""Finding a running :class:`~.remote.RemoteBuffer` by name: ``launch(name=..., namespace=..., detached=...)``
and ``RemoteBuffer.connect(name, namespace=...)`` from another driver or job.

A named buffer's actors carry names of their own in the namespace given (Ray's named actors): the shards
``<name>/shard-<i>``, the coordinator ``<name>/coordinator``, and a small :class:`Registry` actor ``<name>``
that holds what a handle is made of (the shard and coordinator handles, the capacity, the settings). A
driver that reaches the cluster (``ray.init(address=...)``) gets a handle with
``RemoteBuffer.connect(name, namespace)``; it writes under a writer id of its own, as a pickled handle does.

``detached=True`` gives every actor Ray's ``lifetime="detached"``: the buffer outlives the driver that
launched it, until :meth:`RemoteBuffer.kill` (or the cluster's end). Without it, the actors go when the
launching driver exits, as any actor does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from objectrl_buffer.distributed.ray_import import ray_module as _ray
from objectrl_buffer.errors import InvalidArgumentError

__all__ = ["RESERVED_OPTIONS", "Registry", "actor_name", "check_free", "find", "named_options"]

#: Actor options that ``launch(name=, namespace=, detached=)`` sets: refused in ``actor_options`` (one name
#: for every shard made the second shard fail with ``ActorAlreadyExistsError``).
RESERVED_OPTIONS = frozenset({"name", "namespace", "lifetime", "get_if_exists"})


class Registry:
    """The actor ``<name>``: what a handle on the buffer is made of (see the module docs)."""

    def __init__(self, parts: tuple[Any, ...]) -> None:
        self.parts = parts

    def handle_parts(self) -> tuple[Any, ...]:
        """``(shards, capacity, beta, settings)``: the arguments of a handle (``RemoteBuffer.__reduce__``)."""
        return self.parts


def actor_name(name: str, part: str | None = None) -> str:
    """The Ray name of the registry (``part=None``) or of one of the buffer's actors."""
    return name if part is None else f"{name}/{part}"


def named_options(name: str | None, namespace: str | None, detached: bool, part: str | None) -> dict[str, Any]:
    """The Ray actor options that name one actor of a buffer (none without a name)."""
    if name is None:
        return {"lifetime": "detached"} if detached else {}
    options: dict[str, Any] = {"name": actor_name(name, part)}
    if namespace is not None:
        options["namespace"] = namespace
    if detached:
        options["lifetime"] = "detached"
    return options


def check_free(
    name: str | None, namespace: str | None, actor_options: Mapping[str, Any] | None, detached: bool
) -> None:
    """Refuse a launch whose name is taken or whose ``actor_options`` name the actors (nothing is started).

    Raises:
        InvalidArgumentError: see above, naming the argument.
    """
    reserved = sorted(RESERVED_OPTIONS & set(actor_options or {}))
    if reserved:
        raise InvalidArgumentError(
            f"actor_options must not set {reserved}: use launch(name=..., namespace=..., detached=...)"
        )
    if name is None:
        if namespace is not None:
            raise InvalidArgumentError("namespace= needs a name=")
        if detached:
            raise InvalidArgumentError(
                "detached=True needs a name=: detached actors outlive this driver, and only a name reaches them"
            )
        return
    if not isinstance(name, str) or not name or "/" in name:
        raise InvalidArgumentError(f"name must be a non-empty str without '/', got {name!r}")
    if _exists(name, namespace):
        raise InvalidArgumentError(
            f"name {name!r} is in use in namespace {namespace!r}: RemoteBuffer.connect({name!r}) reaches that "
            "buffer; kill() it first to launch another under this name"
        )


def _exists(name: str, namespace: str | None) -> bool:
    ray = _ray()
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


def find(name: str, namespace: str | None) -> tuple[Any, tuple[Any, ...]]:
    """The registry actor of ``name`` and the parts of a handle it holds.

    Raises:
        InvalidArgumentError: no buffer of that name in that namespace (names the namespaces Ray looked in).
    """
    ray = _ray()
    try:
        registry = ray.get_actor(name, namespace=namespace)
    except ValueError:
        where = "this job's namespace" if namespace is None else f"namespace {namespace!r}"
        raise InvalidArgumentError(
            f"no remote buffer named {name!r} in {where} (launch(name=..., namespace=...) makes one)"
        ) from None
    return registry, tuple(ray.get(registry.handle_parts.remote()))
