"""Pinned staging for CPU storage -> CUDA samples (transfer.StagingRing).

The ring logic is tested on the CPU with pinning off (the device copy becomes a clone); the CUDA tests
check the real thing and skip cleanly without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from objectrl_buffer import ReplayBuffer
from objectrl_buffer.storage.staging import StagingRing

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def columns(rows: int = 100) -> dict[str, np.ndarray]:
    return {
        "state": np.arange(rows * 3, dtype=np.float32).reshape(rows, 3),
        "flag": np.arange(rows) % 3 == 0,
        "step": np.arange(rows, dtype=np.int64) * 10,
    }


def test_gather_delivers_rows_and_extras() -> None:
    ring = StagingRing("cpu", depth=2, pin=False)
    arrays = columns()
    idx = np.array([5, 0, 99, 5])
    out = ring.gather(arrays, idx, arrays.keys(), {"index": torch.from_numpy(idx)})
    for key, array in arrays.items():
        assert np.array_equal(out[key].numpy(), array[idx]), key
    assert out["index"].tolist() == [5, 0, 99, 5]
    contiguous = ring.gather(arrays, slice(10, 14), ["step"])
    assert contiguous["step"].tolist() == [100, 110, 120, 130]


def test_results_survive_reuse_of_the_staging_sets() -> None:
    ring = StagingRing("cpu", depth=2, pin=False)
    arrays = columns()
    results = [ring.gather(arrays, np.array([i, i + 1]), ["step"]) for i in range(6)]
    # with depth 2 every set was refilled twice: outputs must not be views of staging memory
    assert [r["step"].tolist() for r in results] == [[10 * i, 10 * i + 10] for i in range(6)]


def test_staging_grows_and_follows_a_new_layout() -> None:
    ring = StagingRing("cpu", depth=1, pin=False)
    arrays = columns()
    for k in (4, 50, 3):
        idx = np.arange(k)[::-1].copy()
        assert np.array_equal(ring.gather(arrays, idx, ["state"])["state"].numpy(), arrays["state"][idx])
    other = {"state": np.ones((10, 2, 2), dtype=np.uint8)}  # same key, new shape and dtype (after a reset)
    out = ring.gather(other, np.array([1, 2]), ["state"])
    assert out["state"].dtype == torch.uint8 and out["state"].shape == (2, 2, 2)


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError):
        StagingRing("cpu", depth=0)


def test_buffer_reads_through_staging_match_plain_reads() -> None:
    staged = ReplayBuffer("cpu", "cpu", 64, seed=3)
    plain = ReplayBuffer("cpu", "cpu", 64, seed=3)
    staged.engine.staging = StagingRing("cpu", depth=2, pin=False)
    for rb in (staged, plain):
        rb.add_batch({"state": torch.randn(80, 4, generator=torch.Generator().manual_seed(0)),
                      "step": torch.arange(80)})  # fmt: skip
    pairs = [
        (staged.sample_batch(16), plain.sample_batch(16)),
        (staged.sample_by_index_fields([3, 1], ["step"]), plain.sample_by_index_fields([3, 1], ["step"])),
        (staged.sample_all(), plain.sample_all()),
        *zip(staged.create_epoch_iterator(10), plain.create_epoch_iterator(10), strict=True),
        *zip(staged.create_epoch_iterator(9, shuffle=True), plain.create_epoch_iterator(9, shuffle=True), strict=True),
    ]
    for got, want in pairs:
        assert got.keys() == want.keys() and got.batch_size == want.batch_size
        for key in list(want.keys()):
            assert torch.equal(got[key], want[key]), key


@cuda
def test_cuda_samples_from_cpu_storage_are_correct_and_not_overwritten() -> None:
    gpu = ReplayBuffer("cuda", "cpu", 10_000, seed=0)
    ref = ReplayBuffer("cpu", "cpu", 10_000, seed=0)
    data = {"state": torch.randn(10_000, 17), "step": torch.arange(10_000)}
    gpu.add_batch(data)
    ref.add_batch(data)
    # many samples queued without synchronising: a refilled staging set must not change earlier ones
    samples = [gpu.sample_batch(4096) for _ in range(20)]
    expected = [ref.sample_batch(4096) for _ in range(20)]
    torch.cuda.synchronize()
    for got, want in zip(samples, expected, strict=True):
        assert got.device.type == "cuda" and got["state"].device.type == "cuda"
        assert torch.equal(got["index"].cpu(), want["index"])
        assert torch.equal(got["state"].cpu(), want["state"])
    batches = list(gpu.create_epoch_iterator(1000))
    torch.cuda.synchronize()
    assert torch.equal(torch.cat([b["step"] for b in batches]).cpu(), torch.arange(10_000))


@cuda
def test_cuda_sample_is_fresh_memory() -> None:
    rb = ReplayBuffer("cuda", "cpu", 100, seed=0)
    rb.add_batch({"x": torch.arange(100.0)})
    sample = rb.sample_batch(10)
    sample["x"].fill_(-1)
    assert (rb.sample_all()["x"].cpu() == torch.arange(100.0)).all()


@cuda
def test_staging_is_pinned_on_cuda() -> None:
    ring = StagingRing("cuda")
    ring.gather(columns(), np.array([1, 2]), ["state"])
    assert ring.buffers() and all(buffer.is_pinned() for buffer in ring.buffers())
