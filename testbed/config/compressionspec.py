"""`--compression none|fp16|topk:F`: the grammar and its typed form (testbed.training.compressor does it).

    none      K bytes: 4 per float32 element
    fp16      K/2 bytes: each element rounded to half precision
    topk:F    8k bytes, k = ceil(F * numel): (int32 index, float32 value) pairs, with error feedback
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("none", "fp16", "topk")
FIX = "use none, fp16 or topk:F with 0 < F <= 1, e.g. topk:0.01"


@dataclass(frozen=True)
class CompressionSpec:
    kind: str = "none"  # none | fp16 | topk
    fraction: float = 1.0  # topk: share of the elements that is sent

    def __str__(self) -> str:
        return f"topk:{short(self.fraction)}" if self.kind == "topk" else self.kind

    def wire_bytes(self, nbytes: float) -> float:
        """Bytes on the wire for a dense float32 message of NBYTES (top-k: 8 bytes per kept
        element, F * NBYTES/4 of them, so 2F * NBYTES; rounding of k up to whole elements aside)."""
        if self.kind == "fp16":
            return nbytes / 2
        if self.kind == "topk":
            return 2 * self.fraction * nbytes
        return float(nbytes)


def short(x: float) -> str:
    """The shortest text of x that reads back as x exactly (0.5, 1, 1e-05)."""
    text = f"{x:g}"
    return text if float(text) == x else repr(x)


def parse_compression(text: str) -> CompressionSpec:
    """'none' | 'fp16' | 'topk:F' (0 < F <= 1) -> CompressionSpec; ValueError names the fix."""
    if not isinstance(text, str):
        raise ValueError(f"--compression {text!r}: {FIX}")
    kind, colon, frac = text.strip().partition(":")
    if kind in ("none", "fp16") and not colon:
        return CompressionSpec(kind)
    if kind == "topk" and colon:
        try:
            f = float(frac)
        except ValueError:
            f = float("nan")
        if 0 < f <= 1:
            return CompressionSpec("topk", f)
    raise ValueError(f"--compression {text!r}: {FIX}")
