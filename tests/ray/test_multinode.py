"""The object-store ring across Ray nodes: two raylets on this machine, peers alternating between
them, so every link has its reader on another node (Ray pushes the channel buffer; no FIFO
signals, the waits poll)."""

import numpy as np
import pytest
import ray

from testbed.allreduce.peer import RingPeer, ring_allreduce
from testbed.allreduce.wiring import wire_ring
from testbed.runtime.rayprocs import stop_ray
from testbed.runtime.reaper import release_semaphores
from tests.ray.helpers import make_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    stop_ray()  # the session's Ray, with what it leaves in /dev/shm
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"node_a": 8}, "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"node_b": 8})
    ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
    raylets = [p.process.pid for node in cluster.list_all_nodes() for p in node.all_processes.get("raylet", [])]
    yield
    ray.shutdown()
    cluster.shutdown()
    release_semaphores(raylets)  # the channels' semaphores (stop_ray does this for a run's Ray)
    # the session's Ray is started again only if a test still needs it (conftest.ray_up); this
    # test runs last, so usually none does


def _buffer(length: int, seed: int, rank: int) -> np.ndarray:
    """Rank's seeded buffer, made where it is used: passed as a call's argument, a megabyte buffer
    is fetched from the driver's raylet before the call starts, a transfer of Ray's own that this
    test of the ring should not depend on."""
    return np.random.default_rng([seed, rank]).standard_normal(length).astype(np.float32)


@ray.remote
class _Peer(RingPeer):
    def allreduce(self, length: int, seed: int, tag: str) -> tuple[np.ndarray, bool]:
        buf = _buffer(length, seed, self.rank)
        ring_allreduce(buf, self.rank, self.n, self.transport, tag)
        return buf, self._outgoing.sender is None


@pytest.mark.usefixtures("two_nodes")
def test_ring_across_nodes_equals_numpy_sum():
    n = 4
    cfg = make_config(strategy="ring", workers=n, **{"workload.name": "synthetic", "workload.grad_mb": 0.001})
    # max_concurrency > 1, as every RingPeer has: opening a link to a reader on another node
    # runs a call on the reader while the reader opens its own link
    peers = [_Peer.options(num_cpus=0.1, max_concurrency=4, resources={"node_a" if r % 2 == 0 else "node_b": 1})
             .remote(cfg, rank=r) for r in range(n)]
    try:
        assert len(set(ray.get([p.node_id.remote() for p in peers], timeout=120))) == 2
        # links sized for the largest chunk, as a run sizes them (a run's links never grow;
        # growth is tested on one node in test_ring.py)
        wire_ring(peers, 120, nbytes=-(-300_000 // n) * 4)
        for length in (1001, 300_000):  # bytes messages, then zero-copy tuples
            bufs = [_buffer(length, 5, r) for r in range(n)]
            outs = ray.get([p.allreduce.remote(length, 5, f"x{length}") for p in peers], timeout=120)
            for res, polled in outs:
                assert polled  # the reader is on the other node: no FIFO between them
                np.testing.assert_allclose(res, np.sum(np.stack(bufs), axis=0), rtol=1e-5, atol=1e-5)
    finally:
        for p in peers:
            ray.kill(p)
