"""The parameter server with partitions, its placements, and the BytePS bound. Pure.

Symbols as in ``testbed.analysis.costmodel``: N workers, S servers, K gradient bytes, a one-way
latency, B per-NIC bandwidth; here also M partitions of K/M bytes (``testbed.ps.partition``:
partition p lives on server p mod S; M = S is partitioning off) and P the bytes a worker pushes
in all (K unless compressed; replies are always K/M). Two time units:

    u = K/(M B)   one reply on one queue          v = P/(M B)   one push on one queue
    m = ceil(M/S) partitions on the busiest server, s* = (M-1) mod S the last such server
    (it holds partition M-1)

Synchronous schedule (zero compute; the NIC model of ``testbed.emulation.network``): a worker
reserves its egress for partitions 0..M-1 back to back; a partition is averaged the instant its
N pushes are in; its server then sends the N replies back to back in the order the pushes
arrived; a worker starts its next step on its last reply. The reference simulation of exactly
this schedule is ``tests/unit/ps_flow.py``; the numbers quoted below come from it.

Dedicated servers (every server has its own NIC). Each step's replies of one partition leave
in worker order, one u apart, so in the steady state worker j starts u after worker j-1 and
sends partition q at j u + q v. Follow server s*:

    worker 0   |q0|q1|..|q s*| ...            worker j starts j u later
    s* ingress      [C pushes, departure order ... last: worker N-1's q = s*]
    s* egress                                      [N replies][N replies] ... m times
    worker 0                                                   ^ its last reply: next step

  fill   its first partition is whole when worker N-1's push of it lands; that push left at
         (N-1)u + s* v and the ingress takes, in departure order, every push to s* that left
         no later: worker j has sent the r-th partition of s* by then iff r S v <= (N-1-j) u,
         C = sum_j min(m, floor((N-1-j) K/(S P)) + 1) pushes. The ingress starts on worker 0's
         push at s* v:  A = max((N-1) u + (s*+1) v, (s* + C) v).
  drain  from A the egress of s* is never idle (each later partition needs N v <= N u of
         ingress), and worker 0 is first in every reply order: its last reply lands
         (N (m-1) + 1) u after A.
  links  with more servers than workers the workers' links bind instead: worker N-1's push of
         partition M-1 leaves (N-1) u + (M-1) v, so worker 0 has that reply N u + M v after it
         started, and its ingress takes M replies from the first, at N u + v: (N-1+M) u + v.
  bulky  pushes larger than replies (P > K) make the ingress of s* the long pole: it takes all
         N m pushes from s* v on, and worker 0's reply of the last one follows: (s* + N m) v + u.

    T = 2a + max(A + (N (m-1) + 1) u,  N u + M v,  (N + M - 1) u + v,  (s* + N m) v + u)

With P = K, C = sum_{r<m} max(0, N - r S) and T = 2a + max(s* + 1 + C + N(m-1), M + N) u,
the simulation's step exactly (a = 0; a > 0 shifts it by 2a to within 1%). Off (M = S):
2a + (N + S) K/(S B). S = N as M grows: 2a + (1 + N/M) K/B -> K/B, the BytePS optimum for
k = n CPU servers. S < N: about N K/(S B) at the busiest server plus the fill C u ~ N^2/(2S) u,
which M shrinks only through u: more partitions cut the pipeline's fill and drain.

Colocated servers (server s shares worker s's NIC, S <= N; messages between them are free).
The busiest NIC is a server's node with m partitions: its egress carries the worker's M - m
pushes and (N-1) m replies, its ingress the (N-1) m pushes and M - m replies (a node without
a server carries M each way, never more):

    L = max((M - m) v + (N-1) m u,  (N-1) m v + (M - m) u)     (= (M + (N-2) m) u if P = K)

and the step is at least L. When the N-1 remote workers are at least as many as the servers
the fill above can bind first: they restart one u apart, and the S-1 workers on other servers'
nodes (taken to restart first, as they mostly do) skip their own partitions, so they reach s*
every S-1 pushes instead of every S:

    C = sum_{i<N-S} min(m, floor(i K/(S P)) + 1) + sum_{N-S<=i<N-1} min(m, floor(i K/((S-1) P)) + 1)
    T = 2a + max(L, max((N-2) u + (s*+1) v, (s* + C) v) + ((N-1)(m-1) + 1) u)

With S = N (and M > S) only L binds. Against the simulation over N = 2..16, S = 1..N,
M = max(S, 25) and max(S, 100), a = 0 and 50 us, B = 10 and 25 Gbit/s: from 2.9% below to 0.9%
above at a = 0 (N = S = 16, M = 25: 53 slots against 54.6), and one point beyond 5% with
latency: N = 16, S = 7, M = 25 at a = 50 us and 10 Gbit/s settles into a cycle of 86 slots (81
at a = 0), 5.8% above the formula. S = 1 is the dedicated S = 1 case with N-1 workers, exactly.
Few partitions per server are rougher: for M < 2S down to 12.7% below (N = 16, S = 8, M = 13).

Colocated, partitioning off (M = S, one partition per server): the fill chain gives only
L + u. Each step the bottleneck ingress idles for a turnaround: once its last push is in, the
server's first reply reaches some worker, which still has to collect the other S-1 replies
(the other servers finish at about the same time, so they queue at its ingress) before its
first push comes back, S slots; the egress, for its part, waits one push after its last reply:

    T = 2a + max((N-1) v + (S-1) u + x u,  (N-1) u + (S-1) v + v),    x = S

which is the simulation's step for S <= 4 and S <= N/3 (5.2 slots instead of 5 at S = 5).
With more servers the node's own worker's replies arrive during that gap and partly fill it;
the measured turnaround falls to 1.5-2.9 slots near S = N. The function takes
x = min(S, N - S + 1), an estimate: within 5% for S >= N - 2 when N >= 7, up to 15% high in
between (N = 13, S = 7: 25 slots against 21.8), and 17% low for N = S = 3 (5 against 6).
N = S = 2 is a plain exchange, x = 0: T = 2a + K/B.

Compressed pushes (P < K) enter every term above through v, the push-side terms, and the
turnaround slots stay replies. That is the simulation's step for dedicated servers with M = S.
With partitions the replies of several servers reach one worker together, which the one-u
stagger does not capture: dedicated, P = K/2 is up to 10% low (N = 11..13, S = 9, M = 25) and
P = K/50 up to 14% (N = 12, S = 9, M = 25), worst where M is no multiple of S; colocated,
P = K/2 is within 5% with a = 50 us but 13% low at a = 0 for N = 16, S = 5, M = 25, and P = K/50
down to 30% low (N = S = 13, M = 25). Colocated with M = S and P < K the servers all answer at
once and their replies collide at the workers: down to 20% low for P = K/2 (S near N) and 44%
low for P = K/50 (and the estimate's 14-15% high in between, as without compression).
Pushes larger than the replies (P > K: top-k keeping more than half): spot checks within 4.4%
with dedicated servers (N = 2, S = 3, M = 10, P = 2K) and 1.4% colocated with partitions.

Asynchronous, partitioned: a lone worker (no one queued ahead) pushes its R remote partitions
back to back and every reply leaves as soon as its push lands, so the replies overlap the later
pushes; its ingress takes them u apart (or its egress leaves them v apart, the slower of the
two): ``2a + (min(P, K) + R max(P, K))/(M B)``, R = M for a worker without a local server and
M - floor(M/S) for the least local one when every worker hosts a server. S = M = 1 gives the
old ``2a + (P + K)/B``; other workers can only add to it.

BytePS bound (OSDI '20) for n workers plus k CPU-only servers, each worker also hosting a
server: send a fraction x of the gradient through the k CPU servers and the rest through the
n colocated ones. A CPU server moves n x K/k bytes each way; a worker's NIC moves x K to the
CPU servers, (1-x)(n-1)K/n to the other workers' servers and (1-x)(n-1)K/n of replies from its
own, in each direction. Balancing the two busiest NICs,

    n x/k = x + 2 (n-1)(1-x)/n   =>   x = 2k(n-1)/(n^2 + k n - 2k),
    t_opt = n x K/(k B) = 2 n (n-1) K/((n^2 + k n - 2k) B).

k = 0 is the ring's bandwidth term 2(n-1)K/(n B); k = n gives x = 1 and K/B, which no schedule
beats because every worker sends and receives K; for k > n it stays K/B.
"""

