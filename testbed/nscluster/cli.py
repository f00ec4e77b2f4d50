"""A real multi-node Ray cluster on one Linux machine: each node in a network namespace of its own.

    python -m testbed.nscluster up [--nodes 3] [--cpus 2] [--name tbns]   # prints the address
    python -m testbed.nscluster run -- python -m testbed.run --address 10.77.0.1:6379 ...
    python -m testbed.nscluster kill-node 2                                 # a node is lost
    python -m testbed.nscluster revive-node 2                               # ... and replaced
    python -m testbed.nscluster down

Needs root (namespaces and veth links). The network it builds, all inside namespaces it creates:

    namespace NAME-sw:   bridge br0 ---+------------+------------+
                                       |            |            |
    namespace NAME-0:    eth0 10.77.0.1 (head)   NAME-1: 10.77.0.2   NAME-2: 10.77.0.3

Every node runs `ray start --block` in its namespace, with its own temp folder, so its raylet,
object store and workers are its own and talk to the others over the veth links (TCP, as across
machines). Drivers run inside the head's namespace (`run`). Node loss (`kill-node`) SIGKILLs
every process in the node's namespace at once, as a machine that dies; `down` ends every node and
removes the namespaces. Nothing is sent outside these namespaces.

Two settings differ from a fresh `ray start`, both for one box: each node's object store is
OBJECT_STORE_MB (Ray's default of 30% of the machine's memory per node would claim most of it
three times over), and the head health-checks nodes every second, declaring one dead after 5
missed checks (about 5 s; Ray's default takes about 15 s).

Token authentication stays on: `up` writes a fresh token to `/tmp/NAME/auth_token` (mode 600)
and every node and every driver started by `run` gets RAY_AUTH_MODE=token and
RAY_AUTH_TOKEN_PATH pointing at it (`env`): the namespaces share the machine's file system, as
machines of a real cluster would share a copied file. Outside `run`, export the two variables
that `python -m testbed.nscluster env` prints. The cluster's description (address, nodes,
namespaces) is `/tmp/NAME/cluster.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SUBNET = "10.77.0"
PORT = 6379


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


class UsageError(Exception):
    """Bad input or state: main prints it in one line and exits 2."""


class RayletDied(RuntimeError):
    """A node's raylet (Ray's own daemon) died while the cluster came up; says its log's end."""


def state_path(name: str) -> Path:
    return Path("/tmp") / name / "cluster.json"


def load(name: str) -> dict[str, Any]:
    path = state_path(name)
    if not path.exists():
        raise UsageError(f"no cluster {name!r} is up (no {path}); "
                         f"start one with python -m testbed.nscluster up --name {name}")
    return json.loads(path.read_text())


