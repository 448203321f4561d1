"""AWorld's ``QueryBuilder`` (same methods, same ``build()`` dicts) and the compiler that turns a built query
into one boolean mask over the tensor columns of a task table: ``==``/``isin`` per leaf, ``&``/``|`` per node.

Semantics (AWorld's in-memory ones, with its gaps filled): ``eq ne in not_in`` compare like Python (``eq(f,
None)`` is ``is_null``); ``gt gte lt lte`` need a numeric field and a real value, and a missing value never
matches; ``like``/``not_like`` are SQL LIKE (``%`` any run, ``_`` one character, ``\\`` escapes) on string
fields, and a pattern without wildcards matches as a substring; a missing string never matches either.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable
from typing import Any, Literal, Protocol, TypedDict

import torch

from objectrl_buffer.core.vocab import Vocab
from objectrl_buffer.errors import QueryError

from .rows import META_STRINGS, NUMERIC

__all__ = ["QueryBuilder", "QueryCondition", "BaseCondition", "LogicalCondition", "compile_query", "resolve_field"]


class BaseCondition(TypedDict, total=False):
    field: str
    value: Any
    op: Literal["eq", "ne", "gt", "gte", "lt", "lte", "in", "not_in", "like", "not_like", "is_null", "is_not_null"]


class LogicalCondition(TypedDict, total=False):
    and_: list[Any]
    or_: list[Any]


QueryCondition = BaseCondition | LogicalCondition | dict[str, Any]


class QueryBuilder:
    """Fluent builder of a query: leaves and ``and_()``/``or_()`` between them, folded strictly left to right
    (no precedence): ``a.and_().b.or_().c`` builds ``{"or_": [{"and_": [a, b]}, c]}``."""

    def __init__(self) -> None:
        self.conditions: list[dict[str, Any]] = []
        self.logical_ops: list[str] = []

    def _leaf(self, field: str, op: str, value: Any) -> QueryBuilder:
        self.conditions.append({"field": field, "value": value, "op": op})
        return self

    def eq(self, field: str, value: Any) -> QueryBuilder:
        return self._leaf(field, "eq", value)

    def ne(self, field: str, value: Any) -> QueryBuilder:
        return self._leaf(field, "ne", value)

    def gt(self, field: str, value: Any) -> QueryBuilder:
        return self._leaf(field, "gt", value)

    def gte(self, field: str, value: Any) -> QueryBuilder:
        return self._leaf(field, "gte", value)

    def lt(self, field: str, value: Any) -> QueryBuilder:
        return self._leaf(field, "lt", value)

    def lte(self, field: str, value: Any) -> QueryBuilder:
        return self._leaf(field, "lte", value)

    def in_(self, field: str, value: Any) -> QueryBuilder:
        return self._leaf(field, "in", value)

    def not_in(self, field: str, value: Any) -> QueryBuilder:
        return self._leaf(field, "not_in", value)

    def like(self, field: str, value: Any) -> QueryBuilder:
        return self._leaf(field, "like", value)

    def not_like(self, field: str, value: Any) -> QueryBuilder:
        return self._leaf(field, "not_like", value)

    def is_null(self, field: str) -> QueryBuilder:
        self.conditions.append({"field": field, "op": "is_null"})
        return self

    def is_not_null(self, field: str) -> QueryBuilder:
        self.conditions.append({"field": field, "op": "is_not_null"})
        return self

    def and_(self) -> QueryBuilder:
        self.logical_ops.append("and_")
        return self

    def or_(self) -> QueryBuilder:
        self.logical_ops.append("or_")
        return self

    def nested(self, builder: QueryBuilder) -> QueryBuilder:
        """Add ``builder``'s query as one parenthesised operand (built now: a malformed one raises here)."""
        self.conditions.append(dict(builder.build()))
        return self

    def build(self) -> QueryCondition:
        """The query dict. Raises ``ValueError`` unless there is exactly one operator between operands."""
        if len(self.logical_ops) != len(self.conditions) - 1:
            raise ValueError("Mismatch between condition and operator counts")
        result: dict[str, Any] = self.conditions[0]
        for op, right in zip(self.logical_ops, self.conditions[1:], strict=False):
            result = {op: [result, right]}
        return result


class Columns(Protocol):
    """What a query runs on: ``n`` rows, an int64 code column + vocabulary per string field, a float64 column
    (NaN = missing) per numeric field; every column ``[n]`` on CPU."""

    @property
    def n(self) -> int: ...

    def string_column(self, name: str) -> tuple[torch.Tensor, Vocab]: ...

    def number_column(self, name: str) -> torch.Tensor: ...


_VALUE_OPS = {"eq", "ne", "gt", "gte", "lt", "lte", "in", "not_in", "like", "not_like"}
_NULL_OPS = {"is_null", "is_not_null"}
_PREFIX = {"exp_meta.": set(META_STRINGS) | {"step", "execute_time"}, "exp_data.": {"reward_t", "adv_t", "v_t"}}


def resolve_field(field: Any) -> str:
    """The column of a query field (``exp_meta.step`` or ``step``); QueryError for any other field."""
    if isinstance(field, str):
        for prefix, names in _PREFIX.items():
            bare = field.removeprefix(prefix)
            if bare in names and (bare != field or field in META_STRINGS + NUMERIC):
                return bare
    raise QueryError(
        f"unknown query field {field!r}: queries run on exp_meta.{{{', '.join(_PREFIX['exp_meta.'])}}} "
        "and exp_data.{reward_t, adv_t, v_t} (with or without the prefix)"
    )


