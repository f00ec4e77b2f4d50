"""The ring's actor shell: transports that move chunks between neighbours, and the ring peer.

The schedule (which chunk goes where at which step) is `ring.py`'s; this module only moves
bytes. Worker r talks to its right neighbour (r+1) mod N and hears from its left (r-1) mod N;
the driver starts a step and collects timings, but never relays a chunk.

Transports (one method, `exchange(tag, send, recv_numel) -> received`):
- object-store: `right.deliver.remote(tag, chunk)` puts the chunk in Ray's object store (small
  ones travel inline) and runs `deliver` on one of the receiver's spare actor threads, which
  files it in a mailbox; the receiver's ring thread takes it by tag. Works across nodes.
- torch: torch.distributed point-to-point isend/recv (gloo on CPU, NCCL on GPU) between the
  same actors; our schedule, not the library's allreduce.

Buffers: a torch tensor (any device: the adds run where the gradient lives, on the GPU for
--device cuda) or, for the torch-free synthetic workload, a numpy array.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
import warnings
from typing import Any

import numpy as np
import ray

from testbed.allreduce.ring import (
    allgather_schedule,
    chunk_bounds,
    ring_neighbours,
    scatter_reduce_schedule,
)
from testbed.emulation import Endpoint
from testbed.network import sleep_until
from testbed.remote import RemoteTimeout
from testbed.worker import WorkerBase

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class Mailbox:
    """Tagged messages from the left neighbour; take() blocks until its tag arrives."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._box: dict[Any, Any] = {}

    def put(self, tag: Any, payload: Any) -> None:
        with self._cv:
            self._box[tag] = payload
            self._cv.notify_all()

    def take(self, tag: Any, timeout: float) -> Any:
        with self._cv:
            if not self._cv.wait_for(lambda: tag in self._box, timeout=timeout):
                raise RemoteTimeout(f"ring message {tag} from the left neighbour did not arrive "
                                    f"within {timeout:g}s; a neighbour may be dead or hung")
            return self._box.pop(tag)


class ObjectStoreTransport:
    def __init__(self, right: Any, mailbox: Mailbox, timeout: float, endpoint: Endpoint,
                 logical_factor: float) -> None:
        self.right, self.mailbox, self.timeout = right, mailbox, timeout
        self.endpoint, self.factor = endpoint, logical_factor
        self.inflight: list[Any] = []

    def exchange(self, tag: Any, send: Any, recv_numel: int) -> np.ndarray:
        chunk = _to_numpy(send)
        departure = self.endpoint.send(int(chunk.nbytes * self.factor))
        self.inflight.append(self.right.deliver.remote(tag, chunk, departure))
        payload, delivery = self.mailbox.take(tag, self.timeout)
        sleep_until(delivery)
        return payload

    def settle(self) -> None:
        """Surface failures of this step's sends (and keep the list short)."""
        if self.inflight:
            ray.get(self.inflight, timeout=self.timeout)
            self.inflight.clear()


class TorchTransport:
    """Point-to-point torch.distributed; under emulation a departure stamp precedes each chunk."""

    def __init__(self, rank: int, n: int, device: str, endpoint: Endpoint, logical_factor: float) -> None:
        self.left, self.right = ring_neighbours(rank, n)
        self.device, self.endpoint, self.factor = device, endpoint, logical_factor

    def exchange(self, tag: Any, send: Any, recv_numel: int) -> Any:
        import torch
        import torch.distributed as dist

        out = torch.as_tensor(send).contiguous()
        buf = torch.empty(recv_numel, dtype=out.dtype, device=out.device)
        nbytes = int(recv_numel * out.element_size() * self.factor)
        if self.endpoint.emulated:
            stamp = torch.tensor([self.endpoint.send(int(out.numel() * out.element_size() * self.factor))],
                                 dtype=torch.float64, device=out.device)
            theirs = torch.empty_like(stamp)
            req = dist.isend(stamp, dst=self.right)
            dist.recv(theirs, src=self.left)
            req.wait()
        req = dist.isend(out, dst=self.right)
        dist.recv(buf, src=self.left)
        req.wait()
        if self.endpoint.emulated:
            self.endpoint.receive(nbytes, float(theirs.item()))
        return buf

    def settle(self) -> None:
        pass


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    return x.detach().cpu().numpy()


def _like(incoming: Any, buf: Any) -> Any:
    """Bring a received chunk to the buffer's kind and device (GPU adds stay on the GPU)."""
    if isinstance(buf, np.ndarray):
        return _to_numpy(incoming)
    import torch

    t = torch.as_tensor(incoming)
    return t.to(buf.device, non_blocking=True) if t.device != buf.device else t


def ring_allreduce(buf: Any, rank: int, n: int, transport: Any, tag: Any) -> int:
    """Sum `buf` across the ring in place (scatter-reduce, then allgather); return bytes sent."""
    if n == 1:
        return 0
    bounds = chunk_bounds(len(buf), n)
    itemsize = buf.itemsize if isinstance(buf, np.ndarray) else buf.element_size()
    sent = 0
    for phase, schedule in (("rs", scatter_reduce_schedule(rank, n)), ("ag", allgather_schedule(rank, n))):
        for i, (s, r) in enumerate(schedule):
            (s0, s1), (r0, r1) = bounds[s], bounds[r]
            incoming = _like(transport.exchange((tag, phase, i), buf[s0:s1], r1 - r0), buf)
            sent += (s1 - s0) * itemsize
            if phase == "rs":
                buf[r0:r1] += incoming
            else:
                buf[r0:r1] = incoming
    return sent


