"""notebooks/analysis.ipynb runs without an error, executed afresh (the notebook only reads results):
as it ships, on the example sweep committed under results/, and pointed at a sweep made here, as
a user points it at their own. Each run executes a copy in tmp_path; the repository is only read.
That the committed notebook holds its outputs is checked in tests/unit/test_notebook_outputs.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from testbed.sweep import load_table, main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"

SPEC = """
name = "nb"
[base]
strategy = "mapreduce"
workload = "synthetic"
steps = 2
"workload.grad_mb" = 0.0625
"workload.compute_ms" = 1
[grid]
workers = [1, 2]
"""


def make_notebook():
    spec = importlib.util.spec_from_file_location("make_notebook", ROOT / "notebooks" / "make_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("nb")
    (root / "nb.toml").write_text(SPEC)
    assert main([str(root / "nb.toml"), "--out", str(root), "--quiet"]) == 0
    return root / "nb"


def execute_copy(tmp_path: Path, sweep: str | None = None) -> tuple[nbformat.NotebookNode, str]:
    """Execute the committed notebook, outputs cleared, as tmp_path/notebooks/analysis.ipynb, beside
    a link to the repository's results/ (so its default SWEEP_DIR resolves as in a checkout); SWEEP
    replaces that default. Raises nbclient's CellExecutionError at the first cell that fails.
    Returns the executed notebook and its printed text."""
    mk = make_notebook()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    if sweep is not None:
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1
        params[0].source, n = re.subn(r'^SWEEP_DIR = .*$', f"SWEEP_DIR = {sweep!r}", params[0].source,
                                      flags=re.M)
        assert n == 1
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "results").symlink_to(ROOT / "results", target_is_directory=True)
    copy = tmp_path / "notebooks" / NOTEBOOK.name
    nbformat.write(nb, copy)
    nb = mk.execute(nbformat.read(copy, as_version=4), cwd=copy.parent)
    nbformat.write(nb, copy)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return nb, "".join(o.get("text", "") for o in outputs)


def figure_cells(nb: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    """{source: cell} of the generator's figure cells, each found once in NB."""
    cells = {c.source: c for c in nb.cells if c.cell_type == "code"}
    sources = [code for code, _, _ in make_notebook().FIGURES]
    assert set(sources) <= set(cells)
    return {s: cells[s] for s in sources}


def test_notebook_shows_every_figure_of_the_committed_example(tmp_path):
    mk = make_notebook()
    nb, text = execute_copy(tmp_path)
    for code, _, mime in mk.FIGURES:
        cell = figure_cells(nb)[code]
        assert [o for o in cell.outputs if mime in o.get("data", {})], f"{code!r} showed no {mime}"
    table = load_table(ROOT / mk.EXAMPLE)
    assert f"{mk.EXAMPLE}: {len(table)} runs" in text
    assert "nothing to draw" not in text and "no evaluated runs" not in text


def test_notebook_runs_on_a_sweep_of_ones_own(sweep_dir, tmp_path):
    nb, text = execute_copy(tmp_path, sweep=str(sweep_dir))
    assert f"{sweep_dir}: {len(load_table(sweep_dir))} runs" in text
    # a figure cell shows its figure, or says in one line why this sweep has nothing for it
    for code, cell in figure_cells(nb).items():
        shown = [o for o in cell.outputs if o.output_type == "display_data"]
        told = [o for o in cell.outputs if o.output_type == "stream"]
        assert len(shown) + len(told) == 1, code
    # two worker counts of one strategy: the table's two main figures draw
    for code in ("show(plots.throughput_vs_workers, table)", "show(plots.step_breakdown, table)"):
        assert [o for o in figure_cells(nb)[code].outputs if "image/png" in o.get("data", {})], code
