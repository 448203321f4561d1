"""The rows of a task buffer (AWorld's ``ExpMeta``/``Experience``/``DataRow``) and how their payloads are kept.

A stored row is *normalised* first: its meta fields are checked (they feed the tensor query columns), and its
payload (state, actions, messages, non-scalar rewards) is turned into its JSON form with tensors kept as
tensors. That form is what comes back, and what :func:`~.codec.encode_row` writes as bytes (JSON + raw tensor
bytes, never pickle) for other processes and checkpoints. The JSON form is what a JSON round trip gives:
subclasses of str/int/float (enums, NumPy's ``float64``) come back as the plain type, and dict keys that
are int, float, bool or None come back as the strings ``json`` makes of them.

A row whose payload is JSON-native already is kept by the in-memory table as one JSON text
(:func:`encode_record`) until it is first read (:func:`decode_record`): no Python objects per stored row.
"""

from __future__ import annotations

import dataclasses
import json
import json.encoder
import math
import numbers
import operator
import uuid
from collections.abc import Iterable
from dataclasses import InitVar, dataclass, field
from typing import Any

import numpy as np
import torch

from objectrl_buffer.core.validate import _brief
from objectrl_buffer.errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "ExpMeta",
    "Experience",
    "DataRow",
    "META_STRINGS",
    "NUMERIC",
    "normalize_row",
    "query_values",
    "row_list",
    "encode_record",
    "decode_record",
]

META_STRINGS = ("task_id", "task_name", "agent_id", "pre_agent")
"""Meta fields held as interned string codes (int64 columns, -1 for None)."""
NUMERIC = ("step", "execute_time", "reward_t", "adv_t", "v_t")
"""Fields held as float64 columns (NaN for None): the meta numbers, then the scalar rewards of ``exp_data``."""
_DATA_NUMERIC = ("reward_t", "adv_t", "v_t")
_MAX_DEPTH = 64
_QUANT = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4})
_PLAIN = frozenset({str, int, float, bool, type(None)})
_NUMBER = frozenset({int, float})
_STR = frozenset({str})
_META_NAMES = ("task_id", "task_name", "agent_id", "pre_agent", "step", "execute_time")
_DATA_NAMES = ("state", "actions", "messages", "reward_t", "adv_t", "v_t")
_DATA_WHERE = tuple(f"exp_data.{n}" for n in _DATA_NAMES)
_META_FIELDS, _DATA_FIELDS = operator.attrgetter(*_META_NAMES), operator.attrgetter(*_DATA_NAMES)


@dataclass
class ExpMeta:
    """Where a row comes from: its task, agent and step. ``pre_agent`` (the agent that handed over) is optional."""

    task_id: str
    task_name: str
    agent_id: str
    step: int
    execute_time: float
    pre_agent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class Experience:
    """What an agent saw and did at one step. ``Experience(action=a)`` means ``actions=[a]`` (AWorld's README)."""

    state: Any = None
    actions: Any = None
    reward_t: Any = None
    adv_t: Any = None
    v_t: Any = None
    messages: Any = None
    action: InitVar[Any] = field(default=None, kw_only=True)

    def __post_init__(self, action: Any) -> None:
        if action is not None:
            if self.actions is not None:
                raise InvalidTypeError("Experience takes actions= or action=, not both")
            self.actions = [action]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: json_form(getattr(self, f.name), f.name) for f in dataclasses.fields(self)}


@dataclass
class DataRow:
    """One stored step: ``exp_meta`` (queried as tensor columns), ``exp_data`` (the payload) and a row ``id``."""

    exp_meta: ExpMeta
    exp_data: Experience
    id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def to_dict(self) -> dict[str, Any]:
        return {"exp_meta": self.exp_meta.to_dict(), "exp_data": self.exp_data.to_dict(), "id": self.id}


