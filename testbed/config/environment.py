"""Where and how a run runs: the cluster section (Ray, placement, real workers), the network
emulation section (bandwidth, latency, dilation) and the faults section. `schema.py` puts them
into `RunConfig` beside the workload's and the strategies' sections; its docstring says what a
field carries.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from testbed.config.checks import choice, integer, real
from testbed.config.faultspec import Faults, parse_faults_spec
from testbed.config.fields import ConfigError, opt
from testbed.config.fields import parse_fields as _parse_fields
from testbed.util import units

AUTO = "auto"  # --dilation auto (NetworkConfig.auto_dilation), --real-workers auto
MAX_WORKERS = 4096  # far past what one Ray cluster here can place; resources are checked later


def _number_or_auto(flag: str, number: type, fix: str, check: Any) -> tuple[Any, Any]:
    """(parse, check) of a flag that takes a number or AUTO: the text as `number` or AUTO, and
    the number's range `check` (AUTO passes)."""
    def parse(text: str) -> Any:
        if text.strip().lower() == AUTO:
            return AUTO
        try:
            return number(text)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {fix}") from None

    return parse, lambda value: None if value == AUTO else check(value)


# --dilation: a factor, or AUTO; --real-workers: a count, or AUTO
MIN_DILATION = 0.01  # below 1 the emulated cluster runs faster than real time (testbed.emulation.dilation)
_FACTOR_FIX = f"use a factor >= {MIN_DILATION:g} (below 1: faster than real time), e.g. 10, or auto"
_COUNT_FIX = "use a count of workers >= 1, e.g. 8, or auto"
parse_dilation, check_dilation = _number_or_auto("--dilation", float, _FACTOR_FIX,
                                                 real(MIN_DILATION, 100_000, fix=_FACTOR_FIX))
parse_real_workers, check_real_workers = _number_or_auto("--real-workers", int, _COUNT_FIX,
                                                         integer(1, MAX_WORKERS, _COUNT_FIX))

DEVICES = ("auto", "cpu", "cuda")
PLACEMENTS = ("pack", "spread")


@dataclass(frozen=True)
class ClusterConfig:
    """cluster (Ray, placement, resources)"""

    address: str | None = opt(None, metavar="auto|HOST:PORT",
                              help="Ray cluster to attach to (default: a private local Ray)")
    placement: str = opt("pack", check=choice(PLACEMENTS), help="placement group: pack or spread")
    device: str = opt("auto", check=choice(DEVICES), help="cpu, cuda or auto (cuda when the cluster has GPUs)")
    cpus_per_worker: float | None = opt(None, check=real(0, None, low_ok=False, fix="use a CPU share > 0, e.g. 0.25"),
                                        help="CPU share per worker; a process of K workers gets K (default: an even share, <= 1)")
    workers_per_process: int | None = opt(None, check=integer(1, MAX_WORKERS, "use a positive integer, e.g. 8"),
                                          metavar="K",
                                          help="logical workers sharing one actor process, each with its own NIC, "
                                               "data and optimizer state (default: 1 up to 16 workers or on a Ray "
                                               "cluster; beyond, on a local Ray, at most 8 processes wherever "
                                               "sharing is allowed: testbed.config.validate)")
    timeout_s: float = opt(120.0, flag="--timeout", check=real(0, None, low_ok=False, fix="use seconds > 0, e.g. 120"),
                           help="seconds any remote wait may take (a hang becomes an error or a restart); "
                                "--dilation auto multiplies it by the factor it picks")
    real_workers: int | str | None = opt(None, metavar="K|auto", parse=parse_real_workers, check=check_real_workers,
                                         help="start K of the workers as processes; they play the others, emulated "
                                              "peers at the model's times (docs/emulation.md, \"Emulated peers\"); "
                                              "auto: all real up to 16 workers; beyond, 16 real where the strategy "
                                              "has emulated peers (fewer where the strategy says their calls per step "
                                              "would pass 2,400), else all (default: auto)")

    def __post_init__(self) -> None:
        _parse_fields(self)  # --real-workers: a count, or AUTO


