"""What a real model asks of a worker process's memory, counted from its flags before Ray starts
(no torch: the architectures of `nets.py` and `modelzoo.GPT2`, parameter by parameter).

A worker process holds, per logical worker it hosts, float32 copies of:
- the parameters (one flat tensor, every layer a view into it) and the gradient (likewise);
- the optimizer's state where it applies updates: none for sgd, one buffer for momentum, two for
  adam (`testbed.training.optim`);
- one copy in transit (the flat gradient or parameters handed to the transport as numpy).

So bytes = 4 x parameters x (3 + optimizer buffers). Activations are left out (they depend on the
batch and free after each step): the estimate is a floor, and a model refused by it could not
have been built. `--workload transformer --d-model 65536` (2 layers) is 103 G parameters, 1152 GiB
a process with sgd; torch's first allocation alone (the attention's 3h x h weight) is 48 GiB.
"""

from __future__ import annotations

from typing import Any

from testbed.config import ConfigError

OPTIMIZER_BUFFERS = {"sgd": 0, "momentum": 1, "adam": 2}
SIZE_FLAGS = {"transformer": ("d_model", "layers"), "resnet": ("width", "depth"),
              "mlp": ("features", "hidden"), "logreg": ("features", "classes")}


def parameters(w: Any) -> int | None:
    """Parameters of the model `w` (a WorkloadConfig) builds; None for a synthetic gradient."""
    if not w.real_compute:
        return None
    shape, classes, vocab = _data_shape(w)
    if w.name == "transformer":
        h = w.d_model
        block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (4 * h * h + 4 * h) + (4 * h * h + h)
        return vocab * h + w.seq_len * h + w.layers * block + 2 * h  # the output layer is tied to wte
    features = 1
    for d in shape:
        features *= d
    if w.name == "logreg":
        return features * classes + classes
    if w.name == "mlp":
        return features * w.hidden + w.hidden + w.hidden * classes + classes
    return _resnet(shape[0], classes, w.width, w.depth)


def _data_shape(w: Any) -> tuple[tuple[int, ...], int, int]:
    """(input shape, classes, vocabulary) of the data the workload trains on."""
    if w.data is None:
        shape = (3, 32, 32) if w.name == "resnet" else (w.features,)
        return shape, w.classes, w.vocab
    from testbed.config.datafiles import probe

    info = probe(w.data, w.seq_len)
    return info.shape or (), info.classes or 0, info.vocab or 0


def _resnet(channels: int, classes: int, width: int, depth: int) -> int:
    """`nets.CifarResNet`: a stem conv and BN, 3 stages of basic blocks, the classifier."""
    total, cin = channels * width * 9 + 2 * width, width
    for stage in range(3):
        cout = width * 2 ** stage
        for j in range(depth):
            total += cin * cout * 9 + 2 * cout + cout * cout * 9 + 2 * cout
            if (stage > 0 and j == 0) or cin != cout:
                total += cin * cout + 2 * cout  # the 1x1 shortcut and its BN
            cin = cout
    return total + cin * classes + classes


def worker_bytes(w: Any) -> int:
    """Bytes of one logical worker's model state (module docstring); 0 for a synthetic gradient."""
    n = parameters(w)
    return 0 if n is None else 4 * n * (3 + OPTIMIZER_BUFFERS.get(w.optimizer, 2))


def check_fits(w: Any, per_process: int, memory: float, overhead: float) -> None:
    """ConfigError (numbers and fix) when one worker process cannot hold its model state beside
    its runtime (`overhead` bytes) in `memory`, the most the cluster gives one process."""
    need = worker_bytes(w) * per_process
    if need + overhead <= memory:
        return
    n = parameters(w)
    flags = SIZE_FLAGS.get(w.name, ())
    given = " ".join(f"--{f.replace('_', '-')} {getattr(w, f)}" for f in flags)
    hosted = "" if per_process == 1 else f" x {per_process} workers per process"
    raise ConfigError(
        f"--workload {w.name} {given}: {n / 1e9:.3g} G parameters need {need / 2**30:.1f} GiB per worker "
        f"process (parameters, gradient, {w.optimizer} state and a copy in transit, 4 bytes each{hosted}) "
        f"but the cluster has {memory / 2**30:.1f} GiB; use a smaller "
        f"{' or '.join('--' + f.replace('_', '-') for f in flags)}")
