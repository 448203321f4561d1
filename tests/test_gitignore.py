"""What the README's and the docs' code writes into the working folder (checkpoints, storage folders) is
ignored by git, so following the quickstart in a clone leaves ``git status`` clean (issue 24)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# save("x"), save_checkpoint("x"), storage_dir="x", save_path="x" in the pages' code
WRITES = re.compile(r"""(?:\.save|save_checkpoint)\(\s*["']([^"']+)["']|(?:storage_dir|save_path)=["']([^"']+)["']""")


def written_names() -> set[str]:
    found = {"replay"}  # the quickstart's rb.save("replay", data=True), whatever the pages say now
    for page in PAGES:
        for match in WRITES.finditer(page.read_text()):
            name = match.group(1) or match.group(2)
            if not name.startswith(("/", "~")):  # relative: lands in the working folder
                found.add(name)
    return found


def ignored(paths: list[str]) -> set[str]:
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    return set(done.stdout.splitlines())


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_what_the_pages_write_is_ignored() -> None:
    names = sorted(written_names())
    # a ReplayBuffer checkpoint (NAME.metadata + NAME.data-<id>/), or a room's folder (NAME/...)
    as_checkpoint = {n: [f"{n}.metadata", f"{n}.data-0123abcd/000-state.bin"] for n in names}
    as_folder = {n: [f"{n}/metadata.json"] for n in names}
    hits = ignored([p for group in (as_checkpoint, as_folder) for n in names for p in group[n]])
    not_ignored = [n for n in names if not (set(as_checkpoint[n]) <= hits or set(as_folder[n]) <= hits)]
    assert not_ignored == [], f"add these to .gitignore (or write them under runs/): {not_ignored}"
    assert "run.agent.pt" in ignored(["run.agent.pt"])  # the main job's --save NAME learner file
    assert not ignored(["tests/fixtures/v1/replay.metadata"])  # fixtures stay tracked