def available() -> str | None:
    """None when namespaces can be made here, else why not (one line)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"tbns-probe-{os.getpid()}"
    out = _sh("ip", "netns", "add", probe, check=False)
    if out.returncode != 0:
        return f"ip netns add failed: {(out.stderr or out.stdout).strip()[:120]}"
    _sh("ip", "netns", "del", probe, check=False)
    return None


def token_path(name: str) -> Path:
    return Path("/tmp") / name / "auth_token"


def env(name: str) -> dict[str, str]:
    """The environment every node and driver of cluster `name` runs with (token authentication)."""
    return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path(name))}


def _write_token(name: str) -> None:
    from ray._private.authentication.authentication_token_generator import (
        generate_new_authentication_token,
    )

    path = token_path(name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(generate_new_authentication_token())


def _ns(ns: str, *args: str) -> subprocess.CompletedProcess:
    return _sh("ip", "netns", "exec", ns, *args)


def ns_pids(ns: str) -> list[int]:
    """Every process in namespace `ns` (empty once it has none, or is gone)."""
    return [int(p) for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split()]


def signal_ns(ns: str, sig: int) -> list[int]:
    """Send `sig` to every process in namespace `ns` at once; the pids it reached."""
    pids = ns_pids(ns)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def build_network(name: str, nodes: int) -> list[dict[str, str]]:
    """The switch namespace with its bridge, and one namespace per node linked to it."""
    sw = f"{name}-sw"
    _sh("ip", "netns", "add", sw)
    _ns(sw, "ip", "link", "add", "br0", "type", "bridge")
    _ns(sw, "ip", "link", "set", "br0", "up")
    out = []
    for i in range(nodes):
        ns, ip = f"{name}-{i}", f"{SUBNET}.{i + 1}"
        _sh("ip", "netns", "add", ns)
        here, there = f"{name}{i}n", f"{name}{i}s"
        _sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        _sh("ip", "link", "set", here, "netns", ns)
        _sh("ip", "link", "set", there, "netns", sw)
        _ns(ns, "ip", "link", "set", here, "name", "eth0")
        _ns(ns, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
        _ns(ns, "ip", "link", "set", "eth0", "up")
        _ns(ns, "ip", "link", "set", "lo", "up")
        _ns(sw, "ip", "link", "set", there, "master", "br0")
        _ns(sw, "ip", "link", "set", there, "up")
        out.append({"ns": ns, "ip": ip})
    return out


# Each node's object store, fixed rather than Ray's default of 30% of the machine's memory per
# node: three nodes would claim 90% of one box's memory (and /dev/shm) between them.
OBJECT_STORE_MB = 512
# How soon the head declares a node dead: Ray's defaults (a health check every 3 s, 5 missed) take
# about 15 s after a machine dies. A node of this cluster that dies refuses connections at once
# (its namespace and address stay), so checks every second, 5 missed, say it in about 5 s without
# mistaking a busy node for a dead one.
HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
                 "RAY_health_check_failure_threshold": "5"}
STARTED = b"Ray runtime started."


def start_node(name: str, node: dict[str, str], head: str | None, cpus: float, log: Path,
               store_mb: int = OBJECT_STORE_MB) -> subprocess.Popen:
    """`ray start --block` in the node's namespace (its own session folder); it runs until a Ray
    process of the node dies or the node is ended."""
    temp = Path("/tmp") / name / node["ns"]
    temp.mkdir(parents=True, exist_ok=True)
    role = (["--head", f"--port={PORT}", "--include-dashboard=false"] if head is None
            else [f"--address={head}"])
    cmd = ["ip", "netns", "exec", node["ns"], sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
           *role, f"--node-ip-address={node['ip']}", f"--num-cpus={cpus:g}", f"--temp-dir={temp}",
           f"--object-store-memory={store_mb * 2**20}", "--disable-usage-stats"]
    fh = open(log, "ab")
    return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**env(name), **HEALTH_CHECKS})


def wait_started(log: Path, proc: subprocess.Popen, timeout: float, before: int = 0) -> None:
    """Until `ray start` says the node runs (a STARTED line in its log beyond the `before` there
    were already), cheaper than a driver's poll."""
    deadline = time.time() + timeout
    while log.read_bytes().count(STARTED) <= before:
        if time.time() > deadline or proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-6:]
            raise RuntimeError(f"ray start did not start a node within {timeout:g} s; {log} ends:\n  "
                               + "\n  ".join(tail))
        time.sleep(0.2)