@dataclass(frozen=True)
class NetworkConfig:
    """network emulation"""

    bandwidth: str | None = opt(None, metavar="RATE", help="emulate a network: NIC bandwidth, e.g. 10Gbit "
                                "(default: the real network)")
    latency: str = opt("0us", metavar="TIME", help="emulated one-way latency, e.g. 50us")
    dilation: float | str | None = opt(None, metavar="D|auto", parse=parse_dilation, check=check_dilation,
                                       help="run the emulated cluster D times slower (transfers, latency, "
                                            "synthetic compute, straggler delays) and report every time "
                                            "divided by D, so this machine's own overheads shrink D-fold "
                                            "(D below 1: faster than real time, for runs whose emulated "
                                            "steps last far longer than their messages cost here); "
                                            "auto: short trial runs raise D until the run is faithful "
                                            "(docs/emulation.md) (default: auto on an emulated network with "
                                            "synthetic compute, else 1)")
    fidelity_budget_s: float = opt(300.0, flag="--fidelity-budget", metavar="SECONDS",
                                   check=real(0, 86_400, low_ok=False, fix="use seconds > 0, e.g. 300"),
                                   help="--dilation auto: the wall time its trial runs and the run itself "
                                        "may take together")
    calibration: str | None = opt(None, metavar="FILE", help="real network: predict with the latency and "
                                  "bandwidth measured by python -m testbed.bench network --out FILE")

    def __post_init__(self) -> None:
        # the rate and the delay as numbers, parsed once, here: the text stays what the user
        # wrote (config.json, messages), and a text that is no rate is the user's one-line error
        _parse_fields(self)  # --dilation: a number, or AUTO
        try:
            rate = None if self.bandwidth is None else units.parse_bandwidth(self.bandwidth, flag="--bandwidth")
            delay = units.parse_duration(self.latency, flag="--latency")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        object.__setattr__(self, "_parsed", (rate, delay))

    def resolved(self, real_compute: bool) -> NetworkConfig:
        """--dilation left out, made explicit (testbed.config.validate does, once): auto on an
        emulated network where every time can be stretched (synthetic compute), else 1."""
        if self.dilation is not None:
            return self
        return replace(self, dilation=AUTO if self.emulated and not real_compute else 1.0)

    @property
    def factor(self) -> float:
        """The dilation the run goes at: a number (validation resolved the default, and the
        --dilation auto search put its factor in place); 1 in a config built in code and never
        validated, whose network is then the real one or undilated."""
        if self.dilation == AUTO:
            raise ValueError("--dilation auto is resolved by the session's search "
                             "(testbed.session.autodilate) before anything runs")
        return 1.0 if self.dilation is None else float(self.dilation)

    @property
    def auto_dilation(self) -> bool:
        """--dilation auto: the session picks the factor (testbed.session.autodilate) and runs
        the config with that number in its place; nothing past it sees AUTO."""
        return self.dilation == AUTO

    @property
    def emulated(self) -> bool:
        return self.bandwidth is not None

    @property
    def bandwidth_Bps(self) -> float | None:
        """The emulated NIC's rate, bytes/s (None: the real network)."""
        return self._parsed[0]

    @property
    def latency_s(self) -> float:
        """The emulated one-way latency, seconds."""
        return self._parsed[1]

    @property
    def wire(self) -> tuple[float, float] | None:
        """(bytes/s, s) the emulator actually runs at: --dilation D stretches the cluster D-fold,
        so the link is D times slower and its latency D times longer (None: not emulated)."""
        if self.bandwidth is None:
            return None
        return self._parsed[0] / self.factor, self._parsed[1] * self.factor


@dataclass(frozen=True)
class FaultConfig:
    """stragglers and faults"""

    fail: Faults = opt(factory=Faults, parse=parse_faults_spec, metavar="SPEC",
                       help="inject faults, e.g. worker=2,at=10 or nan:worker=1,at=3 (docs/faults.md)")
    max_restarts: int = opt(3, check=integer(0, 1000, "use an integer in 0..1000"), help="restarts allowed per actor")
    checkpoint_every: int = opt(0, check=integer(0, None, "use versions >= 0 (0 = no checkpoints)"),
                                help="checkpoint PS shards every K versions (0: none)")
    on_nan: str = opt("skip", check=choice(("skip", "stop")),
                      help="a non-finite gradient: skip it (recorded) or stop the run as diverged")
    max_skipped: int = opt(10, check=integer(0, 10**9, "use an integer >= 0"),
                           help="non-finite gradients skipped before the run stops as diverged")

    def __post_init__(self) -> None:
        _parse_fields(self)
