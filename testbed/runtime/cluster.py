"""The only place that starts or stops Ray: resources, placement, GPUs.

Embedded mode (no --address, no RAY_ADDRESS) starts a private local Ray with the dashboard off
and token authentication left on. Ray 2.60 offers no loopback-only binding (it resolves
127.0.0.1 to the node's address and its gRPC servers listen on every interface), so the token
is what guards the local instance; we never turn it off. With --address (or RAY_ADDRESS) the same
code attaches to a running cluster and never makes this node listen anywhere.

Every actor of a run is placed through one placement group: bundle i is actor i (workers first,
then servers). `--placement pack` fills nodes in order, `spread` puts bundles on distinct nodes
where it can. CPU shares are fractional so that 8+ workers fit on a 2-core machine; a shortfall
(GPUs, memory for that many processes) is reported before any actor is created.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import tempfile
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.config import ClusterConfig, ConfigError

# Resident memory of one worker process, measured on the 2-core machine (ps RSS after setup):
# a torch worker is dominated by the torch import, a synthetic worker by Ray's runtime.
ACTOR_MEMORY_TORCH = 300 * 2**20
ACTOR_MEMORY_PLAIN = 110 * 2**20
RAY_GRANULARITY = 1e-4  # Ray rejects fractional resources finer than this


@dataclass(frozen=True)
class ResourcePlan:
    cpus_per_worker: float
    cpus_per_server: float
    gpus_per_worker: float
    device: str  # resolved: "cpu" or "cuda"


def plan_resources(
    *, workers: int, servers: int, total_cpus: float, total_gpus: float, total_memory: float,
    device: str, cpus_per_worker: float | None, torch_workers: bool,
) -> ResourcePlan:
    """Decide each actor's share; raise ConfigError naming the flag when the cluster is short."""
    if device == "cuda" and total_gpus < 1:
        raise ConfigError("--device 'cuda': the cluster has no GPU; use --device cpu (or auto)")
    resolved = "cuda" if device == "cuda" or (device == "auto" and total_gpus >= 1) else "cpu"
    actors = workers + servers
    per_actor = ACTOR_MEMORY_TORCH if torch_workers else ACTOR_MEMORY_PLAIN
    fit = int(total_memory // per_actor)
    if actors > fit:
        raise ConfigError(
            f"--workers {workers}: {actors} actor processes need about "
            f"{actors * per_actor / 2**30:.1f} GiB but the cluster has {total_memory / 2**30:.1f} GiB; "
            f"use at most {max(1, fit - servers)} workers or add nodes (--address)"
        )
    if cpus_per_worker is None:
        share = min(1.0, total_cpus / actors)
        share = math.floor(share / RAY_GRANULARITY) * RAY_GRANULARITY
        if share < RAY_GRANULARITY:
            raise ConfigError(f"--workers {workers}: too many actors for {total_cpus:g} CPUs; use fewer workers")
        cpw = cps = share
    else:
        cpw = cpus_per_worker
        cps = min(1.0, max(RAY_GRANULARITY, (total_cpus - cpw * workers) / max(servers, 1)))
        if cpw * workers + (cps * servers if servers else 0) > total_cpus + 1e-9:
            raise ConfigError(
                f"--cpus-per-worker {cpw:g}: {workers} workers need {cpw * workers:g} CPUs but the "
                f"cluster has {total_cpus:g}; lower it or use fewer workers"
            )
    gpw = 0.0
    if resolved == "cuda":
        gpw = min(1.0, total_gpus / workers)
        gpw = math.floor(gpw / RAY_GRANULARITY) * RAY_GRANULARITY
    return ResourcePlan(cpw, cps, gpw, resolved)


def local_machine() -> dict[str, float]:
    """CPUs, GPUs and memory of this machine, without starting Ray."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        pass
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(gpus), "memory": float(mem) * 0.7}


AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + empty SETTINGS


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail fast where ray.init would retry for minutes: a Ray head is a gRPC (HTTP/2) server, so
    it answers a connection preface with a SETTINGS frame at once; anything else is named."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--address {address!r}: use 'auto' or HOST:PORT of a running Ray head")
    try:
        conn = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as exc:
        raise ConfigError(f"--address {address!r}: nothing answers there ({exc.strerror or exc}); "
                          "start a head with 'ray start --head' or drop --address") from None
    head: bytes | None = None
    seen = "no answer"
    with conn:
        try:
            conn.settimeout(timeout)
            conn.sendall(HTTP2_PREFACE)
            head = conn.recv(9)
        except TimeoutError:
            pass
        except OSError as exc:
            seen = f"the connection was dropped: {exc.strerror or exc}"
    if not head or len(head) < 4 or head[3] != 0x04:
        seen = seen if not head else f"an answer that is not HTTP/2 ({head[:9]!r})"
        raise ConfigError(f"--address {address!r}: something listens there but it is not a Ray head "
                          f"({seen} to a gRPC handshake); give the head's GCS address (ray start --head "
                          "prints it) or drop --address")


@contextmanager
def _stderr_to(path: str):
    """Send this process's fd 2 (where Ray's C++ client logs its retries) to a file meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextmanager
