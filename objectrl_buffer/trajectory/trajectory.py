"""What one trajectory is: RLinf's ``Trajectory`` dataclass, and how it becomes rows ``[T*B, ...]``.

A trajectory holds tensors ``[T, B, ...]`` (``T`` steps of ``B`` parallel environments) and three dicts of
such tensors (``forward_inputs``, ``curr_obs``, ``next_obs``). Stored, it is ``T*B`` rows (transitions),
time-major: row ``t*B + b`` is step ``t`` of environment ``b``, as RLinf flattens it.

Done-like fields (``dones``, ``terminations``, ``truncations``) may carry ``T + E`` rows: RLinf's rollout
of ``E`` epochs of ``T/E`` steps each records one extra row at the start of every epoch (the state before
the first step). As RLinf does, the first row of each epoch segment is dropped from the stored rows, so the
field lines up with ``rewards``: ``reshape(E, T/E + 1, ...)[:, 1:]``. The dropped rows are kept beside them
(:attr:`Flat.heads`, ``[E, B, ...]``) and put back by :func:`to_payload`, so a trajectory file holds the
``T + E`` rows RLinf writes (its viewer reads the done flags of a step from the file as they were recorded).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from objectrl_buffer.core.schema import Key
from objectrl_buffer.errors import InvalidArgumentError

__all__ = [
    "Trajectory",
    "Flat",
    "DICT_FIELDS",
    "DONE_FIELDS",
    "flatten",
    "from_payload",
    "to_payload",
    "with_heads",
    "check_weights_id",
    "trajectory_fields",
    "OPTIONAL_FIELDS",
]

#: Fields that are dicts of tensors ``[T, B, ...]``.
DICT_FIELDS = ("forward_inputs", "curr_obs", "next_obs")
#: Fields that may carry one extra row per rollout epoch.
DONE_FIELDS = ("dones", "terminations", "truncations")
#: Metadata fields (not rows).
META_FIELDS = ("max_episode_length", "model_weights_id")
#: The tensor fields of :class:`Trajectory` (each ``None`` by default, in RLinf too): a trajectory may lack one
#: the buffer holds (RLinf's ``extract_intervene_traj()`` drops ``versions``). Keys of the dict fields may not.
OPTIONAL_FIELDS = (
    "actions",
    "intervene_flags",
    "rewards",
    "terminations",
    "truncations",
    "dones",
    "prev_logprobs",
    "prev_values",
    "versions",
)
# model_weights_id goes into a file name: no separators, no "..", nothing a shell or glob treats specially
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.\-]*$")


@dataclass
class Trajectory:
    """One batched rollout, RLinf's field names (``rlinf.data.embodied_io_struct.Trajectory``, 0.3).

    Tensors are ``[T, B, ...]`` on any device (copied to the storing device when added); ``None`` fields
    are not stored. ``dones``/``terminations``/``truncations`` may have ``T + E`` rows (see the module).
    ``model_weights_id`` (RLinf: ``"{uuid}_{update_count}"``) goes into the file name.
    """

    max_episode_length: int = 0
    model_weights_id: str = ""
    actions: torch.Tensor | None = None
    intervene_flags: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    terminations: torch.Tensor | None = None
    truncations: torch.Tensor | None = None
    dones: torch.Tensor | None = None
    prev_logprobs: torch.Tensor | None = None
    prev_values: torch.Tensor | None = None
    versions: torch.Tensor | None = None
    forward_inputs: dict[str, Any] = field(default_factory=dict)
    curr_obs: dict[str, Any] = field(default_factory=dict)
    next_obs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Flat:
    """A trajectory as rows: ``rows[key]`` is ``[T*B, ...]`` (nested keys for the dict fields)."""

    rows: dict[Key, torch.Tensor]
    shape: tuple[int, ...]  # RLinf's index "shape": that of prev_logprobs (else rewards), [T, B, ...]
    max_episode_length: int
    model_weights_id: str
    #: per done-like field given with ``T + E`` rows: its ``E`` dropped epoch-first rows ``[E, B, ...]`` (CPU)
    heads: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return self.shape[0] * self.shape[1]


def check_weights_id(value: Any, where: str) -> str:
    """``value`` if it is a string that is safe inside a file name, else :class:`InvalidArgumentError`."""
    if not isinstance(value, str) or not _SAFE_ID.match(value) or value in {".", ".."}:
        raise InvalidArgumentError(
            f"{where}: model_weights_id must be a str of letters, digits, '_', '-' and '.', got {value!r}"
        )
    return value


def trajectory_fields(item: Any) -> dict[str, Any] | None:
    """The fields of a trajectory object by name, or ``None`` if ``item`` is none.

    Duck-typed: :class:`Trajectory`, RLinf's own ``Trajectory`` dataclass, or any object (a dataclass, an
    ``attrs`` class, a plain object) with ``rewards`` or ``prev_logprobs`` among RLinf's field names. A
    dataclass gives all its fields (as RLinf's flattening walks ``__dataclass_fields__``); any other object
    the attributes it has of :class:`Trajectory`'s fields.
    """
    if isinstance(item, (type, TensorDictBase)) or not any(hasattr(item, n) for n in _SAMPLE_FIELDS):
        return None
    if is_dataclass(item):
        return {f.name: getattr(item, f.name) for f in fields(item)}
    return {name: getattr(item, name) for name in _FIELD_ORDER if hasattr(item, name)}


def _align(name: str, tensor: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A done-like field with ``T + E`` rows as ``T`` rows, dropping the first row of each epoch (RLinf's rule),
    and those dropped rows ``[E, ...]`` (a CPU copy)."""
    extra = tensor.shape[0] - T
    if T % extra:
        raise InvalidArgumentError(
            f"field '{name}' has {tensor.shape[0]} rows for T={T}: the {extra} extra rows must split T evenly"
        )
    epochs = tensor.reshape(extra, T // extra + 1, *tensor.shape[1:])
    return epochs[:, 1:].reshape(T, *tensor.shape[1:]), epochs[:, 0].cpu().clone()


def with_heads(aligned: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """The ``T + E`` rows of a done-like field again: ``aligned`` ``[T, B, ...]`` with each of the ``E`` epochs
    of ``heads`` ``[E, B, ...]`` put back before its ``T/E`` rows (the inverse of the alignment)."""
    T, E = aligned.shape[0], heads.shape[0]
    out = aligned.new_empty((E, T // E + 1, *aligned.shape[1:]))
    out[:, 0] = heads.to(aligned.device)
    out[:, 1:] = aligned.reshape(E, T // E, *aligned.shape[1:])
    return out.reshape(T + E, *aligned.shape[1:])


def flatten(item: object, where: str, *, strict: bool = True) -> Flat:
    """Rows ``[T*B, ...]`` of a trajectory object (:func:`trajectory_fields`: ours, RLinf's, any with its
    fields), a TensorDict of batch size ``[T, B]``, or a file payload (a mapping).

    ``strict=False`` (files RLinf wrote) skips values that are not tensors under a name RLinf's
    :class:`Trajectory` has no field for (as RLinf's sampler does); every other value that is not a
    ``[T, B, ...]`` tensor (with ``strict``: any; without: a tensor of another shape, or a field of
    :class:`Trajectory` or of its dicts holding something else than a tensor or ``None``) is an
    :class:`InvalidArgumentError` naming ``where`` and the field.
    The returned tensors may be views of the input: callers copy them into storage.
    """
    if isinstance(item, TensorDictBase):
        if item.batch_dims != 2:
            raise InvalidArgumentError(
                f"{where}: a TensorDict trajectory needs batch size [T, B], got {item.batch_size}"
            )
        T, B = item.batch_size
        if T * B == 0:
            raise InvalidArgumentError(f"{where}: a trajectory with no samples (batch size {list(item.batch_size)})")
        rows: dict[Key, torch.Tensor] = {}
        for key in item.keys(include_nested=True, leaves_only=True):
            rows[key] = item.get(key).reshape(T * B, *item.get(key).shape[2:])
        if not rows:
            raise InvalidArgumentError(f"{where}: the TensorDict trajectory holds no tensors")
        return Flat(rows, (T, B), 0, "")
    if isinstance(item, Mapping):
        values = dict(item)
    else:
        found = trajectory_fields(item)
        if found is None:
            raise InvalidArgumentError(
                f"{where}: expected a Trajectory (or any object with RLinf's trajectory fields, such as "
                f"rlinf's own) or a TensorDict of batch size [T, B], got {type(item).__name__}"
            )
        values = found
    ref = values.get("prev_logprobs")
    if not isinstance(ref, torch.Tensor):
        ref = values.get("rewards")
    if not isinstance(ref, torch.Tensor) or ref.dim() < 2 or ref.shape[0] * ref.shape[1] == 0:
        raise InvalidArgumentError(
            f"{where}: a trajectory with no samples (prev_logprobs and rewards are both missing or empty)"
        )
    T, B = int(ref.shape[0]), int(ref.shape[1])
    shape = tuple(int(s) for s in ref.shape)
    mel = values.get("max_episode_length", 0)
    if isinstance(mel, bool) or not isinstance(mel, int):
        raise InvalidArgumentError(f"{where}: max_episode_length must be an int, got {mel!r}")
    weights_id = check_weights_id(values.get("model_weights_id", ""), where)
    out: dict[Key, torch.Tensor] = {}
    heads: dict[str, torch.Tensor] = {}

    def take(key: Key, name: str, value: Any) -> None:
        if value is None:
            return
        ok = isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == B
        if ok and value.shape[0] != T:
            ok = name in DONE_FIELDS and value.shape[0] > T
        if not ok:
            # lenient (a file): only a value RLinf's Trajectory has no field for, and that is not a tensor, is
            # skipped; a damaged field (a tensor of the wrong shape, anything but a tensor in a field) is refused
            if strict or isinstance(value, torch.Tensor) or name.split(".")[0] in _FIELD_NAMES:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise InvalidArgumentError(f"{where}: field '{name}' must be a tensor [T={T}, B={B}, ...], got {got}")
            return
        if value.shape[0] != T:
            value, heads[name] = _align(name, value, T)
        out[key] = value.reshape(T * B, *value.shape[2:])

    for name, value in values.items():
        if name in META_FIELDS:
            continue
        if name in DICT_FIELDS or isinstance(value, Mapping):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise InvalidArgumentError(
                    f"{where}: field '{name}' must be a dict of tensors, got {type(value).__name__}"
                )
            for sub, tensor in value.items():
                take((name, str(sub)), f"{name}.{sub}", tensor)
        else:
            take(name, name, value)
    return Flat(out, shape, mel, weights_id, heads)


#: The fields of :class:`Trajectory`: in a file, each holds a ``[T, B, ...]`` tensor (or a dict of them) or ``None``.
_FIELD_NAMES = frozenset(f.name for f in fields(Trajectory))
_FIELD_ORDER = tuple(f.name for f in fields(Trajectory))
#: A trajectory object has at least one of these (the fields its sample count comes from).
_SAMPLE_FIELDS = ("prev_logprobs", "rewards")


def to_payload(
    shape: tuple[int, ...],
    max_episode_length: int,
    weights_id: str,
    rows: Mapping[Key, torch.Tensor],
    heads: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """What a trajectory file holds (RLinf's layout): fields ``[T, B, ...]``, dict fields as dicts, and
    ``max_episode_length`` / ``model_weights_id``. ``rows`` are the stored rows ``[T*B, ...]`` (CPU);
    ``shape[:2]`` is ``(T, B)``. A done-like field with ``heads`` (:attr:`Flat.heads`) gets its ``T + E``
    rows back, as RLinf writes it."""
    T, B = shape[0], shape[1]
    payload: dict[str, Any] = {"max_episode_length": max_episode_length, "model_weights_id": weights_id}
    for key, value in rows.items():
        tensor = value.reshape(T, B, *value.shape[1:])
        if isinstance(key, str):
            head = (heads or {}).get(key)
            payload[key] = tensor if head is None else with_heads(tensor, head)
            continue
        node = payload
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = tensor
    return payload


def from_payload(payload: Any, where: str) -> Flat:
    """A trajectory file's payload (a dict as RLinf writes it) as rows; lenient like RLinf's reader."""
    if not isinstance(payload, Mapping):
        raise InvalidArgumentError(f"{where}: a trajectory file must hold a dict, got {type(payload).__name__}")
    return flatten(payload, where, strict=False)
