"""The Ray shell of `ring` (our peer-to-peer allreduce) and `allreduce-torch` (the library's).

Every worker holds a full replica. Per step each computes its gradient, the gradient buckets
(tensor fusion, last layers first, `--bucket-mb`) are summed across workers — by our ring
schedule (`ring.py`, moved by `peer.py`) or by torch.distributed.all_reduce — divided by N, and
every worker applies the same optimizer step (testbed.training.optim) to its own replica. No parameter is ever sent; per
step each worker sends 2K(N-1)/N bytes (K = gradient bytes), independent of N for large N,
which is why the ring's step time stays flat while a single parameter server's grows with N.
Cost per step (no overlap, b buckets): 2(N-1)(b a + K/(N B)).

`--algorithm` picks how `ring` sums a bucket (the table `algorithms.ALGORITHMS`: schedules and
costs); one that needs node groups gets the workers grouped by Ray node, or into emulated nodes
of `--node-size` consecutive ranks. `--compression` (fp16, topk:F) shrinks what
each bucket's allreduce sends; the summary's prediction uses the matching cost formula.

With `--overlap` (default) a bucket's allreduce starts as soon as backward has produced it, on
a communication thread, while backward goes on; `overlap_saved_s` reports the allreduce time
hidden behind compute. The driver only starts steps and collects timings.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray

from testbed.allreduce.algorithms import ALGORITHMS, groups_from_nodes, groups_of_size
from testbed.allreduce.peer import RingPeer
from testbed.allreduce.wiring import wire_ring
from testbed.analysis.records import Recorder, UpdateRecord
from testbed.emulation.faults import NonFiniteGradient
from testbed.runtime import remote
from testbed.strategies.contract import Strategy
from testbed.workloads.base import unflatten

CONCURRENCY = 4  # step thread + deliver threads (messages from the left neighbour)


class RingAllreduce(Strategy):
    peer_class: type[RingPeer] = RingPeer  # the workers' actor; a strategy built on this shell may step otherwise

    def setup(self) -> None:
        cfg = self.config
        self.library = self.spec.library
        # the real workers only, where the others are emulated peers (--real-workers, testbed.allreduce.relay)
        self.peers = remote.spawn(self.peer_class, self.cluster, cfg.real_workers, cfg, device=self.cluster.device,
                                  concurrency=CONCURRENCY, library=self.library,
                                  max_restarts=cfg.faults.max_restarts)
        t = cfg.cluster.timeout_s
        self.liveness = remote.Liveness(self.peers, t, "ring worker")
        # the first calls to freshly started peers, and torch.distributed's rendezvous of them all,
        # wait for their start-up (the restart allowance), not --timeout
        params = remote.get(self.peers[0].get_params.remote(), remote.startup_timeout(t), "initial parameters")
        remote.broadcast(self.peers, params, remote.startup_timeout(t))
        if self.library or cfg.ring.transport == "torch":
            host, port = remote.get(self.peers[0].rendezvous.remote(), t, "rendezvous")
            remote.get([p.connect_torch.remote(host, port) for p in self.peers], remote.startup_timeout(t),
                       "torch.distributed init")
        if not self.library:
            if cfg.ring.transport == "torch":
                remote.get([p.connect_torch_transport.remote() for p in self.peers], t, "transport")
            else:
                wire_ring(self.peers, t)
        self.groups = self._node_groups()
        self.layout = remote.get(self.peers[0].layout.remote(), t, "layout")
        self.num_buckets = remote.get(self.peers[0].num_buckets.remote(), t, "buckets")
        self.bucket_bytes, self.bucket_shares = remote.get(self.peers[0].bucket_plan.remote(), t, "buckets")
        self.grad_bytes = remote.get(self.peers[0].logical_bytes.remote(), t, "sizes")

    def _node_groups(self) -> list[list[int]]:
        """Ranks grouped into emulated nodes (--node-size) or by Ray node; the peers get them
        where the algorithm needs node groups."""
        cfg, t = self.config, self.config.cluster.timeout_s
        if cfg.ring.node_size is not None:
            groups = groups_of_size(cfg.workers, cfg.ring.node_size)
        else:
            groups = groups_from_nodes(remote.get([p.node_id.remote() for p in self.peers], t, "node ids"))
        if ALGORITHMS[cfg.ring.algorithm].needs_groups:
            remote.get([p.set_groups.remote(groups) for p in self.peers], t, "node groups")
        return groups

    def run(self, recorder: Recorder) -> None:
        cfg, n = self.config, self.config.workers
        self.bucket_s: list[list[float]] = []
        self.overlap_saved: list[float] = []
        if recorder.wants_eval(0):
            recorder.evaluate(0, remote.get(self.peers[0].get_params.remote(), cfg.cluster.timeout_s, "parameters"))
        # Each worker's next step is queued while this one runs (RingPeer.train_step runs them in
        # turn), so the driver's round trip never sits between two steps; a failed step's queued
        # successor is aborted with it, and queued again once the step has been redone. With
        # injected faults (--fail) steps go one at a time: a worker told to die as step k begins
        # would otherwise take step k-1's report, already computed, down with it, and the run
        # would name the wrong step.
        ahead = not cfg.faults.fail.items
        queued: dict[int, tuple[list[Any], float]] = {}
        ended = [0.0] * len(self.peers)  # when each worker's last step ended: a queued step waits from there

        def issue(step: int, attempt: int) -> tuple[list[Any], float]:
            send = recorder.wants_eval(step + 1)  # rank 0's parameters come back with its report
            return [p.train_step.remote(step, attempt, send and r == 0) for r, p in enumerate(self.peers)], time.time()

        for step in range(cfg.steps):
            attempt = 0
            while True:
                refs, t_issue = queued.pop(step, None) or issue(step, attempt)
                if ahead and step + 1 < cfg.steps:
                    queued[step + 1] = issue(step + 1, 0)
                try:
                    infos = remote.get(refs, cfg.cluster.timeout_s, f"{self.name} step {step}")
                    break
                except (*remote.ACTOR_ERRORS, ray.exceptions.RayTaskError) as exc:
                    if attempt >= max(1, cfg.faults.max_restarts):  # the step keeps failing: stop with its error
                        raise
                    self._recover(recorder, step, refs + queued.pop(step + 1, ([], 0.0))[0], exc, t_issue)
                    attempt += 1
            t_done = time.time()
            last_end = max(i["t_end"] for i in infos)
            applied = all(i["applied"] for i in infos)
            for r, info in enumerate(infos):
                began = max(t_issue, ended[r])
                ended[r] = info["t_end"]
                self.record(recorder, self.positions[r], step, info, version_read=step,
                            version_applied=step if applied else None,
                            wait_s=(info["t_start"] - began) + (last_end - info["t_end"]) + info["apply_s"])
                self.bucket_s.append(info["bucket_s"])
                # communication hidden under backward: what the buckets took, minus what was
                # left after backward ended (negative when overlap made things slower)
                self.overlap_saved.append(sum(info["bucket_s"]) - info["comm_s"])
            if not applied:
                recorder.fault("nan-skipped", "ring", step, t_done, t_done)
            # applied when the last replica applied it (the driver, with the next step already
            # queued, may come to it later)
            recorder.update(UpdateRecord(version=step + 1, t_applied=last_end, contributors=n if applied else 0,
                                         dropped=0 if applied else n,
                                         loss=float(np.mean([i["loss"] for i in infos]))))
            if "params" in infos[0]:  # asked for at issue (recorder.wants_eval)
                recorder.evaluate(step + 1, infos[0]["params"])
        recorder.events_from(remote.drain_events(self.peers, cfg.cluster.timeout_s))

    def _recover(self, recorder: Recorder, step: int, refs: list[Any], exc: BaseException, t0: float) -> None:
        """A peer died or hung mid-step: abort the step everywhere, restart the peer, rebuild
        the ring from a survivor's parameters (as before the step), and let the step be redone.

        Only the object-store transport can be rebuilt; torch.distributed process groups do not
        survive a member's death, so those runs stop with the error.
        """
        cause = remote.root_cause(exc)
        if isinstance(cause, NonFiniteGradient):
            raise NonFiniteGradient(str(cause).splitlines()[0]) from None
        if self.library or self.config.ring.transport != "object-store":
            raise RuntimeError(f"a ring peer failed at step {step} ({remote.describe(exc)[:160]}); a peer's death "
                               f"cannot be recovered from under {'allreduce-torch' if self.library else '--transport torch'} "
                               "(the torch process group does not survive it): use --transport object-store") from None
        t = self.config.cluster.timeout_s
        dead = self.liveness.find_dead()
        live = [i for i in range(len(self.peers)) if i not in dead]
        for i in live:
            self.peers[i].abort.remote()
        ray.wait(refs, num_returns=len(refs), timeout=t)  # every attempt ends (aborted or done)
        for i in dead:
            self.liveness.wait_alive(i)
        if not live:
            raise RuntimeError(f"{self.name}: every peer died at step {step}; nothing to resume from")
        remote.get([p.reset.remote(step) for p in self.peers], t, "ring reset")  # restarted ones too: the step is next
        params = remote.get(self.peers[live[0]].get_params.remote(), t, "survivor parameters")
        remote.broadcast([self.peers[i] for i in dead], params, t, "parameter re-sync")
        state = remote.get(self.peers[live[0]].optimizer_state.remote(), t, "survivor optimizer state")
        remote.get([self.peers[i].set_optimizer_state.remote(state) for i in dead], t, "optimizer re-sync")
        wire_ring(self.peers, t)
        if ALGORITHMS[self.config.ring.algorithm].needs_groups:
            remote.get([self.peers[i].set_groups.remote(self.groups) for i in dead], t, "node groups")
        for i in dead:
            recorder.fault("worker-restart", f"worker{i}", step, t0, time.time(), cause=type(cause).__name__)

    def summary_extra(self) -> dict[str, Any]:
        n, k = self.config.workers, self.grad_bytes
        per_step = np.array([sum(b) for b in self.bucket_s]) if self.bucket_s else np.zeros(1)
        allreduce_s = float(np.median(per_step))
        algbw = k / allreduce_s if allreduce_s > 0 else None
        return {
            "grad_bytes_logical": k, "buckets": self.num_buckets,
            "bucket_bytes_logical": self.bucket_bytes, "bucket_backward_share": self.bucket_shares,
            "bucket_allreduce_s": [float(x) for x in np.mean(np.array(self.bucket_s), axis=0)] if self.bucket_s else [],
            "allreduce_s_p50": allreduce_s,
            "overlap_saved_s": float(np.mean(self.overlap_saved)) if self.overlap_saved else 0.0,
            "algbw_Bps": algbw,
            "busbw_Bps": None if algbw is None else algbw * 2 * (n - 1) / n,
            "transport": "torch.distributed.all_reduce" if self.library else self.config.ring.transport,
            "algorithm": "library" if self.library else self.config.ring.algorithm,
            "nodes": len(self.groups),
            "node_size": max(len(g) for g in self.groups),  # the session's cost-model prediction uses both
        }

    def parameters(self) -> dict[str, np.ndarray]:
        flat = remote.get(self.peers[0].get_params.remote(), self.config.cluster.timeout_s, "parameters")
        return unflatten(flat, self.layout)

    def replica_parameters(self) -> list[np.ndarray]:
        """Every worker's flat parameters (tests check the replicas never diverge)."""
        return remote.get([p.get_params.remote() for p in self.peers], self.config.cluster.timeout_s, "replicas")

    def teardown(self) -> None:
        remote.kill_all(getattr(self, "peers", []))
