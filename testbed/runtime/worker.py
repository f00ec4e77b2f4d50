"""The worker: a workload replica with its data shard, straggler model and timing, as a plain class.

Strategies wrap `WorkerBase` (or a subclass with their transport) in a Ray actor; the class
itself has no Ray dependency so that its logic runs in tests without a cluster.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from testbed.compression import Compressor, parse_compression
from testbed.config import RunConfig
from testbed.emulation.endpoint import Endpoint
from testbed.emulation.faults import FaultPlan, parse_faults, poison
from testbed.emulation.stragglers import StragglerModel, parse_stragglers
from testbed.workloads import make_workload


def limit_threads(cpus: float) -> None:
    """Give torch as many intra-op threads as this actor's CPU share (at least one).

    N workers on a small machine then contend honestly instead of oversubscribing the cores.
    """
    n = max(1, int(cpus))
    os.environ["OMP_NUM_THREADS"] = str(n)
    try:
        import torch
    except ImportError:  # synthetic-only installs
        return
    torch.set_num_threads(n)


def _restarted() -> bool:
    """True in an actor that Ray restarted after a death (its faults must not fire again)."""
    import warnings

    try:
        import ray

        with warnings.catch_warnings():  # Ray's own property trips its deprecation warning
            warnings.simplefilter("ignore")
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - outside an actor
        return False


class WorkerBase:
    """One data-parallel replica. Times compute, injects straggler delay, keeps its events."""

    def __init__(self, config: RunConfig, rank: int, device: str = "cpu", cpus: float = 1.0) -> None:
        self.config, self.rank, self.device = config, rank, device
        if config.workload.name != "synthetic":
            limit_threads(cpus)
        self.workload = make_workload(
            config.workload, seed=config.seed, workers=config.workers, device=device
        )
        self.stragglers = StragglerModel(parse_stragglers(config.straggler), config.seed)
        self.actor = f"worker{rank}"
        self.events: list[tuple[str, str, float, float]] = []
        self.endpoint = Endpoint(config.network, self.actor)
        self.hung = False
        self.faults = FaultPlan(parse_faults(config.faults.fail), "worker", rank, restarted=_restarted())
        self.logical_factor = self.workload.logical_bytes / (self.workload.numel * 4)
        spec = parse_compression(config.compression)
        # mapreduce / PS gradients leave compressed (the ring family compresses per bucket itself)
        self.compressors: dict[tuple[int, int], Compressor] = {}
        self.compression = spec if spec.kind != "none" else None

    # ---- plumbing shared by every strategy
    def ping(self) -> int:
        """Process id; a hung worker (injected `hang`) answers nothing at all."""
        while self.hung:
            time.sleep(1.0)
        return os.getpid()

    def get_params(self) -> np.ndarray:
        return self.workload.get_params()

    def set_params(self, flat: np.ndarray) -> None:
        self.workload.set_params(flat)

    def layout(self) -> list[tuple[str, tuple[int, ...]]]:
        return self.workload.layout

    def logical_bytes(self) -> int:
        return self.workload.logical_bytes

    def drain_events(self) -> list[tuple[str, str, float, float]]:
        out, self.events = self.events, []
        return out

    def span(self, phase: str, t0: float, t1: float) -> None:
        self.events.append((self.actor, phase, t0, t1))

    # ---- compute
    def straggle(self, iteration: int, compute_s: float) -> float:
        """Sleep this iteration's injected delay; return it."""
        delay = self.stragglers.delay(self.rank, iteration, compute_s)
        if delay > 0:
            t0 = time.time()
            time.sleep(delay)
            self.span("wait", t0, time.time())
        return delay

    def inject(self, iteration: int) -> str | None:
        """Fire this iteration's injected fault: kill or hang here; 'nan' is returned to poison."""
        kind = self.faults.due(iteration)
        if kind == "kill":
            os._exit(1)  # a process death, as a crash or `kill PID` would cause
        if kind == "hang":
            self.hung = True  # every method, ping included, stops answering
            while True:
                time.sleep(1.0)
        return kind

    def compute(self, iteration: int) -> tuple[np.ndarray, dict[str, Any]]:
        """Gradient of this worker's batch at its current parameters, with timings."""
        fault = self.inject(iteration)
        t0 = time.time()
        grad, loss, samples = self.workload.gradient(self.workload.batch(self.rank, iteration))
        if fault == "nan":
            poison(grad)
        t1 = time.time()
        self.span("compute", t0, t1)
        delay = self.straggle(iteration, t1 - t0)
        info = {"t_start": t0, "compute_s": t1 - t0, "loss": loss, "samples": samples,
                "injected_delay_s": delay}
        return grad, info

    def compute_at(self, params: np.ndarray, iteration: int,
                   departure: float | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Receive params (a broadcast that left at `departure`), compute, send the gradient back.

        Used by mapreduce; info["departure"] stamps the gradient for the receiver's NIC.
        """
        self.endpoint.receive(self.workload.logical_bytes, departure)
        self.workload.set_params(params)
        grad, info = self.compute(iteration)
        payload = self.outgoing(grad, 0, grad.size)
        info["bytes_sent"] = int(payload.nbytes * self.logical_factor)
        info["departure"] = self.endpoint.send(info["bytes_sent"])
        return payload, info

    def outgoing(self, grad: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """The gradient slice as it goes on the wire: compressed (with its own top-k residual)."""
        if self.compression is None:
            return grad[lo:hi]
        comp = self.compressors.setdefault((lo, hi), Compressor(self.compression, hi - lo))
        return comp.compress(np.ascontiguousarray(grad[lo:hi]))
