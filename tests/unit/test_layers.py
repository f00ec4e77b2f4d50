"""The house's layers: imports point down only, strategy packages stand apart, pure modules stay pure.

Layers (lowest first; a module may import its own layer and the ones below):

    util                              units, rates, durations; cutting a buffer
    config                            what the user asked for
    training emulation                optimizers, compression; the NIC model, stragglers, faults
    workloads analysis                models, data, the one-process reference; raw records,
                                      metrics, cost model, results, plots
    strategies.contract               the Strategy contract
    runtime                           Ray: cluster, remote calls, the worker base
    ps mapreduce allreduce gossip ... the strategies (never each other, unless one builds on
                                      another's shell): the registry's packages
    strategies.registry               the table of strategies
    session                           the one code path of a run; signals; held-out evaluation
    run sweep bench docs nscluster map
                                      the command lines (run.py and __main__.py the only
                                      top-level modules)

A room is a top-level package or module, or a module of `strategies`, whose two modules sit in
two layers.
"""

import ast
import subprocess
import sys
from pathlib import Path

from testbed.strategies.registry import SPECS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "testbed"
LAYERS = [
    {"util"},
    {"config"},
    {"training", "emulation"},
    {"workloads", "analysis"},
    {"strategies.contract", "strategies"},  # (the package itself: its docstring)
    {"runtime"},
    set(),  # the strategy packages: every package the registry names a spec from (below)
    {"strategies.registry"},
    {"session"},
    {"run", "sweep", "bench", "docs", "nscluster", "map", "__main__", "__init__"},
]
TOP_LEVEL_MODULES = {"run", "__main__", "__init__"}  # the entry points; everything else in a package
STRATEGY_PACKAGES = {type(spec).__module__.split(".")[1] for spec in SPECS.values()}
# a strategy built on another's shell (`StrategySpec.builds_on`) may import that package
BUILDS_ON = {(type(spec).__module__.split(".")[1], type(base).__module__.split(".")[1])
             for spec in SPECS.values() for base in spec.builds_on}
LAYERS[6] |= STRATEGY_PACKAGES
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}

# Modules that must import neither Ray nor torch (the unit tier and the CLI's validation rely on it).
PURE = [
    "testbed.util.units", "testbed.util.split", "testbed.config", "testbed.analysis.records", "testbed.training.compressor",
    "testbed.emulation.network", "testbed.emulation.endpoint", "testbed.emulation.stragglers",
    "testbed.emulation.faults", "testbed.analysis.metrics", "testbed.analysis.costmodel",
    "testbed.analysis.results", "testbed.analysis.baseline", "testbed.analysis.regression",
    "testbed.analysis.plots", "testbed.analysis.psmodel", "testbed.analysis.placement", "testbed.ps.partition",
    "testbed.analysis.runplots", "testbed.strategies.contract", "testbed.strategies.registry", "testbed.sweep.spec",
    "testbed.allreduce.ring", "testbed.allreduce.algorithms", "testbed.allreduce.spec",
    "testbed.gossip.topology", "testbed.gossip.spec", "testbed.ps.ssp", "testbed.ps.schedule",
    "testbed.ps.spec", "testbed.mapreduce.spec", "testbed.workloads.synthetic",
    "testbed.workloads.profiles", "testbed.run", "testbed.training.optim", "testbed.analysis.evals",
    "testbed.config.datafiles", "testbed.workloads.images", "testbed.workloads.language",
    "testbed.workloads.data", "testbed.map.grid", "testbed.map.table", "testbed.map.rank", "testbed.map.report",
    "testbed.bench.report", "testbed.bench.judge",
    # every strategy's spec and the modules of its config sections
    *sorted({type(spec).__module__ for spec in SPECS.values()}),
    *sorted({cls.__module__ for spec in SPECS.values() for cls in spec.sections.values()}),
]


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        yield rel, ".".join(("testbed", *rel.with_suffix("").parts)).removesuffix(".__init__")


def _imports(path: Path):
    """Every testbed module this file imports, at module level or inside a function."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("testbed"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("testbed"):
            if node.module == "testbed":
                yield from (f"testbed.{a.name}" for a in node.names)
            else:
                yield node.module


def _top(module: str) -> str:
    """The room of a module: 'testbed.ps.spec' -> 'ps', 'testbed.strategies.registry' ->
    'strategies.registry' (a package split across layers), 'testbed' -> '__init__'."""
    parts = module.split(".")
    if len(parts) < 2:
        return "__init__"
    two = ".".join(parts[1:3])
    return two if two in RANK else parts[1]


def test_only_the_entry_points_are_top_level_modules():
    loose = {p.stem for p in PACKAGE.glob("*.py")} - TOP_LEVEL_MODULES
    assert not loose, f"top-level modules outside a package: {sorted(loose)} (give each a package of its layer)"


def test_every_top_level_module_has_a_layer():
    tops = {_top(m) for _, m in _modules()}
    assert tops <= set(RANK), f"modules without a layer (add them to LAYERS): {sorted(tops - set(RANK))}"


def test_imports_point_down_and_strategy_packages_stand_apart():
    problems = []
    for rel, module in _modules():
        src = _top(module)
        for target in _imports(PACKAGE / rel):
            dst = _top(target)
            if dst not in RANK:
                continue
            if RANK[dst] > RANK[src]:
                problems.append(f"{module} imports {target} (layer {RANK[dst]} above {RANK[src]})")
            elif (src in STRATEGY_PACKAGES and dst in STRATEGY_PACKAGES and src != dst
                  and (src, dst) not in BUILDS_ON):
                problems.append(f"{module} imports {target}: strategy packages never import each other "
                                "(unless the importer's spec says it builds_on the other)")
    assert not problems, "\n".join(problems)


def test_no_import_cycles_between_modules():
    graph = {m: {t for t in _imports(PACKAGE / rel)} for rel, m in _modules()}

    def resolve(target):  # "from testbed.x import y" may name a module x.y or a name in x
        return target if target in graph else None

    edges = {m: {resolve(t) for t in ts} - {None, m} for m, ts in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node, path):
        state[node] = 1
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_pure_modules_import_neither_ray_nor_torch():
    """One interpreter imports them in turn and names the first that brings Ray or torch in."""
    code = ("import sys, importlib\n"
            f"for m in {PURE!r}:\n"
            "    importlib.import_module(m)\n"
            "    heavy = [h for h in ('ray', 'torch') if h in sys.modules]\n"
            "    if heavy:\n"
            "        print(m, 'imports', ','.join(heavy)); break\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
