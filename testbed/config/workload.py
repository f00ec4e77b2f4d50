"""The workload and evaluation sections of the run configuration: what each worker trains, with
which optimizer, on which data, and how the authoritative model is judged on held-out data.

Which workload reads which of these keys is said once, in `APPLIES`: a key given to a workload
that does not read it is refused (`testbed.config.validate`), as a strategy's key is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from testbed.config.checks import choice, integer, real
from testbed.config.fields import opt, parse_fields
from testbed.config.payload import Payload, parse_payload
from testbed.config.workloadnames import PROFILE, workload_check

OPTIMIZERS = ("sgd", "momentum", "adam")
TORCH_MODELS = ("resnet", "transformer")  # the rest run without torch on the CPU
DEFAULT_LR = {"sgd": 0.1, "momentum": 0.1, "adam": 0.001}
EVALUATIONS_PER_RUN = 10  # the default --eval-every: about this many evaluations a run


def _below_one(value: Any) -> str | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return None if ok and 0 <= value < 1 else "use a momentum in [0, 1), e.g. 0.9"


@dataclass(frozen=True)
class WorkloadConfig:
    """workload"""

    name: str = opt("mlp", flag="--workload", check=workload_check,
                    help="mlp, logreg (synthetic classification data), resnet (a ResNet for 32x32 "
                         "images), transformer (a decoder-only language model), synthetic (no model), or "
                         "profile:NAME (synthetic, as resnet50, resnet101, vgg16, bert-base, bert-large, gpt2)")
    batch_size: int = opt(32, check=integer(1, 1_000_000, "use a positive integer (per worker)"),
                          help="samples per worker per iteration (sequences for the transformer)")
    optimizer: str = opt("sgd", check=choice(OPTIMIZERS),
                         help="sgd, momentum or adam, applied where the authoritative parameters live")
    lr: float | None = opt(None, check=real(0, high=None, low_ok=False, fix="use a finite learning rate > 0, e.g. 0.1"),
                           help="learning rate (default: 0.1, or 0.001 with --optimizer adam)")
    momentum: float = opt(0.9, check=_below_one, help="--optimizer momentum: its coefficient")
    weight_decay: float = opt(0.0, check=real(0, None, fix="use a weight decay >= 0, e.g. 1e-4"),
                              help="L2 weight decay, added to the gradient (as torch.optim does)")
    grad_mb: float = opt(4.0, check=real(0, 65536, low_ok=False,
                                         fix="use a size in MiB > 0 and at most 65536 (64 GiB), e.g. 4"),
                         help="synthetic: logical gradient size (MiB)")
    compute_ms: float = opt(10.0, check=real(0, None, fix="use milliseconds >= 0"),
                            help="synthetic: compute time per iteration (ms)")
    backward_frac: float = opt(2 / 3, check=real(0, 1, fix="use a fraction in [0, 1]"),
                               help="synthetic: share of the compute time that is backward")
    payload: Payload = opt(factory=Payload, parse=parse_payload, metavar="full|scaled:F",
                           help="synthetic: physical arrays are F x the logical size")
    data: str | None = opt(None, metavar="PATH",
                           help="train on files: a CIFAR-10 binary folder (data_batch_*.bin, test_batch.bin) "
                                "or MNIST IDX folder (resnet, mlp, logreg), or a UTF-8 text file (transformer: "
                                "a character model) (default: generated data)")
    samples: int = opt(8192, check=integer(1, 10**9, "use a positive number of samples"),
                       help="generated data: training samples (sequences for the transformer)")
    features: int = opt(32, check=integer(1, 10**6, "use a positive integer"),
                        help="mlp, logreg: input features of the generated data")
    classes: int = opt(4, check=integer(2, 10**6, "use an integer >= 2"),
                       help="mlp, logreg, resnet: classes of the generated data")
    hidden: int = opt(64, check=integer(1, 10**6, "use a positive integer"), help="mlp: hidden units")
    width: int = opt(16, check=integer(1, 4096, "use a positive number of channels, e.g. 16"),
                     help="resnet: channels of the first stage (doubled at each of the next two)")
    depth: int = opt(1, check=integer(1, 100, "use a positive number of blocks, e.g. 1"),
                     help="resnet: basic blocks per stage (ResNet-(6n+2))")
    layers: int = opt(2, check=integer(1, 1000, "use a positive number of blocks, e.g. 2"),
                      help="transformer: decoder blocks")
    d_model: int = opt(64, check=integer(1, 65536, "use a positive width, e.g. 64"),
                       help="transformer: embedding width")
    heads: int = opt(4, check=integer(1, 1024, "use a positive number of heads, e.g. 4"),
                     help="transformer: attention heads (must divide --d-model)")
    seq_len: int = opt(64, check=integer(2, 65536, "use a context of at least 2 tokens, e.g. 64"),
                       help="transformer: tokens per training sequence (the context)")
    vocab: int = opt(32, check=integer(2, 256, "use a vocabulary of 2..256 tokens, e.g. 32"),
                     help="transformer: tokens of the generated language")

    def __post_init__(self) -> None:
        parse_fields(self)

    @property
    def profile(self) -> str | None:  # the real model a synthetic gradient is shaped as (profile:NAME)
        return self.name[len(PROFILE):] if self.name.startswith(PROFILE) else None

    @property
    def real_compute(self) -> bool:
        """A torch model computes for real (imports torch, cannot be dilated, its compute is measured);
        a synthetic workload, plain or a profile, sleeps a set compute time."""
        return self.name != "synthetic" and self.profile is None

    def imports_torch(self, device: str = "cpu") -> bool:
        """Whether a worker of this workload imports torch on `device` (resolved: cpu or cuda):
        resnet and transformer always; mlp and logreg only on a GPU (on the CPU they are numpy,
        testbed.workloads.dense); synthetic workloads never."""
        return self.name in TORCH_MODELS or (self.real_compute and device != "cpu")

    @property
    def learning_rate(self) -> float:
        """--lr, or the optimizer's default (0.1 for sgd and momentum, 0.001 for adam)."""
        return DEFAULT_LR[self.optimizer] if self.lr is None else float(self.lr)