class RingPeer(WorkerBase):
    """A worker that trains one step at a time and allreduces its gradient buckets with peers."""

    def __init__(self, config: Any, rank: int, device: str = "cpu", cpus: float = 1.0,
                 library: bool = False) -> None:
        super().__init__(config, rank, device, cpus)
        self.n = config.workers
        self.library = library  # allreduce-torch: torch.distributed.all_reduce per bucket
        self.mailbox = Mailbox()
        self.transport: Any = None
        sizes = [int(np.prod(s, dtype=np.int64)) for _, s in self.workload.layout]
        from testbed.allreduce.ring import make_buckets

        elems = max(1, int(config.ring.bucket_mb * 2**20) // 4)
        self.buckets = make_buckets(sizes, elems)

    # ---- wiring
    def deliver(self, tag: Any, payload: np.ndarray, departure: float | None = None) -> None:
        """Called by the left neighbour: file the chunk with its (emulated) delivery time."""
        delivery = self.endpoint.delivery(int(payload.nbytes * self.logical_factor), departure)
        self.mailbox.put(tag, (payload, delivery))

    def connect_ring(self, peers: list[Any]) -> None:
        _, right = ring_neighbours(self.rank, self.n)
        self.transport = ObjectStoreTransport(peers[right], self.mailbox, self.config.cluster.timeout_s,
                                              self.endpoint, self.logical_factor)

    def rendezvous(self) -> tuple[str, int]:
        """Address and a free port for torch.distributed's TCP store (called on rank 0)."""
        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            return host, s.getsockname()[1]

    def connect_torch(self, host: str, port: int) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        backend = "nccl" if self.device == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.n, timeout=timedelta(seconds=self.config.cluster.timeout_s))

    def connect_torch_transport(self) -> None:
        self.transport = TorchTransport(self.rank, self.n, self.device, self.endpoint, self.logical_factor)

    def num_buckets(self) -> int:
        return len(self.buckets)


    # ---- one training step
    def _reduce_bucket(self, iteration: int, b: int, view: Any) -> tuple[float, int]:
        t0 = time.time()
        if self.library:
            import torch
            import torch.distributed as dist

            dist.all_reduce(torch.from_numpy(view) if isinstance(view, np.ndarray) else view)
            # gloo/NCCL pick their own algorithm; count the ring's volume as the nominal figure
            sent = int(2 * view.nbytes * (self.n - 1) / self.n) if isinstance(view, np.ndarray) \
                else int(2 * view.numel() * view.element_size() * (self.n - 1) / self.n)
        else:
            sent = ring_allreduce(view, self.rank, self.n, self.transport, (iteration, b))
        t1 = time.time()
        self.span("reduce", t0, t1)
        return t1 - t0, sent

    def train_step(self, iteration: int) -> dict[str, Any]:
        """Compute, allreduce every bucket (overlapped with backward or after it), apply SGD."""
        t_start = time.time()
        delay = self.straggle(iteration, 0.0)
        batch = self.workload.batch(self.rank, iteration)
        bucket_s = [0.0] * len(self.buckets)
        sent = [0]
        t_c0 = time.time()
        if self.config.ring.overlap and self.n > 1:
            grad, loss, samples, t_c1 = self._overlapped(iteration, batch, bucket_s, sent)
        else:
            grad, loss, samples = self.workload.gradient_buckets(batch, self.buckets, lambda b, v: None)
            t_c1 = time.time()
            for b, idx in enumerate(self.buckets):
                bucket_s[b], nbytes = self._reduce_bucket(iteration, b, self.workload.bucket_view(grad, idx))
                sent[0] += nbytes
        t_comm_end = time.time()
        if self.transport is not None:
            self.transport.settle()
        self.span("compute", t_c0, t_c1)
        t_a0 = time.time()
        grad /= self.n  # average, not sum: equals SGD on the concatenated batch
        self.workload.apply_update(grad, self.config.workload.lr)
        t_a1 = time.time()
        self.span("apply", t_a0, t_a1)
        return {"t_start": t_start, "compute_s": t_c1 - t_c0, "comm_s": t_comm_end - t_c1,
                "apply_s": t_a1 - t_a0, "bucket_s": bucket_s, "bytes_sent": int(sent[0] * self.logical_factor),
                "loss": loss, "samples": samples, "injected_delay_s": delay, "t_end": t_a1}

    def _overlapped(self, iteration: int, batch: Any, bucket_s: list[float], sent: list[int]):
        """Backward hands finished buckets to a comm thread that allreduces them meanwhile."""
        ready: queue.Queue = queue.Queue()
        errors: list[BaseException] = []

        def comm() -> None:
            for _ in self.buckets:
                b, view = ready.get()
                try:
                    bucket_s[b], nbytes = self._reduce_bucket(iteration, b, view)
                    sent[0] += nbytes
                except BaseException as exc:  # noqa: BLE001 - re-raised on the step's thread
                    errors.append(exc)
                    return

        thread = threading.Thread(target=comm, name=f"ring-comm-{self.rank}", daemon=True)
        thread.start()
        grad, loss, samples = self.workload.gradient_buckets(batch, self.buckets, lambda b, v: ready.put((b, v)))
        t_c1 = time.time()
        thread.join(timeout=self.config.cluster.timeout_s)
        if errors:
            raise errors[0]
        if thread.is_alive():
            raise RemoteTimeout(f"worker {self.rank}: bucket allreduce did not finish within "
                                f"{self.config.cluster.timeout_s:g}s")
        return grad, loss, samples, t_c1
