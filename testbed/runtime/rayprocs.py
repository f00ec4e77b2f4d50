"""Ray's own processes for this process: start or attach, route their messages, stop them and
end what outlives them. The only `ray.init` and `ray.shutdown` of the package (`cluster.py`
places a run's actors on what this starts).

Embedded mode (no --address, no RAY_ADDRESS) starts a private local Ray with the dashboard off
and token authentication left on. Ray 2.60 offers no loopback-only binding (it resolves
127.0.0.1 to the node's address and its gRPC servers listen on every interface), so the token
is what guards the local instance; we never turn it off. Its daemons run in a session of their
own (`_daemons_in_own_session`): signals to this process's group are this process's to handle. With --address (or RAY_ADDRESS) the same
code attaches to a running cluster and never makes this node listen anywhere.

Attaching with an explicit address, Ray sends a token only when RAY_AUTH_MODE=token is set (it
does not guess for an explicit address); so when a token is available -- RAY_AUTH_TOKEN,
RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, as on every node of a cluster that has token
authentication on -- and the mode is unset, `start_ray` sets it (`use_token_if_available`), unless
the head answers a call without a token (started with authentication off): then the driver must
not ask that head's workers for one either (`head_without_tokens`).
A head that refuses the token refuses it on every try, and Ray tries 20 times a second apart
before it says so; once the head has answered as a gRPC server (`check_reachable`), ATTACH_TRIES
tries are enough (RAY_NUM_REDIS_GET_RETRIES, when set, is kept).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testbed.config import ConfigError
from testbed.runtime.reaper import (
    become_subreaper,
    end_processes,
    ray_descendants,
    release_orphaned_semaphores,
    release_semaphores,
)

AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + empty SETTINGS


ATTACH_TRIES = 5


def _fewer_attach_tries() -> None:
    """Ray's tries to fetch a reachable head's cluster id on attach: ATTACH_TRIES, not 20."""
    if "RAY_NUM_REDIS_GET_RETRIES" in os.environ:
        return
    from ray._private import ray_constants

    if hasattr(ray_constants, "NUM_REDIS_GET_RETRIES"):
        ray_constants.NUM_REDIS_GET_RETRIES = min(ray_constants.NUM_REDIS_GET_RETRIES, ATTACH_TRIES)


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


def _point_stderr_at(path: str, flags: int) -> int:
    """Point this process's fd 2 at PATH (opened with FLAGS); return a duplicate of the old fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, flags, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    return saved


@contextmanager
def _stderr_to(path: str):
    """Send this process's fd 2 (where Ray's C++ client logs its retries) to a file meanwhile."""
    saved = _point_stderr_at(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def silence_stderr() -> int:
    """Point this process's fd 2 (and so sys.stderr, and Ray's threads in this process) at
    /dev/null for good, and return a duplicate of the old one for the last line testbed writes:
    a Ray cut off halfway (ray.init abandoned after a signal) prints RPC errors and tracebacks
    as it goes, which are not the run's to show."""
    return _point_stderr_at(os.devnull, os.O_WRONLY)


@contextmanager
def _keep_our_sigterm():
    """ray.init replaces the process's SIGTERM handler with one that exits on the spot, midway
    through starting the cluster (testbed.session.interrupts owns the signals: a run saves what it
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


@contextmanager
def _daemons_in_own_session():
    """Start Ray's daemons (and so the workers their raylet starts) in a session of their own.
    In this process's group they took every signal sent to the group (`kill -- -PGID`, a batch
    scheduler, a closed terminal's SIGHUP): the raylet began its own shutdown, which lasts about
    10 s, the GCS stayed up, and stopping Ray in order blocked on them meanwhile (measured: 11.2 s
    to exit, the ring's semaphores left in /dev/shm). Out of the group, the signal reaches this
    process alone, which stops Ray in order (about 2 s). A `kill -9` of this process still takes
    the daemons with it (Ray's fate-sharing: they die with their parent)."""
    from ray._private import services

    original = getattr(services, "ConsolePopen", None)
    if original is None or sys.platform == "win32":
        yield
        return

    class OwnSession(original):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSession
    try:
        yield
    finally:
        services.ConsolePopen = original


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


def token_available() -> bool:
    """Whether this process holds a Ray authentication token (where Ray looks for one)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    return os.path.isfile(path) and os.path.getsize(path) > 0


def use_token_if_available(address: str | None = None) -> None:
    """RAY_AUTH_MODE=token when it is unset and a token is available (see the module docstring),
    unless the head at `address` asks for none: then `disabled`, since a driver in token mode
    refuses the calls of that head's workers, which carry no token (its actors die before they
    start). A mode the user set is kept."""
    if "RAY_AUTH_MODE" in os.environ or not token_available():
        return
    _set_auth_mode("disabled" if address and head_without_tokens(address) else "token")


def _set_auth_mode(mode: str) -> None:
    os.environ["RAY_AUTH_MODE"] = mode
    from ray._raylet import Config

    Config.initialize("")  # Ray caches its config: read the mode again, as Ray does when it sets it


def head_without_tokens(address: str) -> bool:
    """True when the Ray head at `address` answers a call that carries no token (a head started
    with authentication off); False when it refuses it, or when it cannot be asked ("auto")."""
    if address == "auto":
        return False
    import ray
    from ray._raylet import GcsClient

    _set_auth_mode("disabled")
    try:
        with tempfile.TemporaryDirectory() as tmp, _stderr_to(os.path.join(tmp, "probe.log")):
            GcsClient(address=address.split("://", 1)[-1]).internal_kv_get(b"probe", b"testbed", timeout=10)
        return True
    except ray.exceptions.AuthenticationError:
        return False
    except Exception:  # noqa: BLE001 - no answer either way: attach as before and let ray.init say
        return False
    finally:
        del os.environ["RAY_AUTH_MODE"]
        from ray._raylet import Config

        Config.initialize("")


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
        become_subreaper()
        release_orphaned_semaphores()
        with _keep_our_sigterm(), _daemons_in_own_session(), _quiet_ray_tips():
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, **common)
        return True
    check_reachable(address)
    use_token_if_available(address)
    _fewer_attach_tries()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "ray-connect.log")
        try:
            with _stderr_to(log), _keep_our_sigterm(), _quiet_ray_tips():
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


@contextmanager
def _quiet_ray_tips():
    """Ray's FutureWarnings from ray.init about its own later releases (Ray 2.54 told every
    driver that it will stop setting CUDA_VISIBLE_DEVICES for actors without GPUs) are not the
    run's to print: a run's stderr holds testbed's lines alone."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray(\.|$)")
        yield


def stop_ray() -> None:
    """Shut down the Ray this process started; end whatever of it outlives that (a raylet killed
    by a signal leaves its agents); remove the named semaphores its raylet left in /dev/shm
    (Ray never unlinks those of its shared-memory channels: two per ring link)."""
    import ray

    if not ray.is_initialized():
        return
    from testbed.runtime import pool

    pool.forget()  # its processes go down with this Ray
    node = getattr(ray._private.worker, "_global_node", None)
    raylets = [p.process.pid for p in (getattr(node, "all_processes", None) or {}).get("raylet", [])]
    ours = ray_descendants()
    ray.shutdown()
    end_processes(ours)
    release_semaphores(raylets)
