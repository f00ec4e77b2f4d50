"""Connecting the ring's peers: the object-store ring's links (`wire_ring`, run by the driver
over the RingPeer actors) and the network interface gloo listens on (`pin_gloo_interface`, run
by each peer before it joins torch.distributed's group).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from testbed.runtime import hosting
from testbed.runtime.remote import get


def wire_ring(peers: list[Any], timeout: float, nbytes: int | None = None) -> None:
    """Connect RingPeer actors into an object-store ring with a channel per link (channels.py).

    Two phases, because Ray lets only a channel's writer create it: every peer opens the
    channel to its right neighbour, then every peer takes its left neighbour's. Called again
    after a peer restarts: every link is new, so nothing of an aborted attempt is read.
    Peers need max_concurrency >= 2: opening a link to a reader on another node runs a call
    on the reader while it opens its own link (tests/ray/test_multinode.py). Neighbours that
    share a process (--workers-per-process) are linked by a `channels.Slot` instead.
    """
    n = len(peers)
    outs: list[Any] = [None] * n
    if n > 1:
        nodes = get([p.node_id.remote() for p in peers], timeout, "peer node ids")
        outs = get([p.open_link.remote(peers[(r + 1) % n], nodes[(r + 1) % n], nbytes,
                                       hosting.same_process(p, peers[(r + 1) % n]))
                    for r, p in enumerate(peers)], timeout, "ring channels")
    get([p.connect_ring.remote(peers, outs[(r - 1) % n]) for r, p in enumerate(peers)], timeout, "ring wiring")


def pin_gloo_interface(ip: str) -> None:
    """Make gloo listen on the interface that holds this node's Ray address.

    Gloo picks its address from the host name, and a host name often resolves to 127.0.0.1
    (/etc/hosts): fine on one machine, but a peer on another node would then be told to connect
    to its own loopback. GLOO_SOCKET_IFNAME names the interface instead; a value the user set is
    kept, and an address held by no interface leaves gloo's default.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    name = interface_of(ip)
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = name


def interface_of(ip: str) -> str | None:
    """The network interface holding IPv4 address `ip` (Linux), or None."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(raw[20:24]) == ip:
                return name
    return None
