"""One version everywhere: ``objectrl_buffer.__version__``, pyproject.toml's ``version`` and the newest
release of CHANGELOG.md (Keep a Changelog: ``## [X.Y.Z] - YYYY-MM-DD`` under ``## [Unreleased]``)."""

from __future__ import annotations

import re
from pathlib import Path

import objectrl_buffer

ROOT = Path(__file__).resolve().parents[1]
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def releases() -> list[tuple[str, str]]:
    return RELEASE.findall((ROOT / "CHANGELOG.md").read_text())


def test_version_matches_pyproject_and_the_newest_changelog_release() -> None:
    # tomllib is Python 3.11+ (the package supports 3.10): the one line of [project] that holds the version
    (project,) = re.findall(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    newest, _ = releases()[0]
    assert objectrl_buffer.__version__ == project == newest


def test_changelog_keeps_the_format() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## .*$", text, re.MULTILINE)
    assert headings[0] == "## [Unreleased]"
    assert len(headings) == 1 + len(releases())  # every other section is a dated release
    versions = [tuple(int(x) for x in v.split(".")) for v, _ in releases()]
    dates = [d for _, d in releases()]
    assert versions == sorted(versions, reverse=True) and dates == sorted(dates, reverse=True)  # newest first
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[2:]:
        kinds = re.findall(r"^### (.*)$", section, re.MULTILINE)
        assert kinds and set(kinds) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds
