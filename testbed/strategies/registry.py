"""The one explicit table of strategies: name -> StrategySpec.

Pure: a spec says everything known of a strategy before Ray starts (flags, rules, servers, cost
model) and imports its Ray shell only when a run starts. Adding a strategy is one package with
a spec and a Strategy, and one line here.
"""

from __future__ import annotations

from testbed.allreduce.spec import RING, TORCH_ALLREDUCE
from testbed.config import use_sections
from testbed.gossip.spec import GOSSIP
from testbed.localsgd.spec import LOCAL_SGD
from testbed.mapreduce.spec import MAPREDUCE
from testbed.ps.spec import PS_ASYNC, PS_SYNC
from testbed.strategies.contract import StrategySpec

SPECS: dict[str, StrategySpec] = {s.name: s for s in (
    MAPREDUCE,
    PS_SYNC,
    PS_ASYNC,
    RING,
    TORCH_ALLREDUCE,
    GOSSIP,
    LOCAL_SGD,
)}

for _spec in SPECS.values():
    use_sections(_spec.sections)


def families() -> dict[str, str]:
    """name -> family (parameter server, allreduce, ...): for tables and figures."""
    return {name: spec.family for name, spec in SPECS.items()}
