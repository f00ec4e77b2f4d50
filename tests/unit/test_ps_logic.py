"""Parameter-server logic without Ray: apply-once, sync quorum, async staleness, SSP rule."""

import numpy as np
import pytest

from testbed.ps.shard import ShardState, push_staleness
from testbed.ps.ssp import ssp_may_start, ssp_staleness_bound
from testbed.training.optim import OptimizerSpec


def test_push_is_applied_at_most_once():
    s = ShardState(np.zeros(3, np.float32), optimizer=OptimizerSpec(lr=1.0), sync=False, workers=2)
    g = np.ones(3, np.float32)
    first = s.push(g, 0, worker=1, iteration=7, loss=1.0)
    again = s.push(g, 0, worker=1, iteration=7, loss=1.0)  # a retried call
    assert first["status"] == "applied" and again["status"] == "duplicate"
    np.testing.assert_array_equal(s.params, -g)
    assert s.version == 1


def test_a_redone_iteration_is_answered_with_its_first_push_read_and_version():
    """Worker 1 pushed iteration 0 and died before the answer; the restarted worker redoes it on
    whatever it pulls. The redo counts nothing, and its ack names the version its first push
    counted towards (the worker waits for that one, and computes its next iteration on it)."""
    s = ShardState(np.zeros(1, np.float32), optimizer=OptimizerSpec(lr=1.0), sync=True, workers=2)
    s.push(np.ones(1, np.float32), 0, worker=1, iteration=0, loss=0.0)
    again = s.push(np.full(1, 9.0, np.float32), 0, worker=1, iteration=0, loss=0.0)
    assert again == {"status": "duplicate", "version_read": 0, "version_applied": 0, "staleness": 0}
    assert s.version == 0 and len(s.pending) == 1
    s.push(np.ones(1, np.float32), 0, worker=0, iteration=0, loss=0.0)
    late = s.push(np.full(1, 9.0, np.float32), 1, worker=1, iteration=0, loss=0.0)  # redone on version 1
    assert (late["version_read"], s.version) == (0, 1)
    np.testing.assert_array_equal(s.params, [-1.0])


def test_sync_applies_the_average_once_all_workers_pushed():
    s = ShardState(np.zeros(2, np.float32), optimizer=OptimizerSpec(lr=0.5), sync=True, workers=3)
    for w, g in enumerate(([1, 2], [3, 4], [5, 6])):
        assert s.version == 0
        ack = s.push(np.array(g, np.float32), 0, worker=w, iteration=0, loss=float(w))
        assert ack["staleness"] == 0
    assert s.version == 1
    np.testing.assert_allclose(s.params, -0.5 * np.array([3.0, 4.0]))
    assert ack["update"]["contributors"] == 3 and ack["update"]["loss"] == pytest.approx(1.0)


def test_backup_workers_apply_after_quorum_and_drop_the_late_gradient():
    s = ShardState(np.zeros(1, np.float32), optimizer=OptimizerSpec(lr=1.0), sync=True, workers=4, backup=1)
    acks = [s.push(np.ones(1, np.float32), 0, worker=w, iteration=0, loss=0.0) for w in range(4)]
    assert [a["status"] for a in acks] == ["applied", "applied", "applied", "dropped"]
    assert acks[2]["update"]["contributors"] == 3 and acks[2]["update"]["dropped"] == 1
    assert s.version == 1


def test_async_staleness_is_version_gap():
    s = ShardState(np.zeros(1, np.float32), optimizer=OptimizerSpec(lr=1.0), sync=False, workers=3)
    assert s.push(np.ones(1, np.float32), 0, worker=0, iteration=0, loss=0)["staleness"] == 0
    assert s.push(np.ones(1, np.float32), 0, worker=1, iteration=0, loss=0)["staleness"] == 1
    assert s.push(np.ones(1, np.float32), 0, worker=2, iteration=0, loss=0)["staleness"] == 2


def test_shard_stops_at_max_updates():
    s = ShardState(np.zeros(1, np.float32), optimizer=OptimizerSpec(lr=1.0), sync=False, workers=1, max_updates=2)
    for i in range(3):
        ack = s.push(np.ones(1, np.float32), i, worker=0, iteration=i, loss=0)
    assert ack["status"] == "finished" and s.version == 2
    _, version, _ = s.pull(5, timeout=0.1)  # finished shards never block
    assert version == 2


def test_a_push_is_applied_where_partition_0_applied_it_and_the_others_applied_it_or_had_finished():
    """Two asynchronous partitions of two updates each, four workers' pushes landing in opposite
    orders on the two: partition 0 applies workers 0 and 1, partition 1 workers 3 and 2. Each
    push's acks, read as the driver reads them: workers 0 and 1 applied (partition 1 had finished
    with theirs), at their larger staleness; 2 and 3 not (partition 0 had finished). Requiring
    every partition to have applied a push counted none of the four."""
    parts = [ShardState(np.zeros(1, np.float32), optimizer=OptimizerSpec(lr=1.0), sync=False, workers=4,
                        max_updates=2) for _ in range(2)]
    acks: dict[int, list] = {w: [None, None] for w in range(4)}
    for p, order in ((0, [0, 1, 2, 3]), (1, [3, 2, 1, 0])):
        for w in order:
            acks[w][p] = parts[p].push(np.ones(1, np.float32), 0, worker=w, iteration=0, loss=0)
    assert [push_staleness(acks[w]) for w in range(4)] == [0, 1, None, None]
    # a partition that did not finish but refused the push (non-finite there) leaves it unapplied
    assert push_staleness([acks[0][0], {"status": "nan", "version_applied": None, "staleness": None}]) is None
    # a retried push that counted stands for its first push
    assert push_staleness([{"status": "duplicate", "version_read": 0, "version_applied": 3, "staleness": 3},
                           acks[1][1]]) == 3


def test_pull_times_out_with_a_clear_error():
    s = ShardState(np.zeros(1, np.float32), optimizer=OptimizerSpec(lr=1.0), sync=True, workers=2)
    with pytest.raises(TimeoutError, match="version 1 not reached"):
        s.pull(1, timeout=0.05)


@pytest.mark.parametrize(("it", "completed", "bound", "ok"), [
    (5, [0, 0], None, True),
    (0, [0, 0], 0, True),
    (1, [1, 0], 0, False),
    (1, [1, 1], 0, True),
    (3, [3, 1], 2, True),
    (4, [4, 1], 2, False),
])
def test_ssp_rule(it, completed, bound, ok):
    assert ssp_may_start(it, completed, bound) is ok


def test_ssp_staleness_bound_formula():
    assert ssp_staleness_bound(1, 3) == 0
    assert ssp_staleness_bound(4, 0) == 3
    assert ssp_staleness_bound(4, 2) == 15
