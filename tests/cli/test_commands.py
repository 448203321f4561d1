"""The ``objectrl-buffer`` command: inspect (human and --json) and verify, in process and as a real command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from objectrl_buffer import PrioritizedReplayBuffer, ReplayBuffer
from objectrl_buffer.cli import commands as cli
from tests.support import data_folder, fill_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    rb = ReplayBuffer("cpu", "cpu", 8, seed=11, shuffle=True, storage_dir=tmp_path / "storage")
    fill_rows(rb, 13)
    rb.save(tmp_path / "run", data=True)
    rb.save(tmp_path / "counters")
    return tmp_path / "run"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_prints_ring_schema_format_and_creation(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "inspect", str(saved))
    assert code == 0 and err == ""
    lines = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
    assert lines["capacity"].split()[1] == "8"
    assert lines["size"].split()[1] == "8"
    assert lines["pointer"].split()[1] == "5"
    assert "format objectrl_buffer v1" in lines["metadata"] and "format v1" in lines["data"]
    assert "9 keys, 137 bytes per row" in lines["schema"]
    assert "shuffle=True" in lines["sampling"] and "initial seed 11" in lines["sampling"]
    assert "torch" in lines["created"] and "objectrl_buffer" in lines["created"]
    table = [line.split() for line in out.splitlines() if line.startswith("  ")]
    assert table[0] == ["key", "shape", "dtype", "bytes/row", "bytes"]
    assert ["frame", "(3,", "5,", "5)", "uint8", "75", "600"] in table
    assert ["terminated", "()", "bool", "1", "8"] in table


def test_inspect_json(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", "--json", f"{saved}.metadata")  # the .metadata name works too
    info = json.loads(out)
    assert code == 0
    assert (info["capacity"], info["size"], info["pointer"]) == (8, 8, 5)
    assert (info["format_version"], info["data_format_version"]) == (1, 1)
    state = next(c for c in info["schema"] if c["key"] == "state")
    assert (state["shape"], state["dtype"], state["row_bytes"], state["bytes"]) == ([4], "float32", 16, 128)
    assert info["data_bytes"] == 8 * 137 and info["data_folder"] == data_folder(saved)
    assert {"time", "host", "torch", "library_version"} <= info["created"].keys()


def test_inspect_shows_the_extras_of_a_prioritized_checkpoint(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rb = PrioritizedReplayBuffer("cpu", "cpu", 8, alpha=0.5, storage_dir=tmp_path / "storage")
    fill_rows(rb, 13)
    rb.update_priority([2], [6.5])
    rb.save(tmp_path / "per", data=True)

    code, out, _ = run(capsys, "inspect", "--json", str(tmp_path / "per"))
    info = json.loads(out)
    assert code == 0 and info["data_bytes"] == 8 * 137  # the rows; extras are counted apart
    [array] = info["extra_arrays"]
    assert {k: array[k] for k in ("name", "shape", "dtype", "bytes", "file")} == {
        "name": "prioritized.priority",
        "shape": [8],
        "dtype": "float64",
        "bytes": 64,
        "file": "extra-prioritized.priority.bin",
    }
    assert info["extra_values"] == {
        "prioritized.max_priority": 6.5,
        "prioritized.alpha": 0.5,
        "prioritized.beta": 0.4,
        "prioritized.eps": 1e-6,
    }
    code, out, _ = run(capsys, "inspect", str(tmp_path / "per"))
    extras = [line for line in out.splitlines() if line.startswith("extra ")]
    assert code == 0 and len(extras) == 2
    assert "prioritized.priority: float64 (8,), 64 B in extra-prioritized.priority.bin" in extras[0]
    assert "prioritized.max_priority=6.5" in extras[1] and "prioritized.alpha=0.5" in extras[1]
    code, out, _ = run(capsys, "verify", str(tmp_path / "per"))
    assert (
        code == 0 and "8 rows, 9 column files + 1 extra" in out
    )  # extras are checked too (see test_prioritized_checkpoint)

    code, out, _ = run(capsys, "inspect", "--json", str(saved))  # a plain buffer's checkpoint has none
    assert (json.loads(out)["extra_arrays"], json.loads(out)["extra_values"]) == ([], {})
    code, out, _ = run(capsys, "inspect", str(saved))
    assert not [line for line in out.splitlines() if line.startswith("extra")]


def test_inspect_metadata_only(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", "--json", str(saved.parent / "counters"))
    assert code == 0 and json.loads(out)["data_folder"] is None
    code, out, _ = run(capsys, "inspect", str(saved.parent / "counters"))
    assert code == 0 and "metadata-only" in out


def test_verify_intact_then_damaged(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "verify", str(saved))
    assert (code, err) == (0, "") and out.startswith("OK:") and "every crc32 matches" in out
    column = next(Path(data_folder(saved)).glob("*-state.bin"))
    data = bytearray(column.read_bytes())
    data[5] ^= 0x10
    column.write_bytes(bytes(data))
    code, out, err = run(capsys, "verify", str(saved))
    assert code == 1 and out == ""
    assert "FAILED" in err and "checksum mismatch" in err and str(column) in err
    code, _, _ = run(capsys, "inspect", str(saved))  # inspect does not read the rows: still fine
    assert code == 0


def test_verify_missing_and_truncated(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "verify", str(saved.parent / "nothing"))
    assert code == 1 and "no buffer checkpoint" in err
    column = next(Path(data_folder(saved)).glob("*-frame.bin"))
    column.write_bytes(column.read_bytes()[:10])
    for command in ("verify", "inspect"):
        code, _, err = run(capsys, command, str(saved))
        assert code == 1 and "truncated" in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["frobnicate", "x"], ["verify"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2


def test_console_script_is_declared() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["objectrl-buffer"].partition(":")
    assert module == "objectrl_buffer.cli" and function == "main" and callable(cli.main)


def test_as_a_real_command(saved: Path) -> None:
    """``python -m objectrl_buffer`` in a fresh process: the exit code and streams a shell sees."""
    column = next(Path(data_folder(saved)).glob("*-step.bin"))
    column.write_bytes(column.read_bytes()[::-1])  # same size, other bytes
    result = subprocess.run(
        [sys.executable, "-m", "objectrl_buffer", "verify", str(saved)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert "checksum mismatch" in result.stderr and "Traceback" not in result.stderr


# ---------------------------------------------------------------- a quick start: --help and --version without torch
PROBE = """
import runpy, sys
sys.argv = ["objectrl-buffer", *sys.argv[1:]]
try:
    runpy.run_module("objectrl_buffer", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print("EXIT", code, "TORCH", "torch" in sys.modules, "NUMPY", "numpy" in sys.modules)
"""


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["inspect", "--help"]])
def test_help_and_version_do_not_import_torch(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    last = done.stdout.strip().splitlines()[-1]
    assert last == "EXIT 0 TORCH False NUMPY False", done.stdout + done.stderr


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"objectrl-buffer {version('objectrl_buffer')}\n"
    import objectrl_buffer

    assert objectrl_buffer.__version__ == version("objectrl_buffer")  # pyproject.toml and the package agree


def test_the_package_imports_its_classes_on_first_use() -> None:
    code = (
        "import sys, objectrl_buffer as o; a = 'torch' in sys.modules; o.ReplayBuffer; print(a, 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["False", "True"]
