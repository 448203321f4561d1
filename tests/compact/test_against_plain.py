"""Every read of a compact buffer (``next_of`` + ``frame_stack``) is bit for bit a plain buffer's for the
same writes and seed: episode ends and truncations, ring wrap-around, several envs, single and batch adds."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDictBase

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.errors import ReplayBufferError
from objectrl_buffer.storage import frame_stream
from tests.compact.streams import env_rows, one_step, steps_of


def compact_kwargs(k: int, with_next: bool = True) -> dict[str, Any]:
    """``k == 0``: no stack axis, ``next_of`` only; ``with_next=False``: ``frame_stack`` only."""
    return {
        "next_of": {"next_state": "state"} if with_next or not k else None,
        "frame_stack": {"state": k} if k else None,
    }


def assert_same(a: Any, b: Any) -> None:
    """Same keys in the same order, each tensor equal in dtype, shape and every byte."""
    if isinstance(a, TensorDictBase):
        assert list(a.keys(True, True)) == list(b.keys(True, True))
        for key in a.keys(True, True):
            x, y = a.get(key), b.get(key)
            assert x.dtype == y.dtype and x.shape == y.shape, key
            assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), key
        assert a.batch_size == b.batch_size
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def both(call: Any, plain: ReplayBuffer, compact: ReplayBuffer) -> None:
    """``call`` on each buffer: the same result, or the same error class."""
    results = []
    for rb in (plain, compact):
        try:
            results.append(call(rb))
        except ReplayBufferError as exc:
            results.append(type(exc))
    if isinstance(results[0], type) or isinstance(results[1], type):
        assert results[0] == results[1]
    else:
        assert_same(*results)


def check_against_plain(
    envs: int,
    k: int,
    steps_per_env: int,
    plan: list[tuple[bool, int]],
    end_rate: float,
    zero_pad: bool,
    prioritized: bool,
    seed: int,
    folder: pathlib.Path,
    storing_device: str = "cpu",
    with_next: bool = True,
    form: str = "tensor",
    loose_ends: bool = False,
) -> None:
    """The writes of ``plan`` (``(batch?, steps)``) into a plain and a compact buffer, then every read of both.
    ``form``, ``loose_ends``: as :func:`~tests.compact.streams.one_step` and ``env_rows`` take them."""
    total = sum(n for _, n in plan)
    streams = [env_rows(total, k, seed * 10 + e, end_rate, zero_pad, loose_ends=loose_ends) for e in range(envs)]
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    common: dict[str, Any] = {"seed": seed, "num_envs": envs, "storage_dir": folder}
    plain = cls(storing_device, storing_device, steps_per_env * envs, **common)
    compact = cls(storing_device, storing_device, steps_per_env * envs, **common, **compact_kwargs(k, with_next))
    t = 0
    for batch, n in plan:
        for rb in (plain, compact):
            if batch:
                rb.add_batch(steps_of(streams, t, t + n))
            else:
                for step in range(t, t + n):
                    rb.add(one_step(streams, step, form))
        t += n
        both(lambda rb: rb.sample_all(), plain, compact)
    size = len(plain)
    both(lambda rb: rb.sample_batch(16), plain, compact)
    both(lambda rb: rb.sample_batch(16, n_step=3, gamma=0.9), plain, compact)
    both(lambda rb: rb.sample_batch(8, recent=envs), plain, compact)
    both(lambda rb: rb.sample_slices(3, 2), plain, compact)
    both(lambda rb: rb.sample_slices(2, min(3, steps_per_env), pad=True), plain, compact)
    both(lambda rb: rb.sample_by_index(list(range(size))[::-1]), plain, compact)
    both(lambda rb: rb.sample_by_index_fields([0, size - 1], ["next_state", "reward"]), plain, compact)
    both(lambda rb: list(rb.create_epoch_iterator(3, 2, shuffle=True)), plain, compact)
    if prioritized:
        for rb in (plain, compact):
            assert isinstance(rb, PrioritizedReplayBuffer)
            rb.update_priority(torch.arange(size), torch.arange(size, dtype=torch.float32) + 1)
        both(lambda rb: rb.sample_batch(12), plain, compact)
        both(lambda rb: rb.sample_batch(12, n_step=2), plain, compact)
    assert compact.nbytes > 0
    plain.close()
    compact.close()


writes = st.lists(st.tuples(st.booleans(), st.integers(1, 7)), min_size=1, max_size=6)


@settings(max_examples=int(os.environ.get("COMPACT_EXAMPLES", "80")), deadline=None)
@given(
    envs=st.sampled_from([1, 2, 3]),
    k=st.sampled_from([0, 1, 2, 4]),
    steps_per_env=st.integers(1, 6),
    plan=writes,
    end_rate=st.sampled_from([0.0, 0.2, 0.6]),
    zero_pad=st.booleans(),
    prioritized=st.booleans(),
    seed=st.integers(0, 1000),
    with_next=st.booleans(),
    form=st.sampled_from(["tensor", "numpy", "readonly", "strided"]),
    loose_ends=st.booleans(),
)
def test_every_read_matches_the_plain_buffer(
    tmp_path_factory: pytest.TempPathFactory,
    envs: int,
    k: int,
    steps_per_env: int,
    plan: list[tuple[bool, int]],
    end_rate: float,
    zero_pad: bool,
    prioritized: bool,
    seed: int,
    with_next: bool,
    form: str,
    loose_ends: bool,
) -> None:
    folder = tmp_path_factory.mktemp("compact")
    check_against_plain(
        envs,
        k,
        steps_per_env,
        plan,
        end_rate,
        zero_pad,
        prioritized,
        seed,
        folder,
        with_next=with_next,
        form=form,
        loose_ends=loose_ends,
    )


#: Fixed cases for the accelerator paths: wraps, several envs, single and batch adds, episode ends.
CASES = [
    (1, 4, 5, [(False, 9), (True, 7), (False, 3)], 0.2, False, True, 1),
    (3, 2, 3, [(True, 5), (False, 4), (True, 2)], 0.6, True, False, 2),
    (2, 0, 4, [(True, 7), (False, 5)], 0.2, False, False, 3),
    (1, 1, 2, [(False, 6), (True, 3)], 0.0, False, True, 4),
]


@pytest.mark.parametrize("case", CASES)
def test_the_accelerator_paths_match_the_plain_buffer_on_the_cpu(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, case: tuple[Any, ...]
) -> None:
    """The torch paths an accelerator storage takes, run on the CPU (NumPy paths off)."""
    monkeypatch.setattr(frame_stream, "NUMPY_ON_CPU", False)
    check_against_plain(*case, tmp_path)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", CASES)
def test_accelerator_storage_matches_the_plain_buffer(tmp_path: pathlib.Path, case: tuple[Any, ...]) -> None:
    check_against_plain(*case, tmp_path, storing_device="cuda")
