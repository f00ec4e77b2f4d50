"""Ring allreduce on actors: peer transports equal the numpy sum; bytes follow 2K(N-1)/N."""

import os

import numpy as np
import pytest
import ray

from testbed.allreduce.peer import RingPeer, ring_allreduce
from testbed.allreduce.ring import bytes_sent_per_rank, ideal_bytes_sent
from testbed.allreduce.wiring import wire_ring
from tests.ray.helpers import make_config, run_strategy


@ray.remote
class _Probe(RingPeer):
    """A ring peer that allreduces an arbitrary buffer (transport test, no training)."""

    def allreduce(self, buf: np.ndarray, tag: str) -> tuple[np.ndarray, int]:
        buf = buf.copy()
        sent = ring_allreduce(buf, self.rank, self.n, self.transport, tag)
        self.transport.settle()
        return buf, sent

    def link_capacity(self) -> int | None:
        """Bytes of the largest message the outgoing link takes without growing (half of a
        shared-memory ring: shm.Sender); None when no link was opened."""
        if self._outgoing is None:
            return None
        sender = self._outgoing.sender  # one node: shared memory; else a Ray channel
        return sender.segment.capacity // 2 if sender is not None else self._outgoing.channel._typ.buffer_size_bytes

    def link_names(self) -> list[str]:
        """The FIFO and segment names of this peer's outgoing link (gone once the reader attached)."""
        path, _, wake, ack = self._outgoing.sender.reader_end()
        return [path, wake, ack]

    def link_exchange(self, send_tag: str, expect_tag: str) -> str:
        """Send under one tag, expect another: the schedule check of channels.Link."""
        self.transport.link.send(send_tag, None, np.ones(4, np.float32))
        try:
            self.transport.link.recv(expect_tag)
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    def allreduce_torch(self, buf: np.ndarray, tag: str) -> tuple[np.ndarray, int]:
        import torch

        t = torch.from_numpy(buf.copy())
        sent = ring_allreduce(t, self.rank, self.n, self.transport, tag)
        return t.numpy(), sent


RINGS = [(n, t) for t in ("object-store", "actor-calls") for n in (1, 2, 5)] + [(3, "torch")]


@pytest.mark.parametrize(("n", "transport"), RINGS)
def test_actor_ring_equals_numpy_sum(n, transport):
    # object-store: chunks over shared-memory channels; actor-calls: one `deliver` per chunk
    cfg = make_config(strategy="ring", workers=n, **{"workload.name": "synthetic", "workload.grad_mb": 0.001})
    peers = [_Probe.options(num_cpus=0.1, max_concurrency=4).remote(cfg, rank=r) for r in range(n)]
    try:
        if transport == "object-store":
            wire_ring(peers, 60)
        else:
            ray.get([p.connect_ring.remote(peers) for p in peers], timeout=60)
        if transport == "torch" and n > 1:
            host, port = ray.get(peers[0].rendezvous.remote(), timeout=60)
            ray.get([p.connect_torch.remote(host, port) for p in peers], timeout=60)
            ray.get([p.connect_torch_transport.remote() for p in peers], timeout=60)
        rng = np.random.default_rng(n)
        for length in (0, 1, n - 1 if n > 1 else 2, 1001):
            bufs = [rng.standard_normal(length).astype(np.float32) for _ in range(n)]
            call = "allreduce_torch" if transport == "torch" else "allreduce"
            outs = ray.get([getattr(p, call).remote(b, f"t{length}") for p, b in zip(peers, bufs, strict=True)], timeout=60)
            expected = np.sum(np.stack(bufs), axis=0) if length else np.zeros(0, np.float32)
            for r, (res, sent) in enumerate(outs):
                np.testing.assert_allclose(res, expected, rtol=1e-5, atol=1e-5)
                assert sent == bytes_sent_per_rank(length, n, 4, r)
    finally:
        for p in peers:
            ray.kill(p)


