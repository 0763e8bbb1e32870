"""The cross-run reuse notebook executes end to end (nbclient); any failing cell fails the test."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "cross_run_reuse.ipynb"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook, executed once headless (the kernel's own default backend, as in CI)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    path = tmp_path_factory.mktemp("nb")
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path)}}).execute()
    return nb


def test_cross_run_reuse_notebook_executes(executed):
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "rollouts" in text and "prompt/run pairs" in text


def test_every_plot_cell_renders_an_image_when_executed_headless(executed):
    """No backend that swallows figures (``matplotlib.use("Agg")``): each plotting cell shows a PNG."""
    plot_cells = [c for c in executed.cells if c.cell_type == "code" and "plt.subplots" in c.source]
    assert len(plot_cells) >= 7  # reward, lag at replay, zero variance, truncation, length, pass rate, reuse
    for cell in plot_cells:
        kinds = {k for o in cell.get("outputs", []) for k in o.get("data", {})}
        assert "image/png" in kinds, cell.source.splitlines()[0]
