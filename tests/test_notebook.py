"""The cross-run reuse notebook executes end to end (nbclient); any failing cell fails the test.

It runs headless in one kernel under three parameter sets, as a user would set its first cell:
``LAKE = None`` (the notebook builds its 3-run demo lake), and a lake of 6 runs x 60 policy versions
(small rows) with ``RUN_DIRS = {}`` and (the setup and the one cell that reads it) with one run directory. Every figure it draws is recorded (an
injected first cell wraps ``plt.figure``) and checked by an injected last cell: titled, every axis
labelled with a unit in brackets, and readable at that size (few legend entries and tick labels per
axes, heatmaps of bounded width). CI's check that each plot cell renders a PNG stays.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pyarrow as pa
import pytest
from nbclient import NotebookClient

import lakebuffer as lb

# ~25 s of notebook kernels: `make test-slow` runs them (and the wheel check executes the notebook too)
pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "cross_run_reuse.ipynb"
PLOTS = 7  # reward, lag at replay (or version gap), zero variance, truncation, length, pass rate, reuse
RUNS, VERSIONS = 6, 60

RECORD = """import matplotlib.pyplot as _plt
_FIGURES, _figure = [], getattr(_plt.figure, "__wrapped__", _plt.figure)  # one wrapper, however many runs
def _recording_figure(*args, **kwargs):
    fig = _figure(*args, **kwargs)
    _FIGURES.append(fig)
    return fig
_recording_figure.__wrapped__ = _figure
_plt.figure = _recording_figure"""

DESCRIBE = """import json as _json
def _describe(fig):  # the inline backend drew each figure when its cell ended: its tick labels are set
    sup = lambda name: (getattr(fig, name, None) and getattr(fig, name).get_text()) or ""
    axes = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        colorbar = ax.get_label() == "<colorbar>"
        axes.append({"colorbar": colorbar, "title": ax.get_title(),
                     "xlabel": "" if colorbar else ax.get_xlabel() or sup("_supxlabel"),
                     "ylabel": ax.get_ylabel() or ("" if colorbar else sup("_supylabel")),
                     "legend": len(ax.get_legend().get_texts()) if ax.get_legend() else 0,
                     "xticks": sum(1 for t in ax.get_xticklabels() if t.get_text() and t.get_visible()),
                     "image_columns": max([im.get_array().shape[1] for im in ax.get_images()] or [0])})
    return {"suptitle": sup("_suptitle"), "axes": axes}
print("FIGURES=" + _json.dumps([_describe(f) for f in _FIGURES]))"""


def _small_lake(root: Path, runs: int = RUNS, versions: int = VERSIONS, replay_runs: int = 1) -> tuple[str, dict]:
    """``runs`` runs of ``versions`` policy versions, 16 rows (2 GRPO groups) each; the first
    ``replay_runs`` runs replay the last 3 versions at every version (their directories returned)."""
    lake, dirs = str(root / "lake"), {}
    rng = np.random.default_rng(0)
    n = versions * 16
    for r in range(runs):
        run = f"run-{r}"
        version = np.repeat(np.arange(versions), 16)
        lens = rng.integers(4, 24, n)
        off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        toks = pa.ListArray.from_arrays(pa.array(off), pa.array(rng.integers(0, 100, off[-1], dtype=np.int32)))
        solved = rng.random(n) < 0.2 + 0.6 * version / versions
        with lb.ReplayBuffer.open(root / run, lake=lake, run_id=run, memory_limit_mb=8, snapshot_interval_s=0) as buf:
            buf.push({"prompt_id": [f"p{(i // 8) % 50}" for i in range(n)], "group_id": [f"{run}-g{i // 8}" for i in range(n)],
                      "policy_version": version, "prompt_ids": toks, "response_ids": toks,
                      "reward": solved.astype(np.float32), "verified": solved})
            if r < replay_runs:
                for v in range(2, versions):
                    buf.set_policy_version(v)
                    buf.sample(8, where=f"policy_version BETWEEN {v - 2} AND {v}", seed=v)
                dirs[run] = str(root / run)
            buf.snapshot(wait=True)
    return lake, dirs


def _parameterised(lake: str | None, run_dirs: dict | None, only_lag: bool = False) -> nbformat.NotebookNode:
    """The notebook with these parameters, the recording cell after them and the describing cell last;
    ``only_lag``: just the setup and the policy-lag cell (the only one that reads ``RUN_DIRS``)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    params = nb.cells[code[0]]
    assert params.source.lstrip().startswith("# Parameters"), "the notebook's first code cell holds its parameters"
    if lake is not None:
        params.source += f"\nLAKE = {lake!r}\nRUN_DIRS = {run_dirs!r}"
    if only_lag:
        nb.cells = nb.cells[: code[1] + 1] + [c for c in nb.cells if "RUN_DIRS.values()" in c.source]
    nb.cells.insert(code[0] + 1, nbformat.v4.new_code_cell(RECORD))
    nb.cells.append(nbformat.v4.new_code_cell(DESCRIBE))
    return nb


