"""Every example answers ``--help`` before loading torch, gymnasium or matplotlib, and documents every option."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# Runs the example as ``__main__`` with --help; records each parser's options as it prints its help, then
# reports which heavy modules were loaded by then.
PROBE = r"""
import argparse, json, runpy, sys
seen = []
original = argparse.ArgumentParser.print_help
def print_help(self, file=None):
    seen.append([[a.option_strings, a.help] for a in self._actions if not isinstance(a, argparse._HelpAction)])
    original(self, file)
argparse.ArgumentParser.print_help = print_help
sys.argv = [sys.argv[1], "--help"]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "gymnasium", "matplotlib", "ray", "tensordict", "torchrl") if m in sys.modules)
print("PROBE" + json.dumps({"options": seen, "heavy": heavy}))
"""


def test_every_example_is_covered() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_help_answers_before_heavy_imports_and_every_option_has_help(example: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(example)], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage:" in done.stdout
    report = json.loads(done.stdout.rsplit("PROBE", 1)[1])
    assert report["heavy"] == [], f"{example.name} --help imported {report['heavy']}"
    (options,) = report["options"]
    assert options, example.name
    missing = [names for names, text in options if not text or not text.strip()]
    assert missing == [], f"{example.name}: options without help text: {missing}"
    description = done.stdout.split("\n\n")[1].rstrip()
    assert description.endswith("."), f"{example.name}: description cut mid-sentence: {description!r}"