def json_form(value: Any, where: str, depth: int = 0) -> Any:
    """``value`` as JSON values (dict/list/str/number/bool/None), tensors and arrays kept as CPU tensors.

    Dataclasses become dicts of their fields, objects with ``model_dump()`` (pydantic) or ``to_dict()`` the
    JSON form of what those return; tuples become lists. Raises :class:`~objectrl_buffer.errors.InvalidTypeError`
    (a ``TypeError`` too) naming ``where`` otherwise, and for nesting deeper than ``_MAX_DEPTH``.
    """
    kind = type(value)
    if kind in _PLAIN:  # the common case first: exact types, no ABC checks (stores are per row)
        return value
    if kind is dict and depth < _MAX_DEPTH and all(type(k) is str for k in value):
        return {k: json_form(v, where + "." + k, depth + 1) for k, v in value.items()}
    if kind is list and depth < _MAX_DEPTH:
        return [json_form(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, bool, int, float)):
        return _plain_scalar(value)
    if depth > _MAX_DEPTH:
        raise InvalidTypeError(f"{where}: nested more than {_MAX_DEPTH} levels deep (a cycle?)")
    if isinstance(value, torch.Tensor):
        return _tensor_copy(value, where)
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OUSV":  # objects and strings: no tensor dtype, keep their JSON form
            return [json_form(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value.tolist())]
        return torch.from_numpy(np.array(value, copy=True))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [json_form(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {_json_key(k, where): json_form(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return json_form(fields, where, depth + 1)
    for method in ("model_dump", "to_dict"):
        if callable(getattr(value, method, None)):
            return json_form(getattr(value, method)(), where, depth + 1)
    raise InvalidTypeError(
        f"{where}: cannot store a {type(value).__name__} (payloads are JSON values, tensors, arrays, dataclasses, "
        "or objects with model_dump()/to_dict())"
    )


def _tensor_copy(value: torch.Tensor, where: str) -> torch.Tensor:
    """A CPU copy of a payload tensor; InvalidArgumentError naming ``where`` for one without plain data to copy
    (on the meta device, sparse or another layout, quantized): such a tensor cannot be stored nor encoded."""
    if value.device.type == "meta" or value.layout != torch.strided or value.is_quantized or value.dtype in _QUANT:
        kind = "on the meta device" if value.device.type == "meta" else f"{value.layout} {value.dtype}"
        raise InvalidArgumentError(f"{where}: cannot store a tensor {kind} (only dense, non-quantized tensors)")
    return value.detach().to("cpu", copy=True)


def _plain_scalar(value: str | bool | int | float | None) -> Any:
    """``value`` as the exact type ``json`` writes it as: a subclass of str/int/float (a ``str`` enum, an
    ``IntEnum``, NumPy's ``float64``) becomes the plain value, as it would after a JSON round trip."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    return float.__float__(value)  # type: ignore[arg-type]


def _json_key(key: Any, where: str) -> str:
    """A dict key as ``json`` converts it (str as it is; int, float, True/False/None to their JSON text)."""
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, (bool, int, float)) or key is None:
        return json.dumps(key)
    raise InvalidTypeError(
        f"{where}: dict key {_brief(key)} is a {type(key).__name__}; payload keys must be str, int, float, bool or None"
    )


def _scalar(value: Any) -> float | None:
    """The float of a real scalar (number, NumPy scalar, one-element real tensor), else None.

    Raises ``OverflowError`` for a number beyond the float range (``10**400``)."""
    if type(value) in (float, int):
        return float(value)
    if value is None:
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return float(value.item())
    return None


def _meta_string(value: Any, name: str, required: bool) -> str | None:
    if isinstance(value, str) or (value is None and not required):
        return value
    raise InvalidTypeError(
        f"exp_meta.{name} must be a str{'' if required else ' or None'}, got {type(value).__name__} {_brief(value)}"
    )


def _meta_number(value: Any, name: str) -> Any:
    """``value`` as a plain ``int``/``float`` or None: a NumPy scalar or a 0-d real tensor (on any device) becomes
    its ``item()``, another real number (an ``IntEnum``, a ``Fraction``) its ``int`` or ``float`` (what the JSON
    form of a stored row holds); a bool, a complex number, a string, a tensor of another shape or kind are
    refused (InvalidTypeError naming the field), as is a number no float64 holds (InvalidArgumentError)."""
    if type(value) in (int, float) or value is None:
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, numbers.Integral):
            return operator.index(value)
        try:
            return float(value)
        except OverflowError:
            raise InvalidArgumentError(f"exp_meta.{name} must fit a float64, got {_brief(value)}") from None
    if isinstance(value, torch.Tensor):
        if (
            value.dim() == 0
            and value.layout == torch.strided
            and value.device.type != "meta"
            and not value.is_quantized
            and not value.is_complex()
            and value.dtype != torch.bool
        ):
            return value.item()
        got = f"a {value.dtype} tensor of shape {list(value.shape)} on {value.device.type}"
    else:
        got = f"{type(value).__name__} {_brief(value)}"
    raise InvalidTypeError(
        f"exp_meta.{name} must be a real number (int, float, NumPy scalar or 0-d real tensor) or None, got {got}"
    )


class NotPlain(Exception):
    """Raised by :func:`plain_copy` for a value that is not JSON-native (the general path takes it)."""


def plain_copy(value: Any, depth: int = 0) -> Any:
    """A structural copy of a JSON-native ``value`` (exact ``str/int/float/bool/None`` leaves in exact ``list``s
    and ``dict``s with ``str`` keys): what :func:`json_form` returns for it, without its per-node error paths.

    Raises :class:`NotPlain` for anything else (subclasses, tuples, tensors, other keys, nesting past
    ``_MAX_DEPTH``) so the caller redoes the whole value with :func:`json_form`."""
    kind = type(value)
    if kind is dict:
        if depth >= _MAX_DEPTH or not _STR.issuperset(map(type, value)):
            raise NotPlain
        if _PLAIN.issuperset(map(type, value.values())):  # flat: the type check and the copy run in C
            return value.copy()
        return {k: v if type(v) in _PLAIN else plain_copy(v, depth + 1) for k, v in value.items()}
    if kind is list:
        if depth >= _MAX_DEPTH:
            raise NotPlain
        if _PLAIN.issuperset(map(type, value)):
            return value.copy()
        return [v if type(v) in _PLAIN else plain_copy(v, depth + 1) for v in value]
    if kind in _PLAIN:
        return value
    raise NotPlain


def _form(value: Any, where: str) -> Any:
    """:func:`json_form` of ``value``, by the cheap :func:`plain_copy` walk when the payload is JSON-native."""
    if type(value) in _PLAIN:
        return value
    try:
        return plain_copy(value)
    except NotPlain:
        return json_form(value, where)


def _checked_meta(row: Any) -> tuple[Any, ...]:
    """``row``'s six ``exp_meta`` fields, checked (see :func:`normalize_row` for the errors), numbers as plain
    ``int``/``float``."""
    if row is None:
        raise InvalidArgumentError("Data is required: data is None, not a DataRow")
    meta = getattr(row, "exp_meta", None)
    if meta is None:
        raise InvalidArgumentError(f"exp_meta is required: data must be a DataRow with an exp_meta, got {_brief(row)}")
    try:  # one C call for all six fields; a missing one reads as None, as getattr(meta, name, None) would
        task_id, name, agent, pre, step, when = _META_FIELDS(meta)
    except AttributeError:
        task_id, name, agent, pre, step, when = (getattr(meta, n, None) for n in _META_NAMES)
    # exact types first (one check each), the general checks and their errors otherwise
    if type(task_id) is not str:
        task_id = _meta_string(task_id, "task_id", True)
    if type(name) is not str:
        name = _meta_string(name, "task_name", False)
    if type(agent) is not str:
        agent = _meta_string(agent, "agent_id", False)
    if pre is not None and type(pre) is not str:
        pre = _meta_string(pre, "pre_agent", False)
    if type(step) not in _NUMBER:
        step = _meta_number(step, "step")
    if type(when) not in _NUMBER:
        when = _meta_number(when, "execute_time")
    return task_id, name, agent, pre, step, when


def query_values(row: Any) -> tuple[Any, ...]:
    """``row``'s values of the query columns (``META_STRINGS + NUMERIC``, NaN for a missing number), checked
    as :func:`normalize_row` checks them, without touching the payload (state, actions, messages)."""
    task_id, name, agent, pre, step, when = _checked_meta(row)
    data = getattr(row, "exp_data", None)
    reward, adv, v = (
        x if type(x) in _PLAIN else _form(x, f"exp_data.{n}")  # as stored: a 1-element array counts as its number
        for n, x in ((n, getattr(data, n, None)) for n in _DATA_NUMERIC)
    )
    return _column_values(task_id, name, agent, pre, step, when, reward, adv, v)


def normalize_row(row: Any) -> tuple[DataRow, tuple[Any, ...]]:
    """Check ``row`` and return (the row as stored, its column values ``META_STRINGS + NUMERIC`` as
    ``(str|None)*4 + (float)*5``, NaN for a missing number). Never changes ``row``.

    ``step`` and ``execute_time`` may be NumPy scalars or 0-d real tensors: the stored row holds their
    Python number (``item()``).

    Raises:
        InvalidArgumentError: ``row`` is None or has no ``exp_meta`` (AWorld's messages, and ValueErrors as
            AWorld's are).
        InvalidTypeError: a meta field of the wrong type (a bool ``step``, a str ``execute_time``, a 1-element
            tensor), a payload value that cannot be stored (``object()``, a complex number, nesting deeper
            than 65 levels), a ``DataRow.id`` that is not a str; each named. An ``InvalidArgumentError`` that
            is also the ``TypeError`` earlier releases raised.
        InvalidArgumentError: a ``step`` no int64 holds (NaN, inf, ``1e300``, ``2**70``), a number no float64
            holds (``10**400``), a tensor on the meta device, sparse or quantized (named).
    """
    task_id, name, agent, pre, step, when = _checked_meta(row)
    data = getattr(row, "exp_data", None)
    # payload fields: JSON-native scalars as they are, containers by the plain_copy walk, the rest json_form
    try:
        fields = _DATA_FIELDS(data)
    except AttributeError:
        fields = tuple(getattr(data, n, None) for n in _DATA_NAMES)
    state, actions, messages, reward, adv, v = (
        x if type(x) in _PLAIN else _form(x, where) for x, where in zip(fields, _DATA_WHERE, strict=True)
    )
    row_id = getattr(row, "id", None)
    row_id = str(uuid.uuid4()) if row_id is None else row_id
    if type(row_id) is not str and not isinstance(row_id, str):
        raise InvalidTypeError(f"DataRow.id must be a str, got {type(row_id).__name__} {_brief(row_id)}")
    stored = DataRow(
        ExpMeta(task_id, name, agent, step, when, pre),
        Experience(state, actions, reward, adv, v, messages),
        row_id,
    )
    return stored, _column_values(task_id, name, agent, pre, step, when, reward, adv, v)


def row_list(rows: Any, name: str = "data_batch") -> list[Any]:
    """``rows`` (any iterable of rows, not a str or bytes) as a list, unchecked.

    Raises:
        InvalidTypeError: naming ``name``, for a single row or any other non-iterable.
    """
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Iterable):
        raise InvalidTypeError(f"{name} must be a list of DataRow, got {type(rows).__name__} {_brief(rows)}")
    return list(rows)


def _column_values(
    task_id: str, name: Any, agent: Any, pre: Any, step: Any, when: Any, reward: Any, adv: Any, v: Any
) -> tuple[Any, ...]:
    """A checked row's values of the query columns, ``META_STRINGS + NUMERIC`` (NaN for a missing number)."""
    nan = math.nan
    return (
        task_id,
        name,
        agent,
        pre,
        nan if step is None else float(step) if _STEP_LOW <= step < _STEP_HIGH else _bad_step(step),
        when if type(when) is float else nan if when is None else _number(when, "exp_meta.execute_time"),
        reward if type(reward) is float else nan if reward is None else _number(reward, "exp_data.reward_t"),
        adv if type(adv) is float else nan if adv is None else _number(adv, "exp_data.adv_t"),
        v if type(v) is float else nan if v is None else _number(v, "exp_data.v_t"),
    )


_STEP_LOW, _STEP_HIGH = -(2**63), 2**63  # an int64: what TensorDictConverter's step column holds


def _bad_step(step: Any) -> float:
    raise InvalidArgumentError(
        f"exp_meta.step must be a finite number in [-2**63, 2**63) (an int64 step), got {_brief(step)}"
    )


# ---- the compact form of a stored row: one JSON text, built into a DataRow when first read ----

_RECORD_FIELDS = operator.attrgetter(
    "id", *(f"exp_meta.{n}" for n in _META_NAMES), *(f"exp_data.{n}" for n in _DATA_NAMES)
)
_STR_OR_NONE = frozenset({str, type(None)})
_NUMBER_OR_NONE = frozenset({int, float, type(None)})


class _NotNative(Exception):
    """Raised by the encoder's ``default`` hook: a value JSON cannot hold as it is (the general path takes it)."""


def _refuse(value: Any) -> Any:
    raise _NotNative


# no circular-reference markers (a cycle ends in RecursionError, and the general path names it); non-ASCII kept
# (json.encoder.c_make_encoder: the C encoder json.dumps itself uses, called directly to skip a per-call setup;
# None where the C accelerator is missing, then the JSONEncoder below)
_make = getattr(json.encoder, "c_make_encoder", None)
_encode_c = _make and _make(None, _refuse, json.encoder.encode_basestring, None, ":", ",", False, False, True)
_encode_py = json.JSONEncoder(ensure_ascii=False, check_circular=False, separators=(",", ":"), default=_refuse).encode


_raw_decode = json.JSONDecoder().raw_decode  # our own records: no whitespace around them for loads() to strip


def encode_record(row: Any) -> tuple[str, tuple[Any, ...]] | None:
    """The compact stored form of ``row``, or ``None`` when the row needs :func:`normalize_row`.

    Returns (one JSON text ``[id, task_id, task_name, agent_id, pre_agent, step, execute_time, state,
    actions, messages, reward_t, adv_t, v_t]``, the column values as :func:`normalize_row` gives them).
    Only for exact ``DataRow``/``ExpMeta``/``Experience`` with exact meta types and JSON-native payloads
    nested at most as deep as :func:`json_form` allows: :func:`decode_record` of the text is then exactly
    ``normalize_row(row)[0]`` (a str holds no references, so a stored text costs the cyclic GC nothing).
    Anything else (tensors, arrays, dataclasses, bad values) returns ``None``; this never raises.
    """
    if type(row) is not DataRow or type(row.exp_meta) is not ExpMeta or type(row.exp_data) is not Experience:
        return None
    try:
        fields = _RECORD_FIELDS(row)
    except AttributeError:
        return None
    row_id, task_id, name, agent, pre, step, when, _, _, _, reward, adv, v = fields
    if (
        type(task_id) is not str
        or type(name) not in _STR_OR_NONE
        or type(agent) not in _STR_OR_NONE
        or type(pre) not in _STR_OR_NONE
        or type(step) not in _NUMBER_OR_NONE
        or type(when) not in _NUMBER_OR_NONE
    ):
        return None
    if type(row_id) is not str:
        if row_id is not None:
            return None
        fields = (str(uuid.uuid4()), *fields[1:])
    try:
        text = "".join(_encode_c(fields, 0)) if _encode_c else _encode_py(fields)
    except (_NotNative, TypeError, ValueError, RecursionError):
        return None
    # json_form allows _MAX_DEPTH + 1 nested containers per field; the record adds its own list. The count
    # includes brackets inside strings, so it only bounds the depth: a row over it takes the general path.
    if text.count("[") + text.count("{") > _MAX_DEPTH + 2:
        return None
    try:
        return text, _column_values(task_id, name, agent, pre, step, when, reward, adv, v)
    except InvalidArgumentError:  # a number out of range: the general path raises it
        return None


def decode_record(text: str) -> DataRow:
    """The row :func:`encode_record` encoded as ``text``."""
    row_id, task_id, name, agent, pre, step, when, state, actions, messages, reward, adv, v = _raw_decode(text)[0]
    meta = ExpMeta(task_id, name, agent, step, when, pre)
    return DataRow(meta, Experience(state, actions, reward, adv, v, messages), row_id)


def _number(value: Any, where: str) -> float:
    """The column value of a number field: its float when a real scalar, else NaN; InvalidArgumentError naming
    ``where`` for a number beyond the float range (``10**400``), which no column nor converter can hold."""
    try:
        found = _scalar(value)
    except OverflowError:
        raise InvalidArgumentError(f"{where} must fit a float64, got {_brief(value)}") from None
    return math.nan if found is None else found
