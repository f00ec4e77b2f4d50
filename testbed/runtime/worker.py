"""The worker: a workload replica with its data shard, straggler model and timing, as a plain class.

Strategies wrap `WorkerBase` (or a subclass with their transport) in a Ray actor; the class
itself needs no Ray so that its logic runs in tests without a cluster.

What every strategy's worker shares is here, once: the injected faults, the straggler stretch
of compute (`testbed.emulation.stragglers.Stretch`), the spans of its timeline (handed back
with every report, so a run that dies keeps the timeline it had), its NIC and the compression
of what it sends.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from testbed.config import RunConfig
from testbed.emulation.endpoint import Endpoint
from testbed.emulation.faults import FaultPlan, NanPolicy, poison
from testbed.emulation.network import LinkSpec
from testbed.emulation.peers import SegmentNics, real_positions, segment_sizes
from testbed.emulation.stragglers import StragglerModel
from testbed.training.compressor import Compressor
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


def restarted() -> bool:
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
        # with emulated peers (--real-workers K < N) this is real worker `rank` of K (`index`), at
        # position q_rank among the N (testbed.emulation.peers), whose batch, name and records it
        # has; `segment`: the emulated peers after it, which its strategy plays
        real, n = config.real_workers, config.workers
        self.index = rank
        self.segment = segment_sizes(n, real)[rank] if real < n else 0
        rank = real_positions(n, real)[rank] if real < n else rank
        self.config, self.rank, self.device = config, rank, device
        if config.workload.imports_torch(device):
            limit_threads(cpus)
        dilation = config.network.factor  # synthetic compute and delays run D times slower
        self.workload = make_workload(
            replace(config.workload, compute_ms=config.workload.compute_ms * dilation),
            seed=config.seed, workers=config.workers, device=device
        )
        self.stragglers = StragglerModel(config.straggler.items, config.seed, dilation=dilation)
        self.actor = f"worker{rank}"
        self.events: list[tuple[str, str, float, float]] = []
        self.endpoint = Endpoint(config.network, self.actor)
        self.hung = False
        self.faults = FaultPlan(config.faults.fail.items, "worker", rank, restarted=restarted())
        self.dies_once_sent = False  # a `sent` fault fired this iteration (the strategy ends the process)
        self.nan = NanPolicy(config.faults.on_nan)
        self.logical_factor = self.workload.logical_bytes / (self.workload.numel * 4)
        # mapreduce / PS gradients leave compressed (the ring family compresses per bucket itself)
        self.compressors: dict[tuple[int, int], Compressor] = {}
        self.compression = config.compression if config.compression.kind != "none" else None
        self.stretch: Any = None
        # where this worker's strategy talks to a server or the driver, it plays its emulated
        # peers' NICs (testbed.emulation.peers.SegmentNics, made on first use: the ring's peers
        # have a Relay instead); when each last held what it computes on
        self._peer_nics: SegmentNics | None = None
        self.peer_ready = np.zeros(self.segment)
        self._peers_lag = 0.0  # this iteration's latest peer_delays (its report's peers_lag_s)

    # ---- plumbing shared by every strategy
    def _nics(self) -> SegmentNics:
        if self._peer_nics is None:
            self._peer_nics = SegmentNics(LinkSpec(*self.config.network.wire), self.segment)
        return self._peer_nics

    def peers_receive(self, nbytes: list[int], departures: list[list[float]]) -> None:
        """Parts of `nbytes` that left their senders for the emulated peers at
        `departures[part][peer]` reach the peers' NICs: when each peer holds them all."""
        if self.segment:
            self.peer_ready = self._nics().receive(nbytes, departures)

    def peers_send(self, nbytes: list[int], compute_s: float, iteration: int) -> list[list[float]]:
        """Departures [part][peer] of the emulated peers' gradients: each peer computes as long as
        this worker did (`compute_s`), plus its straggler delay beyond this worker's, from when it
        held the parameters; then its parts leave back to back."""
        if not self.segment:
            return [[] for _ in nbytes]
        at = self.peer_ready + compute_s + self.peer_delays(iteration)
        return self._nics().send(nbytes, list(at))

    def peer_delays(self, iteration: int, since: int | None = None) -> np.ndarray:
        """How much later than this worker each emulated peer of its segment has its gradient:
        the peer's own straggler delay beyond this worker's, never less than 0 (its gradient is a
        copy of this worker's, testbed.emulation.peers). `since`: the first of the iterations
        whose delays add up before the workers next meet (local SGD's round: a peer's lag builds
        up over its local steps, as a real worker's does); `iteration` alone by default."""
        out = np.zeros(self.segment)
        model = self.stragglers
        if not model.specs or not self.segment:
            return out
        c = self.stretch.compute_s if self.stretch is not None else 0.0
        iterations = range(iteration if since is None else since, iteration + 1)

        def delay(x: int) -> float:
            return sum((model.factor(x) - 1.0) * c + model.additive(x, i) * model.dilation for i in iterations)

        mine = delay(self.rank)
        for j in range(self.segment):
            out[j] = max(0.0, delay((self.rank + 1 + j) % self.config.workers) - mine)
        self._peers_lag = max(self._peers_lag, float(out.max()))
        return out

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

    def report(self, info: dict[str, Any]) -> dict[str, Any]:
        """An iteration's report as it leaves the actor: with the spans recorded since the last,
        how late (past their emulated delivery) its messages arrived meanwhile, and how much
        later than this worker its slowest emulated peer had its gradient (`peer_delays`: the
        cost model's critical path counts it as compute, as a real straggler's delay)."""
        info["events"] = self.drain_events()
        info["late_s"] = self.endpoint.take_late()
        info["peers_lag_s"], self._peers_lag = self._peers_lag, 0.0
        return info

    # ---- compute
    def inject(self, iteration: int) -> str | None:
        """Fire this iteration's injected fault: kill or hang here; 'nan' is returned to poison."""
        kind = self.faults.due(iteration)
        if kind == "sent":  # fired by the strategy once the iteration's messages are out
            self.dies_once_sent = True
            return None
        if kind == "kill":
            os._exit(1)  # a process death, as a crash or `kill PID` would cause
        if kind == "hang":
            self.hung = True  # every method, ping included, stops answering
            while True:
                time.sleep(1.0)
        return kind

    def gradient(self, iteration: int, batch: Any,
                 buckets: list[list[int]] | None = None,
                 on_ready: Callable[[int, Any], None] | None = None) -> tuple[Any, dict[str, Any]]:
        """This worker's gradient of `batch` at its current parameters, as a slow machine would
        produce it (the straggler stretch), with the iteration's timings.

        With `buckets`, `on_ready(b, view)` is called as backward finishes each bucket (after
        the stretch's sleep for that moment), so communication can overlap the rest of it.
        """
        fault = self.inject(iteration)
        stretch = self.stragglers.stretch(self.rank, iteration)
        self.stretch = stretch  # this iteration's, while it computes (emulated peers read it, WorkerBase.peer_delays)
        t0 = time.time()
        if buckets is None:
            grad, loss, samples = self.workload.gradient(batch)
            if fault == "nan":
                poison(grad)
        else:
            def ready(b: int, view: Any) -> None:
                if fault == "nan":
                    poison(view)
                stretch.ready()
                on_ready(b, view)

            grad, loss, samples = self.workload.gradient_buckets(batch, buckets, ready)
        stretch.ready()
        t1 = time.time()
        self.span("compute", t0, t1)
        return grad, {"t_start": t0, "compute_s": stretch.compute_s, "loss": loss, "samples": samples,
                      "injected_delay_s": stretch.injected_s, "t_computed": t1}

    def compute(self, iteration: int) -> tuple[np.ndarray, dict[str, Any]]:
        """Gradient of this worker's batch for `iteration` (see `gradient`)."""
        return self.gradient(iteration, self.workload.batch(self.rank, iteration))

    def compute_at(self, params: np.ndarray, iteration: int, departure: float | None = None,
                   peers: list[float] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Receive params (a broadcast that left at `departure`; `peers`: when the copies for the
        emulated peers this worker plays left), compute, send the gradient back.

        Used by mapreduce; info["departure"] stamps the gradient for the receiver's NIC, and
        info["peer_departures"] its peers' copies (testbed.emulation.peers).
        """
        k = self.workload.logical_bytes
        self.endpoint.receive(k, departure)
        self.peers_receive([k], [list(peers or ())])
        t0 = time.time()
        self.workload.set_params(params)
        grad, info = self.compute(iteration)
        payload = self.outgoing(grad, 0, grad.size)
        info["bytes_sent"] = int(payload.nbytes * self.logical_factor)
        info["peer_departures"] = self.peers_send([info["bytes_sent"]], time.time() - t0, iteration)[0]
        info["departure"] = self.endpoint.send(info["bytes_sent"])
        return payload, self.report(info)

    def outgoing(self, grad: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """The gradient slice as it goes on the wire: compressed (with its own top-k residual)."""
        if self.compression is None:
            return grad[lo:hi]
        comp = self.compressors.setdefault((lo, hi), Compressor(self.compression, hi - lo))
        return comp.compress(np.ascontiguousarray(grad[lo:hi]))
