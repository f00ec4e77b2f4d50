"""What is true of `ring` (our peer-to-peer allreduce) and `allreduce-torch` (the library's).

Both keep a full replica per worker and sum gradient buckets across workers every step; `ring`
moves the pieces itself by `--algorithm` (the table `algorithms.ALGORITHMS`: schedules, and
costs from `testbed.analysis.costmodel`) over `--transport`, and may compress
them; `allreduce-torch` hands each bucket to torch.distributed.all_reduce. Pure: no Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from testbed.allreduce.algorithms import ALGORITHMS, groups_of_size, lookup
from testbed.allreduce.config import RingConfig
from testbed.allreduce.ring import make_buckets
from testbed.analysis import costmodel
from testbed.analysis.costmodel import NotModelled
from testbed.config import RunConfig, fail
from testbed.strategies.contract import (
    Equivalence,
    Prediction,
    Strategy,
    StrategySpec,
    Variant,
)
from testbed.workloads import tiny

TRANSPORTS = ("object-store", "torch")
RING_KEYS = frozenset({"ring.bucket_mb", "ring.first_bucket_mb", "ring.overlap", "ring.transport", "ring.algorithm",
                       "ring.node_size", "compression"})

SUMMARY_KEYS = {
    "grad_bytes_logical": "bytes: the logical gradient K",
    "buckets": "count: gradient buckets (tensor fusion, --bucket-mb)",
    "bucket_bytes_logical": "bytes: each bucket's logical size, in the order backward produces them",
    "bucket_backward_share": "fractions: each bucket's share of backward (synthetic: by elements, or "
                             "by the profile's FLOPs); null for a torch model",
    "bucket_allreduce_s": "s: mean allreduce time per bucket, in bucket order",
    "allreduce_s_p50": "s: median over steps of the summed bucket allreduce times",
    "overlap_saved_s": "s: mean per worker step of (summed bucket allreduce time - comm time after "
                       "backward); positive when overlap hid communication under backward",
    "algbw_Bps": "bytes/s: K / allreduce_s_p50",
    "busbw_Bps": "bytes/s: algbw * 2(N-1)/N (nccl-tests' bus bandwidth)",
    "transport": "how pieces moved: object-store, torch, or torch.distributed.all_reduce",
    "algorithm": "--algorithm, or 'library' for allreduce-torch",
    "nodes": "count: node groups (Ray nodes, or --node-size groups)",
    "node_size": "count: workers in the largest node group",
}


def allreduce_comm_s(algorithm: str, n: int, k: float, a: float, b: float, buckets: int = 1,
                     node_size: int | None = None, nodes: int | None = None) -> float:
    """The cost model of one allreduce by --algorithm (its table entry's cost)."""
    return lookup(algorithm).cost(n, k, a, b, buckets, node_size, nodes)


def _names(wanted: str) -> str:
    """The algorithms whose entry has the flag `wanted`, for error messages ("x or y")."""
    return " or ".join(name for name, alg in ALGORITHMS.items() if getattr(alg, wanted))


# Runs equal to one-process training (tests/ray/test_equivalence.py): Adam where every worker
# applies it, bucketed synthetic gradients at N = 1, 2 (one chunk each way), 4, ranks sharing a
# process (in-process slots + 2 channels), no overlap, any-pair sends over gloo (the ring's
# exchange over torch: test_ring.py), ResNet-50's 161 tensors bucketed by their real sizes, and
# rings of emulated peers (the reference weighs each real worker's gradient by its segment).
RING_EQUIVALENCE = (
    Equivalence(2, tiny.RESNET_ADAM),
    *[Equivalence(n, tiny.SMALL_BUCKETS) for n in (1, 2, 4)],
    Equivalence(4, {**tiny.SMALL_BUCKETS, "cluster.workers_per_process": 3}),
    Equivalence(3, {**tiny.SMALL_BUCKETS, "ring.overlap": False}),
    Equivalence(3, {**tiny.SMALL_BUCKETS, "ring.transport": "torch", "ring.algorithm": "halving-doubling"}),
    Equivalence(2, tiny.PROFILE),
    # emulated peers (testbed.allreduce.relay): N a multiple of K, uneven segments (weights 3 and
    # 2), one real worker whose segment comes back to it, and real workers sharing processes
    *[Equivalence(n, {**tiny.SMALL_BUCKETS, "network.bandwidth": "10Gbit", "cluster.real_workers": k})
      for n, k in ((8, 2), (5, 2), (3, 1))],
    Equivalence(6, {**tiny.SMALL_BUCKETS, "network.bandwidth": "10Gbit", "cluster.real_workers": 4,
                    "cluster.workers_per_process": 2, "ring.overlap": False}),
)
LIBRARY_EQUIVALENCE = (Equivalence(2, tiny.LM_ADAM), Equivalence(3, tiny.SMALL_BUCKETS))


class AllreduceSpec(StrategySpec):
    family = "allreduce"
    sections = {"ring": RingConfig}  # its config section (testbed.allreduce.config)
    summary_keys = SUMMARY_KEYS

    def shell(self) -> type[Strategy]:
        from testbed.allreduce.strategy import RingAllreduce  # the Ray shell, imported at a run
        return RingAllreduce

    def __init__(self, *, library: bool) -> None:
        self.library = library  # torch.distributed.all_reduce sums the buckets
        self.equivalence = LIBRARY_EQUIVALENCE if library else RING_EQUIVALENCE
        self.name = "allreduce-torch" if library else "ring"
        self.keys = frozenset({"ring.bucket_mb", "ring.first_bucket_mb", "ring.overlap"}) if library else RING_KEYS
        self.choices = {} if library else {"ring.transport": TRANSPORTS, "ring.algorithm": tuple(ALGORITHMS)}

    def cannot_share_processes(self, cfg: RunConfig) -> str | None:
        """The object-store ring links neighbours in one process through memory (channels.Slot);
        torch.distributed's ranks are processes."""
        if self.library or cfg.ring.transport == "torch":
            return "torch.distributed's ranks are processes (use --strategy ring --transport object-store)"
        return None

    def cannot_emulate_peers(self, cfg: RunConfig) -> str | None:
        """The ring's neighbour exchange over the object store, uncompressed, plays emulated peers
        (testbed.allreduce.relay): a real worker computes what its segment sends on."""
        if self.library:
            return "hands each bucket to torch.distributed, which needs every rank real"
        if cfg.ring.algorithm != "ring" or cfg.ring.transport != "object-store" or cfg.compression.kind != "none":
            return (f"plays emulated peers with --algorithm ring over --transport object-store, uncompressed "
                    f"(got --algorithm {cfg.ring.algorithm}, --transport {cfg.ring.transport}, "
                    f"--compression {cfg.compression.kind})")
        return None

    def cannot_share_gpu(self, cfg: RunConfig) -> str | None:
        """On GPUs torch.distributed runs NCCL, which refuses two ranks on one device."""
        if self.library:
            return ("allreduce-torch's NCCL ranks need a GPU each (NCCL refuses two ranks on one GPU); "
                    "use --strategy ring, whose object-store transport several workers on one GPU share")
        if cfg.ring.transport == "torch":
            return ("--transport torch runs NCCL, whose ranks need a GPU each (NCCL refuses two ranks on "
                    "one GPU); use --transport object-store")
        return None

    def validate(self, cfg: RunConfig) -> None:
        if self.library:
            if cfg.network.emulated:
                fail("network.bandwidth", cfg.network.bandwidth, "the library allreduce moves bytes "
                     "itself and cannot be emulated; drop --bandwidth or use --strategy ring")
            return
        r = cfg.ring
        alg = ALGORITHMS[r.algorithm]  # a known name: the choices are checked before this
        if r.node_size is not None and not alg.needs_groups:
            fail("ring.node_size", r.node_size, f"groups workers into nodes for --algorithm "
                 f"{_names('needs_groups')}; add it or drop --node-size (got --algorithm {r.algorithm})")
        if cfg.compression.kind == "topk" and not alg.neighbour_exchange:
            fail("compression", cfg.compression, "top-k pieces are gathered around the ring; "
                 f"use --algorithm {_names('neighbour_exchange')} (got {r.algorithm}) or fp16")

    def message_path(self, cfg: RunConfig) -> str:
        """torch p2p over --transport torch; over the object store, the ring's neighbour exchange
        uses shared-memory channels and the any-pair algorithms actor calls."""
        if cfg.ring.transport == "torch":
            return "torch"
        return ALGORITHMS[cfg.ring.algorithm].message_path

    def map_variants(self, cfg: RunConfig) -> list[Variant]:
        """ring: every --algorithm, with and without --overlap, over the object store (the torch
        transport moves the same bytes by the same model); one that needs node groups only where
        the map was told the workers per machine (--node-size), which it groups by. allreduce-torch: its
        defaults (the model has no formula for the library's own algorithm)."""
        if self.library:
            return super().map_variants(cfg)
        algorithms = [a for a in ALGORITHMS.values() if not a.needs_groups or cfg.ring.node_size is not None]
        return [Variant({"ring.algorithm": alg.name, "ring.overlap": overlap, "ring.transport": "object-store",
                         "ring.node_size": cfg.ring.node_size if alg.needs_groups else None},
                        f"{self.name} {alg.name}" + (f" g={cfg.ring.node_size}" if alg.needs_groups else "")
                        + ("" if overlap else ", no overlap"))
                for alg in algorithms for overlap in (True, False)]

    def plan(self, cfg: RunConfig, logical_sizes: list[int], backward_share: list[float] | None) -> dict[str, Any]:
        """The buckets a peer forms (peer.py: make_buckets over the logical sizes, first bucket
        capped), each one's bytes and share of backward, and the node groups of --node-size (one
        node without it, as on one machine)."""
        elems = max(1, int(cfg.ring.bucket_mb * 2**20 / 4))
        first = max(1, int(cfg.ring.first_bucket_mb * 2**20 / 4))
        buckets = make_buckets(logical_sizes, elems, first)
        groups = groups_of_size(cfg.workers, cfg.ring.node_size or cfg.workers)
        return {**super().plan(cfg, logical_sizes, backward_share), "buckets": len(buckets),
                "bucket_bytes_logical": [4 * sum(logical_sizes[i] for i in b) for b in buckets],
                "bucket_backward_share": None if backward_share is None
                else [float(sum(backward_share[i] for i in b)) for b in buckets],
                "nodes": len(groups), "node_size": max(len(g) for g in groups)}

    def predict(self, cfg: RunConfig, resolved: Mapping[str, Any], latency: float,
                bandwidth: float) -> Prediction:
        if self.library:
            raise NotModelled("torch.distributed moves the bytes itself; its algorithm is the library's")
        n, k, a, b = cfg.workers, resolved["grad_bytes_logical"], latency, bandwidth
        buckets, spec = resolved.get("buckets", 1), cfg.compression
        if spec.kind == "topk":
            comm = costmodel.sparse_allgather_comm_s(n, spec.wire_bytes(k), a, b, buckets=buckets)
            return Prediction(comm, f"(N-1)*({'b*' if buckets > 1 else ''}a + 2*F*K/B) "
                                    f"(top-k, F={spec.fraction:g})")
        alg = cfg.ring.algorithm
        shape = {"node_size": resolved.get("node_size"), "nodes": resolved.get("nodes")}
        comm = allreduce_comm_s(alg, n, spec.wire_bytes(k), a, b, buckets=buckets, **shape)
        formula = ALGORITHMS[alg].formula
        if buckets > 1:  # every round's latency is paid once per bucket
            formula = formula.replace("(a + ", "(b*a + ").replace("log2(p)*a", "log2(p)*b*a")
        formula += " with K/2 (fp16)" if spec.kind == "fp16" else ""
        shares, sizes = resolved.get("bucket_backward_share"), resolved.get("bucket_bytes_logical")
        if not (cfg.ring.overlap and n > 1 and shares and sizes and not cfg.workload.real_compute):
            return Prediction(comm, formula)
        # buckets allreduced as backward produces them: only what outlasts backward is exposed
        total = cfg.workload.compute_ms / 1000.0
        each = [allreduce_comm_s(alg, n, spec.wire_bytes(x), a, b, **shape) for x in sizes]
        exposed = costmodel.overlapped_comm_s(total * (1 - cfg.workload.backward_frac),
                                              total * cfg.workload.backward_frac, shares, each)
        return Prediction(exposed, formula + ", overlapped bucket by bucket with backward "
                          "(costmodel.overlapped_comm_s)", comm_s_no_overlap=sum(each))

    def bytes_per_worker(self, cfg: RunConfig, resolved: Mapping[str, Any]) -> float:
        """Every algorithm moves 2(N-1)K in all, 2K(N-1)/N per worker on average; top-k sends
        its 2FK-byte piece to the right neighbour N-1 times."""
        n, k = cfg.workers, resolved["grad_bytes_logical"]
        if cfg.compression.kind == "topk":
            return (n - 1) * cfg.compression.wire_bytes(k)
        return 2 * cfg.compression.wire_bytes(k) * (n - 1) / n


RING = AllreduceSpec(library=False)
TORCH_ALLREDUCE = AllreduceSpec(library=True)
