"""One run's place on a Ray cluster: resources, placement, GPUs (Ray itself is started and
stopped by `rayprocs.py`).

Every actor of a run is placed through one placement group: bundle i is actor i (workers first,
then servers; a server colocated with worker i shares bundle i, so the same node). `--placement pack` fills nodes in order, `spread` puts bundles on distinct nodes
where it can. CPU shares are fractional so that 8+ workers fit on a 2-core machine; a shortfall
(GPUs, memory for that many processes) is reported before any actor is created.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.config import ClusterConfig, ConfigError
from testbed.runtime.rayprocs import check_reachable, start_ray, stop_ray
from testbed.runtime.reaper import pid_alive
from testbed.workloads import footprint

# Resident memory of one worker process, measured on the 2-core machine (ps RSS after setup):
# a torch worker is dominated by the torch import, a synthetic worker by Ray's runtime.
ACTOR_MEMORY_TORCH = 300 * 2**20
ACTOR_MEMORY_PLAIN = 110 * 2**20
RAY_GRANULARITY = 1e-4  # Ray rejects fractional resources finer than this


@dataclass(frozen=True)
class ResourcePlan:
    cpus_per_worker: float
    cpus_per_server: float
    gpus_per_worker: float
    device: str  # resolved: "cpu" or "cuda"


def plan_resources(
    *, workers: int, servers: int, total_cpus: float, total_gpus: float, total_memory: float,
    device: str, cpus_per_worker: float | None, torch_workers: bool | Callable[[str], bool],
    node_cpus: list[float] | None = None, colocated: bool = False, per_process: int = 1,
    gpu_exclusive: str | None = None, model_bytes: float = 0.0,
) -> ResourcePlan:
    """Decide each actor's share; raise ConfigError naming the flag when the cluster is short.

    The share is the largest that lets every actor's bundle fit on some node (`node_cpus`, one
    entry per node; None: one node of `total_cpus`): 5 actors on two 2-CPU nodes get 0.666, not
    4/5 = 0.8, which no node could hold three of. Colocated servers double their worker's bundle.
    `torch_workers`: whether worker processes import torch (their memory), or a function of the
    resolved device that says so. `workers` counts worker processes, each hosting `per_process`
    logical workers (--workers-per-process): shares and memory are per process, `cpus_per_worker`
    is per logical worker (a process gets K of them), and the errors name the flags as given.
    `gpu_exclusive`: why the strategy's workers cannot share a GPU, with the fix (its spec's
    `cannot_share_gpu`), or None where several workers may share one (each a fraction of it).
    `model_bytes`: one logical worker's model state (`testbed.workloads.footprint`), on top of
    each worker process's runtime."""
    if device == "cuda" and total_gpus < 1:
        raise ConfigError("--device 'cuda': the cluster has no GPU; use --device cpu (or auto)")
    resolved = "cuda" if device == "cuda" or (device == "auto" and total_gpus >= 1) else "cpu"
    if resolved == "cuda" and gpu_exclusive and total_gpus < workers:
        raise ConfigError(f"--device {device} with --workers {workers} on {total_gpus:g} GPU(s): "
                          f"{gpu_exclusive}, or at most {int(total_gpus)} workers")
    actors = workers + servers
    if callable(torch_workers):  # whether workers import torch can depend on the device
        torch_workers = torch_workers(resolved)
    per_actor = ACTOR_MEMORY_TORCH if torch_workers else ACTOR_MEMORY_PLAIN
    per_worker = per_actor + model_bytes * per_process
    fit = int((total_memory - servers * per_actor) // per_worker)  # worker processes that fit
    asked = (f"--workers {workers}" if per_process == 1 else
             f"--workers-per-process {per_process}: {workers} worker processes")
    if workers > fit:
        raise ConfigError(
            f"{asked}: {actors} actor processes need about "
            f"{(workers * per_worker + servers * per_actor) / 2**30:.1f} GiB but the cluster has "
            f"{total_memory / 2**30:.1f} GiB; use at most {max(1, fit) * per_process} workers or add nodes (--address)"
        )
    if cpus_per_worker is None:
        units = [2] * min(servers, workers) + [1] * (workers - min(servers, workers)) if colocated else [1] * actors
        share = packable_share(units, node_cpus or [total_cpus], min(1.0, total_cpus / actors))
        if share < RAY_GRANULARITY:
            raise ConfigError(f"{asked}: too many actors for {total_cpus:g} CPUs; use fewer workers")
        cpw = cps = share
    else:
        cpw = cpus_per_worker * per_process  # one process's share
        cps = min(1.0, max(RAY_GRANULARITY, (total_cpus - cpw * workers) / max(servers, 1)))
        if cpw * workers + (cps * servers if servers else 0) > total_cpus + 1e-9:
            raise ConfigError(
                f"--cpus-per-worker {cpus_per_worker:g}: {workers * per_process} workers need "
                f"{cpw * workers:g} CPUs but the cluster has {total_cpus:g}; lower it or use fewer workers"
            )
    gpw = 0.0
    if resolved == "cuda":
        gpw = min(1.0, total_gpus / workers)
        gpw = math.floor(gpw / RAY_GRANULARITY) * RAY_GRANULARITY
    return ResourcePlan(cpw, cps, gpw, resolved)


def packable_share(units: list[int], node_cpus: list[float], cap: float) -> float:
    """The largest CPU share s <= cap (a multiple of Ray's granularity) such that bundles of
    u * s CPUs (u in `units`) fit the nodes, first-fit by decreasing size; 0 if none does."""
    def fits(share: float) -> bool:
        free = sorted(node_cpus, reverse=True)
        for u in sorted(units, reverse=True):
            for j, room in enumerate(free):
                if u * share <= room + 1e-9:
                    free[j] = room - u * share
                    break
            else:
                return False
        return True

    # the best share fills some node exactly with k bundle units: try each c/k below the cap
    candidates = sorted({min(cap, c / k) for c in node_cpus for k in range(1, 2 * len(units) + 1)}, reverse=True)
    for share in candidates:
        share = math.floor(share / RAY_GRANULARITY) * RAY_GRANULARITY
        if share >= RAY_GRANULARITY and fits(share):
            return share
    return 0.0


def nvidia_devices() -> int:
    """GPUs the NVIDIA driver lists (/proc/driver/nvidia/gpus), 0 where it is not loaded."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def local_machine() -> dict[str, float]:
    """CPUs, GPUs and memory of this machine, without starting Ray."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpus = 0
    if nvidia_devices():  # torch (seconds to import) only where there is a GPU for it to use
        try:
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:
            pass
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(gpus), "memory": float(mem) * 0.7}


