"""Env streams of stacked pixel-like observations for the compact storage tests (tiny frames, fast)."""

from __future__ import annotations

from typing import Any

import torch

FRAME = (2, 3)  # a tiny "image": the storage does not care about its size


def env_rows(
    steps: int,
    k: int,
    seed: int,
    end_rate: float = 0.2,
    zero_pad: bool = False,
    frame_shape: tuple[int, ...] = FRAME,
    loose_ends: bool = False,
) -> list[dict[str, Any]]:
    """``steps`` transitions of one env: ``state``/``next_state`` stacks of ``k`` frames (no stack axis for
    ``k == 0``), episode ends at random (terminated or truncated), reset padding repeated or zeros.
    ``loose_ends``: a row that ends an episode has a ``next_state`` of fresh frames (not its stack moved
    on by one frame), which the claims allow there."""
    g = torch.Generator().manual_seed(seed)

    def frame() -> torch.Tensor:
        return torch.randint(0, 256, frame_shape, generator=g, dtype=torch.uint8)

    rows: list[dict[str, Any]] = []
    stack: torch.Tensor | None = None
    depth = max(k, 1)
    for _ in range(steps):
        if stack is None:
            first = frame()
            pad = torch.zeros_like(first) if zero_pad else first
            stack = torch.stack([*([pad] * (depth - 1)), first])
        nxt = torch.cat([stack[1:], frame().unsqueeze(0)])
        draw = float(torch.rand(1, generator=g))
        terminated, truncated = draw < end_rate / 2, end_rate / 2 <= draw < end_rate
        if loose_ends and (terminated or truncated):
            nxt = torch.stack([frame() for _ in range(depth)])
        rows.append(
            {
                "state": stack if k else stack[0],
                "next_state": nxt if k else nxt[0],
                "action": torch.randint(0, 4, (1,), generator=g),
                "reward": torch.rand(1, generator=g),
                "terminated": torch.tensor([terminated]),
                "truncated": torch.tensor([truncated]),
            }
        )
        stack = None if terminated or truncated else nxt
    return rows


def steps_of(envs: list[list[dict[str, Any]]], t0: int, t1: int) -> dict[str, torch.Tensor]:
    """Steps ``t0 .. t1-1`` of every env as one ``add_batch`` argument: ``[T]`` for one env, else ``[T, E]``."""
    keys = envs[0][0].keys()
    if len(envs) == 1:
        return {key: torch.stack([envs[0][t][key] for t in range(t0, t1)]) for key in keys}
    return {key: torch.stack([torch.stack([env[t][key] for env in envs]) for t in range(t0, t1)]) for key in keys}


def one_step(envs: list[list[dict[str, Any]]], t: int, form: str = "tensor") -> dict[str, Any]:
    """Step ``t`` as one ``add`` argument: a row for one env, else ``[E]`` rows. ``form`` (one env): how the
    observations come, ``"tensor"``, ``"numpy"`` (arrays), ``"readonly"`` (arrays that are not writeable) or
    ``"strided"`` (tensors that are not contiguous)."""
    if len(envs) == 1:
        row = dict(envs[0][t])
        for key in ("state", "next_state"):
            if form in ("numpy", "readonly"):
                row[key] = row[key].numpy().copy()
                row[key].flags.writeable = form == "numpy"
            elif form == "strided":
                row[key] = row[key].transpose(-1, -2).contiguous().transpose(-1, -2)
        return row
    return {key: torch.stack([env[t][key] for env in envs]) for key in envs[0][0]}
