"""Which worker may start which iteration next: the PS driver's bookkeeping. Pure.

- ps-sync: a worker's next pull waits for the version it contributed to (min_version);
  none is started for a version that will never be made (>= steps).
- ps-async: any idle worker starts at once, or, under SSP bound s, once every worker has
  finished iteration c-s-1 (`ssp_may_start`); the time it is held back is its wait.
- A rollback (PS shard restored from a checkpoint at version c) restarts sync schedules at c.
"""

from __future__ import annotations

import time

from testbed.ps.ssp import ssp_may_start


class Schedule:
    def __init__(self, workers: int, steps: int, *, sync: bool, bound: int | None) -> None:
        self.n, self.steps, self.sync, self.bound = workers, steps, sync, bound
        self.next_iter = [0] * workers
        self.completed = [0] * workers
        self.min_version = [0] * workers
        self.held_since: dict[int, float] = {}
        self.held_s = [0.0] * workers

    def startable(self, busy: set[int], now: float | None = None) -> list[int]:
        """Idle workers that may start their next iteration now (records SSP hold times)."""
        now = time.time() if now is None else now
        out = []
        for w in range(self.n):
            if w in busy or (self.sync and self.min_version[w] >= self.steps):
                continue
            if ssp_may_start(self.next_iter[w], self.completed, self.bound):
                if w in self.held_since:
                    self.held_s[w] = now - self.held_since.pop(w)
                out.append(w)
            else:
                self.held_since.setdefault(w, now)
        return out

    def finished(self, w: int, version_read: int) -> float:
        """Worker w completed its iteration; return the time it had been held back before it."""
        held, self.held_s[w] = self.held_s[w], 0.0
        self.completed[w] += 1
        self.next_iter[w] += 1
        if self.sync:
            self.min_version[w] = version_read + 1
        return held

    def rollback(self, version: int) -> None:
        """Shards were restored to `version`: synchronous training redoes everything after it."""
        if self.sync:
            self.next_iter = [version] * self.n
            self.completed = [version] * self.n
            self.min_version = [version] * self.n
        self.held_since.clear()
