"""A run's stderr holds the run's own lines: a diverging model (--lr 1e6) overflows in the
held-out evaluation, and numpy's warnings about it stay off stderr (the loss is recorded as it
is and divergence is --on-nan's to judge)."""

import json
from pathlib import Path

from testbed.run import main


def test_a_diverging_run_says_one_line_and_no_numpy_warning(tmp_path, capfd):
    code = main(["--lr", "1e6", "--eval-every", "1", "--out", str(tmp_path), "--quiet"])
    out, err = capfd.readouterr()
    assert code == 4, err
    assert err.strip().splitlines() == [line for line in err.strip().splitlines()
                                        if line.startswith("testbed.run: ")], err
    assert "RuntimeWarning" not in err and len(err.strip().splitlines()) == 1
    summary = json.loads((Path(out.strip().splitlines()[-1]) / "summary.json").read_text())
    assert summary["status"] == "diverged"
