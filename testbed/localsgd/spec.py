"""What is true of `local-sgd`: workers take H steps of their own, then average their replicas
with the allreduce (testbed.localsgd.outer: the round and the outer step). Pure: no Ray.

Every worker holds a replica and steps it with the run's optimizer on its own batches; after
every H-th iteration (and the last) the replicas are summed bucket by bucket by `--algorithm`
over the object store, exactly as `ring` sums gradients (the shell is the allreduce's, with
another step: `peer.py`), divided by N, and the outer step (`--outer-optimizer`) gives every
replica the next round's start. Per iteration a worker sends 2K(N-1)/(N H) bytes on average: H
times less than `ring`, paid in one burst per round, at the price of replicas that drift apart
for H steps. Cost per iteration: the algorithm's allreduce of the parameters, divided by H.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from testbed.allreduce.algorithms import ALGORITHMS
from testbed.allreduce.spec import RING, allreduce_comm_s
from testbed.config import RunConfig, fail
from testbed.emulation.peers import owner
from testbed.localsgd.config import LocalSGDConfig
from testbed.localsgd.outer import OuterStep, ends_round, rounds
from testbed.strategies.contract import Equivalence, Prediction, Strategy, StrategySpec, Variant
from testbed.training.optim import Optimizer, mean_gradient, optimizer_for
from testbed.workloads import make_workload, tiny

SUMMARY_KEYS = {
    "grad_bytes_logical": "bytes: the logical parameter (= gradient) bytes K, averaged each round",
    "local_steps": "count: H, the local steps between two averages (--local-steps)",
    "averages": "count: rounds that ended in an average across the workers (measured)",
    "average_s_p50": "s: median over rounds of the summed bucket allreduce times of the parameters",
    "outer_optimizer": "average or nesterov (--outer-optimizer)",
    "buckets": "count: parameter buckets of each average (--bucket-mb)",
    "algorithm": "--algorithm of the average",
    "nodes": "count: node groups (Ray nodes, or --node-size groups)",
    "node_size": "count: workers in the largest node group",
}

# H = 1 with `average` is synchronous SGD (one case against the plain reference); longer rounds,
# Nesterov's outer step and a last round cut short by --steps against `reference` below. The
# synthetic gradient is linear in the parameters, so with SGD an average of H local steps equals
# H synchronous steps: the H = 2 case runs Adam, whose local states make the rounds differ (0.035
# from synchronous Adam after 5 steps at lr 0.01).
EQUIVALENCE = (
    Equivalence(3, {**tiny.SMALL_BUCKETS, "localsgd.local_steps": 1}),
    Equivalence(3, {**tiny.SMALL_BUCKETS, "localsgd.local_steps": 2, "workload.optimizer": "adam",
                    "workload.lr": 0.01}),
    Equivalence(5, {**tiny.SMALL_BUCKETS, "localsgd.local_steps": 2, "network.bandwidth": "10Gbit",
                    "cluster.real_workers": 2}),  # three emulated peers, played by the two real workers
    Equivalence(4, {**tiny.SYN, "localsgd.local_steps": 2, "localsgd.outer_optimizer": "nesterov",
                    "ring.algorithm": next(a for a, e in ALGORITHMS.items() if not e.neighbour_exchange),
                    "cluster.workers_per_process": 2}),  # an any-pair algorithm, two workers a process
)


class LocalSGDSpec(StrategySpec):
    name = "local-sgd"
    family = "allreduce"
    library = False  # the allreduce shell's switch: our own allreduce, not torch.distributed's
    sections = {"localsgd": LocalSGDConfig}  # its config section (testbed.localsgd.config)
    keys = frozenset({"localsgd.local_steps", "localsgd.outer_optimizer", "localsgd.outer_lr",
                      "localsgd.outer_momentum", "ring.bucket_mb", "ring.first_bucket_mb", "ring.algorithm",
                      "ring.node_size"})
    choices = {"ring.algorithm": tuple(ALGORITHMS)}
    summary_keys = SUMMARY_KEYS
    fault_kinds = ("nan",)  # a lost worker takes its round's own replica with it (strategy.py)
    equivalence = EQUIVALENCE
    builds_on = (RING,)  # its shell is the allreduce's with another step (peer.py, strategy.py)

    def shell(self) -> type[Strategy]:
        from testbed.localsgd.strategy import LocalSGD  # the Ray shell, imported when a run starts
        return LocalSGD

    def cannot_share_processes(self, cfg: RunConfig) -> str | None:
        return None  # neighbours in one process share a slot, as the ring's do

    def cannot_emulate_peers(self, cfg: RunConfig) -> str | None:
        """The average is the ring's allreduce, so it plays emulated peers as the ring does
        (testbed.allreduce.relay): an emulated peer's replica is a copy of its real owner's (it
        takes the owner's local steps on the owner's batches), and the mean weighs each real
        replica by the positions it stands for. A peer's straggler lag at an average is its
        delays beyond its owner's added up over the round's H local steps (LocalSGDPeer.peer_delays)."""
        if cfg.ring.algorithm != "ring":
            return f"plays emulated peers with --algorithm ring (got --algorithm {cfg.ring.algorithm})"
        return None

    def validate(self, cfg: RunConfig) -> None:
        own = cfg.localsgd
        if own.outer_optimizer == "average":
            for key in ("outer_lr", "outer_momentum"):
                if getattr(own, key) != getattr(LocalSGDConfig(), key):
                    fail(f"localsgd.{key}", getattr(own, key), "applies to --outer-optimizer nesterov; "
                         "add it or drop the flag")
        if cfg.ring.node_size is not None and not ALGORITHMS[cfg.ring.algorithm].needs_groups:
            fail("ring.node_size", cfg.ring.node_size, "groups workers into nodes for an algorithm that "
                 f"takes node groups; drop --node-size (got --algorithm {cfg.ring.algorithm})")

    def message_path(self, cfg: RunConfig) -> str:
        return ALGORITHMS[cfg.ring.algorithm].message_path

    def map_variants(self, cfg: RunConfig) -> list[Variant]:
        """Rounds of 4 and 16 local steps, each outer optimizer, averaged by the ring (the table's
        first algorithm): none is the minibatch step, so each ranks by its own samples to the target."""
        ring = next(iter(ALGORITHMS))
        return [Variant({"localsgd.local_steps": h, "localsgd.outer_optimizer": outer, "ring.algorithm": ring,
                         "ring.node_size": None},
                        f"{self.name} H={h} {outer}", exact=False)
                for h in (4, 16) for outer in ("average", "nesterov")]

    def period(self, cfg: RunConfig) -> int:
        """An average every H iterations: measured by the mean step, as `predict` spreads them."""
        return cfg.localsgd.local_steps

    def plan(self, cfg: RunConfig, logical_sizes: list[int], backward_share: list[float] | None) -> dict[str, Any]:
        from testbed.allreduce.ring import make_buckets

        elems = max(1, int(cfg.ring.bucket_mb * 2**20 / 4))
        first = max(1, int(cfg.ring.first_bucket_mb * 2**20 / 4))
        return {**super().plan(cfg, logical_sizes, backward_share),
                "buckets": len(make_buckets(logical_sizes, elems, first))}

    def predict(self, cfg: RunConfig, resolved: Mapping[str, Any], latency: float,
                bandwidth: float) -> Prediction:
        n, k, h = cfg.workers, resolved["grad_bytes_logical"], cfg.localsgd.local_steps
        alg = ALGORITHMS[cfg.ring.algorithm]
        buckets = resolved.get("buckets", 1)
        shape = {"node_size": resolved.get("node_size") or n, "nodes": resolved.get("nodes") or 1}
        average = allreduce_comm_s(alg.name, n, k, latency, bandwidth, buckets=buckets, **shape)
        share = rounds(h, cfg.steps) / cfg.steps  # averages per iteration: 1/H, the last round included
        formula = alg.formula.replace("(a + ", "(b*a + ") if buckets > 1 else alg.formula
        return Prediction(average * share, f"[{formula}] * R/S (R = {rounds(h, cfg.steps)} averages "
                                           f"in S = {cfg.steps} iterations, H = {h})")

    def bytes_per_worker(self, cfg: RunConfig, resolved: Mapping[str, Any]) -> float:
        n, k = cfg.workers, resolved["grad_bytes_logical"]
        return 2 * k * (n - 1) / n * rounds(cfg.localsgd.local_steps, cfg.steps) / cfg.steps

    def reference(self, cfg: RunConfig, device: str = "cpu") -> np.ndarray | None:
        """Local SGD in one process: N replicas, each with its own optimizer state, stepped in
        rank order; at the end of a round the mean (rank order) and the outer step. With H = 1
        and `average` it is plain SGD, and the plain reference is used. With emulated peers
        (--real-workers K < N) only the K real replicas step, and position x adds its owner's."""
        own = cfg.localsgd
        if own.local_steps == 1 and own.outer_optimizer == "average":
            return None
        model = make_workload(replace(cfg.workload, compute_ms=0.0), seed=cfg.seed, workers=cfg.workers,
                              device=device)
        anchor = model.get_params()
        sources = [owner(cfg.workers, cfg.real_workers, x) for x in range(cfg.workers)]  # x's replica's owner
        real = sorted(set(sources))  # every position, or the real workers'
        replicas = {r: anchor.copy() for r in real}
        optimizers = {r: Optimizer(optimizer_for(cfg.workload)) for r in real}
        outer = OuterStep(own.outer_optimizer, own.outer_lr, own.outer_momentum)
        for t in range(cfg.steps):
            for r in real:
                model.set_params(replicas[r])
                grad = np.asarray(model.gradient(model.batch(r, t))[0], dtype=np.float32)
                optimizers[r].step(replicas[r], grad)
            if ends_round(t, own.local_steps, cfg.steps):  # an emulated peer's replica is its owner's
                anchor = outer.step(anchor, mean_gradient([replicas[q] for q in sources]))
                replicas = {r: anchor.copy() for r in real}
        return anchor


LOCAL_SGD = LocalSGDSpec()
