"""`ps-async`: asynchronous parameter server, optionally stale-synchronous (SSP).

No barrier: each pushed gradient is applied the moment it arrives, so fast workers never wait
for slow ones, at the price of staleness: a gradient computed from version v_read and applied
at version v has staleness v - v_read (0 with one worker). `--steps` counts applied gradients.
`--staleness-bound s` adds the SSP rule: a worker may not start iteration c until every worker
has finished iteration c-s-1 (s = 0 is bulk synchronous); the time a fast worker is held back is
its wait. Cost per applied gradient: one worker round trip, 2(a + K/(S B)), as a lower bound —
pushes still contend at the shards' NICs.
"""

from testbed.ps.common import ParameterServer


class PSAsync(ParameterServer):
    name = "ps-async"
    sync = False
    synchronous = False
