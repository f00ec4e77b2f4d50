"""Values refused before Ray with one line that names the value and the fix: limits said, the
example that fits the flag, paths too long for the file system, a target that can never be
measured, a negative size given as `--sizes -4KiB`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from testbed.config.checks import integer, real
from testbed.config.validate import NAME_MAX
from tests.unit.test_cli_errors import FAST_S, run_cli


def _bench(args, cwd):
    proc = subprocess.run([sys.executable, "-m", "testbed.bench", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    return proc.returncode, proc.stdout, proc.stderr


def test_a_value_past_the_upper_limit_is_told_the_limit():
    high = 4096
    assert integer(1, high, "use a positive number")(high + 1) == f"at most {high}; use a positive number"
    assert integer(1, high, "use a positive number")(0) == "use a positive number"
    assert real(1, 1e5, fix="use a factor >= 1")(1e9) == f"at most {1e5:g}; use a factor >= 1"


@pytest.mark.parametrize(("args", "needles"), [
    (["--dilation", "1e9", "--bandwidth", "1Gbit", "--workload", "synthetic"], ["--dilation", "at most"]),
    (["--width", "100000", "--workload", "resnet"], ["--width 100000", "at most"]),
    (["--eval-every", "0", "--target-loss", "0.5"], ["--eval-every 0", "--target-loss", "drop"]),
    (["--out", "x" * (NAME_MAX + 1)], ["--out", f"{NAME_MAX + 1} bytes", "shorter --out"]),
    (["--out", os.sep.join(["y" * (NAME_MAX // 2)] * (os.pathconf("/", "PC_PATH_MAX") // (NAME_MAX // 2)))],
     ["--out", "the path is", "shorter --out"]),
])
def test_run_refuses_with_one_line_before_ray(tmp_path, args, needles):
    code, out, err, took = run_cli(args, tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert all(n in lines[0] for n in needles), lines[0]
    assert took < FAST_S and not out


def test_a_sweep_name_too_long_for_a_folder_is_one_line(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(f'name = "{"n" * (NAME_MAX + 45)}"\n[base]\nworkload = "synthetic"\nsteps = 1\n'
                    '[grid]\nstrategy = ["ring"]\nworkers = [2]\n')
    proc = subprocess.run([sys.executable, "-m", "testbed.sweep", str(spec), "--out", str(tmp_path / "o")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "Errno" not in lines[0] and f"{NAME_MAX + 45} characters" in lines[0] and "shorter name" in lines[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("args", "needles"), [
    (["startup", "--cases", ""], ["--cases ''", "e.g. default,synthetic:"]),
    (["network", "--sizes", "-4KiB"], ["--sizes '-4KiB'", "e.g."]),
    (["network", "--sizes", "-4KiB,8KiB"], ["--sizes '-4KiB'"]),
])
def test_bench_refuses_with_the_rule_of_its_own_flag(tmp_path, args, needles):
    code, out, err = _bench(args, tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "expected one argument" not in lines[0] and all(n in lines[0] for n in needles), lines[0]
    assert "4KB,64MB" not in lines[0] or "--sizes" in lines[0]
