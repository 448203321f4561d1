"""prefault: pre-mapping pages keeps every byte, touches only whole pages inside the tensor, never fails loudly."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch

from objectrl_buffer.storage import prefault


@pytest.mark.parametrize(("start", "stop"), [(0, 1 << 20), (123, 50_000), (4096, 8192), (10, 20), (0, 0)])
def test_populate_keeps_contents_of_any_slice(start: int, stop: int) -> None:
    data = torch.from_numpy(np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8))
    before = data.clone()
    prefault.populate_write(data[start:stop])
    assert torch.equal(data, before)


def test_populate_reports_what_it_did() -> None:
    big = torch.zeros(4 * mmap.PAGESIZE, dtype=torch.uint8)
    assert prefault.populate_write(big[:10]) is False  # no whole page inside 10 bytes
    assert prefault.populate_write(big.view(torch.uint8)[::2]) is False  # not contiguous
    assert prefault.populate_write(torch.zeros(0)) is False


def test_populate_all_keeps_contents_and_handles_odd_tensors() -> None:
    rng = np.random.default_rng(1)
    tensors = [torch.from_numpy(rng.standard_normal((3000, 17)).astype(np.float32)) for _ in range(3)]
    tensors.append(torch.arange(10).reshape(2, 5).t())  # not contiguous: skipped
    before = [t.clone() for t in tensors]
    prefault.populate_all(tensors, chunk_bytes=40_000, workers=2)
    prefault.populate_all(tensors[:1], workers=1)
    assert all(torch.equal(a, b) for a, b in zip(tensors, before, strict=True))


def test_prefault_ahead_stays_a_few_pieces_ahead_and_drops_the_rest_on_close(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    done: list[int] = []
    lock = threading.Lock()
    pieces = [torch.full((16,), i, dtype=torch.uint8) for i in range(40)]

    def record(piece: torch.Tensor) -> bool:
        with lock:
            done.append(int(piece[0]))
        return True

    monkeypatch.setattr(prefault, "populate_write", record)
    with prefault.PrefaultAhead(pieces, workers=2, ahead=3) as ahead:
        for i in range(5):
            ahead.wait(i)
            assert i in done  # piece i is mapped before the writer gets it
            assert max(done) <= i + 3  # and the workers never run more than 3 pieces ahead
    # the writer stopped at piece 4 (as a failed load does): nothing beyond what was queued ran
    assert sorted(done) == list(range(max(done) + 1)) and max(done) <= 4 + 3
