"""The allreduce family's actor shell: a worker that trains and allreduces its gradient buckets.

The schedules (which piece goes where in which round) are `ring.py`'s and `algorithms.py`'s;
`collectives.py` walks them over a transport (`testbed.runtime.transport`); `wiring.py` connects
the peers, and this module runs one training step. The driver starts a step and collects
timings, but never relays a chunk.

Per bucket (`--algorithm`, an entry of `algorithms.ALGORITHMS`): one with the ring's neighbour
exchange -> `ring_allreduce` over `exchange` (right neighbour only); the any-pair ones ->
`run_schedule` over `send_to`/`recv_from` (any peer).
`--compression fp16` sends every piece as float16 (sums stay float32); `--compression topk:F`
compresses each bucket once (error feedback, one `Compressor` per bucket) and gathers all
ranks' sparse pieces around the ring (`sparse_ring_allgather`), then sums them densely.

Buffers: a torch tensor (any device: the adds run where the gradient lives, on the GPU for
--device cuda) or, for the torch-free synthetic workload, a numpy array.
"""

from __future__ import annotations

import queue
import socket
import sys
import threading
import time
import warnings
from typing import Any

import numpy as np
import ray

from testbed.allreduce.algorithms import ALGORITHMS, bytes_moved, groups_of_size, schedule
from testbed.allreduce.channels import Link, Outgoing, Slot
from testbed.allreduce.collectives import ring_allreduce, run_schedule, sparse_ring_allgather
from testbed.allreduce.relay import Loopback, Relay, relay_allreduce
from testbed.allreduce.ring import make_buckets
from testbed.allreduce.wiring import pin_gloo_interface
from testbed.emulation.network import LinkSpec
from testbed.emulation.peers import segment_sizes
from testbed.runtime import hosting
from testbed.runtime.remote import RemoteTimeout
from testbed.runtime.transport import (
    Mailbox,
    ObjectStoreTransport,
    TorchTransport,
    Wire,
    like,
    to_numpy,
)
from testbed.runtime.turns import Turns
from testbed.runtime.worker import WorkerBase
from testbed.training.compressor import Compressor, unpack_sparse
from testbed.training.optim import Optimizer, optimizer_for, to_numpy_state