from __future__ import annotations

import math

from testbed.analysis.costmodel import _count, _link

__all__ = ["byteps_optimal_comm_s", "ps_async_partitioned_comm_s", "ps_partitioned_comm_s"]


def _layout(n: int, k: float, a: float, b: float, servers: int, partitions: int | None,
            colocated: bool, push: float | None) -> tuple[int, float]:
    """Validate the common arguments; return (M, P)."""
    _count("workers", n, 1)
    _count("servers", servers, 1)
    _link(k, a, b)
    m = servers if partitions is None else partitions
    if isinstance(m, bool) or not isinstance(m, int) or m < servers:
        raise ValueError(f"partitions {m!r}: must be an integer >= servers ({servers}); "
                         f"e.g. {max(servers, 25)}")
    if colocated and servers > n:
        raise ValueError(f"servers {servers!r}: colocated servers share worker NICs, so at most "
                         f"workers ({n}); e.g. {n}")
    p = k if push is None else push
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not (math.isfinite(p) and p >= 0):
        raise ValueError(f"push {p!r}: must be finite and >= 0 bytes; e.g. {k / 2:g}")
    return m, float(p)


def _pushes_by(count: int, first: int, gap: float, cap: int) -> int:
    """sum over i in [first, count) of min(cap, floor(i / gap) + 1): pushes sent in time."""
    if gap <= 0:
        return (count - first) * cap
    # A push leaving together with the deadline still counts (ties go in worker order).
    return sum(min(cap, math.floor(i / gap + 1e-9) + 1) for i in range(first, count))


