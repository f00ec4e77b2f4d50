"""The directions the shipped map must show (docs/map.md), from the cost model alone: where
the ring beats one server, how close dedicated partitioned servers come to the BytePS bound, and
how latency and message size move the servers against the ring. No Ray."""

import pandas as pd
import pytest

from testbed.analysis.psmodel import byteps_optimal_comm_s
from testbed.config import RunConfig, with_overrides
from testbed.map.grid import parse_grid
from testbed.map.rank import CELL
from testbed.map.table import configurations, predictions
from testbed.util import units
from testbed.workloads import tensor_plan


@pytest.fixture(scope="module")
def shipped():
    """The predictions of the shipped maps' axes (docs/map.md), at two latencies, of the ring's
    and ps-sync's configurations, which the tests below compare (ps-async's, a replay of the
    whole run each, would take most of the time)."""
    from testbed.map import table

    def compared(base, n, *more):
        return [c for c in configurations(base, n, *more) if c.spec.name in ("ring", "ps-sync")]

    out = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(table, "configurations", compared)
        for name in ("profile:resnet50", "profile:bert-large"):
            grid = parse_grid(workload=name, workers="4,8,16,64", bandwidth="1Gbit,10Gbit,100Gbit",
                              latency="50us,1ms", compute_ms=100)
            out.append(predictions(grid).assign(profile=name))
    return pd.concat(out, ignore_index=True)


def _comm(cell, label):
    return float(cell.loc[cell["label"] == label, "predicted_comm_s"].item())


RING = "ring ring, no overlap"
ONE_SERVER = "ps-sync k=1 dedicated, unpartitioned"
ALL_SERVERS = "ps-sync k=N dedicated, 4 MiB partitions"
ALL_WHOLE = "ps-sync k=N dedicated, unpartitioned"


def _ring_buckets(profile, n):
    base = parse_grid(workload=profile, workers=str(n), bandwidth="1Gbit", latency="0us", compute_ms=0).base()
    ring = next(c for c in configurations(base, n) if c.variant.label == RING)
    return ring.spec.plan(ring.config, *tensor_plan(base.workload, seed=base.seed))["buckets"]


def test_the_ring_beats_one_server_wherever_bandwidth_matters(shipped):
    """Where the single server's bytes (N K / B) outweigh the ring's latencies (2(N-1) per
    bucket), the ring wins; where they do not (1 ms at 100 Gbit/s), it need not."""
    seen = 0
    for (prof, lat, bw, n), cell in shipped.groupby(["profile", *CELL]):
        k, b = float(cell["grad_bytes_logical"].dropna().iloc[0]), units.parse_bandwidth(bw)
        if n * k / b > 2 * (n - 1) * _ring_buckets(prof, n) * units.parse_duration(lat):
            seen += 1
            assert _comm(cell, RING) < _comm(cell, ONE_SERVER), (prof, lat, bw, n)
    assert seen > len(shipped.groupby(["profile", *CELL])) / 2


def test_dedicated_partitioned_servers_beat_the_ring_by_at_most_the_byteps_bound(shipped):
    for (prof, lat, bw, n), cell in shipped.groupby(["profile", *CELL]):
        k, b = float(cell["grad_bytes_logical"].dropna().iloc[0]), units.parse_bandwidth(bw)
        bound = byteps_optimal_comm_s(n, n, k, b)
        assert bound <= _comm(cell, ALL_SERVERS) < _comm(cell, RING), (prof, lat, bw, n)


def test_the_servers_gain_on_the_ring_as_latency_grows(shipped):
    lats = sorted(shipped["latency"].unique(), key=units.parse_duration)
    for (prof, bw, n), group in shipped.groupby(["profile", "bandwidth", "workers"]):
        ratios = [_comm(group[group["latency"] == lat], ALL_SERVERS) / _comm(group[group["latency"] == lat], RING)
                  for lat in lats]
        assert ratios == sorted(ratios, reverse=True), (prof, bw, n, ratios)


def test_the_servers_gain_on_the_ring_as_messages_shrink():
    """One tensor (one bucket) of K bytes: as K shrinks against a B, the ring's 2(N-1) latencies
    weigh more than the servers' 2, and the servers' share of the ring's time falls (servers
    unpartitioned: with partitions of a fixed size the pipeline's fill, N/M partitions, moves
    with K too)."""
    n, a, b = 16, units.parse_duration("50us"), units.parse_bandwidth("10Gbit")
    base = with_overrides(RunConfig(), workers=n, **{"workload.name": "synthetic"})
    ratios = []
    for mib in (256, 64, 16, 4, 1):
        sizes = [mib * 2**20 // 4]
        comm = {}
        for c in configurations(base, n):
            if c.variant.label in (RING, ALL_WHOLE):
                comm[c.variant.label] = c.spec.predict(c.config, c.spec.plan(c.config, sizes, None), a, b).comm_s
        ratios.append(comm[ALL_WHOLE] / comm[RING])
    assert ratios == sorted(ratios, reverse=True), ratios