def wait_nodes(name: str, head_ns: str, address: str, count: int, timeout: float) -> None:
    """Until the head sees `count` live nodes (a driver in the head's namespace asks)."""
    code = ("import ray, sys, time\n"
            f"ray.init(address={address!r}, configure_logging=False, log_to_driver=False)\n"
            "deadline = time.time() + float(sys.argv[1])\n"
            f"while sum(n['Alive'] for n in ray.nodes()) < {count} and time.time() < deadline:\n"
            "    time.sleep(0.5)\n"
            "print('ALIVE', sum(n['Alive'] for n in ray.nodes()))\n")
    deadline = time.time() + timeout
    while True:
        out = subprocess.run(["ip", "netns", "exec", head_ns, sys.executable, "-c", code, str(timeout)],
                             capture_output=True, text=True, env=env(name))
        said = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("ALIVE ")]
        alive = said[-1] if said else ""
        if alive == str(count):
            return
        if time.time() > deadline:
            deaths = raylet_deaths(name)
            raise (RayletDied if deaths else RuntimeError)(
                f"the cluster has {alive or 'no'} live nodes of {count} after {timeout:g} s "
                f"(logs in /tmp/{name}/): {out.stderr.strip()[-300:]}{deaths}")
        time.sleep(1.0)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def raylet_deaths(name: str) -> str:
    """What each node's raylet log says last, for nodes whose raylet is not running (empty if none)."""
    said = []
    for log in sorted((Path("/tmp") / name).glob("*/session_latest/logs/raylet.out")):
        ns = log.parts[3]
        if not any("raylet/raylet" in _cmdline(pid) for pid in ns_pids(ns)):
            tail = log.read_text(errors="replace").strip().splitlines()[-6:]
            said.append(f"\n{ns}: raylet is not running; {log} ends:\n  " + "\n  ".join(tail))
    return "".join(said)


def up(name: str, nodes: int, cpus: float, timeout: float = 120.0) -> dict[str, Any]:
    if state_path(name).exists():
        raise UsageError(f"cluster {name!r} is already up; "
                         f"python -m testbed.nscluster down --name {name} first")
    why = available()
    if why:
        raise UsageError(why)
    (Path("/tmp") / name).mkdir(parents=True, exist_ok=True)
    _write_token(name)
    net = build_network(name, nodes)
    address = f"{net[0]['ip']}:{PORT}"
    state = {"name": name, "address": address, "nodes": net, "cpus": cpus}
    state_path(name).write_text(json.dumps(state, indent=2))
    procs: dict[int, subprocess.Popen] = {}

    def start(i: int) -> Path:
        log = Path("/tmp") / name / f"{net[i]['ns']}.log"
        procs[i] = start_node(name, net[i], None if i == 0 else address, cpus, log)
        net[i]["pid"] = procs[i].pid
        state_path(name).write_text(json.dumps(state, indent=2))
        return log

    try:
        wait_started(start(0), procs[0], timeout)  # the head first; then the others, all at once
        for i in range(1, nodes):
            start(i)
        deadline, restarted = time.time() + timeout, set()
        while True:
            try:
                wait_nodes(name, net[0]["ns"], address, nodes, max(5.0, min(30.0, deadline - time.time())))
                break
            except RuntimeError:
                # a node whose `ray start` ended while joining (its raylet died: the log says why)
                # is started once more, as a machine that failed to boot is rebooted
                dead = {i for i, proc in procs.items() if proc.poll() is not None}
                if not dead or 0 in dead or dead & restarted or time.time() > deadline:
                    raise
                for i in sorted(dead):
                    start(i)
                restarted |= dead
    except BaseException:
        down(name)
        raise
    return state


def kill_node(name: str, index: int) -> list[int]:
    """SIGKILL every process in node `index`'s namespace at once (a machine that dies)."""
    return signal_ns(load(name)["nodes"][index]["ns"], signal.SIGKILL)


def revive_node(name: str, index: int, timeout: float = 120.0) -> None:
    """Start node `index` again after `kill_node` (a replacement machine joins the cluster)."""
    state = load(name)
    if index == 0:
        raise UsageError("node 0 is the head; a lost head is a new cluster "
                         f"(python -m testbed.nscluster down --name {name}, then up)")
    node = state["nodes"][index]
    signal_ns(node["ns"], signal.SIGKILL)
    log = Path("/tmp") / name / f"{node['ns']}.log"
    before = log.read_bytes().count(STARTED) if log.exists() else 0
    proc = start_node(name, node, state["address"], state["cpus"], log)
    node["pid"] = proc.pid
    state_path(name).write_text(json.dumps(state, indent=2))
    # the new node first, then the count: the lost one stays "alive" to the head until its health
    # checks fail (HEALTH_CHECKS), so the count alone could be the old node's
    wait_started(log, proc, timeout, before=before)
    wait_nodes(name, state["nodes"][0]["ns"], state["address"], len(state["nodes"]), timeout)