def test_channels_grow_for_larger_chunks_and_check_the_schedule():
    # links start at 64 KiB (channels.MIN_BYTES): 1.2 MB buffers make every link grow
    n = 3
    cfg = make_config(strategy="ring", workers=n, **{"workload.name": "synthetic", "workload.grad_mb": 0.001})
    peers = [_Probe.options(num_cpus=0.1, max_concurrency=4).remote(cfg, rank=r) for r in range(n)]
    try:
        wire_ring(peers, 60)
        rng = np.random.default_rng(7)
        for length in (300_001, 300_001, 17, 600_000):  # grow, reuse, shrink, grow again
            bufs = [rng.standard_normal(length).astype(np.float32) for _ in range(n)]
            outs = ray.get([p.allreduce.remote(b, f"g{length}") for p, b in zip(peers, bufs, strict=True)],
                           timeout=120)
            for res, _ in outs:
                np.testing.assert_allclose(res, np.sum(np.stack(bufs), axis=0), rtol=1e-5, atol=1e-5)
        errors = ray.get([p.link_exchange.remote(f"t{r}", f"t{(r - 1) % n}x") for r, p in enumerate(peers)],
                         timeout=60)
        assert all("ring link out of step: expected message" in e for e in errors), errors
        wire_ring(peers, 60)  # as after a restart: fresh links, the old ones closed
        bufs = [np.full(1000, r + 1.0, np.float32) for r in range(n)]
        outs = ray.get([p.allreduce.remote(b, "rewired") for p, b in zip(peers, bufs, strict=True)], timeout=60)
        assert all((res == n * (n + 1) / 2).all() for res, _ in outs)
        names = [path for paths in ray.get([p.link_names.remote() for p in peers], timeout=60) for path in paths]
        assert len(names) == 3 * n and not any(os.path.exists(x) for x in names)  # removed once attached
    finally:
        for p in peers:
            ray.kill(p)


@pytest.mark.parametrize("algorithm, compression, linked", [
    ("ring", "none", True), ("halving-doubling", "none", False), ("ring", "topk:0.2", True)])
