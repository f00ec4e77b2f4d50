"""The architectures a run trains for real: softmax regression, an MLP, a ResNet for 32x32 images
and a decoder-only transformer language model.

ResNet (He et al. 2016, the CIFAR family ResNet-(6n+2)): a 3x3 convolution to `width` channels,
three stages of n basic blocks at width, 2 width, 4 width channels (the second and third start
with stride 2), global average pooling, a linear classifier. A basic block is
conv3x3-BN-ReLU-conv3x3-BN plus the shortcut (a 1x1 convolution and BN where the shape changes),
then ReLU. `width 16, n = 1` is ResNet-8: 78k parameters, about 12 MFLOP (multiply-adds) a
forward pass of one image.

Batch norm, and why it is `GhostBatchNorm`: its statistics are not gradients, so no strategy
synchronises them. In training every worker normalises with its own batch's mean and variance
(as DDP does without SyncBatchNorm); the single-process reference, which sees the concatenated
global batch, normalises each worker's slice of it on its own (a "ghost batch" of --batch-size
samples), so the synchronous strategies stay equivalent to it. No running averages are kept:
to evaluate, the statistics of the authoritative parameters are recomputed from a fixed set of
training images in one pass (`calibrate`, "precise BN"), so every strategy's model is evaluated
by the same rule whatever replica it lives on.

The transformer is GPT-2's block structure at any size (`testbed.workloads.modelzoo.GPT2`):
token and position embeddings, pre-norm blocks of causal self-attention and a 4x MLP, a final
layer norm, the output layer tied to the token embedding; weights drawn N(0, 0.02) as GPT-2's.
"""

from __future__ import annotations

import torch
from torch import nn

from testbed.workloads.modelzoo import GPT2

BN_EPS = 1e-5


class GhostBatchNorm(nn.Module):
    """Batch norm over ghost batches of `group` samples (a larger batch is cut into them, in
    order); `calibrate()` fixes population statistics for evaluation (see the module docstring)."""

    def __init__(self, channels: int, group: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.group = group
        self.population: tuple[torch.Tensor, torch.Tensor] | None = None
        self.calibrating = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c = x.shape[0], x.shape[1]
        if not self.training:
            if self.population is None:
                raise RuntimeError("GhostBatchNorm: evaluate after calibrate(); there are no statistics yet")
            mean, var = self.population
            y = (x - mean.view(1, c, 1, 1)) / torch.sqrt(var.view(1, c, 1, 1) + BN_EPS)
            return y * self.weight.view(1, c, 1, 1) + self.bias.view(1, c, 1, 1)
        g = self.group if self.group and not self.calibrating and n > self.group and n % self.group == 0 else n
        xg = x.reshape(n // g, g, c, *x.shape[2:])
        dims = (1, *range(3, xg.dim()))
        mean = xg.mean(dim=dims, keepdim=True)
        var = xg.var(dim=dims, unbiased=False, keepdim=True)
        if self.calibrating:
            self.population = (mean.detach().reshape(c), var.detach().reshape(c))
        shape = (1, 1, c) + (1,) * (xg.dim() - 3)
        y = (xg - mean) / torch.sqrt(var + BN_EPS) * self.weight.view(shape) + self.bias.view(shape)
        return y.reshape(x.shape)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, group: int | None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = GhostBatchNorm(cout, group)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = GhostBatchNorm(cout, group)
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), GhostBatchNorm(cout, group))
                         if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class CifarResNet(nn.Module):
    def __init__(self, channels: int, classes: int, width: int = 16, depth: int = 1,
                 group: int | None = None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
        self.bn = GhostBatchNorm(width, group)
        blocks, cin = [], width
        for stage in range(3):
            cout = width * 2 ** stage
            for j in range(depth):
                blocks.append(BasicBlock(cin, cout, 2 if stage > 0 and j == 0 else 1, group))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def calibrate(model: nn.Module, x: torch.Tensor) -> None:
    """Population batch-norm statistics for the current parameters from one pass over `x`
    (a fixed set of training samples); a model without batch norm is left as it is."""
    norms = [m for m in model.modules() if isinstance(m, GhostBatchNorm)]
    if not norms:
        return
    was = model.training
    model.train()
    for m in norms:
        m.calibrating = True
    try:
        with torch.no_grad():
            model(x)
    finally:
        for m in norms:
            m.calibrating = False
        model.train(was)


def language_model(vocab: int, d_model: int, layers: int, heads: int, seq_len: int) -> nn.Module:
    model = GPT2(h=d_model, layers=layers, heads=heads, vocab=vocab, positions=seq_len)
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    return model


def classifier(name: str, shape: tuple[int, ...], classes: int, *, hidden: int = 64, width: int = 16,
               depth: int = 1, group: int | None = None) -> nn.Module:
    """logreg / mlp over inputs of `shape` flattened (the caller flattens them), or the ResNet
    over images of `shape`."""
    features = 1
    for d in shape:
        features *= d
    if name == "logreg":
        return nn.Linear(features, classes)
    if name == "mlp":
        return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    return CifarResNet(shape[0], classes, width, depth, group)
