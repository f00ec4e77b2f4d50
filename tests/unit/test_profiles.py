"""Real model shapes (--workload profile:NAME): totals against the published parameter counts,
the table against the model definitions it is derived from, and the synthetic workload laid
out as those tensors (sizes, buckets, backward time spread by FLOPs)."""

from __future__ import annotations

import time

import pytest

from testbed.allreduce.ring import make_buckets
from testbed.config import WorkloadConfig
from testbed.workloads.profiles import load_profile, names
from testbed.workloads.synthetic import SyntheticWorkload

# Published parameter counts: torchvision's model cards (ResNet-50/101, VGG-16), the BERT
# paper's base/large BertModel with its pooler (uncased vocabulary), GPT-2 small with a tied head.
PUBLISHED = {"resnet50": 25_557_032, "resnet101": 44_549_160, "vgg16": 138_357_544,
             "bert-base": 109_482_240, "bert-large": 335_141_888, "gpt2": 124_439_808}


def test_every_profile_has_the_published_parameter_count():
    assert names() == tuple(f"profile:{n}" for n in PUBLISHED)
    for name, count in PUBLISHED.items():
        p = load_profile(name)
        assert p.params == count == sum(p.numels), name
        assert len(p.names) == len(set(p.names)) and all(f >= 0 for f in p.backward_flops)
    assert len(load_profile("resnet50").names) == 161  # 53 convolutions, 53 batch norms x 2, fc x 2


@pytest.mark.slow
def test_the_table_is_what_the_model_definitions_give():
    import json

    from testbed.workloads.modelzoo import TABLE, tables

    assert json.loads(TABLE.read_text()) == json.loads(json.dumps(tables())), (
        "profiles.json is stale: python -m testbed.workloads.modelzoo")


def workload(name="resnet50", scale=0.001, compute_ms=0.0, backward_frac=2 / 3):
    cfg = WorkloadConfig(name=f"profile:{name}", payload=f"scaled:{scale}", compute_ms=compute_ms,
                         backward_frac=backward_frac)
    return SyntheticWorkload(cfg, seed=0, workers=2)


def test_a_profile_lays_the_gradient_out_as_the_models_tensors():
    w, p = workload(), load_profile("resnet50")
    assert [n for n, _ in w.layout] == list(p.names)
    assert w.logical_sizes() == p.numels and w.logical_bytes == 4 * p.params
    assert w.numel == sum(max(1, round(n * 0.001)) for n in p.numels)
    assert sum(w.backward_share) == pytest.approx(1.0)
    conv1 = p.names.index("conv1.weight")  # 3x7x7x64 at 112x112: the largest share of any stem tensor
    assert w.backward_share[conv1] > w.backward_share[p.names.index("bn1.weight")]
    # DDP-like buckets over the real sizes: 97.5 MiB in 25 MiB buckets, tensors never split;
    # a first bucket of at most 1 MiB holds fc.bias alone (fc.weight is 7.8 MiB)
    assert len(make_buckets(w.logical_sizes(), 25 * 2**20 // 4)) == 5
    first = make_buckets(w.logical_sizes(), 25 * 2**20 // 4, 2**20 // 4)
    assert len(first) == 6 and [p.names[i] for i in first[0]] == ["fc.bias"]


def test_backward_is_spread_over_the_buckets_by_flops():
    """Each bucket is handed out no earlier than forward + its cumulative FLOPs share of backward
    (sleeps never end early); the whole takes the compute time."""
    compute = 0.2
    w = workload(compute_ms=compute * 1e3, backward_frac=0.5)
    buckets = make_buckets(w.logical_sizes(), 25 * 2**20 // 4)
    seen = []
    t0 = time.perf_counter()
    w.gradient_buckets(w.batch(0, 0), buckets, lambda b, view: seen.append((b, time.perf_counter() - t0)))
    assert [b for b, _ in seen] == list(range(len(buckets)))
    cumulative = 0.0
    for (b, at) in seen:
        cumulative += sum(w.backward_share[i] for i in buckets[b])
        assert at >= compute * 0.5 + compute * 0.5 * cumulative - 1e-3
    assert cumulative == pytest.approx(1.0)


def test_time_in_a_buckets_hook_delays_the_rest_of_backward():
    """A straggler sleeps in the hook of the first bucket (Stretch.ready): the later buckets keep
    their shares of backward after it, so the whole takes the compute time plus the sleep (a
    bound, never shorter; on a schedule fixed at the start they came at once, and it did not)."""
    compute, delay = 0.1, 0.06
    w = workload(compute_ms=compute * 1e3, backward_frac=0.5)
    buckets = make_buckets(w.logical_sizes(), 25 * 2**20 // 4)
    assert len(buckets) > 2
    seen = []

    def hook(b: int, view: object) -> None:
        seen.append(time.perf_counter() - t0)
        if b == 0:
            time.sleep(delay)

    t0 = time.perf_counter()
    w.gradient_buckets(w.batch(0, 0), buckets, hook)
    assert time.perf_counter() - t0 >= compute + delay - 1e-3
    assert len(seen) == len(buckets)