def _keep_our_sigterm():
    """ray.init replaces the process's SIGTERM handler with one that exits on the spot, midway
    through starting the cluster (testbed.interrupts owns the signals: a run saves what it
    measured and stops Ray in order). Keep Ray from installing it while it starts. (It cannot
    start on another thread instead: its daemons die with the thread that started them.)"""
    import ray._private.utils as ray_utils

    original = getattr(ray_utils, "set_sigterm_handler", None)
    if original is None:  # a Ray without it: nothing to keep off
        yield
        return
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original


class RayMessages:
    """Where the messages Ray's raylet sends the driver go (a worker died, a node is short of
    memory, ...). Ray prints them on stdout, which belongs to testbed (`--quiet` prints only the
    run folder there); a run sends them to its folder (ray.log), anything else to stderr, one line
    each. The errors of a worker's task reach the run as exceptions anyway, so Ray's reprint of
    an error nobody fetched is switched off (RAY_IGNORE_UNHANDLED_ERRORS)."""

    path: Path | None = None

    @classmethod
    def to(cls, path: Path | None) -> None:
        cls.path = path

    @classmethod
    def write(cls, data: dict[str, Any], ignore_prefix: bool = False) -> None:
        lines = [ln for ln in data.get("lines", []) if ln.strip()]
        source = data.get("pid", "ray")
        if cls.path is not None:
            try:
                with open(cls.path, "a", encoding="utf-8") as fh:
                    fh.writelines(f"({source}) {ln}\n" for ln in lines)
                return
            except OSError:
                pass
        for ln in lines:
            print(f"ray ({source}): {ln[:300]}", file=sys.stderr)

    @classmethod
    def install(cls) -> None:
        import ray._private.worker as ray_worker

        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        ray_worker.print_to_stdstream = cls.write  # the raylet-message thread prints through it


def start_ray(address: str | None, *, flag: str = "--address", num_cpus: int | None = None) -> bool:
    """Start a private local Ray (address None and no RAY_ADDRESS) or attach to a running one;
    return True if this call started or attached it (the caller then stops it), False if Ray was
    already up in this process. The only place Ray is started.

    Private means private: `address="local"`, so a `ray start --head` elsewhere on the machine is
    never joined by accident. Token authentication stays on, Ray's default for a new local
    cluster; the notice Ray logs about it (how to turn it off) is not printed. Workers' output
    stays in Ray's log files (`log_to_driver=False`), so stdout holds what testbed prints.
    Attaching captures Ray's client log while it connects, to name a refused token in one line.
    Ray's messages to the driver go where `RayMessages` says.
    """
    import ray

    if ray.is_initialized():
        return False
    logging.getLogger(AUTH_LOGGER).setLevel(logging.ERROR)
    address = address or os.environ.get("RAY_ADDRESS") or None
    common = {"include_dashboard": False, "configure_logging": False, "log_to_driver": False}
    RayMessages.install()
    if address is None:
        _become_subreaper()
        with _keep_our_sigterm():
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, **common)
        return True
    check_reachable(address)
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "ray-connect.log")
        try:
            with _stderr_to(log), _keep_our_sigterm():
                ray.init(address=address, **common)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            said = Path(log).read_text(errors="replace")
            if "InvalidAuthToken" in said or "Unauthenticated" in said:
                raise ConfigError(f"{flag} {address!r}: the Ray cluster there refused this machine's "
                                  "authentication token; set RAY_AUTH_TOKEN (or ~/.ray/auth_token) to "
                                  "that cluster's token (ray get-auth-token on its head)") from None
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"{flag} {address!r}: cannot reach Ray there ({first[:160]}); start a "
                              "head with 'ray start --head' or drop the address") from None
    return True


RAY_PROCESS = ("raylet", "gcs_server", "default_worker.py", "ray::", "dashboard", "runtime_env",
               "log_monitor", "monitor.py")