__all__ = ["Mailbox", "ObjectStoreTransport", "RingPeer", "TorchTransport", "ring_allreduce"]

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class RingPeer(WorkerBase):
    """A worker that trains one step at a time and allreduces its gradient buckets with peers."""

    def __init__(self, config: Any, rank: int, device: str = "cpu", cpus: float = 1.0,
                 library: bool = False) -> None:
        # with emulated peers this is real worker `index` at ring position `rank` (WorkerBase)
        super().__init__(config, rank, device, cpus)
        real, n = config.real_workers, config.workers
        self.n = n
        self.relay: Relay | None = None  # the emulated peers after this one (testbed.allreduce.relay)
        if real < n:
            self.upstream = segment_sizes(n, real)[self.index - 1]  # the emulated peers before this one
            self.relay = Relay(n, self.rank, self.segment, LinkSpec(*config.network.wire), self.logical_factor)
        self.library = library  # allreduce-torch: torch.distributed.all_reduce per bucket
        self.mailbox = Mailbox()
        self.transport: Any = None
        self._outgoing: Any = None  # channels.Outgoing to the right neighbour (object-store ring)
        self._comm_thread: threading.Thread | None = None  # --overlap: this step's allreduce thread
        sizes = [int(np.prod(s, dtype=np.int64)) for _, s in self.workload.layout]
        # buckets by logical bytes: a scaled payload (--payload scaled:F) is bucketed as the
        # gradient it stands for, so overlap and per-bucket latency are those of the real size
        elems = max(1, int(config.ring.bucket_mb * 2**20 / 4))
        first = max(1, int(config.ring.first_bucket_mb * 2**20 / 4))
        self.buckets = make_buckets(self.workload.logical_sizes(), elems, first)
        self.bucket_numels = [sum(sizes[i] for i in b) for b in self.buckets]
        self.algorithm = config.ring.algorithm
        self.compress_spec = config.compression
        self.wire = Wire(half=self.compress_spec.kind == "fp16")
        self.compressors: dict[int, Compressor] = {}  # top-k: one residual per bucket
        self.groups = groups_of_size(self.n, config.ring.node_size or self.n)
        self._schedules: dict[int, list] = {}
        self.optimizer = Optimizer(optimizer_for(config.workload))  # every replica steps the same state
        self._snapshot: tuple[int, Any, Any] | None = None  # (iteration, params, optimizer state before it)
        self._deferred: tuple[int, float, float] | None = None  # (bucket, start, model's end): _reduce_bucket
        # only the object-store ring is rebuilt after a death (allreduce/strategy.py)
        self._recoverable = (not library and config.ring.transport == "object-store"
                             and config.faults.max_restarts > 0)
        self.attempt = 0
        self.turns = Turns()  # train_step runs steps in order (testbed.runtime.turns)

    # ---- wiring
    def deliver(self, tag: Any, payload: np.ndarray, departure: float | None = None) -> None:
        """Called by a peer: file the chunk with its (emulated) delivery time."""
        delivery = self.endpoint.delivery(int(payload.nbytes * self.logical_factor), departure)
        self.mailbox.put(tag, (payload, delivery))

    def open_link(self, right: Any, right_node: str, nbytes: int | None = None, local: bool = False) -> Any:
        """Create the channel to the right neighbour (first half of `wire_ring`); None when
        this peer never uses the ring exchange (an --algorithm without `neighbour_exchange`).

        Sized for the largest message (a dense ring chunk, or a packed top-k piece) unless
        `nbytes` says otherwise: Ray never frees a channel's buffer, not even the one it
        replaces when a message outgrows it, so a link should never have to grow. `local`: the
        right neighbour lives in this process; the link is a `Slot` (no size to fix).
        """
        self._close_links()  # re-wiring after a restart: the old links are done
        exchange = ALGORITHMS[self.algorithm].neighbour_exchange
        if local:
            if not exchange:
                return None
            self._outgoing = Slot()
            return self._outgoing.reader_end()
        if nbytes is None:
            if not exchange:  # (top-k, the other user of the exchange, is allowed only with it)
                return None
            largest = max(self.bucket_numels, default=0)
            nbytes = -(-largest // self.n) * 4
            if self.relay is not None:  # a batch: a chunk and its departure per step of the segment
                nbytes = max(1, self.relay.m) * (nbytes + 8)
            if self.compress_spec.kind == "topk":
                nbytes = max(nbytes, Compressor(self.compress_spec, largest).payload_bytes)
        self._outgoing = Outgoing(hosting.process_of(right), right_node, nbytes)
        return self._outgoing.reader_end()

    def _close_links(self) -> None:
        link = getattr(self.transport, "link", None)
        if link is not None:
            link.close()
        if self._outgoing is not None:
            self._outgoing.close()
            self._outgoing = None

    def release(self) -> None:
        """Before its process serves another run (testbed.runtime.pool): links closed, an
        overlapped step's thread finished, torch.distributed's group (one per process) ended."""
        comm = self._comm_thread
        if comm is not None and comm.is_alive():
            comm.join(timeout=1.0)
            if comm.is_alive():
                raise RuntimeError("an overlapped allreduce is still running")
        self._close_links()
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def connect_ring(self, peers: list[Any], left_channel: Any = None) -> None:
        """Object-store transport to the ring neighbours; `left_channel` (the left peer's
        `open_link`) carries the ring's chunks, else each chunk is a `deliver` call."""
        right = (self.index + 1) % len(peers)  # the next real worker (the right neighbour when all are)
        t = self.config.cluster.timeout_s
        link = None
        if left_channel is not None and self._outgoing is not None:
            link = Link(self._outgoing, left_channel, t, lambda: self.mailbox.aborted)
        self.transport = ObjectStoreTransport(peers[right], self.mailbox, t, self.endpoint,
                                              self.logical_factor, peers=peers, rank=self.rank, link=link)

    def node_id(self) -> str:
        """The Ray node this peer runs on (an algorithm that needs node groups groups by it)."""
        return ray.get_runtime_context().get_node_id()

    def set_groups(self, groups: list[list[int]]) -> None:
        """The node groups, for an algorithm that needs them (each a list of ranks; the first leads)."""
        self.groups, self._schedules = groups, {}

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
        pin_gloo_interface(ray.util.get_node_ip_address())
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.n, timeout=timedelta(seconds=self.config.cluster.timeout_s))

    def connect_torch_transport(self) -> None:
        self.transport = TorchTransport(self.rank, self.n, self.device, self.endpoint, self.logical_factor)

    def num_buckets(self) -> int:
        return len(self.buckets)

    def bucket_plan(self) -> tuple[list[int], list[float] | None]:
        """Each bucket's logical bytes, and its share of backward where the workload knows it
        (synthetic: by elements or a profile's FLOPs; a torch model: None)."""
        logical = self.workload.logical_sizes()
        share = getattr(self.workload, "backward_share", None)
        return ([4 * sum(logical[i] for i in b) for b in self.buckets],
                None if share is None else [float(sum(share[i] for i in b)) for b in self.buckets])


    # ---- one training step
    def _reduce_bucket(self, iteration: int, b: int, view: Any, ready: float) -> tuple[float, int, int]:
        """Sum bucket b across the workers; `ready`: when backward handed it over.

        With emulated peers the last bucket's sum is complete before the model's end of its
        allreduce, so the worker does not sleep to that end here: `train_step` applies the update
        first and then sleeps (`_finish_deferred`). The model has no time for the optimizer step
        (a GPU's takes milliseconds); this machine's, on the CPU, runs inside the last transfer
        instead of after it, and shows as lateness only where it outlasts it."""
        t0 = time.time()
        if self.relay is not None:
            last = b == len(self.buckets) - 1
            sent, recv, due = self._relay_allreduce(iteration, view, (iteration, self.attempt, b), ready, wait=not last)
            if last and due is not None:
                self._deferred = (b, t0, due)
                return 0.0, sent, recv
        elif self.library:
            import torch
            import torch.distributed as dist

            dist.all_reduce(torch.from_numpy(view) if isinstance(view, np.ndarray) else view)
            # gloo/NCCL pick their own algorithm; count the ring's volume as the nominal figure
            nbytes = view.nbytes if isinstance(view, np.ndarray) else view.numel() * view.element_size()
            sent = recv = int(2 * nbytes * (self.n - 1) / self.n)
        else:
            sent, recv = self._allreduce(view, (iteration, self.attempt, b), b)
        t1 = time.time()
        self.span("reduce", t0, t1)
        return t1 - t0, sent, recv

    def _finish_deferred(self, bucket_s: list[float]) -> float:
        """Sleep to the model's end of the last bucket's allreduce if `_reduce_bucket` left it to
        this step (its time then counts from its start to there); return when communication ended."""
        if self._deferred is None:
            return time.time()
        b, t0, due = self._deferred
        self._deferred = None
        self.endpoint.finish(due)
        t1 = time.time()
        bucket_s[b] = t1 - t0
        self.span("reduce", t0, t1)
        return t1

    def _relay_allreduce(self, iteration: int, view: Any, tag: Any, ready: float,
                         wait: bool = True) -> tuple[int, int, float | None]:
        """The ring of N positions, this worker's segment of emulated peers played here
        (testbed.allreduce.relay); the adds run on a numpy view of the bucket (a copy, written
        back, for a GPU tensor)."""
        buf = to_numpy(view)
        link = getattr(self.transport, "link", None)
        io = link if link is not None else Loopback()  # one real worker: its segment comes back to it
        out = relay_allreduce(buf, self.rank, self.n, self.relay, self.upstream, io, tag, self.endpoint,
                              ready, self._peers_ready(iteration, ready), wait)
        if not isinstance(view, np.ndarray) and view.device.type != "cpu":
            view[:] = like(buf, view)
        return out

    def _peers_ready(self, iteration: int, ready: float) -> np.ndarray:
        """When this worker and each emulated peer of its segment had the bucket (peer_delays)."""
        return np.concatenate([[ready], ready + self.peer_delays(iteration)])

    def _allreduce(self, view: Any, tag: Any, b: int) -> tuple[int, int]:
        """Sum one bucket across the peers in place by --algorithm; return wire bytes (sent, recv)."""
        if self.compress_spec.kind == "topk":
            return self._topk_allreduce(view, tag, b)
        if len(view) not in self._schedules:
            self._schedules[len(view)] = schedule(self.algorithm, self.rank, self.n, len(view), self.groups)
        rounds = self._schedules[len(view)]
        if ALGORITHMS[self.algorithm].neighbour_exchange:  # same rounds, same bytes as `rounds`
            sent = ring_allreduce(view, self.rank, self.n, self.transport, tag, self.wire)
            return sent, bytes_moved(rounds, self.wire.itemsize(view))[1]
        return run_schedule(view, rounds, self.transport, tag, self.wire)

    def _topk_allreduce(self, view: Any, tag: Any, b: int) -> tuple[int, int]:
        """Compress once (error feedback), gather every rank's sparse piece, sum them densely."""
        comp = self.compressors.setdefault(b, Compressor(self.compress_spec, len(view)))
        packed = comp.compress(to_numpy(view))
        dense = np.zeros(len(view), np.float32)
        for piece in sparse_ring_allgather(packed, self.rank, self.n, self.transport, tag):
            idx, vals = unpack_sparse(piece)
            dense[idx] += vals  # rank order on every peer: bit-identical replicas
        view[:] = like(dense, view)
        return packed.nbytes * (self.n - 1), packed.nbytes * (self.n - 1)

    # ---- recovery (driver-initiated, see allreduce/strategy.py)
    def abort(self) -> None:
        self.mailbox.abort()
        self.turns.wake()  # a queued step waiting for its turn ends too

    def reset(self, iteration: int) -> None:
        """Forget the aborted attempt: mailbox cleared, parameters as before `iteration`."""
        comm = self._comm_thread
        if comm is not None and comm.is_alive():  # let it see the abort before the flag clears
            comm.join(timeout=1.0)
        self.mailbox.reset()
        self._deferred = None
        self.turns.redo(iteration)  # next (a restarted peer, fresh, starts there too)
        if self._snapshot is not None and self._snapshot[0] == iteration:
            self.workload.set_params(self._snapshot[1])
            self.optimizer.load_state_dict(self._snapshot[2])

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state (numpy), for a restarted peer to continue from."""
        return to_numpy_state(self.optimizer.state_dict())

    def set_optimizer_state(self, state: dict[str, Any]) -> None:
        like = getattr(self.workload, "flat", None)
        self.optimizer.load_state_dict(state, like=like if like is not None else self.workload.get_params())

    def train_step(self, iteration: int, attempt: int = 0, send_params: bool = False) -> dict[str, Any]:
        """Run `iteration` (`run_step`) once the one before it has ended here. The driver queues a
        worker's next step while this one runs, so no driver round trip sits between two steps
        (a real cluster has no driver between them); an abort (recovery) ends a queued step too."""
        self.turns.wait(iteration, self.config.cluster.timeout_s, lambda: self.mailbox.aborted, f"worker {self.rank}")
        out = self.run_step(iteration, attempt, send_params)
        self.turns.ended(iteration)
        return out

    def run_step(self, iteration: int, attempt: int = 0, send_params: bool = False) -> dict[str, Any]:
        """Compute, allreduce every bucket (overlapped with backward or after it), apply the
        optimizer; with `send_params`, the report carries the parameters after it (evaluation)."""
        t_start = time.time()
        self.attempt = attempt  # tags carry it: messages of an aborted attempt never match
        self._deferred = None
        batch = self.workload.batch(self.rank, iteration)
        bucket_s = [0.0] * len(self.buckets)
        sent = [0, 0]  # wire bytes sent, received
        if self.config.ring.overlap and self.n > 1:
            grad, info = self._overlapped(iteration, batch, bucket_s, sent)
        else:
            grad, info = self.gradient(iteration, batch, self.buckets, lambda b, v: None)
            for b, idx in enumerate(self.buckets):
                bucket_s[b], out, into = self._reduce_bucket(iteration, b, self.workload.bucket_view(grad, idx),
                                                             info["t_computed"])
                sent[0] += out
                sent[1] += into
        t_comm_end = time.time()  # or, with emulated peers, the model's end of the last bucket (below)
        if self.transport is not None:
            self.transport.settle()
        t_a0 = time.time()
        grad /= self.n  # average, not sum: equals SGD on the concatenated batch
        # a NaN anywhere reaches every peer's sum alike, so all peers skip the same update
        finite = self.nan.admit(grad, f"step {iteration}: the summed gradient")
        if finite:
            if self._recoverable:  # what a rollback returns to; its copy is part of apply_s
                self._snapshot = (iteration, self.workload.get_params(), self.optimizer.state_dict())
            self.workload.apply_update(grad, self.optimizer)
        t_a1 = time.time()
        self.span("apply", t_a0, t_a1)
        if self._deferred is not None:  # the update ran inside the last transfer: end it now
            t_comm_end = self._finish_deferred(bucket_s)
            t_a0 = t_a1 = max(t_a1, t_comm_end)  # no time after communication left to apply
        extra = {"params": self.workload.get_params()} if send_params else {}
        return self.report({**extra,
            **info, "t_start": t_start, "comm_s": t_comm_end - info["t_computed"], "apply_s": t_a1 - t_a0,
            "bucket_s": bucket_s, "bytes_sent": int(sent[0] * self.logical_factor),
            "bytes_recv": int(sent[1] * self.logical_factor), "t_end": t_a1, "applied": finite})

    def _overlapped(self, iteration: int, batch: Any, bucket_s: list[float], sent: list[int]):
        """Backward hands finished buckets to a comm thread that allreduces them meanwhile."""
        ready: queue.Queue = queue.Queue()
        errors: list[BaseException] = []

        def comm() -> None:
            for _ in self.buckets:
                b, view, t_ready = ready.get()
                if view is None:  # compute failed: nothing more comes
                    return
                try:
                    bucket_s[b], out, into = self._reduce_bucket(iteration, b, view, t_ready)
                    sent[0] += out
                    sent[1] += into
                except BaseException as exc:  # noqa: BLE001 - re-raised on the step's thread
                    errors.append(exc)
                    return

        thread = threading.Thread(target=comm, name=f"ring-comm-{self.rank}", daemon=True)
        thread.start()
        self._comm_thread = thread
        try:
            grad, info = self.gradient(iteration, batch, self.buckets, lambda b, v: ready.put((b, v, time.time())))
        except BaseException:
            ready.put((None, None, None))
            raise
        thread.join(timeout=self.config.cluster.timeout_s)
        if errors:
            raise errors[0]
        if thread.is_alive():
            raise RemoteTimeout(f"worker {self.rank}: bucket allreduce did not finish within "
                                f"{self.config.cluster.timeout_s:g}s")
        return grad, info
