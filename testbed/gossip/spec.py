"""What is true of `gossip`: decentralised SGD over a neighbour graph (no server, no barrier).

Every worker takes a local SGD step and averages its model with its graph neighbours
(`--topology`, Metropolis-Hastings weights; `topology.py`), either in rounds or, with
`--gossip-async`, pairwise with one random neighbour at a time (`peer.py`). Per synchronous
step a worker sends its K-byte model to its d neighbours: a + d K/B. Pure: no Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from testbed.analysis import costmodel
from testbed.config import RunConfig, fail
from testbed.gossip.config import GossipConfig
from testbed.gossip.topology import TOPOLOGIES, degree
from testbed.strategies.contract import Equivalence, Prediction, Strategy, StrategySpec, Variant
from testbed.workloads import tiny


class GossipSpec(StrategySpec):
    name = "gossip"
    family = "gossip"
    sections = {"gossip": GossipConfig}  # its config section (testbed.gossip.config)
    keys = frozenset({"gossip.topology", "gossip.asynchronous", "compression"})
    choices = {"gossip.topology": TOPOLOGIES}
    # runs equal to one-process training (tests/ray/test_equivalence.py): on the complete graph
    # one mixing round is the exact average, so gossip is synchronous SGD, with emulated peers too
    equivalence = (Equivalence(5, {**tiny.SYN, "gossip.topology": "complete", "network.bandwidth": "10Gbit",
                                   "cluster.real_workers": 2}),)
    summary_keys = {
        "grad_bytes_logical": "bytes: the logical model size K (what a worker sends a neighbour)",
        "topology": "--topology",
        "asynchronous": "--gossip-async",
        "degree": "count: the largest number of distinct neighbours d",
        "spectral_gap": "1 - |lambda_2(W)|: the share of disagreement one mixing round removes",
        "consensus_distance_initial": "mean L2 distance of the replicas from their average, at the start",
        "consensus_distance": "list: the same after every model update",
        "consensus_distance_last": "the same after the last update",
    }

    def shell(self) -> type[Strategy]:
        from testbed.gossip.strategy import GossipSGD  # the Ray shell, imported when a run starts
        return GossipSGD

    def synchronous(self, cfg: RunConfig) -> bool:
        return not cfg.gossip.asynchronous

    def cannot_emulate_peers(self, cfg: RunConfig) -> str | None:
        """Synchronous gossip plays emulated peers (testbed.gossip.segment): a real worker keeps
        its peers' replicas and sends their models at the NIC model's times. A pairwise exchange
        (--gossip-async) is a call into the partner's live replica at a moment of its choosing,
        which a peer living in another worker's process cannot answer in its own time."""
        if cfg.gossip.asynchronous:
            return "--gossip-async averages pairwise with live replicas, each a real worker's"
        return None

    def validate(self, cfg: RunConfig) -> None:
        if cfg.compression.kind == "topk":
            fail("compression", cfg.compression, "gossip averages parameters, not gradients, and "
                 "top-k of parameters does not average; use fp16 or none")

    def map_variants(self, cfg: RunConfig) -> list[Variant]:
        """Every --topology in rounds, and pairwise (--gossip-async) on cfg's topology. The
        replicas only approach their average, so no variant is `exact`."""
        rounds = [Variant({"gossip.topology": t, "gossip.asynchronous": False}, f"{self.name} {t}", exact=False)
                  for t in TOPOLOGIES]
        return rounds + [Variant({"gossip.asynchronous": True}, f"{self.name} {cfg.gossip.topology} async",
                                 exact=False)]

    def _model_bytes(self, cfg: RunConfig, resolved: Mapping[str, Any]) -> float:
        return cfg.compression.wire_bytes(resolved["grad_bytes_logical"])

    def predict(self, cfg: RunConfig, resolved: Mapping[str, Any], latency: float,
                bandwidth: float) -> Prediction:
        k, n = self._model_bytes(cfg, resolved), cfg.workers
        suffix = " with K/2 (fp16)" if cfg.compression.kind == "fp16" else ""
        if cfg.gossip.asynchronous:
            comm = 0.0 if n == 1 else costmodel.gossip_async_comm_s(k, latency, bandwidth)
            return Prediction(comm, "2*(a + K/B) (one pairwise exchange)" + suffix)
        d = min(degree(cfg.gossip.topology, n), n - 1)
        return Prediction(costmodel.gossip_comm_s(d, k, latency, bandwidth), "a + d*K/B" + suffix)

    def bytes_per_worker(self, cfg: RunConfig, resolved: Mapping[str, Any]) -> float:
        """Synchronous: d models; asynchronous: one (booked on the worker that starts the exchange)."""
        k, n = self._model_bytes(cfg, resolved), cfg.workers
        if cfg.gossip.asynchronous:
            return k if n > 1 else 0.0
        return min(degree(cfg.gossip.topology, n), n - 1) * k


GOSSIP = GossipSpec()
