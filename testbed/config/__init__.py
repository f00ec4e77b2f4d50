"""What the user asked for: one validated configuration per run, and nothing else.

    schema.py       RunConfig; each field's flag, help, check and parser; the strategy
                    packages' own sections, which their specs name
    environment.py  the cluster, network emulation and faults sections
    workload.py     the workload and evaluation sections; which workload reads which key
    fields.py       what a field is (`opt`) and the one error (`ConfigError`)
    datafiles.py    the --data formats (CIFAR-10 binary, MNIST IDX, UTF-8 text): probe and read
    flags.py        the command line, generated from the fields
    validate.py     every rule (generic ones, and what each strategy's spec declares)
    checks.py       the field checks
    stragglerspec.py faultspec.py compressionspec.py payload.py items.py
                    the spec-string grammars (--straggler, --fail, --compression, --payload) and types

The lowest layer: it imports no other testbed package but `units`, never Ray or torch; the
strategies' sections come from their packages through the registry (`strategy_sections`). A
`RunConfig` is saved as config.json beside every run's measurements.
"""

from testbed.config.compressionspec import CompressionSpec
from testbed.config.environment import (
    DEVICES,
    MAX_WORKERS,
    PLACEMENTS,
    ClusterConfig,
    FaultConfig,
    NetworkConfig,
)
from testbed.config.flags import build_parser, parse_config
from testbed.config.schema import (
    ConfigError,
    EvalConfig,
    Faults,
    Payload,
    RunConfig,
    Stragglers,
    WorkloadConfig,
    default_of,
    flag_of,
    from_dict,
    get,
    leaves,
    sections,
    strategy_sections,
    use_sections,
    with_overrides,
)
from testbed.config.validate import fail, validate
from testbed.config.workloadnames import WORKLOADS

__all__ = ["DEVICES", "MAX_WORKERS", "PLACEMENTS", "WORKLOADS", "ClusterConfig", "CompressionSpec",
           "ConfigError", "EvalConfig", "FaultConfig", "Faults", "NetworkConfig", "Payload", "RunConfig",
           "Stragglers", "WorkloadConfig", "build_parser", "default_of", "fail", "flag_of", "from_dict", "get",
           "leaves", "parse_config", "sections", "strategy_sections", "use_sections", "validate",
           "with_overrides"]
