"""The Ray shell of `local-sgd`: the allreduce's driver and wiring, with `LocalSGDPeer`s.

The driver issues one iteration at a time to every worker and records it as the ring's driver
does (one update per iteration; its `comm_s` is the round's average where a round ends, else
about zero). A worker that dies takes the replica it stepped since the last average with it, so
a death is not recovered from: the run stops with one line (`--fail nan` is the fault it takes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from testbed.allreduce.strategy import RingAllreduce
from testbed.analysis.records import Recorder
from testbed.localsgd.peer import LocalSGDPeer


class LocalSGD(RingAllreduce):
    peer_class = LocalSGDPeer

    def _recover(self, recorder: Recorder, step: int, refs: list[Any], exc: BaseException, t0: float) -> None:
        raise RuntimeError(f"a local-sgd worker failed at iteration {step}; the replica it stepped since the "
                           "last average is lost with it, so the run stops (average more often with a "
                           "smaller --local-steps, or use --strategy ring, which recovers)") from None

    def summary_extra(self) -> dict[str, Any]:
        own = self.config.localsgd
        averaged = [sum(b) for b in self.bucket_s if any(b)]
        return {
            "grad_bytes_logical": self.grad_bytes, "local_steps": own.local_steps,
            "averages": len(averaged) // self.config.real_workers,  # one row per real worker a round
            "average_s_p50": float(np.median(averaged)) if averaged else 0.0,
            "outer_optimizer": own.outer_optimizer, "buckets": self.num_buckets,
            "algorithm": self.config.ring.algorithm, "nodes": len(self.groups),
            "node_size": max(len(g) for g in self.groups),
        }
