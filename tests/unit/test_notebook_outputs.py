"""The committed notebooks/analysis.ipynb is the generated one, executed on the committed example
sweep: every figure cell holds its figure, no cell an error, no output a path of the machine it
ran on. Reads files only (executing it is tests/ray/test_notebook.py's)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from testbed.analysis.results import load_table

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"


@pytest.fixture(scope="module")
def mk():
    spec = importlib.util.spec_from_file_location("make_notebook", ROOT / "notebooks" / "make_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def nb():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    return notebook


def code_cells(notebook):
    return [c for c in notebook.cells if c.cell_type == "code"]


def test_committed_notebook_is_the_generated_one(mk, nb):
    built = mk.build()
    assert nb.metadata == built.metadata
    assert [(c.cell_type, c.id, c.source, c.metadata) for c in nb.cells] == \
           [(c.cell_type, c.id, c.source, c.metadata) for c in built.cells]


def test_committed_notebook_was_executed_top_to_bottom_without_an_error(nb):
    cells = code_cells(nb)
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1))
    assert not [o for c in cells for o in c.outputs if o.output_type == "error"]


def test_every_figure_cell_holds_its_figure(mk, nb):
    cells = {c.source: c for c in code_cells(nb)}
    for code, _, mime in mk.FIGURES:
        outputs = cells[code].outputs
        assert [o for o in outputs if mime in o.get("data", {})], f"{code!r} holds no {mime}: rerun " \
            "python notebooks/make_notebook.py --execute"
        assert not [o for o in outputs if o.output_type == "stream"], f"{code!r} says it drew nothing"


def test_outputs_are_the_committed_example_and_hold_no_machine_paths(mk, nb):
    text = "".join(o.get("text", "") for c in code_cells(nb) for o in c.outputs)
    assert f"{mk.EXAMPLE}: {len(load_table(ROOT / mk.EXAMPLE))} runs" in text
    committed = json.dumps([c.outputs for c in code_cells(nb)])
    for path in {str(ROOT), str(Path.home())}:
        assert path not in committed
    assert not [c.id for c in nb.cells if "execution" in c.metadata]  # no timings to churn


def test_files_the_notebook_reads_are_committed_not_ignored(mk):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    table = load_table(ROOT / mk.EXAMPLE)
    files = [ROOT / mk.EXAMPLE / "runs.parquet"]
    files += [Path(d) / f"{kind}.parquet" for d in table["run_dir"] for kind in ("steps", "updates", "evals")]
    assert all(f.is_file() for f in files)
    names = [str(f.relative_to(ROOT)) for f in files]
    check = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, text=True,
                           input="\n".join(names), capture_output=True)
    assert check.returncode in (0, 1), check.stderr  # 0: some are ignored, 1: none is
    assert not check.stdout.split(), "ignored by .gitignore"
