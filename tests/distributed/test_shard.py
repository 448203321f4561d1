"""The wire format of a shard's draw (no Ray needed): :func:`pack` / :func:`unpack` round trips."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from objectrl_buffer.distributed.shard import pack, unpack

DTYPES = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_, np.float16]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 9),
    spec=st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(1, 3), max_size=2)), min_size=1, max_size=5),
    mass=st.floats(0, 1e9),
)
def test_pack_round_trips_columns(rows: int, spec: list[tuple[type, list[int]]], mass: float) -> None:
    rng = np.random.default_rng(0)
    columns = {
        f"k{i}.x" if i % 2 else f"k{i}": (rng.random((rows, *shape)) * 100).astype(dtype)
        for i, (dtype, shape) in enumerate(spec)
    }
    packed = pack(mass, columns)
    assert isinstance(packed, bytes)
    got_mass, got_rows, got = unpack(packed)
    assert (got_mass, got_rows) == (mass, rows)
    assert list(got) == list(columns)
    for key, value in columns.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape
        assert np.array_equal(got[key], value)
        assert got[key].flags.writeable  # a copy the caller owns: torch.from_numpy takes it as it is
    _, _, views = unpack(packed, copy=False)
    assert all(np.array_equal(views[k], v) for k, v in columns.items())


def test_pack_of_nothing_and_of_strided_columns() -> None:
    assert unpack(pack(0.0, {})) == (0.0, 0, {})
    wide = np.arange(24, dtype=np.float32).reshape(4, 6)
    _, _, got = unpack(pack(1.0, {"a": wide[:, ::2]}))  # a strided view travels as its values
    assert np.array_equal(got["a"], wide[:, ::2])


def test_unpack_refuses_bytes_that_do_not_match_their_header() -> None:
    packed = pack(1.0, {"a": np.zeros((3, 2), np.float32)})
    with pytest.raises(ValueError, match="packed draw"):
        unpack(packed[:-4])
