"""`--payload full|scaled:F`: how large the synthetic workload's physical arrays are. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.compressionspec import short


@dataclass(frozen=True)
class Payload:
    """`--payload full|scaled:F`: physical arrays are F times the logical gradient."""

    scale: float = 1.0

    def __str__(self) -> str:
        return "full" if self.scale == 1.0 else f"scaled:{short(self.scale)}"


def parse_payload(text: str) -> Payload:
    fix = "use 'full' or 'scaled:F' with 0 < F <= 1, e.g. scaled:0.01"
    if text == "full":
        return Payload()
    kind, _, frac = text.partition(":")
    try:
        scale = float(frac)
    except ValueError:
        scale = float("nan")
    if kind != "scaled" or not (0 < scale <= 1):
        raise ValueError(f"--payload {text!r}: {fix}")
    return Payload(scale)
