"""Signals end a run the same way, whatever sends them and whenever: Ctrl-C (SIGINT), SIGTERM (a
terminal's kill, `docker stop`, a batch scheduler, sent to the process or to its whole process
group) and SIGHUP (a closed terminal) all become one KeyboardInterrupt in the main thread.

- The first signal interrupts the run; the session then saves what was measured (records are
  already on disk, the summary is written next) and stops Ray within a bounded time.
- Later signals do not cut that short (a half-finished shutdown orphans Ray's processes): each
  is acknowledged on stderr; the bound on the cleanup is what guarantees the exit.
- Inside `deferred()` (starting Ray: an interrupt inside ray.init leaves half a cluster) the
  interrupt waits until the block ends -- or, if a signal sent to the whole process group took
  Ray's daemons too and the block cannot end, until a watchdog says so and exits 130;
  inside `shielded()` (saving the run and stopping Ray after it ended) it is only noted.

Only the main thread can own signal handlers; elsewhere this does nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


class Interrupts:
    """The process's signal handling while a command runs; `with INTERRUPTS:` nests (the
    outermost block installs and restores the handlers)."""

    def __init__(self) -> None:
        self.received: int | None = None  # the first signal, once one came
        self._deferring = 0
        self._shielding = 0
        self._pending = False
        self._stuck: tuple[float, Callable[[], None]] | None = None
        self._watching = False
        self._ending = threading.Lock()  # the watchdog's last look and the end of its block: one at a time
        self._wakeup: tuple[int, int, int] | None = None
        self._previous: dict[int, Any] = {}
        self._depth = 0

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            if self._depth == 0:
                self.received, self._pending = None, False
                self._previous = {s: signal.getsignal(s) for s in SIGNALS}
                self.install()
                self._listen()
            self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is threading.main_thread() and self._depth:
            self._depth -= 1
            if self._depth == 0:
                for s, handler in self._previous.items():
                    signal.signal(s, handler if handler is not None else signal.SIG_DFL)
                self._unlisten()

    def _listen(self) -> None:
        """Python runs a signal handler only when the main thread is back in Python code, which
        ray.init may not be for a minute (blocked in C, waiting for daemons a group signal
        killed). The C handler writes every signal to a wakeup fd at once: a thread watches it,
        so that the watchdog of `deferred` starts on time."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._wakeup = (read, write, signal.set_wakeup_fd(write, warn_on_full_buffer=False))

        def listen() -> None:
            while True:
                try:
                    got = os.read(read, 64)
                except OSError:
                    return
                if not got:
                    return
                if self._deferring and self._stuck is not None:
                    self._watch(self._stuck)

        threading.Thread(target=listen, name="testbed-signal-listener", daemon=True).start()

    def _unlisten(self) -> None:
        read, write, previous = self._wakeup
        signal.set_wakeup_fd(previous)
        os.close(write)  # the listener reads end-of-file and ends
        self._wakeup = None

    def install(self) -> None:
        """(Re)install the handlers: ray.init puts a SIGTERM handler of its own in their place."""
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                signal.signal(s, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            print(f"testbed: {signal.Signals(signum).name} received again; still saving the run and "
                  "stopping Ray (bounded, a few seconds)", file=sys.stderr, flush=True)
            return
        self.received = signum
        if self._shielding:
            return
        if self._deferring:
            self._pending = True
            return
        raise KeyboardInterrupt

    def _watch(self, stuck: tuple[float, Callable[[], None]]) -> None:
        """A signal inside a block that may never end (ray.init waiting a minute for daemons the
        same signal killed): if the block is still running `after` seconds later, run `on_stuck`
        (save, say why) and exit 130."""
        if self._watching:
            return
        self._watching = True
        after, on_stuck = stuck

        def watch() -> None:
            time.sleep(after)
            with self._ending:  # the block cannot end (and go on) while this decides
                if self._stuck is stuck:  # still inside that block
                    try:
                        on_stuck()
                    finally:
                        os._exit(130)

        threading.Thread(target=watch, name="testbed-interrupt-watchdog", daemon=True).start()

    @contextmanager
    def deferred(self, stuck_after: float | None = None,
                 on_stuck: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold an interrupt that arrives inside this block until it ends (then raise it); if the
        block is still running `stuck_after` seconds after one, `on_stuck()` and exit 130."""
        self._deferring += 1
        if on_stuck is not None:
            self._stuck = (stuck_after, on_stuck)
        try:
            yield
        finally:
            if on_stuck is not None:
                with self._ending:  # a watchdog already deciding ends the process here
                    self._stuck = None
            self._deferring -= 1
            self.install()
        if self._pending and not self._deferring:
            self._pending = False
            raise KeyboardInterrupt

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Let no interrupt into this block (saving the run, stopping Ray): it is noted, not raised."""
        self._shielding += 1
        try:
            yield
        finally:
            self._shielding -= 1

    @property
    def name(self) -> str | None:
        return None if self.received is None else signal.Signals(self.received).name


INTERRUPTS = Interrupts()  # the process's one instance: commands and the session share it
