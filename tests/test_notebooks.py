"""The notebooks run top to bottom, so they never rot."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def plots(notebook: nbformat.NotebookNode) -> list[str]:
    """The source of the cell behind each PNG output of ``notebook``, in order."""
    return [
        cell.source for cell in notebook.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    shipped = plots(notebook)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [out for cell in notebook.cells for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    assert not errors
    assert plots(notebook) == shipped  # the run draws every plot the notebook ships with, none left from old runs


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_ships_with_its_outputs_and_stays_small(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.get("execution_count") for cell in code), "execute it and save it with its outputs"
    outputs = [out for cell in code for out in cell.get("outputs", [])]
    assert not [out for out in outputs if out.get("output_type") == "error" or out.get("name") == "stderr"]
    if path.name == "quickstart.ipynb":
        assert sum("image/png" in out.get("data", {}) for out in outputs) >= 3  # the plots read on GitHub
    assert path.stat().st_size < 300_000


def test_quickstart_plots_the_buffer_and_shows_a_vector_env() -> None:
    source = "\n".join(cell.source for cell in nbformat.read(NOTEBOOKS[0].parent / "quickstart.ipynb", 4).cells)
    for shown in ("fill level", "recent=200", "importance weight", "gym.make_vec(", "num_envs=4"):
        assert shown in source, shown


def test_async_notebook_plots_the_buffers_state_over_time() -> None:
    (plot,) = plots(nbformat.read(NOTEBOOKS[0].parent / "async_buffer.ipynb", 4))
    for shown in (".size", ".ready(", ".consumed_ids()", "BufferFull", "max_size=8", "plt.show()"):
        assert shown in plot, shown
