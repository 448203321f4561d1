"""The per-step ``add`` of one schema, compiled to straight-line Python once per schema.

Why generated code: the per-step write is the hot path of every training loop, and a NumPy ring
(``column[slot] = value`` per key, ~0.15 µs a key) is the floor a user could write by hand. A loop over
per-column entries that checks each value pays ~0.4 µs a key in loop and tuple-unpacking overhead alone,
2-2.5x that floor. So, as :mod:`dataclasses` does for ``__init__``, we write out the checks of each
column as plain statements with the column's constants bound by name, and ``exec`` that source once.
The code only ever names ``v0, v1, ...`` and constants from the namespace below: keys never enter
the source text.

The rules (the templates below are their statement) are those of the module docstring of
:mod:`~objectrl_buffer.storage.fast_write`; ``tests/storage/test_fast_write.py`` checks, on random
inputs of every form, that this path and the full checked path accept the same writes and store the
same bytes. Every value is checked before anything is written; any input the rules do not cover returns
``False`` (nothing written) and the caller takes the full path, which stores the same bytes or raises
the precise error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from objectrl_buffer.core.casts import narrows, real_part
from objectrl_buffer.core.schema import INDEX_KEY, Key
from objectrl_buffer.storage.torchrl_compat import plain_items

if TYPE_CHECKING:
    from objectrl_buffer.storage.fast_write import FastWriter

__all__ = ["RowWriter", "compile_row_writer", "pwrite_rows"]

#: ``write(data, slot, cast_ok) -> bool``: see :meth:`FastWriter.write_row`.
RowWriter = Callable[[Any, int, Container[Key]], bool]

# A value of a column with a per-row shape: a tensor of the stored dtype and shape, or a NumPy array
# of the shape whose dtype casts without a look at the values.
_ARRAY = """
    v{i} = items[k{i}]
    t = type(v{i})
    if t is ndarray:
        if v{i}.shape != s{i} or (v{i}.dtype is not n{i} and not castable(c{i}, v{i}.dtype, d{i})):
            return False
    elif t is Tensor:
        v{i} = v{i}.numpy()  # raises for a tensor off the CPU or that needs grad; NumPy's checks are cheaper
        if v{i}.dtype is not n{i} or v{i}.shape != s{i}:
            return False
    else:
        return False{narrow}"""

# A column of a float dtype narrower than float64 also checks a NumPy array of another (wider) dtype: a
# finite value beyond the column's range would become inf. The sum of squares is no more than ``q``
# (``limit ** 2``) when every element is within the range; nan, inf or a false alarm (many elements
# near the limit) take the checked path, which decides element by element (so does a complex array:
# comparing its complex square raises TypeError).
_NARROW_ARRAY = """
    if t is ndarray and v{i}.dtype is not n{i} and not {square} <= q{i}:
        return False"""

# A value of a 0-d column: a Python number the column holds, a 0-d tensor of the stored dtype (read
# with ``item()``: 3x cheaper than ``numpy()``), a one-element tensor the user was warned about, or a
# NumPy scalar/0-d array that casts without a look at the values. ``{numbers}`` is one of the three
# number rules below; the first test of the chain is the form a gymnasium loop hands over.
_SCALAR = """
    v{i} = items[k{i}]
    t = type(v{i}){numbers}
    elif t is Tensor:
        if v{i}.dtype is not d{i} or v{i}.dim():
            if v{i}.numel() != 1 or k{i} not in cast_ok:
                return False
            v{i} = v{i}.item()
            if not fits{i}(v{i}):
                return False
        else:
            v{i} = v{i}.item()
    elif t is ndarray or isinstance(v{i}, generic):
        if v{i}.shape or (v{i}.dtype is not n{i} and not castable(c{i}, v{i}.dtype, d{i})):
            return False{narrow}
    else:
        return False"""
_NUMBERS = {
    # NaN passes (as in the checked path); beyond the column's range would become inf: refused
    "float": """
    if t is float:
        if v{i} > m{i} or v{i} < nm{i}:
            return False
    elif t is int or t is bool:
        if not l{i} <= v{i} <= h{i}:
            return False""",
    "int": """
    if t is int or t is bool:
        if not l{i} <= v{i} <= h{i}:
            return False""",
    "bool": """
    if t is bool:
        pass""",
}


# A NumPy scalar of another dtype into a 0-d column narrower than float64: within the column's range
# (a comparison with nan is false: nan takes the checked path, as inf does)
_NARROW_SCALAR = """
        if v{i}.dtype is not n{i} and not nm{i} <= v{i} <= m{i}:
            return False"""


def pwrite_rows(fd: int, row_bytes: int, first: int, value: Any, dtype: np.dtype) -> None:
    """Write the rows ``value`` (``[n, ...]``, cast to ``dtype``) at rows ``first, first + 1, ...`` of
    the column file ``fd``."""
    data = memoryview(np.ascontiguousarray(value, dtype=dtype).data).cast("B")
    offset = first * row_bytes
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _fits(kind: str, low: int, high: int, limit: float) -> Callable[[Any], bool]:
    """Whether a Python number (from a one-element tensor's ``item()``) goes into a 0-d column as it is."""

    def fits(value: Any) -> bool:
        t = type(value)
        if t is float:
            return kind == "float" and not (value > limit or value < -limit)
        if t is bool:
            return True
        return t is int and kind != "bool" and low <= value <= high

    return fits


def compile_row_writer(writer: FastWriter, extra_keys: int = 0) -> RowWriter:
    """The ``write_row`` function of ``writer``'s schema (its ``entries``, ``limit`` and wide columns).

    ``extra_keys``: inputs hold this many keys besides the schema's, which the caller checks and stores
    (a compact storage's frames; see :mod:`~objectrl_buffer.storage.compact_step`): the key count must
    then be the schema's plus these (plus, maybe, ``"index"``).
    """
    n_keys = writer.n_keys + extra_keys
    namespace: dict[str, Any] = {
        "Tensor": torch.Tensor,
        "ndarray": np.ndarray,
        "vdot": np.vdot,
        "generic": np.generic,
        "castable": writer.castable,
        "plain_items": plain_items,
        "INDEX_KEY": INDEX_KEY,
        "bound": writer.bound,
        "pwrite_rows": pwrite_rows,
        "expand": lambda value: np.expand_dims(np.asarray(value), 0),
    }
    checks, writes = [], []
    for i, (key, dtype, shape, array, scalar, low, high, limit, casts) in enumerate(writer.entries):
        namespace.update({f"k{i}": key, f"d{i}": dtype, f"s{i}": shape, f"a{i}": array, f"n{i}": array.dtype})
        namespace.update({f"c{i}": casts, f"l{i}": low, f"h{i}": high, f"m{i}": limit, f"nm{i}": -limit})
        narrow = narrows(torch.float64, dtype)  # a finite float64 can become inf in this column
        if shape:
            if narrow:
                namespace[f"q{i}"] = float(torch.finfo(real_part(dtype)).max) ** 2
            # ndarray.dot of a 1-D array: 0.35 us for 17 elements, vdot (any shape) 0.57 us
            square = f"v{i}.dot(v{i})" if len(shape) == 1 else f"vdot(v{i}, v{i})"
            checks.append(_ARRAY.format(i=i, narrow=_NARROW_ARRAY.format(i=i, square=square) if narrow else ""))
        else:
            namespace[f"fits{i}"] = _fits(scalar, low, high, limit)
            extra = _NARROW_SCALAR.format(i=i) if narrow else ""
            checks.append(_SCALAR.format(i=i, numbers=_NUMBERS[scalar].format(i=i), narrow=extra))
        wide = writer.wide(array)
        if wide is None:
            writes.append(f"    a{i}[slot] = v{i}")
        else:
            namespace[f"w{i}"] = wide
            writes.append(f"    pwrite_rows(*w{i}, slot, expand(v{i}), n{i})")
    source = (
        "def write_row(data, slot, cast_ok=()):\n"
        "    if slot >= bound[0]:\n"
        "        return False\n"
        "    if type(data) is dict:\n"
        "        items = data\n"
        "    else:\n"
        "        items = plain_items(data, 0)\n"
        "        if items is None:\n"
        "            return False\n"
        f"    if len(items) != {n_keys} and (len(items) != {n_keys + 1} or INDEX_KEY not in items):\n"
        "        return False\n"
        "    try:" + "".join(check.replace("\n", "\n    ") for check in checks) + "\n"
        "    except (KeyError, RuntimeError, TypeError):\n"
        "        return False\n" + "\n".join(writes) + "\n"
        "    return True\n"
    )
    exec(compile(source, f"<row writer of {writer.n_keys} columns>", "exec"), namespace)
    # out of its own globals: the function <-> namespace cycle would keep the column views (and the
    # mappings behind them) alive until a GC pass
    write_row: RowWriter = namespace.pop("write_row")
    write_row.__doc__ = f"Generated by objectrl_buffer.storage.row_writer:\n\n{source}"
    return write_row
