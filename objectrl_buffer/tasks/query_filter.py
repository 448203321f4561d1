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
import reprlib
from collections.abc import Callable, Iterable
from typing import Any, Literal, Protocol, TypedDict

import torch

from objectrl_buffer.core.vocab import Vocab
from objectrl_buffer.errors import QueryError

from .rows import META_STRINGS, NUMERIC, query_values

__all__ = [
    "QueryBuilder",
    "QueryFilter",
    "QueryCondition",
    "BaseCondition",
    "LogicalCondition",
    "compile_query",
    "resolve_field",
]


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


def _like_tokens(pattern: str) -> tuple[list[list[str | None]], bool]:
    """``pattern`` split at its unescaped ``%``: segments of characters (``None`` for ``_``), and whether it
    has a wildcard at all. ``\\`` escapes the next character (a trailing one stands for itself)."""
    segments: list[list[str | None]] = [[]]
    wild = False
    chars = iter(pattern)
    for ch in chars:
        if ch == "\\":
            segments[-1].append(next(chars, "\\"))
        elif ch == "%":
            wild = True
            segments.append([])
        elif ch == "_":
            wild = True
            segments[-1].append(None)
        else:
            segments[-1].append(ch)
    return segments, wild


def _segment_finder(segment: list[str | None]) -> Callable[[str, int, int], int]:
    """``find(s, start, end)``: the first index ``i >= start`` where ``segment`` matches ``s[i:i + len]`` within
    ``end``, or -1. Literal segments use ``str.find``; one with ``_`` a regex of literals and ``.`` only (no
    repetition, so no backtracking: O(len(s) * len(segment)))."""
    if None not in segment:
        literal = "".join(segment)  # type: ignore[arg-type]
        return lambda s, start, end: s.find(literal, start, end)
    regex = re.compile("".join("." if c is None else re.escape(c) for c in segment), re.DOTALL)

    def find(s: str, start: int, end: int) -> int:
        found = regex.search(s, start, end)
        return -1 if found is None else found.start()

    return find


def like_matcher(pattern: str) -> Callable[[str], bool]:
    """A predicate for SQL ``LIKE pattern`` (``%``, ``_``, ``\\`` escape); without wildcards, substring.

    Linear in the string for a given pattern, whatever the pattern (no backtracking regex): the first segment
    must match at the start, the last at the end, and each middle one at its leftmost place after the one
    before (taking a later place never helps the segments that follow, since ``%`` takes any run).
    """
    segments, wild = _like_tokens(pattern)
    if not wild:
        literal = "".join(segments[0])  # type: ignore[arg-type]
        return lambda s: literal in s
    first, *middle = segments
    last = middle.pop() if middle else None
    first_at = _segment_finder(first)
    last_at = _segment_finder(last) if last is not None else None
    middle_at = [(_segment_finder(m), len(m)) for m in middle if m]

    def match(s: str) -> bool:
        if last_at is None:  # no %: the whole string is the one segment
            return len(s) == len(first) and first_at(s, 0, len(s)) == 0
        end = len(s) - len(last)  # type: ignore[arg-type]
        if end < len(first) or first_at(s, 0, len(first)) != 0 or last_at(s, end, len(s)) != end:
            return False
        at = len(first)
        for find, size in middle_at:
            found = find(s, at, end)
            if found < 0:
                return False
            at = found + size
        return True

    return match


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
        found = [c for c in map(vocab.find, wanted) if c is not None]  # a non-str value matches no string
        hit = codes == found[0] if len(found) == 1 else vocab.member_mask(codes, found)
        return hit if op in ("eq", "in") else ~hit
    if not isinstance(value, str):
        raise QueryError(f"'{op}' on {field!r} needs a str pattern, got {type(value).__name__}")
    hit = vocab.member_mask(codes, vocab.codes_where(like_matcher(value)).tolist())
    return hit if op == "like" else (~hit & (codes >= 0))


