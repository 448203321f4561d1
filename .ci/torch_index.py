#!/usr/bin/env python3
"""Print the pip arguments that install torch for `make` (stdout, one line); say what and why on stderr.

PyPI's `torch` for Linux is the CUDA build: it pulls gigabytes of nvidia-* wheels onto a machine
without a GPU. PyTorch's own CPU index serves the CPU build of the same version. Which one is used is
chosen by TORCH_INDEX (the Makefile passes it; `make TORCH_INDEX=... setup`):

  auto   (the default) PyTorch's CPU index, $TORCH_CPU_INDEX (https://download.pytorch.org/whl/cpu),
         when it answers within 5 s; else the plain pin below (a machine that reaches only PyPI or a
         local mirror, as CI does).
  ""     (empty) the plain pin only: `-c .ci/constraints-cpu.txt`, torch from the configured indexes.
  a URL  that index, without probing: https://download.pytorch.org/whl/cu126 installs a CUDA build.

Every choice keeps the version pins of .ci/constraints-cpu.txt (torch==2.13.0 matches 2.13.0+cpu).
Standard library only: it runs with the system Python before the virtual environment exists.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

CONSTRAINTS = ".ci/constraints-cpu.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TIMEOUT_S = 5.0


def reachable(index: str) -> bool:
    """Whether ``index`` answers for torch (``<index>/torch/``, a PEP 503 page) within :data:`TIMEOUT_S`."""
    try:
        with urllib.request.urlopen(index.rstrip("/") + "/torch/", timeout=TIMEOUT_S) as response:
            return 200 <= response.status < 300
    except (OSError, ValueError):  # URLError, timeouts, refused connections, HTTP errors, bad URLs
        return False


def choose(setting: str, cpu_index: str) -> tuple[list[str], str]:
    """``(pip arguments, what is installed in words)`` for a ``TORCH_INDEX`` value."""
    plain = ["-c", CONSTRAINTS]
    setting = setting.strip()
    if not setting:
        return plain, "torch as pinned in .ci/constraints-cpu.txt, from pip's configured indexes (TORCH_INDEX is empty)"
    if setting != "auto":
        return [*plain, "--index-url", setting], f"torch from {setting} (TORCH_INDEX)"
    if reachable(cpu_index):
        return [*plain, "--index-url", cpu_index], f"the CPU build of torch from {cpu_index}"
    return plain, (
        f"torch as pinned in .ci/constraints-cpu.txt, from pip's configured indexes: {cpu_index} is not "
        "reachable (on a machine that reaches PyPI, that is the CUDA build: set TORCH_INDEX to a CPU index)"
    )


def main() -> int:
    args, what = choose(os.environ.get("TORCH_INDEX", "auto"), os.environ.get("TORCH_CPU_INDEX", CPU_INDEX))
    print(f"installing {what}", file=sys.stderr)
    print(" ".join(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
