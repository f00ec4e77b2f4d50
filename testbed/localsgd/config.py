"""Local SGD's config section (`cfg.localsgd`: --local-steps, --outer-optimizer, --outer-lr,
--outer-momentum). Owned here and named by the spec; pure."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.checks import choice, integer, real
from testbed.config.fields import opt

OUTER_OPTIMIZERS = ("average", "nesterov")


@dataclass(frozen=True)
class LocalSGDConfig:
    """local SGD"""

    local_steps: int = opt(8, check=integer(1, 1_000_000, "use an integer number of local steps >= 1, e.g. 8"),
                           metavar="H", help="local steps each worker takes between two averages (H)")
    outer_optimizer: str = opt("average", check=choice(OUTER_OPTIMIZERS),
                               help="average: the replicas become their mean; nesterov: the mean change "
                                    "is an outer gradient for Nesterov momentum (DiLoCo)")
    outer_lr: float = opt(0.7, check=real(0, None, low_ok=False, fix="use an outer learning rate > 0, e.g. 0.7"),
                          help="nesterov: the outer learning rate")
    outer_momentum: float = opt(0.9, check=real(0, 0.999, fix="use a momentum in [0, 0.999], e.g. 0.9"),
                                help="nesterov: the outer momentum")