def _float(value: Any) -> float | None:
    """``float(value)`` of a real number; ``None`` for NaN and for one beyond the float range (``10**400``),
    which no stored number equals."""
    try:
        found = float(value)
    except OverflowError:
        return None
    return None if math.isnan(found) else found


# a bound beyond every float (10**400) compared exactly, as the infinity on its side with these operators:
# x > 10**400 and x >= 10**400 hold for x == inf only, x < 10**400 and x <= 10**400 for every x < inf
_PAST_FLOATS = {
    True: {"gt": "gte", "gte": "gte", "lt": "lt", "lte": "lt"},
    False: {"gt": "gt", "gte": "gt", "lt": "lte", "lte": "lte"},
}


def _number_leaf(op: str, field: str, value: Any, columns: Columns) -> torch.Tensor:
    column = columns.number_column(field)
    if op in ("gt", "gte", "lt", "lte"):
        if not _is_number(value):
            raise QueryError(f"'{op}' on {field!r} needs a real number, got {type(value).__name__}")
        try:
            bound = float(value)
        except OverflowError:
            bound = math.inf if value > 0 else -math.inf
            op = _PAST_FLOATS[value > 0][op]
        compare = {"gt": torch.gt, "gte": torch.ge, "lt": torch.lt, "lte": torch.le}[op]
        return compare(column, bound)  # NaN (missing) compares False
    if op in ("like", "not_like"):
        raise QueryError(f"'{op}' needs a string field; {field!r} is numeric")
    wanted = [value] if op in ("eq", "ne") else _collection(value, op, field)
    reals = [f for v in wanted if _is_number(v) and (f := _float(v)) is not None]
    hit = column == reals[0] if len(reals) == 1 else torch.isin(column, torch.tensor(reals, dtype=torch.float64))
    if any(v is None for v in wanted):
        hit |= torch.isnan(column)
    return hit if op in ("eq", "in") else ~hit


def _leaf(cond: dict[str, Any], columns: Columns) -> torch.Tensor:
    op = cond.get("op")
    if op not in _VALUE_OPS and op not in _NULL_OPS:
        raise QueryError(f"unknown query operator {reprlib.repr(op)} in {reprlib.repr(cond)}")
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


def _operands(cond: Any) -> tuple[str, list[Any] | tuple[Any, ...]] | None:
    """``(key, operands)`` of a logical node, ``None`` for a leaf; QueryError for anything else."""
    if not isinstance(cond, dict):
        raise QueryError(f"a query condition is a dict, got {type(cond).__name__}: {reprlib.repr(cond)}")
    if "op" in cond or "field" in cond:
        return None
    keys = set(cond) & {"and_", "or_"}
    if len(cond) != 1 or len(keys) != 1:
        got = sorted(map(repr, cond))
        raise QueryError(f"a logical query condition has exactly one key, 'and_' or 'or_': got {got}")
    key = keys.pop()
    operands = cond[key]
    if not isinstance(operands, (list, tuple)):
        raise QueryError(f"'{key}' takes a list of conditions, got {type(operands).__name__}")
    return key, operands


def _evaluate(root: Any, columns: Columns) -> torch.Tensor:
    """The mask of ``root``, walked with an explicit stack: a query of any depth (a chain of 10 000
    ``or_()``, which ``build()`` folds into 10 000 nested levels) runs without recursion. A query that
    contains itself raises QueryError instead of looping."""
    frames: list[tuple[str, Any, int, torch.Tensor]] = []  # (key, operands, next operand, mask so far)
    path: set[int] = set()  # ids of the operand lists being evaluated: a cycle would meet one again
    cond: Any = root
    while True:
        node = _operands(cond)
        if node is None:
            mask = _leaf(cond, columns)
        else:
            if id(node[1]) in path:
                raise QueryError("the query contains itself (a cycle of and_/or_ lists)")
            path.add(id(node[1]))
            frames.append((node[0], node[1], 0, torch.full((columns.n,), node[0] == "and_", dtype=torch.bool)))
            mask = None
        while True:  # fold finished masks into the open nodes until one has an operand left to evaluate
            if mask is not None:
                if not frames:
                    return mask
                key, operands, i, acc = frames[-1]
                frames[-1] = (key, operands, i + 1, acc & mask if key == "and_" else acc | mask)
            key, operands, i, acc = frames[-1]
            if i < len(operands):
                cond = operands[i]
                break
            frames.pop()
            path.discard(id(operands))
            mask = acc