def ps_partitioned_comm_s(n: int, k: float, a: float, b: float, servers: int = 1,
                          partitions: int | None = None, colocated: bool = False,
                          push: float | None = None) -> float:
    """Return the steady-state ps-sync step with M partitions on S servers (module docstring).

    Dedicated: 2a + max(A + (N(m-1) + 1) u, N u + M v, (N + M - 1) u + v, (s* + N m) v + u),
    A the fill of the last full server. Colocated: 2a + max(L, fill chain), or the turnaround form when M = S.
    """
    m_parts, p = _layout(n, k, a, b, servers, partitions, colocated, push)
    s = servers
    m = -(-m_parts // s)
    last = (m_parts - 1) % s
    if k == 0:
        return 0.0 if colocated and n == 1 else 2 * a  # nothing to send but the latencies
    u, v = k / (m_parts * b), p / (m_parts * b)
    gap = s * p / k  # a worker's pushes to one server leave S v = gap * u apart
    if not colocated:
        fill = max((n - 1) * u + (last + 1) * v, (last + _pushes_by(n, 0, gap, m)) * v)
        chain = fill + (n * (m - 1) + 1) * u
        links = max(n * u + m_parts * v, (n + m_parts - 1) * u + v)
        return 2 * a + max(chain, links, (last + n * m) * v + u)
    if n == 1:
        return 0.0  # one worker, one colocated server: every message is local
    egress = (m_parts - m) * v + (n - 1) * m * u
    ingress = (n - 1) * m * v + (m_parts - m) * u
    node = max(egress, ingress)
    if m_parts == s:
        turnaround = 0 if n == s == 2 else min(s, n - s + 1)
        return 2 * a + max(ingress + turnaround * u, egress + (v if turnaround else 0.0))
    if n - 1 < s:
        return 2 * a + node
    # Remote workers counted by how many restart after them: N-S without a server, then S-1
    # on other servers' nodes, whose pushes reach server s* every S-1 pushes.
    sent = _pushes_by(n - s, 0, gap, m)
    if s > 1:
        sent += _pushes_by(n - 1, n - s, (s - 1) * p / k, m)
    fill = max((n - 2) * u + (last + 1) * v, (last + sent) * v)
    return 2 * a + max(node, fill + ((n - 1) * (m - 1) + 1) * u)


def ps_async_partitioned_comm_s(n: int, k: float, a: float, b: float, servers: int = 1,
                                partitions: int | None = None, colocated: bool = False,
                                push: float | None = None) -> float:
    """Return a lone worker's round trip 2a + (min(P, K) + R max(P, K))/(M B), R remote partitions.

    R = M unless every worker hosts a server (colocated, S = N): then M - floor(M/S).
    """
    m_parts, p = _layout(n, k, a, b, servers, partitions, colocated, push)
    remote = m_parts - m_parts // servers if colocated and servers == n else m_parts
    if remote == 0:
        return 0.0
    return 2 * a + (min(p, k) + remote * max(p, k)) / (m_parts * b)


def byteps_optimal_comm_s(n: int, servers: int, k: float, b: float) -> float:
    """Return t_opt = 2n(n-1)K/((n^2 + k n - 2k) B), k = SERVERS CPU-only servers (K/B for k >= n)."""
    _count("workers", n, 1)
    _count("servers", servers, 0)
    _link(k, 0.0, b)
    if n == 1:
        return 0.0
    c = min(servers, n)
    return 2 * n * (n - 1) * k / ((n * n + c * n - 2 * c) * b)
