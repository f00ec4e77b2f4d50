"""Real architectures, for their shapes: the parameter tensors of ResNet-50/101, VGG-16,
BERT-base/large and GPT-2 (small), and the backward FLOPs behind each, built on torch's meta
device (no memory, nothing downloaded). `--workload profile:NAME` lays its synthetic gradient out
as these tensors (testbed.workloads.profiles); this module only derives the table:

    python -m testbed.workloads.modelzoo        # rewrite testbed/workloads/profiles.json

Definitions follow the published architectures' parameter layout (torchvision's ResNet and
VGG, Hugging Face's BertModel with its pooler, GPT-2 with its output layer tied to the token
embedding), so the totals are the published ones (tests/unit/test_profiles.py checks them).

Backward FLOPs per tensor, for one sample (224x224 image; 128 tokens for BERT, 1024 for GPT-2):
a forward pass on meta tensors records each layer's output shape; forward, a convolution costs
2 Cin/groups kh kw FLOPs per output element, a linear layer 2 in_features per output element,
a norm 4 per output element, an embedding 1 per output element (its backward is a scatter-add). Backward is taken as twice the forward (gradients of the input and of the
weights) and split among the layer's tensors by their element counts. Attention's score and
value products have no parameters and are left out: the shares are of parametric work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

TABLE = Path(__file__).resolve().parent / "profiles.json"


# ---------------------------------------------------------------- ResNet and VGG


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                           if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self, blocks: list[int], classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        cin, stages = 64, []
        for i, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512), strict=True)):
            layer = []
            for j in range(n):
                layer.append(Bottleneck(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = width * 4
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class VGG16(nn.Module):
    PLAN = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in self.PLAN:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU()]
                cin = v
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Linear(4096, 4096),
                                        nn.ReLU(), nn.Linear(4096, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 7)
        return self.classifier(torch.flatten(x, 1))


# ---------------------------------------------------------------- transformers


class BertLayer(nn.Module):
    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attn_out, self.attn_norm = nn.Linear(h, h), nn.LayerNorm(h)
        self.intermediate, self.output = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.out_norm = nn.LayerNorm(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = (f(x).view(b, t, self.heads, -1).transpose(1, 2) for f in (self.query, self.key, self.value))
        a = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, h)
        x = self.attn_norm(x + self.attn_out(a))
        return self.out_norm(x + self.output(nn.functional.gelu(self.intermediate(x))))


class Bert(nn.Module):
    def __init__(self, h: int, layers: int, heads: int, vocab: int = 30522, positions: int = 512) -> None:
        super().__init__()
        self.word, self.position, self.token_type = nn.Embedding(vocab, h), nn.Embedding(positions, h), nn.Embedding(2, h)
        self.emb_norm = nn.LayerNorm(h)
        self.layers = nn.ModuleList(BertLayer(h, heads) for _ in range(layers))
        self.pooler = nn.Linear(h, h)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        x = self.emb_norm(self.word(ids) + self.position(pos) + self.token_type(torch.zeros_like(ids)))
        for layer in self.layers:
            x = layer(x)
        return torch.tanh(self.pooler(x[:, 0]))


class GPT2Block(nn.Module):
    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.c_attn, self.attn_proj = nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.ln_2, self.c_fc, self.mlp_proj = nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in self.c_attn(self.ln_1(x)).split(h, 2))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(a.transpose(1, 2).reshape(b, t, h))
        return x + self.mlp_proj(nn.functional.gelu(self.c_fc(self.ln_2(x))))


class GPT2(nn.Module):
    """GPT-2 small; the output layer is the token embedding (tied), so it adds no tensor."""

    def __init__(self, h: int = 768, layers: int = 12, heads: int = 12, vocab: int = 50257,
                 positions: int = 1024) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, h), nn.Embedding(positions, h)
        self.blocks = nn.ModuleList(GPT2Block(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


# ---------------------------------------------------------------- the table

MODELS: dict[str, tuple[Any, tuple[int, ...], str]] = {
    # name: (constructor, one sample's input shape, what the sample is)
    "resnet50": (lambda: ResNet([3, 4, 6, 3]), (1, 3, 224, 224), "one 224x224 image"),
    "resnet101": (lambda: ResNet([3, 4, 23, 3]), (1, 3, 224, 224), "one 224x224 image"),
    "vgg16": (VGG16, (1, 3, 224, 224), "one 224x224 image"),
    "bert-base": (lambda: Bert(768, 12, 12), (1, 128), "a sequence of 128 tokens"),
    "bert-large": (lambda: Bert(1024, 24, 16), (1, 128), "a sequence of 128 tokens"),
    "gpt2": (GPT2, (1, 1024), "a sequence of 1024 tokens"),
}


def _forward_flops(module: nn.Module, out: torch.Tensor) -> float:
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        return 2.0 * module.in_channels // module.groups * kh * kw * out.numel()
    if isinstance(module, nn.Linear):
        return 2.0 * module.in_features * out.numel()
    if isinstance(module, (nn.BatchNorm2d, nn.LayerNorm)):
        return 4.0 * out.numel()
    if isinstance(module, nn.Embedding):
        return float(out.numel())
    return 0.0


def tensor_table(name: str) -> dict[str, Any]:
    """{params, sample, tensors: [[name, shape, backward FLOPs], ...] in registration order}."""
    make, shape, sample = MODELS[name]
    with torch.device("meta"):
        model = make()
        x = (torch.zeros(shape) if len(shape) == 4 else torch.zeros(shape, dtype=torch.long))
    flops: dict[str, float] = {}

    def hook(prefix: str):
        def record(module: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
            flops[prefix] = flops.get(prefix, 0.0) + 2.0 * _forward_flops(module, out)  # backward = 2x
        return record

    handles = [m.register_forward_hook(hook(p)) for p, m in model.named_modules()
               if next(m.parameters(recurse=False), None) is not None]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    tensors = []
    for prefix, module in model.named_modules():
        own = list(module.named_parameters(recurse=False))
        total = sum(p.numel() for _, p in own)
        for pname, p in own:
            share = flops.get(prefix, 0.0) * p.numel() / total
            tensors.append([f"{prefix}.{pname}" if prefix else pname, list(p.shape), round(share)])
    return {"params": sum(p.numel() for p in model.parameters()), "sample": sample, "tensors": tensors}


def tables() -> dict[str, dict[str, Any]]:
    return {name: tensor_table(name) for name in MODELS}


def main() -> None:
    TABLE.write_text(json.dumps(tables(), separators=(",", ":")) + "\n")
    print(TABLE)


if __name__ == "__main__":
    main()
