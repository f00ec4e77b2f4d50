"""Sweeps: a grid of runs from a TOML spec, its table and figures, and the regression check.

    python -m testbed.sweep SPEC.toml [--check | --update-baseline]   (cli.py)

    cli.py      the command line and its signal policy
    spec.py     the spec: load, validate, expand into points (pure)
    runner.py   run the points through testbed.session, resume, tables and figures
    check.py    compare a sweep's curves with a saved baseline

The library's names (`from testbed.sweep import load_table, run_tables, main`) load on first use,
so importing the package costs nothing until one is asked for.
"""

from __future__ import annotations

from typing import Any

LIBRARY = frozenset({"SWEEP_OWNED", "Point", "Spec", "applies", "build_table", "config_keys", "expand",
                     "flat_config", "load_spec", "load_table", "read_points", "run_point", "run_tables",
                     "spec_dict"})


def __getattr__(name: str) -> Any:
    if name == "main":
        from testbed.sweep.cli import main

        return main
    if name in LIBRARY:
        from testbed.sweep import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'testbed.sweep' has no attribute {name!r}")