def compile_query(cond: QueryCondition | None, columns: Columns) -> torch.Tensor:
    """bool ``[columns.n]``, CPU: which rows match ``cond`` (None or ``{}`` matches every row).

    Raises :class:`QueryError` naming an unknown operator or field, ordering of a string field, a non-collection
    ``in_``/``not_in`` value, a non-string ``like`` pattern, or a query that contains itself. Reads only;
    evaluates the whole query even when part of it is already decided, so every malformed leaf is reported
    whatever the data. Any depth runs (no recursion), ``like`` is linear in each string, and a number beyond
    float64 (``10**400``) compares exactly (equal to nothing, beyond every finite value).
    """
    if not cond:
        return torch.ones(columns.n, dtype=torch.bool)
    return _evaluate(cond, columns)


class _RowColumns:
    """The :class:`Columns` of a list of rows, built for one filter call (what a task table holds, unstored)."""

    def __init__(self, rows: list[Any]) -> None:
        values = [query_values(r) for r in rows]
        self._n = len(rows)
        self.vocabs = {name: Vocab() for name in META_STRINGS}
        width = len(META_STRINGS)
        columns = list(zip(*values, strict=True)) or [() for _ in META_STRINGS + NUMERIC]
        self._codes = {
            name: torch.tensor(self.vocabs[name].codes(columns[j]), dtype=torch.int64)
            for j, name in enumerate(META_STRINGS)
        }
        self._numbers = {name: torch.tensor(columns[width + j], dtype=torch.float64) for j, name in enumerate(NUMERIC)}

    @property
    def n(self) -> int:
        return self._n

    def string_column(self, name: str) -> tuple[torch.Tensor, Vocab]:
        return self._codes[name], self.vocabs[name]

    def number_column(self, name: str) -> torch.Tensor:
        return self._numbers[name]


class QueryFilter:
    """AWorld's ``QueryFilter``: a built query applied to rows in hand, with the semantics of a storage's query
    (the module docstring), so ``QueryFilter(q).filter(rows)`` keeps exactly the rows ``storage.get_all(q)``
    would return from storing them.

    Args:
        query_condition: a built query (``QueryBuilder().eq(...).build()``); ``None`` or ``{}`` keeps every row.

    Unlike AWorld's, a malformed query (unknown operator or field) raises
    :class:`~objectrl_buffer.errors.QueryError` instead of matching nothing, ``is_null``/``is_not_null`` work,
    ``like`` is SQL LIKE, and ordering a missing number is False instead of a ``TypeError``.
    """

    def __init__(self, query_condition: QueryCondition | None) -> None:
        self.query_condition = query_condition

    def check_condition(self, row: Any) -> bool:
        """Whether ``row`` (a :class:`~objectrl_buffer.tasks.DataRow`) matches. Raises QueryError for a malformed
        query and, for a row the storage would refuse, the storage's error naming the field."""
        return bool(self.filter([row]))

    def filter(self, rows: Iterable[Any]) -> list[Any]:
        """The rows of ``rows`` that match, in order (the same objects, not copies)."""
        found = list(rows)
        if not self.query_condition:
            return found
        mask = compile_query(self.query_condition, _RowColumns(found)).tolist()
        return [r for r, keep in zip(found, mask, strict=True) if keep]