def test_links_exist_only_where_the_ring_exchange_runs_and_never_need_to_grow(algorithm, compression, linked):
    n = 3
    cfg = make_config(strategy="ring", workers=n, compression=compression,
                      **{"ring.algorithm": algorithm, "workload.name": "synthetic", "workload.grad_mb": 1})
    peers = [_Probe.options(num_cpus=0.1, max_concurrency=4).remote(cfg, rank=r) for r in range(n)]
    try:
        wire_ring(peers, 60)
        capacity = ray.get(peers[0].link_capacity.remote(), timeout=60)
        if not linked:
            assert capacity is None
            return
        k = 2**20 // 4  # one bucket holds the whole synthetic gradient (above channels.MIN_BYTES)
        dense = -(-k // n) * 4
        largest = max(dense, 8 * int(np.ceil(0.2 * k))) if compression != "none" else dense
        assert capacity >= largest  # a top-k piece (8 bytes a kept value) outgrows a dense chunk here
    finally:
        for p in peers:
            ray.kill(p)


@pytest.mark.parametrize("n", [2, 5])
def test_bytes_sent_per_worker_per_step_is_2k_n_minus_1_over_n(n):
    cfg = make_config(strategy="ring", workers=n, steps=2,
                      **{"workload.name": "synthetic", "workload.grad_mb": 0.05, "workload.compute_ms": 0.0})
    out = run_strategy(cfg)
    k = out["extra"]["grad_bytes_logical"]
    numel = k // 4
    ideal = ideal_bytes_sent(numel, n, 4)
    for _, row in out["steps"].iterrows():
        # one bucket here; with b buckets rounding adds up to b chunks of slack
        assert abs(row["bytes_sent"] - ideal) <= 2 * (n - 1) * 4 * out["extra"]["buckets"]
    assert out["steps"]["bytes_sent"].sum() == pytest.approx(2 * (n - 1) * k * cfg.steps, rel=1e-9)


def test_scaled_payload_counts_logical_bytes():
    cfg = make_config(strategy="ring", workers=2, steps=1,
                      **{"workload.name": "synthetic", "workload.grad_mb": 1.0,
                         "workload.payload": "scaled:0.01", "workload.compute_ms": 0.0})
    out = run_strategy(cfg)
    k = out["extra"]["grad_bytes_logical"]
    assert k == 2**20
    assert out["steps"]["bytes_sent"].iloc[0] == pytest.approx(k, rel=0.01)  # 2K(N-1)/N = K at N=2


def test_emulated_peers_records_name_the_real_positions_and_samples_count_every_worker():
    """--real-workers 3 of 10: records of workers 0, 3 and 6 only; the summary says 3 real, and
    samples/s counts the 10 batches of a step (each real worker's once per worker it stands for);
    a message per batch of segment steps, so a real worker sends the bytes of a worker of 10."""
    base = {"strategy": "ring", "workers": 10, "steps": 3, "network.bandwidth": "10Gbit",
            "workload.grad_mb": 0.04, "workload.compute_ms": 20.0}
    out = run_strategy(make_config(**base, **{"cluster.real_workers": 3}))
    steps, s = out["steps"], out["summary"]
    assert sorted(steps["worker"].unique()) == [0, 3, 6]
    assert s["real_workers"] == 3 and s["workers"] == 10
    per_step = steps.groupby("iteration")["samples"].sum()
    assert (per_step == 3 * steps["samples"].iloc[0]).all()
    wall = s["train_wall_s"]
    np.testing.assert_allclose(s["samples_per_s"], 10 * steps["samples"].iloc[0] * len(per_step) / wall, rtol=1e-9)
    np.testing.assert_allclose(steps["bytes_sent"], s["predicted_bytes_sent_per_worker_per_step"], rtol=0.01)
    for rep in out["replicas"]:  # every real worker holds the same parameters
        np.testing.assert_array_equal(rep, out["replicas"][0])


def test_a_straggling_emulated_peer_holds_the_ring_back():
    """Worker 5 of 8 is an emulated peer (real workers 0 and 4); its 300 ms delay reaches every
    step through the ring's schedule, as a real straggler's would (a bound: never shorter)."""
    base = {"strategy": "ring", "workers": 8, "steps": 3, "network.bandwidth": "10Gbit",
            "workload.compute_ms": 10.0, "cluster.real_workers": 2, "ring.overlap": False}
    out = run_strategy(make_config(**base, straggler="fixed:worker=5,delay=300ms"))
    s, steps = out["summary"], out["steps"]
    assert s["step_time_p50_s"] >= 0.3
    assert (steps["injected_delay_s"] == 0).all()  # neither real worker straggled
    # its owner's rows say how much later it was, so the critical path counts the delay as
    # compute, as a real straggler's, not as communication
    lag = steps.set_index("worker")["peers_lag_s"]
    np.testing.assert_allclose(lag[4], 0.3)
    assert (lag[0] == 0).all()
    assert s["comm_s_per_step"] <= s["step_time_p50_s"] - 0.3 + 1e-9


def test_local_sgd_with_emulated_peers_averages_the_owners_replicas_once_a_round():
    """local-sgd builds on the ring: two real workers play six positions, and the run is local
    SGD in one process where a peer's replica is its owner's (LocalSGDSpec.reference). Position
    1, an emulated peer, straggles 150 ms a local step: its lag adds up over a round, so its
    owner's average waits for its two steps' delays (one step's in the last round, of one step)."""
    from testbed.strategies.registry import SPECS

    delay = 0.15
    cfg = make_config(strategy="local-sgd", workers=6, steps=5, straggler=f"fixed:worker=1,delay={delay * 1e3:g}ms",
                      **{"localsgd.local_steps": 2, "network.bandwidth": "10Gbit", "cluster.real_workers": 2})
    out = run_strategy(cfg)
    np.testing.assert_allclose(out["flat"], SPECS["local-sgd"].reference(cfg), rtol=1e-5, atol=1e-6)
    steps = out["steps"]
    assert sorted(set(steps["worker"])) == [0, 3]  # the real workers, under their positions
    assert out["summary"]["real_workers"] == 2
    assert out["summary"]["averages"] == 3  # rounds end after iterations 1, 3 and the last, 4
    averaging = steps["iteration"].isin([1, 3, 4])
    assert (steps[averaging]["bytes_sent"] > 0).all() and (steps[~averaging]["bytes_sent"] == 0).all()
    assert (steps["injected_delay_s"] == 0).all()  # neither real worker straggled
    # a bound, never shorter: the peer's owner's averages wait for the peer's whole lag from when
    # its own replica was ready (worker 3 waits too, but from when worker 0 was ready, not it)
    owner = steps[steps["worker"] == 0].set_index("iteration")
    for iteration, lag in ((1, 2 * delay), (3, 2 * delay), (4, delay)):
        assert owner["comm_s"][iteration] >= lag, (iteration, steps)
        assert owner["peers_lag_s"][iteration] == pytest.approx(lag)  # counted as compute, not comm
    assert (owner["peers_lag_s"][[0, 2]] == 0).all()  # no average, no lag