def down(name: str, grace: float = 2.0) -> None:
    """End every node (SIGTERM, then SIGKILL what is left) and remove the namespaces."""
    path = state_path(name)
    state = json.loads(path.read_text()) if path.exists() else {"nodes": []}
    namespaces = [n["ns"] for n in state["nodes"]]
    for ns in namespaces:
        signal_ns(ns, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and any(ns_pids(ns) for ns in namespaces):
        time.sleep(0.2)
    for ns in namespaces:
        signal_ns(ns, signal.SIGKILL)
    for ns in [*namespaces, f"{name}-sw"]:
        _sh("ip", "netns", "del", ns, check=False)
    path.unlink(missing_ok=True)
    token_path(name).unlink(missing_ok=True)


def run_in_head(name: str, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """A command inside the head node's namespace (a driver: testbed.run, testbed.sweep, ...)."""
    head = load(name)["nodes"][0]["ns"]
    return subprocess.run(["ip", "netns", "exec", head, *argv], **{"env": env(name), **kwargs})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.nscluster", description=__doc__.split("\n")[0])
    p.add_argument("--name", default="tbns", help="namespace prefix and /tmp folder (default: tbns)")
    named = argparse.ArgumentParser(add_help=False)  # --name also after the command
    named.add_argument("--name", default=argparse.SUPPRESS, help="as above")
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", parents=[named], help="build the namespaces and start a Ray node in each")
    u.add_argument("--nodes", type=int, default=3)
    u.add_argument("--cpus", type=float, default=2.0, help="CPUs each node offers Ray")
    k = sub.add_parser("kill-node", parents=[named], help="SIGKILL every process of one node")
    k.add_argument("index", type=int)
    v = sub.add_parser("revive-node", parents=[named], help="start a killed node again")
    v.add_argument("index", type=int)
    sub.add_parser("down", parents=[named], help="stop every node and remove the namespaces")
    sub.add_parser("env", parents=[named], help="print the exports a driver needs (token authentication)")
    r = sub.add_parser("run", parents=[named], help="run a command in the head node's namespace")
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    try:
        return _command(ns)
    except UsageError as exc:
        print(f"testbed.nscluster: error: {exc}", file=sys.stderr)
        return 2


def _command(ns: argparse.Namespace) -> int:
    if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", ns.name):
        raise UsageError(f"--name {ns.name!r}: use 1-8 lower-case letters and digits, starting with a "
                         "letter (interface names are limited to 15 characters)")
    if ns.command in ("kill-node", "revive-node"):
        count = len(load(ns.name)["nodes"])
        if not 0 <= ns.index < count:
            raise UsageError(f"node {ns.index}: cluster {ns.name!r} has nodes 0..{count - 1}")
    if ns.command == "up":
        if not 1 <= ns.nodes <= 200:
            raise UsageError(f"--nodes {ns.nodes}: use 1..200")
        if not (ns.cpus >= 1 and float(ns.cpus).is_integer()):  # before anything is created
            raise UsageError(f"--cpus {ns.cpus:g}: each node offers Ray a whole number of CPUs "
                             "(ray start --num-cpus); use 1 or more, e.g. 2")
        state = up(ns.name, ns.nodes, ns.cpus)
        print(state["address"])
    elif ns.command == "kill-node":
        print(len(kill_node(ns.name, ns.index)))
    elif ns.command == "revive-node":
        revive_node(ns.name, ns.index)
    elif ns.command == "down":
        down(ns.name)
    elif ns.command == "env":
        load(ns.name)
        print(f"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token_path(ns.name)}")
    else:
        cmd = ns.cmd[1:] if ns.cmd[:1] == ["--"] else ns.cmd
        return run_in_head(ns.name, cmd).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