# key -> the workloads that read it; every other workload refuses it when it is not the default
APPLIES = {
    "hidden": ("mlp",),
    "features": ("mlp", "logreg"),
    "classes": ("mlp", "logreg", "resnet"),
    "width": ("resnet",),
    "depth": ("resnet",),
    "layers": ("transformer",),
    "d_model": ("transformer",),
    "heads": ("transformer",),
    "seq_len": ("transformer",),
    "vocab": ("transformer",),
    "data": ("mlp", "logreg", "resnet", "transformer"),
}
FROM_DATA = ("samples", "features", "classes", "vocab")  # what a --data file fixes itself


@dataclass(frozen=True)
class EvalConfig:
    """evaluation (held-out data, time to a target)"""

    every: int | None = opt(None, flag="--eval-every", check=integer(0, None, "use updates >= 0 (0: never)"),
                            help="evaluate the authoritative model on held-out data every K model updates, "
                                 f"off the critical path (default: about {EVALUATIONS_PER_RUN} a run; 0: never)")
    samples: int = opt(512, flag="--eval-samples", check=integer(1, 10**7, "use a positive number of samples"),
                       help="held-out samples an evaluation uses (sequences for the transformer)")
    target_loss: float | None = opt(None, flag="--target-loss", metavar="X",
                                    check=real(0, None, fix="use a loss >= 0, e.g. 0.5"),
                                    help="report time, updates and samples until the held-out loss is <= X")
    target_acc: float | None = opt(None, flag="--target-acc", metavar="Y",
                                   check=real(0, 1, low_ok=False, fix="use an accuracy in (0, 1], e.g. 0.9"),
                                   help="... until the held-out accuracy is >= Y (both given: both)")

    def interval(self, steps: int) -> int:
        """Updates between evaluations (0: none)."""
        if self.every is not None:
            return self.every
        return max(1, math.ceil(steps / EVALUATIONS_PER_RUN))