def _become_subreaper() -> None:
    """Linux: let the processes of the Ray this process starts stay its descendants even when
    their parent dies first (a signal to the process group takes the raylet, whose agents would
    otherwise be adopted by init and outlive the run by a minute), so `stop_ray` can end them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _ray_descendants() -> dict[int, str]:
    """This process's descendants that are Ray's: {pid: command line}."""
    parent, cmd = {}, {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return {pid: cmd.get(pid, "") for pid in found if any(k in cmd.get(pid, "") for k in RAY_PROCESS)}


def _end(pids: dict[int, str], grace: float = 2.0) -> None:
    """What is left of them after Ray's own shutdown: SIGTERM, a moment, SIGKILL, and reap."""
    import signal
    import time

    left = [pid for pid in pids if _pid_alive(pid)]
    for pid in left:
        with suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (left := [pid for pid in left if _pid_alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:  # adopted orphans are ours to reap (Ray's own children it reaps itself)
        with suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def end_ray_processes() -> None:
    """Ray cannot be stopped in order (its daemons are gone, or it would not stop in time): end
    the processes of it that this process started, before leaving without it."""
    _end(_ray_descendants(), grace=1.0)


def stop_ray() -> None:
    """Shut down the Ray this process started; end whatever of it outlives that (a raylet killed
    by a signal leaves its agents); remove the named semaphores its raylet left in /dev/shm
    (Ray never unlinks those of its shared-memory channels: two per ring link)."""
    import ray

    if not ray.is_initialized():
        return
    node = getattr(ray._private.worker, "_global_node", None)
    raylets = [p.process.pid for p in (getattr(node, "all_processes", None) or {}).get("raylet", [])]
    ours = _ray_descendants()
    ray.shutdown()
    _end(ours)
    release_semaphores(raylets)


def release_semaphores(raylets: list[int]) -> None:
    """Remove the named semaphores these (stopped) raylets left in /dev/shm."""
    for pid in raylets:
        for path in Path("/dev/shm").glob(f"sem.*{pid}-*"):
            if path.name.startswith((f"sem.hdr{pid}-", f"sem.obj{pid}-")):
                path.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    """Running (a dead daemon stays a zombie until its parent, this process, reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class Cluster:
    """Start (or attach to) Ray, reserve resources for one run's actors, release them."""

    def __init__(self, cfg: ClusterConfig, *, workers: int, servers: int = 0,
                 torch_workers: bool = True) -> None:
        self.cfg, self.workers, self.servers = cfg, workers, servers
        self.torch_workers = torch_workers
        self.started_ray = False
        self.pg: Any = None
        self.plan: ResourcePlan | None = None

    def address(self) -> str | None:
        return self.cfg.address or os.environ.get("RAY_ADDRESS") or None

    def precheck_local(self) -> ResourcePlan | None:
        """Check resources (embedded) or reachability (--address) before Ray starts."""
        import ray

        if ray.is_initialized():
            return None
        if self.address() is not None:
            check_reachable(self.address())
            return None
        m = local_machine()
        return self._plan(m["CPU"], m["GPU"], m["memory"])

    def _plan(self, cpus: float, gpus: float, memory: float) -> ResourcePlan:
        return plan_resources(
            workers=self.workers, servers=self.servers, total_cpus=cpus, total_gpus=gpus,
            total_memory=memory, device=self.cfg.device, cpus_per_worker=self.cfg.cpus_per_worker,
            torch_workers=self.torch_workers,
        )

    def start(self) -> Cluster:
        import ray

        if not ray.is_initialized():
            self.precheck_local()
            self.started_ray = start_ray(self.address())
        res = ray.cluster_resources()
        self.plan = self._plan(res.get("CPU", 0.0), res.get("GPU", 0.0), res.get("memory", 0.0) or 1e12)
        self._reserve()
        return self

    def _reserve(self) -> None:
        import ray
        from ray.util.placement_group import placement_group

        assert self.plan is not None
        bundles = [self._bundle(i) for i in range(self.workers + self.servers)]
        strategy = "SPREAD" if self.cfg.placement == "spread" else "PACK"
        self.pg = placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([self.pg.ready()], timeout=min(self.cfg.timeout_s, 60.0))
        if not ready:
            self.stop()
            raise ConfigError(
                f"--workers {self.workers}: the cluster cannot place {len(bundles)} actors "
                f"({bundles[0]} each); use fewer workers or a larger cluster"
            )

    def _bundle(self, i: int) -> dict[str, float]:
        assert self.plan is not None
        if i < self.workers:
            b = {"CPU": self.plan.cpus_per_worker}
            if self.plan.gpus_per_worker:
                b["GPU"] = self.plan.gpus_per_worker
            return b
        return {"CPU": self.plan.cpus_per_server}

    def options(self, i: int, *, server: bool = False) -> dict[str, Any]:
        """Ray actor options for worker i (or server i) inside this run's placement group."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        index = self.workers + i if server else i
        bundle = self._bundle(index)
        return {
            "num_cpus": bundle["CPU"],
            "num_gpus": bundle.get("GPU", 0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=index
            ),
        }

    @property
    def device(self) -> str:
        return self.plan.device if self.plan else "cpu"

    def stop(self) -> None:
        import ray

        if self.pg is not None:
            try:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
            self.pg = None
        if self.started_ray and ray.is_initialized():
            stop_ray()
            self.started_ray = False

    def daemons_alive(self) -> bool:
        """Whether the Ray this cluster started still has its GCS and raylet processes."""
        if not self.started_ray:
            return False
        import ray

        node = getattr(ray._private.worker, "_global_node", None)
        procs = getattr(node, "all_processes", None) or {}
        pids = [p.process.pid for kind in ("gcs_server", "raylet") for p in procs.get(kind, [])]
        return bool(pids) and all(_pid_alive(pid) for pid in pids)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