def node_labels(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Ray node id -> how records name the node: its IP address, with the id's first 6 hex
    digits after a slash where several live nodes share one address (raylets on one host)."""
    alive = [n for n in nodes if n.get("Alive")]
    ips = [n.get("NodeManagerAddress", "?") for n in alive]
    return {n["NodeID"]: ip if ips.count(ip) == 1 else f"{ip}/{n['NodeID'][:6]}"
            for n, ip in zip(alive, ips, strict=True)}


class Cluster:
    """Start (or attach to) Ray, reserve resources for one run's actors, release them."""

    def __init__(self, cfg: ClusterConfig, *, workers: int, servers: int = 0,
                 torch_workers: bool | Callable[[str], bool] = True, colocated: bool = False,
                 gpu_exclusive: str | None = None, workload: Any = None) -> None:
        # --workers-per-process K: `workers` logical workers live in ceil(workers / K) processes
        # (testbed.runtime.hosting); a bundle, a CPU share and a memory estimate are per process
        # (None: a ClusterConfig no run validated, the benchmark's: one process per actor)
        self.per_process = 1 if cfg.workers_per_process is None else cfg.workers_per_process
        self.ranks = workers
        self.cfg, self.processes, self.servers = cfg, -(-workers // self.per_process), servers
        self.colocated = colocated  # server i in worker i's bundle (same node), not a bundle of its own
        self.torch_workers = torch_workers
        self.gpu_exclusive = gpu_exclusive  # why its workers need a GPU each (None: they may share one)
        self.workload = workload  # its WorkloadConfig: the model's memory (None: not counted)
        self.started_ray = False
        self.pg: Any = None
        self.plan: ResourcePlan | None = None
        self.nodes_at_start = 0

    def address(self) -> str | None:
        return self.cfg.address or os.environ.get("RAY_ADDRESS") or None

    def precheck_local(self) -> ResourcePlan | None:
        """Check resources (embedded) or reachability (--address) before Ray starts."""
        import ray

        if ray.is_initialized():
            return None
        if self.address() is not None:
            check_reachable(self.address())
            return None
        m = local_machine()
        return self._plan(m["CPU"], m["GPU"], m["memory"])

    def _plan(self, cpus: float, gpus: float, memory: float, node_cpus: list[float] | None = None) -> ResourcePlan:
        model = 0
        if self.workload is not None:
            model = footprint.worker_bytes(self.workload)
            footprint.check_fits(self.workload, self.per_process, memory, ACTOR_MEMORY_TORCH)
        return plan_resources(
            workers=self.processes, servers=self.servers, total_cpus=cpus, total_gpus=gpus,
            total_memory=memory, device=self.cfg.device, cpus_per_worker=self.cfg.cpus_per_worker,
            torch_workers=self.torch_workers, node_cpus=node_cpus, colocated=self.colocated,
            per_process=self.per_process, gpu_exclusive=self.gpu_exclusive, model_bytes=model,
        )

    def start(self) -> Cluster:
        import ray

        if not ray.is_initialized():
            self.precheck_local()
            self.started_ray = start_ray(self.address())
        res = ray.cluster_resources()
        node_cpus = [float(n["Resources"].get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]
        self.nodes_at_start = len(node_cpus)  # live nodes when this run was placed
        self.plan = self._plan(res.get("CPU", 0.0), res.get("GPU", 0.0), res.get("memory", 0.0) or 1e12,
                               [c for c in node_cpus if c > 0] or None)
        self._reserve()
        return self

    def _reserve(self) -> None:
        import ray
        from ray.util.placement_group import placement_group

        assert self.plan is not None
        bundles = [self._bundle(i) for i in range(self.processes + (0 if self.colocated else self.servers))]
        strategy = "SPREAD" if self.cfg.placement == "spread" else "PACK"
        self.pg = placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([self.pg.ready()], timeout=min(self.cfg.timeout_s, 60.0))
        if not ready:
            self.stop()
            raise ConfigError(
                f"--workers {self.ranks}: the cluster cannot place {len(bundles)} actors "
                f"({bundles[0]} each); use fewer workers or a larger cluster"
            )

    def _bundle(self, i: int) -> dict[str, float]:
        assert self.plan is not None
        if i < self.processes:
            cpus = self.plan.cpus_per_worker + (self.plan.cpus_per_server if self.colocated and i < self.servers else 0)
            b = {"CPU": cpus}
            if self.plan.gpus_per_worker:
                b["GPU"] = self.plan.gpus_per_worker
            return b
        return {"CPU": self.plan.cpus_per_server}

    def options(self, i: int, *, server: bool = False) -> dict[str, Any]:
        """Ray actor options for worker i (or server i) inside this run's placement group: for
        the process worker i lives in, where several share one."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        assert self.plan is not None
        index = i // self.per_process if not server else i if self.colocated else self.processes + i
        bundle = self._bundle(index)
        own = self.plan.cpus_per_server if server else self.plan.cpus_per_worker
        return {
            "num_cpus": own,
            "num_gpus": 0 if server else bundle.get("GPU", 0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=index
            ),
        }

    def bundle_nodes(self) -> dict[int, str]:
        """Bundle i (worker i, then the dedicated servers) -> the Ray node it sits on
        (`node_labels`), from the placement group's table: asked of Ray at each call, so a bundle
        moved after its node was lost shows its new node."""
        import ray
        from ray.util.placement_group import placement_group_table

        if self.pg is None:
            return {}
        where = placement_group_table(self.pg).get("bundles_to_node_id") or {}
        labels = node_labels(ray.nodes())
        return {int(i): labels.get(node, node[:8]) for i, node in where.items()}

    def worker_nodes(self, placed: dict[int, str] | None = None) -> dict[int, str]:
        """Worker i -> its node: its process's bundle's (`placed`, default: `bundle_nodes()`)."""
        placed = self.bundle_nodes() if placed is None else placed
        return {r: placed[r // self.per_process] for r in range(self.ranks) if r // self.per_process in placed}

    @staticmethod
    def alive_nodes() -> int:
        import ray

        return sum(bool(n.get("Alive")) for n in ray.nodes())

    @property
    def device(self) -> str:
        return self.plan.device if self.plan else "cpu"

    def facts(self) -> dict[str, Any]:
        """What a run's summary says of where it ran (testbed.analysis.keys)."""
        return {"cluster_nodes": self.nodes_at_start, "worker_processes": self.processes,
                "device": self.device, "gpus_per_worker": self.plan.gpus_per_worker if self.plan else 0.0}

    def stop(self) -> None:
        import ray

        if self.pg is not None:
            try:
                from ray.util.placement_group import remove_placement_group

                held = sum(b.get("CPU", 0.0) for b in self.pg.bundle_specs)
                free = ray.available_resources().get("CPU", 0.0)
                remove_placement_group(self.pg)
                if not self.started_ray:  # (a Ray this run started stops right after)
                    self._wait_released(held, free)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
            self.pg = None
        if self.started_ray and ray.is_initialized():
            stop_ray()
            self.started_ray = False

    @staticmethod
    def _wait_released(held: float, free: float, timeout: float = 5.0) -> None:
        """Until the CPUs the group held are free again, as the scheduler sees them (at most
        `timeout`: other jobs may take them meanwhile). Removal is asynchronous, and the next run
        of a sweep placed while one node still held the last run's bundles was seen spread over
        two of three nodes (Ray's SPREAD prefers free nodes; it does not wait for them)."""
        import ray

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and ray.available_resources().get("CPU", 0.0) < free + held - 1e-6:
            time.sleep(0.05)

    def daemons_alive(self) -> bool:
        """Whether the Ray this cluster started still has its GCS and raylet processes."""
        if not self.started_ray:
            return False
        import ray

        node = getattr(ray._private.worker, "_global_node", None)
        procs = getattr(node, "all_processes", None) or {}
        pids = [p.process.pid for kind in ("gcs_server", "raylet") for p in procs.get(kind, [])]
        return bool(pids) and all(pid_alive(pid) for pid in pids)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