def _execute(root: Path, cases: dict) -> dict:
    """The notebook executed headless (the kernel's own default backend, as in CI) under each parameter
    set, in one kernel (``%reset -f`` between runs): {name: (notebook, figure descriptions)}. With one
    run directory only the cell that reads ``RUN_DIRS`` runs (the others are the no-run-directory case's)."""
    out = {}
    client = NotebookClient(nbformat.v4.new_notebook(), timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(root)}})
    with client.setup_kernel():
        for name, (lake_url, run_dirs, only_lag) in cases.items():
            nb = _parameterised(lake_url, run_dirs, only_lag)
            client.nb = nb
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
            text = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []) if o.get("output_type") == "stream")
            out[name] = (nb, json.loads(text.split("FIGURES=", 1)[1]))
            reset = nbformat.v4.new_code_cell("%reset -f")
            client.nb = nbformat.v4.new_notebook(cells=[reset])
            client.execute_cell(reset, 0)
    return out


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """6 runs x 60 versions, without and with one run directory (make test: ~10 s)."""
    root = tmp_path_factory.mktemp("nb")
    lake, dirs = _small_lake(root / "many")
    return _execute(root, {"many_runs_no_run_dirs": (lake, {}, False), "many_runs_one_run_dir": (lake, dirs, True)})


@pytest.fixture(scope="module")
def executed_demo(tmp_path_factory):
    """``LAKE = None``: the notebook builds its own 3-run lake (slow: ~6 s more; CI's wheel check runs it too)."""
    root = tmp_path_factory.mktemp("nb-demo")
    return _execute(root, {"demo": (None, None, False)})


def _outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def test_cross_run_reuse_notebook_executes(executed):
    for name, (nb, _) in executed.items():
        outputs = _outputs(nb)
        assert not [o for o in outputs if o.get("output_type") == "error"], name
        text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        assert "rollouts" in text and (name == "many_runs_one_run_dir" or "prompt/run pairs" in text), name
    none_text = "".join(o.get("text", "") for o in _outputs(executed["many_runs_no_run_dirs"][0]) if "text" in o)
    assert "RUN_DIRS is empty" in none_text and f"{RUNS * VERSIONS * 16} rollouts" in none_text


def test_every_plot_cell_renders_an_image_when_executed_headless(executed):
    """No backend that swallows figures (``matplotlib.use("Agg")``): each plotting cell shows a PNG."""
    for name, (nb, _) in executed.items():
        plot_cells = [c for c in nb.cells if c.cell_type == "code" and re.search(r"^fig, ", c.source, re.M)]
        assert len(plot_cells) == (1 if name == "many_runs_one_run_dir" else PLOTS), name
        for cell in plot_cells:
            kinds = {k for o in cell.get("outputs", []) for k in o.get("data", {})}
            assert "image/png" in kinds, (name, cell.source.splitlines()[0])


UNIT = re.compile(r"\(.+\)\s*$")


@pytest.mark.slow
def test_the_demo_notebook_executes_renders_and_titles_every_plot(executed_demo):
    test_every_plot_cell_renders_an_image_when_executed_headless(executed_demo)
    _check_figures(executed_demo, "demo")
    nb, _ = executed_demo["demo"]
    text = "".join(o.get("text", "") for o in _outputs(nb) if o.get("output_type") == "stream")
    assert not [o for o in _outputs(nb) if o.get("output_type") == "error"]
    assert "['run-a', 'run-b', 'run-c'] 4608 rollouts" in text and "prompt/run pairs" in text


@pytest.mark.parametrize("case", ["many_runs_no_run_dirs", "many_runs_one_run_dir"])
def test_every_figure_is_titled_labelled_with_units_and_readable(executed, case):
    _check_figures(executed, case)


def _check_figures(executed: dict, case: str) -> None:
    _, figures = executed[case]
    assert len(figures) == (1 if case == "many_runs_one_run_dir" else PLOTS)
    for fig in figures:
        plots = [a for a in fig["axes"] if not a["colorbar"]]
        title = fig["suptitle"] or (plots[0]["title"] if len(plots) == 1 else "")
        assert title, f"a figure without a title: {fig}"
        for ax in fig["axes"]:
            for label in ("ylabel",) if ax["colorbar"] else ("xlabel", "ylabel"):
                assert UNIT.search(ax[label]), f"{title}: {label} {ax[label]!r} names no unit in brackets"
            assert ax["legend"] <= 4, f"{title}: {ax['legend']} legend entries on one axes"
            assert ax["xticks"] <= 12, f"{title}: {ax['xticks']} x tick labels on one axes"
            assert ax["image_columns"] <= 30, f"{title}: a heatmap {ax['image_columns']} columns wide"
    panels = [len([a for a in f["axes"] if not a["colorbar"]]) for f in figures]
    if case == "many_runs_no_run_dirs":  # 6 runs: small multiples, one panel per run
        assert panels == [RUNS] * PLOTS
    elif case == "many_runs_one_run_dir":  # lag at replay of the one run directory given
        assert panels == [1] and figures[0]["axes"][0]["title"].startswith("Policy lag at replay")