def like_matcher(pattern: str) -> Callable[[str], bool]:
    """A predicate for SQL ``LIKE pattern`` (``%``, ``_``, ``\\`` escape); without wildcards, substring."""
    parts: list[str] = []
    wild = False
    chars = iter(pattern)
    for ch in chars:
        if ch == "\\":
            parts.append(re.escape(next(chars, "\\")))
        elif ch in "%_":
            wild = True
            parts.append(".*" if ch == "%" else ".")
        else:
            parts.append(re.escape(ch))
    if not wild:
        literal = re.sub(r"\\(.)", r"\1", pattern)
        return lambda s: literal in s
    regex = re.compile("".join(parts), re.DOTALL)
    return lambda s: regex.fullmatch(s) is not None


def _collection(value: Any, op: str, field: str) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise QueryError(f"'{op}' on {field!r} needs a list, tuple or set of values, got {type(value).__name__}")
    return list(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real)


def _string_leaf(op: str, field: str, value: Any, columns: Columns) -> torch.Tensor:
    codes, vocab = columns.string_column(field)
    if op in ("gt", "gte", "lt", "lte"):
        raise QueryError(f"'{op}' cannot order the string field {field!r}")
    if op in ("eq", "ne", "in", "not_in"):
        wanted = [value] if op in ("eq", "ne") else _collection(value, op, field)
        found = [c for c in map(vocab.find, wanted) if c is not None]
        hit = codes == found[0] if len(found) == 1 else vocab.member_mask(codes, found)
        return hit if op in ("eq", "in") else ~hit
    if not isinstance(value, str):
        raise QueryError(f"'{op}' on {field!r} needs a str pattern, got {type(value).__name__}")
    hit = vocab.member_mask(codes, vocab.codes_where(like_matcher(value)).tolist())
    return hit if op == "like" else (~hit & (codes >= 0))


def _number_leaf(op: str, field: str, value: Any, columns: Columns) -> torch.Tensor:
    column = columns.number_column(field)
    if op in ("gt", "gte", "lt", "lte"):
        if not _is_number(value):
            raise QueryError(f"'{op}' on {field!r} needs a real number, got {type(value).__name__}")
        compare = {"gt": torch.gt, "gte": torch.ge, "lt": torch.lt, "lte": torch.le}[op]
        return compare(column, float(value))  # NaN (missing) compares False
    if op in ("like", "not_like"):
        raise QueryError(f"'{op}' needs a string field; {field!r} is numeric")
    wanted = [value] if op in ("eq", "ne") else _collection(value, op, field)
    reals = [float(v) for v in wanted if _is_number(v) and not math.isnan(v)]
    hit = column == reals[0] if len(reals) == 1 else torch.isin(column, torch.tensor(reals, dtype=torch.float64))
    if any(v is None for v in wanted):
        hit |= torch.isnan(column)
    return hit if op in ("eq", "in") else ~hit


def _leaf(cond: dict[str, Any], columns: Columns) -> torch.Tensor:
    op = cond.get("op")
    if op not in _VALUE_OPS and op not in _NULL_OPS:
        raise QueryError(f"unknown query operator {op!r} in {cond!r}")
    field = resolve_field(cond.get("field"))
    if op in _NULL_OPS:
        missing = (
            columns.string_column(field)[0] < 0 if field in META_STRINGS else torch.isnan(columns.number_column(field))
        )
        return missing if op == "is_null" else ~missing
    if "value" not in cond:
        raise QueryError(f"query operator {op!r} on {field!r} has no 'value'")
    leaf = _string_leaf if field in META_STRINGS else _number_leaf
    return leaf(op, field, cond["value"], columns)


def _node(cond: Any, columns: Columns, depth: int) -> torch.Tensor:
    if depth > 200:
        raise QueryError("query nested more than 200 levels deep")
    if not isinstance(cond, dict):
        raise QueryError(f"a query condition is a dict, got {type(cond).__name__}: {cond!r}")
    if "op" in cond or "field" in cond:
        return _leaf(cond, columns)
    keys = set(cond) & {"and_", "or_"}
    if len(cond) != 1 or len(keys) != 1:
        raise QueryError(f"a logical query condition has exactly one key, 'and_' or 'or_': got {sorted(cond)}")
    key = keys.pop()
    operands = cond[key]
    if not isinstance(operands, (list, tuple)):
        raise QueryError(f"'{key}' takes a list of conditions, got {type(operands).__name__}")
    result = torch.full((columns.n,), key == "and_", dtype=torch.bool)
    for operand in operands:
        mask = _node(operand, columns, depth + 1)
        result = result & mask if key == "and_" else result | mask
    return result


def compile_query(cond: QueryCondition | None, columns: Columns) -> torch.Tensor:
    """bool ``[columns.n]``, CPU: which rows match ``cond`` (None or ``{}`` matches every row).

    Raises :class:`QueryError` naming an unknown operator or field, ordering of a string field, a non-collection
    ``in_``/``not_in`` value or a non-string ``like`` pattern. Reads only; evaluates the whole query even when
    part of it is already decided, so every malformed leaf is reported whatever the data.
    """
    if not cond:
        return torch.ones(columns.n, dtype=torch.bool)
    return _node(cond, columns, 0)
