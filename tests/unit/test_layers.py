"""The house's layers: imports point down only, strategy packages stand apart, pure modules stay pure.

Layers (lowest first; a module may import its own layer and the ones below):

    units split                       formats and cutting
    config                            what the user asked for
    records compression optim emulation
                                      raw records, compression, optimizers, the NIC model, stragglers, faults
    workloads analysis                models and data; metrics, cost model, results, plots
    strategy                          the Strategy contract
    runtime                           Ray: cluster, remote calls, the worker base
    ps mapreduce allreduce gossip ... the strategies (never each other): the registry's packages
    registry reference                the table of strategies; single-process SGD
    session interrupts evaluation     the one code path of a run; signals; held-out evaluation
    run sweep sweeprun sweepspec bench docs map
                                      the command lines
"""

import ast
import subprocess
import sys
from pathlib import Path

from testbed.registry import SPECS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "testbed"
LAYERS = [
    {"units", "split"},
    {"config"},
    {"records", "compression", "optim", "emulation"},
    {"workloads", "analysis"},
    {"strategy"},
    {"runtime"},
    set(),  # the strategy packages: every package the registry names a spec from (below)
    {"registry", "reference"},
    {"session", "interrupts", "evaluation"},
    {"run", "sweep", "sweeprun", "sweepcheck", "sweepspec", "bench", "docs", "nscluster", "map", "__main__", "__init__"},
]
STRATEGY_PACKAGES = {type(spec).__module__.split(".")[1] for spec in SPECS.values()}
# a strategy built on another's shell (`StrategySpec.builds_on`) may import that package
BUILDS_ON = {(type(spec).__module__.split(".")[1], type(base).__module__.split(".")[1])
             for spec in SPECS.values() for base in spec.builds_on}
LAYERS[6] |= STRATEGY_PACKAGES
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}

# Modules that must import neither Ray nor torch (the unit tier and the CLI's validation rely on it).
PURE = [
    "testbed.units", "testbed.split", "testbed.config", "testbed.records", "testbed.compression",
    "testbed.emulation.network", "testbed.emulation.endpoint", "testbed.emulation.stragglers",
    "testbed.emulation.faults", "testbed.analysis.metrics", "testbed.analysis.costmodel",
    "testbed.analysis.results", "testbed.analysis.baseline", "testbed.analysis.regression",
    "testbed.analysis.plots", "testbed.analysis.psmodel", "testbed.analysis.placement", "testbed.ps.partition",
    "testbed.analysis.runplots", "testbed.strategy", "testbed.registry", "testbed.sweepspec",
    "testbed.allreduce.ring", "testbed.allreduce.algorithms", "testbed.allreduce.spec",
    "testbed.gossip.topology", "testbed.gossip.spec", "testbed.ps.ssp", "testbed.ps.schedule",
    "testbed.ps.spec", "testbed.mapreduce.spec", "testbed.workloads.synthetic",
    "testbed.workloads.profiles", "testbed.run", "testbed.optim", "testbed.analysis.evals",
    "testbed.config.datafiles", "testbed.workloads.images", "testbed.workloads.language",
    "testbed.workloads.data", "testbed.map.grid", "testbed.map.table", "testbed.map.rank", "testbed.map.report",
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
    return module.split(".")[1] if module.count(".") else "__init__"


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
