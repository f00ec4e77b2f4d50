"""One run: argv -> RunConfig -> Cluster -> Strategy -> results folder.

    python -m testbed.run --strategy ring --workers 8

Prints a progress bar, a summary table and, as the last stdout line, the run folder. Bad input
is one stderr line naming the value and the fix, exit 2, before Ray starts. Ctrl-C keeps what
was measured (status "interrupted", exit 130); a failure keeps it too (status "failed", exit 1).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from testbed.config import (
    DEVICES,
    PLACEMENTS,
    TRANSPORTS,
    WORKLOADS,
    ClusterConfig,
    ConfigError,
    FaultConfig,
    GossipConfig,
    NetworkConfig,
    PSConfig,
    RingConfig,
    RunConfig,
    WorkloadConfig,
    validate,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        raise ConfigError(message)


def build_parser(strategies: list[str]) -> argparse.ArgumentParser:
    p = _Parser(prog="python -m testbed.run", description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--strategy", default="ring", help=f"one of: {', '.join(strategies)}")
    a("--workers", type=int, default=4, help="number of data-parallel workers")
    a("--steps", type=int, default=100, help="model updates to apply")
    a("--workload", default="mlp", help=f"one of: {', '.join(WORKLOADS)}")
    a("--batch-size", type=int, default=32, help="samples per worker per iteration")
    a("--lr", type=float, default=0.1, help="SGD learning rate")
    a("--seed", type=int, default=0)
    a("--device", default="auto", help=f"one of: {', '.join(DEVICES)}")
    a("--grad-mb", type=float, default=4.0, help="synthetic: logical gradient MiB")
    a("--compute-ms", type=float, default=10.0, help="synthetic: compute per iteration (ms)")
    a("--backward-frac", type=float, default=2 / 3, help="synthetic: share of compute in backward")
    a("--payload", default="full", help="synthetic: 'full' or 'scaled:F' (physical = F x logical)")
    a("--address", default=None, help="Ray cluster to attach to ('auto' or HOST:PORT)")
    a("--placement", default="pack", help=f"one of: {', '.join(PLACEMENTS)}")
    a("--cpus-per-worker", type=float, default=None, help="CPU share per worker (default: even)")
    a("--timeout", type=float, default=120.0, help="seconds any remote wait may take")
    a("--out", default="results/runs", help="folder that receives the run folder")
    a("--quiet", action="store_true", help="print only the run folder path")
    a("--timeline", action="store_true", help="also write timeline.json (Chrome trace)")
    a("--straggler", default="none", help="e.g. fixed:worker=3,delay=200ms (see README)")
    a("--ps-shards", type=int, default=1, help="parameter-server shards")
    a("--staleness-bound", type=int, default=None, help="ps-async: SSP bound s")
    a("--backup-workers", type=int, default=0, help="ps-sync: apply after N-b gradients")
    a("--bucket-mb", type=float, default=25.0, help="ring: gradient bucket size (MiB)")
    a("--overlap", action=argparse.BooleanOptionalAction, default=True,
      help="ring: allreduce buckets while backward runs")
    a("--transport", default="object-store", help=f"ring: one of: {', '.join(TRANSPORTS)}")
    a("--algorithm", default="ring", help="ring: ring, halving-doubling, tree or hierarchical")
    a("--node-size", type=int, default=None, help="hierarchical: workers per emulated node "
      "(default: one node per Ray node)")
    a("--topology", default="ring", help="gossip: ring, torus, exponential or complete")
    a("--gossip-async", action="store_true", help="gossip: asynchronous pairwise averaging")
    a("--compression", default="none", help="none, fp16 or topk:F (e.g. topk:0.01)")
    a("--fail", default="none", help="inject faults, e.g. worker=2,at=10 (see README)")
    a("--max-restarts", type=int, default=3, help="restarts allowed per actor")
    a("--checkpoint-every", type=int, default=0, help="PS: checkpoint shards every N versions")
    a("--on-nan", default="skip", help="non-finite gradient: skip (default) or stop")
    a("--bandwidth", default=None, help="emulate a network: e.g. 10Gbit (default: real)")
    a("--latency", default="0us", help="emulated one-way latency, e.g. 50us")
    return p


def parse_config(argv: list[str] | None, strategies: dict[str, str]) -> RunConfig:
    """argv -> validated RunConfig (raises ConfigError with the one-line message)."""
    ns = build_parser(sorted(strategies)).parse_args(argv)
    cfg = RunConfig(
        strategy=ns.strategy, workers=ns.workers, steps=ns.steps, seed=ns.seed, out=ns.out,
        quiet=ns.quiet, timeline=ns.timeline, straggler=ns.straggler, compression=ns.compression,
        workload=WorkloadConfig(name=ns.workload, batch_size=ns.batch_size, lr=ns.lr,
                                grad_mb=ns.grad_mb, compute_ms=ns.compute_ms,
                                backward_frac=ns.backward_frac, payload=ns.payload),
        cluster=ClusterConfig(address=ns.address, placement=ns.placement, device=ns.device,
                              cpus_per_worker=ns.cpus_per_worker, timeout_s=ns.timeout),
        ps=PSConfig(shards=ns.ps_shards, staleness_bound=ns.staleness_bound,
                    backup_workers=ns.backup_workers),
        ring=RingConfig(bucket_mb=ns.bucket_mb, overlap=ns.overlap, transport=ns.transport,
                        algorithm=ns.algorithm, node_size=ns.node_size),
        gossip=GossipConfig(topology=ns.topology, asynchronous=ns.gossip_async),
        network=NetworkConfig(bandwidth=ns.bandwidth, latency=ns.latency),
        faults=FaultConfig(fail=ns.fail, max_restarts=ns.max_restarts,
                           checkpoint_every=ns.checkpoint_every, on_nan=ns.on_nan),
    )
    return validate(cfg, strategies)


def main(argv: list[str] | None = None) -> int:
    from testbed import registry

    try:
        cfg = parse_config(argv, registry.families())
    except ConfigError as exc:
        print(f"testbed.run: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from testbed.session import execute

    outcome = execute(cfg)
    if outcome.error_line:
        print(f"testbed.run: error: {outcome.error_line}", file=sys.stderr)
    if outcome.folder is not None:
        if not cfg.quiet and outcome.summary:
            print(format_summary(outcome.summary))
        print(outcome.folder)
    return outcome.exit_code


def format_summary(s: dict[str, Any]) -> str:
    """The human table printed at the end of a run."""
    def num(key: str, fmt: str = "{:.3g}") -> str:
        v = s.get(key)
        return "-" if v is None else fmt.format(v)

    def ms(key: str) -> str:
        v = s.get(key)
        return "-" if v is None else f"{v * 1e3:.2f} ms"

    split = "-"
    if s.get("compute_frac") is not None:
        split = (f"{s['compute_frac']:.0%} / {s['comm_frac']:.0%} / {s['wait_frac']:.0%}")
    b = s.get("bytes_sent_per_worker_per_step")
    rows = [
        ("strategy", f"{s['strategy']}  (N={s['workers']}, {s.get('status')})"),
        ("updates", f"{s['steps']}  in {num('train_wall_s')} s  (start-up {num('startup_s')} s)"),
        ("throughput", f"{num('samples_per_s', '{:.1f}')} samples/s, {num('updates_per_s', '{:.2f}')} updates/s"),
        ("step time p50 / p95", f"{ms('step_time_p50_s')} / {ms('step_time_p95_s')}"),
        ("compute / comm / wait", split),
        ("bytes sent / worker / step", "-" if b is None else f"{b / 2**20:.3f} MiB"),
        ("loss first -> last", f"{num('loss_first', '{:.4f}')} -> {num('loss_last', '{:.4f}')}"),
    ]
    if s.get("staleness_max") is not None and s.get("staleness_max"):
        rows.append(("staleness mean / p95 / max",
                     f"{s['staleness_mean']:.2f} / {s['staleness_p95']:.1f} / {s['staleness_max']}"))
    if s.get("predicted_step_s") is not None:
        rows.append(("comm measured / predicted",
                     f"{ms('comm_s_per_step')} / {ms('predicted_comm_s')}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


if __name__ == "__main__":
    sys.exit(main())
