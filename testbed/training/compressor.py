"""Gradient compression: fp16 and top-k with error feedback (pure numpy, no Ray).

    --compression none      K bytes: 4 per float32 element
    --compression fp16      K/2 bytes: each element rounded to half precision (relative error
                            <= 2^-11; values beyond 65504 saturate to inf, which gradients
                            of a stable run never reach)
    --compression topk:F    8k bytes, k = ceil(F * numel): the k largest-magnitude entries of
                            (gradient + residual) as (int32 index, float32 value) pairs

Top-k with error feedback (Stich et al. 2018; Lin et al. 2018, "Deep Gradient Compression"):
what is not sent is not lost, it is carried to the next step::

    acc       = grad + residual
    idx       = argtop_k |acc|            (sorted ascending, so the payload is canonical)
    sent      = acc[idx]                  -> the receiver densifies: zeros, sent at idx
    residual  = acc with acc[idx] = 0     -> added to the next step's gradient

Every coordinate is eventually applied, only late, so SGD still converges. The residual belongs
to the sender and to one tensor (one gradient, or one allreduce bucket): a `Compressor` per
tensor keeps it.

Byte counts are those of the compressed payload ("bytes counted after compression"): a
strategy multiplies them by its logical/physical factor for scaled synthetic payloads.

Usage on a worker (mapreduce / PS; the receiver sums what the sender would reconstruct)::

    comp = Compressor(cfg.compression, numel)   # once, per tensor (cfg.compression is typed)
    dense, nbytes = comp.roundtrip(grad)     # dense float32 the receiver sums; payload bytes
"""

from __future__ import annotations

import math

import numpy as np

from testbed.config.compressionspec import CompressionSpec, parse_compression

__all__ = ["Compressor", "CompressionSpec", "pack_sparse", "parse_compression", "topk_count",
           "unpack_sparse"]


def topk_count(numel: int, fraction: float) -> int:
    """k = ceil(fraction * numel), at least 1 for a non-empty tensor, at most numel."""
    if numel <= 0:
        return 0
    return min(numel, max(1, math.ceil(fraction * numel - 1e-9)))  # 0.01*300 is 3.0000000000000004


def pack_sparse(idx: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """(int32 indices, float32 values) -> one float32 array [index bits | values] (2k elements)."""
    return np.concatenate([np.asarray(idx, np.int32).view(np.float32), np.asarray(vals, np.float32)])


def unpack_sparse(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of pack_sparse."""
    packed = np.asarray(packed, np.float32)
    k = packed.size // 2
    return packed[:k].view(np.int32), packed[k:]


class Compressor:
    """Compress one tensor of `numel` float32 elements, step after step (keeps the residual)."""

    def __init__(self, spec: CompressionSpec, numel: int) -> None:
        self.spec, self.numel = spec, numel
        self.k = topk_count(numel, spec.fraction) if spec.kind == "topk" else numel
        self.residual = np.zeros(numel, np.float32) if spec.kind == "topk" else None

    @property
    def payload_bytes(self) -> int:
        """Bytes of one compressed message of this tensor."""
        return {"none": 4 * self.numel, "fp16": 2 * self.numel, "topk": 8 * self.k}[self.spec.kind]

    def compress(self, grad: np.ndarray) -> np.ndarray:
        """Return the payload that travels: float32, float16, or packed (index, value) pairs."""
        g = np.asarray(grad, np.float32).reshape(-1)
        if g.size != self.numel:
            raise ValueError(f"gradient of {g.size} elements: this Compressor was built for "
                             f"{self.numel}; build one Compressor per tensor")
        if self.spec.kind == "none":
            return g
        if self.spec.kind == "fp16":
            return g.astype(np.float16)
        acc = g + self.residual
        idx = np.sort(np.argpartition(np.abs(acc), self.numel - self.k)[self.numel - self.k:])
        vals = acc[idx]
        acc[idx] = 0.0
        self.residual = acc
        return pack_sparse(idx, vals)

    def decompress(self, payload: np.ndarray) -> np.ndarray:
        """Return the dense float32 tensor the receiver reconstructs from a payload."""
        if self.spec.kind != "topk":
            return np.asarray(payload).astype(np.float32)
        idx, vals = unpack_sparse(payload)
        dense = np.zeros(self.numel, np.float32)
        dense[idx] = vals
        return dense

    def roundtrip(self, grad: np.ndarray) -> tuple[np.ndarray, int]:
        """compress + decompress: (dense float32 the receiver sums, payload bytes on the wire)."""
        payload = self.compress(grad)
        return self.decompress(payload), int(payload.nbytes)
