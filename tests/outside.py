"""Processes outside this one's tree, as a user's other programs are: a shell starts them and
ends, so they are orphans, and no longer below this process. Ray makes its driver a child
subreaper (Linux prctl), which adopts its descendants' orphans: off while the shell ends."""

from __future__ import annotations

import contextlib
import ctypes
import subprocess
import sys

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37  # linux/prctl.h


@contextlib.contextmanager
def no_subreaper():
    """This process not a child subreaper inside, as it was after."""
    libc = ctypes.CDLL(None, use_errno=True)
    was = ctypes.c_int(0)
    libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, was.value, 0, 0, 0)


def left_behind(script: str, count: int = 1) -> list[int]:
    """The pids of `count` Python processes running `script`, started outside this process's tree."""
    with no_subreaper():
        started = subprocess.run(["sh", "-c", f'for i in $(seq {count}); do "{sys.executable}" -c "$0" '
                                              '>/dev/null 2>&1 & echo $!; done', script],
                                 capture_output=True, text=True, check=True)
    return [int(pid) for pid in started.stdout.split()]
