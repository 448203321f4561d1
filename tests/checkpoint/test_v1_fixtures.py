"""Checkpoints written by the code before the package was split into folders still load, exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer

V1 = Path(__file__).resolve().parent.parent / "fixtures" / "v1"


def test_a_v1_replay_checkpoint_loads_rows_ring_and_generator() -> None:
    rb = ReplayBuffer.from_checkpoint(V1 / "replay")
    assert (rb.buffer_size, rb.data_size, rb.pointer) == (8, 8, 3)
    rows = rb.sample_all()  # oldest first: steps 3 .. 10 of the 11 written
    assert rows["step"].tolist() == list(range(3, 11))
    assert torch.equal(rows["state"], torch.arange(3, dtype=torch.float32) + torch.arange(3, 11)[:, None])
    assert rows["action"].tolist() == [[i % 2] for i in range(3, 11)]
    assert rows["terminated"].tolist() == [float(i % 4 == 3) for i in range(3, 11)]
    assert rb.sample_batch(4)["index"].tolist() == [2, 0, 1, 3]  # the saved generator's next draw
    rb.close()


def test_a_v1_metadata_only_checkpoint_restores_the_counters() -> None:
    rb = ReplayBuffer("cpu", "cpu", 8)
    with pytest.warns(RuntimeWarning, match="metadata-only"):  # 8 rows counted, none held
        rb.load(V1 / "counters")
    assert (rb.buffer_size, len(rb), rb.pointer) == (8, 8, 3)
    rb.close()


def test_a_v1_prioritized_checkpoint_keeps_priorities_and_settings() -> None:
    per = PrioritizedReplayBuffer.from_checkpoint(V1 / "prioritized")
    assert (per.alpha, per.beta, per.eps) == (0.7, 0.5, 1e-3)
    assert per.priorities().tolist() == [0.5, 2.0, 3.0, 1.0, 1.0, 1.0]
    assert per.max_priority == 3.0
    assert per.sample_batch(4)["index"].tolist() == [2, 4, 0, 5]
    per.close()
