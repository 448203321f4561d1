"""A metadata-only checkpoint (ObjectRL's ``save(path)``) carries the rate limiter's counters: a load
admits no insert burst the saved counters would not have admitted (issue 26)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.errors import CheckpointError, RateLimitTimeout
from objectrl_buffer.flow import SampleToInsertRatio
from tests.support import rows

Factory = Callable[..., ReplayBuffer]


def _limited(make_buffer: Factory) -> ReplayBuffer:
    # spi 1, fill-up 10, diff = inserts - samples kept in [6, 14]
    return make_buffer(100, rate_limiter=SampleToInsertRatio(1, 10, 4, deadlock_after_s=None))


def _at_the_limit(make_buffer: Factory) -> ReplayBuffer:
    buffer = _limited(make_buffer)
    buffer.add_batch(rows(0, 14))  # 10 free, then diff 14: at max_diff
    buffer.sample_batch(8)  # diff 6
    buffer.add_batch(rows(14, 8))  # diff 14 again: no insert is admitted until someone samples
    assert (buffer.rate_limiter.inserts, buffer.rate_limiter.samples, buffer.rate_limiter.deletes) == (22, 8, 0)
    return buffer


def _load(buffer: ReplayBuffer, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # counted rows without data (metadata only)
        buffer.load(path)


def test_metadata_only_load_restores_the_counters(make_buffer: Factory, tmp_path: Path) -> None:
    saved = _at_the_limit(make_buffer)
    saved.save(tmp_path / "run")
    fresh = _limited(make_buffer)
    _load(fresh, tmp_path / "run")
    limiter = fresh.rate_limiter
    assert (limiter.inserts, limiter.samples, limiter.deletes) == (22, 8, 0)
    with pytest.raises(RateLimitTimeout):  # the burst the limiter rules out is still ruled out
        fresh.add_batch(rows(22, 1), timeout=0.01)
    assert limiter.inserts == 22


def test_the_metadata_stays_objectrls_dict_of_ints(make_buffer: Factory, tmp_path: Path) -> None:
    _at_the_limit(make_buffer).save(tmp_path / "run")
    meta = torch.load(f"{tmp_path / 'run'}.metadata", weights_only=True)  # how ObjectRL reads it
    assert (meta["buffer_size"], meta["data_size"], meta["pointer"]) == (100, 22, 22)
    assert {k: v for k, v in meta.items() if k.startswith("extra.")} == {
        "extra.rate_limiter.inserts": 22,
        "extra.rate_limiter.samples": 8,
        "extra.rate_limiter.deletes": 0,
    }


def test_old_metadata_without_counters_loads_as_before(make_buffer: Factory, tmp_path: Path) -> None:
    torch.save({"buffer_size": 100, "data_size": 22, "pointer": 22}, f"{tmp_path / 'old'}.metadata")
    fresh = _limited(make_buffer)
    _load(fresh, tmp_path / "old")
    limiter = fresh.rate_limiter  # rows counted as inserted, diff at the ratio's centre (min_size * spi)
    assert (limiter.inserts, limiter.samples, limiter.deletes) == (22, 12, 0)


def test_bad_saved_counters_are_refused_and_change_nothing(make_buffer: Factory, tmp_path: Path) -> None:
    ring = {"buffer_size": 100, "data_size": 22, "pointer": 22}
    bad = {"extra.rate_limiter.inserts": 2, "extra.rate_limiter.samples": 0, "extra.rate_limiter.deletes": 5}
    torch.save({**ring, **bad}, f"{tmp_path / 'bad'}.metadata")
    torch.save({**ring, "extra.rate_limiter.inserts": "22"}, f"{tmp_path / 'str'}.metadata")
    fresh = _limited(make_buffer)
    for name, reason in (("bad", "deletes 5 > inserts 2"), ("str", "extra.rate_limiter.inserts must be an int")):
        with pytest.raises(CheckpointError, match=reason):
            fresh.load(tmp_path / name)
        assert (len(fresh), fresh.rate_limiter.inserts, fresh.rate_limiter.samples) == (0, 0, 0)
