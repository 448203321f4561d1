"""Episode ends given as Python numbers (0-d keys), one ``add`` per env step: what a gymnasium loop writes.

The per-step fast path reads ``terminated``/``truncated`` from its one-row scratch; a 0-d key must be read
from the scratch itself (a view), not from a copy taken when the scratch was built, or every episode end
after the first write is missed and the next episode's first row is refused.
"""

from __future__ import annotations

import pytest
import torch

from objectrl_buffer import ReplayBuffer
from tests.support import assert_td_equal

COMPACT = {"next_of": {"next_state": "state"}, "frame_stack": {"state": 4}}


def gym_rows(lengths: list[int], end_key: str) -> list[dict[str, object]]:
    """Episodes of ``lengths`` steps: uint8[4, 2, 3] stacks (reset frame repeated), scalars as Python numbers."""
    g = torch.Generator().manual_seed(0)
    rows: list[dict[str, object]] = []
    for length in lengths:
        frames = [torch.randint(0, 256, (2, 3), generator=g, dtype=torch.uint8)] * 4
        for t in range(length):
            state = torch.stack(frames)
            frames = [*frames[1:], torch.randint(0, 256, (2, 3), generator=g, dtype=torch.uint8)]
            last = t == length - 1
            rows.append({"state": state, "next_state": torch.stack(frames), "action": t, "reward": 1.0,
                         "terminated": float(last and end_key == "terminated"),
                         "truncated": float(last and end_key == "truncated")})  # fmt: skip
    return rows


@pytest.mark.parametrize("end_key", ["terminated", "truncated"])
def test_python_number_episode_ends_split_episodes_per_step(end_key: str) -> None:
    rows = gym_rows([5, 3, 7, 2], end_key)
    compact = ReplayBuffer("cpu", "cpu", 12, seed=0, **COMPACT)  # 17 rows into 12 slots: the ring wraps
    plain = ReplayBuffer("cpu", "cpu", 12, seed=0)
    for row in rows:
        compact.add(row)
        plain.add(row)

    assert_td_equal(compact.sample_all(), plain.sample_all())
    assert_td_equal(compact.sample_batch(8), plain.sample_batch(8))
