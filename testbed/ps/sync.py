"""`ps-sync`: synchronous parameter server, optionally with backup workers.

Each version v: every worker pulls params_v (the pull blocks until v is applied), computes its
gradient and pushes it to every shard. A shard applies one averaged update when it holds the
gradients of N - b workers for v (`--backup-workers b`, default 0) and drops later ones for v
(recorded, `dropped_gradients`). With b = 0 this equals single-process SGD on the concatenated
batch. Per step a shard moves N*K/S bytes in and N*K/S out: 2(a + N K/(S B)) in the alpha-beta
model, linear in N for a fixed number of shards. See ps/server.py for the message flow.
"""

from testbed.ps.common import ParameterServer


class PSSync(ParameterServer):
    name = "ps-sync"
    sync = True
