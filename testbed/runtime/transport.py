"""Transports that move buffer pieces between peer actors (the allreduce algorithms use them; gossip
its Mailbox and Wire), and the wire format they carry.

Two calls serve every schedule:
- `exchange(tag, send, recv_numel) -> received`: the ring's step -- send to the right
  neighbour, receive from the left one. The result may be a view of a shared buffer: drop
  it before the next exchange (the send may wait until the neighbour dropped its own).
- `send_to(peer, tag, array)` / `recv_from(peer, tag, numel, template) -> received`: any pair
  of ranks (halving-doubling, trees, hierarchical). Sends never block; a receive blocks
  until its message is there. `flush()` ends a round (torch: the round's sends are complete),
  `settle()` ends a step (object store: surface failures of the step's sends).

object-store: the ring's `exchange` writes into a shared-memory channel to the right
neighbour and reads the left one's (`testbed.allreduce.channels`: no RPC per chunk on one node). Any-pair
sends are `peer.deliver.remote(key, chunk, departure)`, which puts the chunk in Ray's object store
(small ones travel inline) and runs `deliver` on one of the receiver's spare actor threads,
which files it in the receiver's `Mailbox` under `key`; the receiving thread takes it by key.
Pairwise keys are ("p2p", sender, tag), so one mailbox serves all peers. Works across nodes.
torch: torch.distributed point-to-point isend/recv (gloo on CPU, NCCL on GPU). Messages between
one pair arrive in the order they were sent, and every rank walks the same schedule, so no tags
are needed.

Emulated network: every send queues its logical bytes on the sender's NIC
(`endpoint.send(n) -> departure`, stamped on the message) and the receiver's NIC delivers it
(`endpoint.delivery(n, departure)`); the receive sleeps until then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from testbed.emulation.endpoint import Endpoint
from testbed.emulation.network import sleep_until
from testbed.runtime.remote import RemoteTimeout


class StepAborted(RuntimeError):
    """The driver aborted this step to rebuild the ring after a peer died."""


class Mailbox:
    """Tagged messages from peers; take() blocks until its tag arrives."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._box: dict[Any, Any] = {}
        self._aborted = False

    def put(self, tag: Any, payload: Any) -> None:
        with self._cv:
            self._box[tag] = payload
            self._cv.notify_all()

    def take(self, tag: Any, timeout: float) -> Any:
        with self._cv:
            if not self._cv.wait_for(lambda: tag in self._box or self._aborted, timeout=timeout):
                raise RemoteTimeout(f"message {tag} did not arrive within {timeout:g}s; "
                                    "the sending peer may be dead or hung")
            if self._aborted:
                raise StepAborted(f"message {tag}: the step was aborted (a peer died)")
            return self._box.pop(tag)

    @property
    def aborted(self) -> bool:
        return self._aborted

    def abort(self) -> None:
        """Wake every waiting take() with StepAborted (the driver is recovering a dead peer)."""
        with self._cv:
            self._aborted = True
            self._cv.notify_all()

    def reset(self) -> None:
        """Drop messages of aborted attempts and accept new ones."""
        with self._cv:
            self._box.clear()
            self._aborted = False


class ObjectStoreTransport:
    """Ray's object store: the ring's `exchange` over a shared-memory channel `link` when one is
    wired (`channels.py`), else over one `deliver` actor call per chunk; `send_to`/`recv_from`
    (any pair of peers) always over actor calls."""

    def __init__(self, right: Any, mailbox: Mailbox, timeout: float, endpoint: Endpoint,
                 logical_factor: float, peers: list[Any] | None = None, rank: int = -1,
                 link: Any = None) -> None:
        self.right, self.mailbox, self.timeout = right, mailbox, timeout
        self.endpoint, self.factor = endpoint, logical_factor
        self.peers, self.rank, self.link = peers or [], rank, link
        self.inflight: list[Any] = []

    def exchange(self, tag: Any, send: Any, recv_numel: int) -> np.ndarray:
        """Send to the right neighbour, return what the left one sent under `tag`. The result
        may be a view of a channel buffer: drop it before the next exchange (channels.py)."""
        chunk = to_numpy(send)
        departure = self.endpoint.send(int(chunk.nbytes * self.factor))
        if self.link is not None:
            self.link.send(tag, departure, chunk)
            return self._from_link(tag)
        self.inflight.append(self.right.deliver.remote(tag, chunk, departure))
        payload, delivery = self.mailbox.take(tag, self.timeout)
        sleep_until(delivery)
        return payload

    @property
    def computes(self) -> bool:
        """Whether `exchange_computed` writes into the link: a shared-memory ring each way."""
        return self.link is not None and self.link.computes

    def exchange_computed(self, tag: Any, dtype: np.dtype, numel: int, fill: Callable[[np.ndarray], Any],
                          recv_numel: int) -> np.ndarray:
        """`exchange` of a chunk that `fill(out)` computes into `out` (numel elements of dtype),
        in the link's room for it (`channels.Link.send_computed`); where `computes`."""
        departure = self.endpoint.send(int(numel * dtype.itemsize * self.factor))
        self.link.send_computed(tag, departure, dtype, numel, fill)
        return self._from_link(tag)

    def _from_link(self, tag: Any) -> np.ndarray:
        """The left neighbour's message `tag` off the link, its arrival accounted (emulated: waited for)."""
        departure, payload = self.link.recv(tag)
        self.endpoint.receive(int(payload.nbytes * self.factor), departure)
        return payload

    def send_to(self, peer: int, tag: Any, array: Any) -> None:
        chunk = to_numpy(array)  # serialised by .remote(): later changes to the buffer don't leak
        departure = self.endpoint.send(int(chunk.nbytes * self.factor))
        self.inflight.append(self.peers[peer].deliver.remote(("p2p", self.rank, tag), chunk, departure))

    def recv_from(self, peer: int, tag: Any, numel: int = 0, template: Any = None) -> np.ndarray:
        payload, delivery = self.mailbox.take(("p2p", peer, tag), self.timeout)
        sleep_until(delivery)
        return payload

    def flush(self) -> None:
        pass

    def settle(self) -> None:
        """Surface failures of this step's sends (and keep the list short)."""
        if self.inflight:
            ray.get(self.inflight, timeout=self.timeout)
            self.inflight.clear()


