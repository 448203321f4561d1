"""Where a remote buffer's actors run: Ray options per shard and for the coordinator (Ray's own API).

``RemoteBuffer.launch(..., placement=...)`` takes:

* ``None``: Ray's default scheduler places each shard (with ``actor_options``, as before).
* ``"spread"``, ``"strict_spread"``, ``"pack"``: the buffer makes a placement group with one bundle per shard
  and that strategy (``SPREAD``: on different nodes as far as possible; ``STRICT_SPREAD``: each on a node of
  its own, or the launch fails after ``timeout_s``; ``PACK``: on as few nodes as possible), and shard ``i``
  runs in bundle ``i`` (:class:`~ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy`). A bundle
  asks for the shard's resources (``num_cpus``, ``num_gpus``, ``resources`` of ``actor_options``) and at
  least 0.01 CPU (Ray refuses bundles of nothing). :meth:`RemoteBuffer.kill` removes that group.
* a list of node ids, one per shard (``ray.nodes()[k]["NodeID"]``): shard ``i`` runs on node ``i``
  (:class:`~ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy` with ``soft=False``).
* a :class:`~ray.util.placement_group.PlacementGroup` of yours with at least ``num_shards`` bundles: shard
  ``i`` runs in bundle ``i``; it is yours to remove.

Restarts keep these rules: Ray restarts an actor with the options it was created with. A shard pinned to a
node that died cannot restart until that node is back (its calls raise
:class:`~objectrl_buffer.errors.BufferUnavailable` after ``retry_timeout_s``). In a placement group, Ray
reschedules the bundles of a dead node (the group is ``RESCHEDULING``) onto nodes that satisfy its strategy:
under ``STRICT_SPREAD`` only onto a node that holds no other bundle of the group, so with no spare node the
shard waits until a node joins; under ``SPREAD`` and ``PACK`` onto any node with the resources.

The coordinator: ``coordinator_options`` are its Ray actor options (``scheduling_strategy``, ``resources``,
``num_cpus``, ...). By default it runs on the *launching driver's node* (node affinity, ``soft=True``: if that
node dies, it runs wherever Ray finds room). It asks for :data:`COORDINATOR_MEMORY` (one byte of Ray's
``memory`` resource), not nothing: Ray places an actor that asks for no resources on a random node whatever its
soft affinity says (measured with ray 2.60 on a 3-node ``Cluster``: 2 of 6 on the asked node with
``num_cpus=0``; 10 of 10 with one byte of memory, every CPU of that node taken; ray-project/ray#25360 fixed
this for hard affinity only). Not a CPU: on a cluster whose CPUs are all taken (environment actors) it would
never start.
Nothing at launch knows where the writers
will run, so the default cannot keep it off a writer's node; the driver's node is the learner's, whose loss
ends the job anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from objectrl_buffer.distributed.ray_import import ray_module as _ray
from objectrl_buffer.errors import InvalidArgumentError

__all__ = ["COORDINATOR_MEMORY", "STRATEGIES", "Placed", "place_shards", "coordinator_actor_options"]

#: bytes of Ray's ``memory`` resource the coordinator asks for by default (a soft node affinity needs a
#: resource to hold, see the module docs)
COORDINATOR_MEMORY = 1

#: the ``placement`` strings and Ray's placement group strategies they stand for
STRATEGIES = {"spread": "SPREAD", "strict_spread": "STRICT_SPREAD", "pack": "PACK"}
#: Ray actor options that ``launch`` sets itself (``name=``, ``namespace=``, ``detached=``, ``placement=``)
_RESERVED = ("name", "namespace", "lifetime", "get_if_exists")


class Placed:
    """Each shard's Ray actor options, and the placement group the buffer made (``None``: none of its own)."""

    def __init__(self, options: list[dict[str, Any]], group: Any = None) -> None:
        self.options, self.group = options, group


def _bundle(options: Mapping[str, Any]) -> dict[str, float]:
    bundle = {"CPU": max(float(options.get("num_cpus") or 0.0), 0.01)}
    if options.get("num_gpus"):
        bundle["GPU"] = float(options["num_gpus"])
    bundle.update({k: float(v) for k, v in dict(options.get("resources") or {}).items()})
    return bundle


