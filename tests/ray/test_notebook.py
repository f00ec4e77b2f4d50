"""notebooks/analysis.ipynb executes against a small sweep made here (it only reads results)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from testbed.sweep import main

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


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("nb")
    (root / "nb.toml").write_text(SPEC)
    assert main([str(root / "nb.toml"), "--out", str(root), "--quiet"]) == 0
    return root / "nb"


def test_notebook_runs_on_a_sweep(sweep_dir):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    params[0].source = f"SWEEP_DIR = {str(sweep_dir)!r}"
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # throughput, step breakdown, loss curves at least
    text = "".join(o.get("text", "") for o in outputs)
    assert f"{sweep_dir}: 2 runs" in text


def test_committed_notebook_is_outputs_free_and_generated():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code")
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_notebook", ROOT / "notebooks" / "make_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert nbformat.writes(module.build()).rstrip("\n") == NOTEBOOK.read_text().rstrip("\n")
