"""`--fail SPEC`: the grammar of injected faults and their typed form (no behaviour here).

SPEC is `none` or one or more items joined by ';':
    worker=2,at=10         kill worker 2's process at its iteration 10
    server=0,at=20         kill PS shard 0 when it is about to apply version 20
    hang:worker=1,at=5     worker 1 stops answering at its iteration 5 (treated as dead)
    nan:worker=3,at=7      worker 3 returns a NaN gradient at its iteration 7
    sent:worker=1,at=4     worker 1 dies right after its iteration-4 gradient reached the
                           servers, before it reports back (a machine lost mid-step; PS only)

What a fault does, and how runs recover, is `testbed.emulation.faults`.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.items import Items

KINDS = ("kill", "hang", "nan", "sent")


@dataclass(frozen=True)
class Fault:
    kind: str  # kill / hang / nan / sent
    target: str  # worker / server
    index: int
    at: int

    def to_text(self) -> str:
        head = "" if self.kind == "kill" else f"{self.kind}:"
        return f"{head}{self.target}={self.index},at={self.at}"


def _bad(item: str, why: str) -> ValueError:
    return ValueError(f"--fail {item!r}: {why}; e.g. worker=2,at=10 or hang:worker=1,at=5")


def _parse_item(item: str) -> Fault:
    kind, sep, rest = item.partition(":")
    if not sep:
        kind, rest = "kill", item
    if kind not in KINDS:
        raise _bad(item, f"unknown fault kind {kind!r} (use kill, hang, nan or sent)")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or key in fields:
            raise _bad(item, f"expected key=value pairs, got {part.strip()!r}")
        fields[key] = value
    targets = [k for k in ("worker", "server") if k in fields]
    if len(targets) != 1 or set(fields) != {targets[0], "at"}:
        raise _bad(item, "name exactly one of worker=N or server=N, and at=ITERATION")
    if kind != "kill" and targets[0] == "server":
        raise _bad(item, f"{kind} faults apply to workers only")
    try:
        index, at = int(fields[targets[0]]), int(fields["at"])
    except ValueError:
        raise _bad(item, "worker/server and at must be integers") from None
    if index < 0 or at < 0:
        raise _bad(item, "indices and iterations are >= 0")
    return Fault(kind, targets[0], index, at)


def parse_faults(text: str) -> tuple[Fault, ...]:
    """Parse --fail; 'none' or '' means no faults."""
    if not isinstance(text, str):
        raise _bad(str(text), "must be a string")
    text = text.strip()
    if text in ("", "none"):
        return ()
    return tuple(_parse_item(item.strip()) for item in text.split(";") if item.strip())


def format_faults(faults: tuple[Fault, ...]) -> str:
    """The --fail text of FAULTS ('none' when empty)."""
    return ";".join(f.to_text() for f in faults) or "none"


def check_faults(faults: tuple[Fault, ...], *, workers: int, servers: int, steps: int | None = None) -> None:
    """Raise ValueError naming a fault whose worker or server does not exist, or (given the
    run's `steps`) whose `at` lies beyond the run: no worker makes more than `steps` iterations
    (0..steps-1) and no shard is about to apply a version past steps-1, so it could never fire."""
    for f in faults:
        if steps is not None and f.at >= steps:
            what = (f"worker {f.index}'s iterations are" if f.target == "worker"
                    else f"the versions shard {f.index} is about to apply are")
            raise ValueError(f"--fail {f.to_text()!r}: {what} 0..{steps - 1} in a run of --steps {steps}, "
                             f"so it would never fire; use at in 0..{steps - 1} or raise --steps")
        if f.target == "worker" and f.index >= workers:
            raise ValueError(f"--fail {f.to_text()!r}: there is no worker {f.index}; "
                             f"use a worker in 0..{workers - 1}")
        if f.target == "server" and not servers:
            raise ValueError(f"--fail {f.to_text()!r}: only parameter-server strategies have servers")
        if f.target == "server" and f.index >= servers:
            raise ValueError(f"--fail {f.to_text()!r}: there is no shard {f.index}; "
                             f"use a shard in 0..{servers - 1}")


@dataclass(frozen=True)
class Faults(Items):
    """Parsed `--fail` items."""

    items: tuple[Fault, ...] = ()
    render = staticmethod(format_faults)


def parse_faults_spec(text: str) -> Faults:
    return Faults(parse_faults(text), text)