class TorchTransport:
    """Point-to-point torch.distributed; under emulation a departure stamp precedes each chunk."""

    def __init__(self, rank: int, n: int, device: str, endpoint: Endpoint, logical_factor: float) -> None:
        self.left, self.right = (rank - 1) % n, (rank + 1) % n  # the ring's neighbours
        self.device, self.endpoint, self.factor = device, endpoint, logical_factor
        self.pending: list[tuple[Any, Any]] = []  # (request, tensor kept alive until it completes)

    def _nbytes(self, t: Any) -> int:
        return int(t.numel() * t.element_size() * self.factor)

    def exchange(self, tag: Any, send: Any, recv_numel: int) -> Any:
        import torch

        out = torch.as_tensor(send).contiguous()
        self.send_to(self.right, tag, out, clone=False)
        buf = self.recv_from(self.left, tag, recv_numel, out)
        self.flush()
        return buf

    def send_to(self, peer: int, tag: Any, array: Any, clone: bool = True) -> None:
        import torch
        import torch.distributed as dist

        out = torch.as_tensor(array).contiguous()
        out = out.clone() if clone else out  # isend reads later; later rounds change the buffer
        if self.endpoint.emulated:
            stamp = torch.tensor([self.endpoint.send(self._nbytes(out))], dtype=torch.float64,
                                 device=out.device)
            self.pending.append((dist.isend(stamp, dst=peer), stamp))
        self.pending.append((dist.isend(out, dst=peer), out))

    def recv_from(self, peer: int, tag: Any, numel: int = 0, template: Any = None) -> Any:
        import torch
        import torch.distributed as dist

        like = torch.as_tensor(template)
        stamp = None
        if self.endpoint.emulated:
            stamp = torch.empty(1, dtype=torch.float64, device=like.device)
            dist.recv(stamp, src=peer)
        buf = torch.empty(numel, dtype=like.dtype, device=like.device)
        dist.recv(buf, src=peer)
        if stamp is not None:
            self.endpoint.receive(self._nbytes(buf), float(stamp.item()))
        return buf

    def flush(self) -> None:
        for req, _ in self.pending:
            req.wait()
        self.pending.clear()

    def settle(self) -> None:
        self.flush()


class Wire:
    """How buffer elements travel: float32 as they are, or as float16 (--compression fp16)."""

    def __init__(self, half: bool = False) -> None:
        self.half = half

    def encode(self, x: Any) -> Any:
        if not self.half:
            return x
        return x.astype(np.float16) if isinstance(x, np.ndarray) else x.to(_torch().float16)

    def decode(self, x: Any) -> Any:
        if not self.half:
            return x
        return x.astype(np.float32) if isinstance(x, np.ndarray) else x.to(_torch().float32)

    def itemsize(self, buf: Any) -> int:
        if self.half:
            return 2
        return buf.itemsize if isinstance(buf, np.ndarray) else buf.element_size()

    def round(self, buf: Any) -> None:
        """Round the buffer as the wire would, in place: every replica ends bit-identical."""
        if self.half:
            buf[:] = self.decode(self.encode(buf))


def _torch() -> Any:
    import torch

    return torch


def to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    return x.detach().cpu().numpy()


def like(incoming: Any, buf: Any) -> Any:
    """Bring a received chunk to the buffer's kind and device (GPU adds stay on the GPU)."""
    if isinstance(buf, np.ndarray):
        return to_numpy(incoming)
    import torch

    t = torch.as_tensor(incoming)
    return t.to(buf.device, non_blocking=True) if t.device != buf.device else t
