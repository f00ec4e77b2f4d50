"""Optimizers on flat parameter vectors, applied where the authoritative parameters live.

    sgd        p <- p - lr (g + wd p)
    momentum   b <- mu b + (g + wd p)   (b = g + wd p on the first step)      p <- p - lr b
    adam       g' = g + wd p;  m <- b1 m + (1 - b1) g';  v <- b2 v + (1 - b2) g'^2
               p <- p - lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps)

These are torch.optim.SGD (dampening 0, no Nesterov) and torch.optim.Adam (betas 0.9/0.999,
eps 1e-8, L2 weight decay added to the gradient, not AdamW's decoupled decay), written out so
that one definition runs on a parameter-server partition (numpy), the MapReduce driver (numpy),
every ring and gossip replica (a torch tensor on the worker's device, or numpy) and the
single-process reference alike. Every rule is elementwise, so a partition's optimizer with its
own state computes exactly the slice of the whole vector's update: a PS shard holds the state of
the slices it owns, and the sharded update equals the unsharded one.

Only Python operators touch the arrays (`*=`, `+`, `**`), so numpy arrays and torch tensors
take the same code. Pure: no Ray, no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.config.workload import OPTIMIZERS

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass(frozen=True)
class OptimizerSpec:
    kind: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.kind!r}: choose one of {', '.join(OPTIMIZERS)}")

    @property
    def slots(self) -> tuple[str, ...]:
        """The state vectors it keeps beside the parameters (each the parameters' size)."""
        return {"sgd": (), "momentum": ("buf",), "adam": ("m", "v")}[self.kind]


def mean_gradient(grads: list[Any]) -> Any:
    """The average of gradients, summed in the order given (worker order): the one way the
    parameter server and the MapReduce driver average, so that both are reproducible to the bit
    and agree with each other -- summing in arrival order would make the last bits, and through a
    ReLU that sits on its kink the whole step, depend on timing."""
    import numpy as np

    total = np.array(grads[0], dtype=np.float32, copy=True)
    for g in grads[1:]:
        total += g
    return total / np.float32(len(grads))


def _copy(x: Any) -> Any:
    return x.clone() if hasattr(x, "clone") else x.copy()  # a torch tensor, or a numpy array


def _zeros_like(x: Any) -> Any:
    new_zeros = getattr(x, "new_zeros", None)  # a torch tensor: on its device, in its dtype
    if new_zeros is not None:
        return new_zeros(x.shape)
    import numpy as np

    return np.zeros_like(x)


class Optimizer:
    """One optimizer with its state, for one flat vector (or one slice of it)."""

    def __init__(self, spec: OptimizerSpec) -> None:
        self.spec = spec
        self.t = 0  # steps applied
        self.state: dict[str, Any] = {}

    def step(self, params: Any, grad: Any) -> None:
        """Apply one update to `params` in place from the (averaged) gradient `grad`."""
        s = self.spec
        g = grad if not s.weight_decay else grad + s.weight_decay * params
        self.t += 1
        if s.kind == "sgd":
            params -= s.lr * g
        elif s.kind == "momentum":
            if "buf" not in self.state:
                self.state["buf"] = _copy(g) if g is grad else g  # never the caller's array
            else:
                buf = self.state["buf"]
                buf *= s.momentum
                buf += g
            params -= s.lr * self.state["buf"]
        else:
            b1, b2 = ADAM_BETAS
            if "m" not in self.state:
                self.state["m"], self.state["v"] = _zeros_like(params), _zeros_like(params)
            m, v = self.state["m"], self.state["v"]
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * (g * g)
            denom = v ** 0.5 / (1 - b2 ** self.t) ** 0.5 + ADAM_EPS
            params -= (s.lr / (1 - b1 ** self.t)) * (m / denom)

    # ---- state, for checkpoints, rollbacks and a restarted replica
    def state_dict(self) -> dict[str, Any]:
        """{"t": steps, slot: a copy of each state vector} (vectors absent before the first step)."""
        return {"t": self.t, **{k: _copy(v) for k, v in self.state.items()}}

    def load_state_dict(self, state: dict[str, Any], like: Any = None) -> None:
        """Restore `state_dict()` output; `like` (the parameters) converts numpy state to its kind."""
        self.t = int(state.get("t", 0))
        self.state = {}
        for k in self.spec.slots:
            if k in state and state[k] is not None:
                v = state[k]
                self.state[k] = _like(v, like) if like is not None else _copy(v)


def _like(value: Any, like: Any) -> Any:
    """`value` as an array of `like`'s kind (numpy state onto a torch replica, or the reverse)."""
    import numpy as np

    if hasattr(like, "new_zeros"):
        out = like.new_zeros(like.shape)
        out.copy_(out.new_tensor(np.asarray(value)) if not hasattr(value, "new_zeros") else value)
        return out
    return np.array(value.cpu().numpy() if hasattr(value, "cpu") else value, dtype=np.float32, copy=True)


def to_numpy_state(state: dict[str, Any]) -> dict[str, Any]:
    """A state_dict with every vector as a float32 numpy array (to send or to save)."""
    import numpy as np

    out: dict[str, Any] = {"t": int(state.get("t", 0))}
    for k, v in state.items():
        if k != "t":
            out[k] = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v, dtype=np.float32)
    return out


def optimizer_for(cfg: Any) -> OptimizerSpec:
    """The optimizer a run's `WorkloadConfig` asks for (its --lr, or the optimizer's default)."""
    return OptimizerSpec(cfg.optimizer, cfg.learning_rate, cfg.momentum, cfg.weight_decay)