def place_shards(placement: Any, num_shards: int, options: Mapping[str, Any], timeout_s: float = 60.0) -> Placed:
    """Ray actor options of each of ``num_shards`` shards: ``options`` (the ``actor_options``) plus where it runs.

    Raises:
        InvalidArgumentError: ``placement`` is none of the forms in the module docs, a list of the wrong
            length or naming a node that is not alive, a group with too few bundles, ``actor_options`` that
            also name a ``scheduling_strategy`` or one of ``name``/``namespace``/``lifetime`` (use ``launch``'s
            own arguments), or a group of ours not placed within ``timeout_s`` (it is removed).
    """
    ray = _ray()
    from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    for key in _RESERVED:
        if key in options:
            raise InvalidArgumentError(
                f"actor_options: {key!r} is set by launch itself (one name for every shard fails with "
                "ActorAlreadyExistsError): use launch(name=..., namespace=..., detached=...)"
            )
    base = dict(options)
    if placement is None:
        return Placed([dict(base) for _ in range(num_shards)])
    if "scheduling_strategy" in base:
        raise InvalidArgumentError("actor_options: a 'scheduling_strategy' and placement= cannot both be given")
    if isinstance(placement, str):
        strategy = STRATEGIES.get(placement)
        if strategy is None:
            raise InvalidArgumentError(f"placement: {placement!r} is not one of {sorted(STRATEGIES)}")
        group = placement_group([_bundle(base) for _ in range(num_shards)], strategy=strategy)
        if not group.wait(timeout_s):
            remove_placement_group(group)
            raise InvalidArgumentError(
                f"placement: a {strategy} group of {num_shards} bundles of {_bundle(base)} could not be placed "
                f"within {timeout_s:g} s (not enough nodes or resources)"
            )
        return Placed(_in_group(group, num_shards, base, PlacementGroupSchedulingStrategy), group)
    if isinstance(placement, PlacementGroup):
        if placement.bundle_count < num_shards:
            raise InvalidArgumentError(
                f"placement: the placement group has {placement.bundle_count} bundles for {num_shards} shards"
            )
        return Placed(_in_group(placement, num_shards, base, PlacementGroupSchedulingStrategy))
    if isinstance(placement, Sequence) and not isinstance(placement, bytes):
        nodes = [str(node) for node in placement]
        if len(nodes) != num_shards or not all(isinstance(node, str) for node in placement):
            raise InvalidArgumentError(f"placement: {len(nodes)} node ids for {num_shards} shards (one per shard)")
        alive = {str(node["NodeID"]) for node in ray.nodes() if node.get("Alive")}
        unknown = [node for node in nodes if node not in alive]
        if unknown:
            raise InvalidArgumentError(f"placement: no alive Ray node has the id {unknown[0]!r}")
        return Placed([dict(base, scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)) for n in nodes])
    raise InvalidArgumentError(
        f"placement: expected None, one of {sorted(STRATEGIES)}, a list of node ids or a PlacementGroup, "
        f"got {type(placement).__name__}"
    )


def _in_group(group: Any, n: int, base: dict[str, Any], strategy: Any) -> list[dict[str, Any]]:
    return [dict(base, scheduling_strategy=strategy(group, placement_group_bundle_index=i)) for i in range(n)]


def coordinator_actor_options(options: Mapping[str, Any] | None, max_restarts: int) -> dict[str, Any]:
    """The coordinator's Ray actor options: ``options`` over the defaults (``num_cpus=0``, ``max_restarts``;
    unless ``options`` name ``resources``: the driver's node and ``memory=COORDINATOR_MEMORY``; see the module
    docs).

    Raises:
        InvalidArgumentError: ``options`` is not a mapping, or names ``name``/``namespace``/``lifetime``.
    """
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if options is not None and not isinstance(options, Mapping):
        raise InvalidArgumentError(f"coordinator_options: expected a dict of Ray actor options, got {options!r}")
    given = dict(options or {})
    for key in _RESERVED:
        if key in given:
            raise InvalidArgumentError(f"coordinator_options: {key!r} is set by launch itself")
    here = ray.get_runtime_context().get_node_id()
    out: dict[str, Any] = {"num_cpus": 0, "max_restarts": max_restarts}
    if "resources" not in given:  # custom resources place it themselves
        out.update(memory=COORDINATOR_MEMORY, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True))
    out.update(given)
    return out
