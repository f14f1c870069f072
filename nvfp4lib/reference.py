"""The exact reference: dequantize exactly, accumulate in fp32 (or fp64), round once.

Every E2M1 value times its E4M3 block scale is exact in fp32 (and in bf16), so the
only roundings are the global-scale multiply, the summation, and the final cast.
This is the semantics every backend is checked against.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F

from .formats import NVFP4Tensor, dequantize
from .runner import Runner

__all__ = ["reference_grouped_gemm", "prepare", "relative_error"]


@contextlib.contextmanager
def exact_matmuls():
    """Inside the block, CUDA fp32 matmuls do not use TF32 (a global TF32 setting would silently round the operands
    to 10-bit mantissas); the setting is restored after it."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _group_product(a: NVFP4Tensor, b: NVFP4Tensor, acc: torch.dtype) -> torch.Tensor:
    with exact_matmuls():
        return dequantize(a, acc) @ dequantize(b, acc).T


def reference_grouped_gemm(a, b, b2=None, *, out_dtype=torch.float16, accumulate=torch.float32):
    """C_g = A_g·B_gᵀ (or silu(A_g·B1_gᵀ)·(A_g·B2_gᵀ) when ``b2`` is given), per group."""
    if accumulate not in (torch.float32, torch.float64):
        raise ValueError(f"accumulate must be torch.float32 or torch.float64, got {accumulate}")
    out = []
    for g in range(len(a)):
        c = _group_product(a[g], b[g], accumulate)
        if b2 is not None:
            c = F.silu(c) * _group_product(a[g], b2[g], accumulate)
        out.append(c.to(out_dtype))
    return out


def prepare(a, b, b2, *, out_dtype=torch.float16, accumulate=torch.float32) -> Runner:
    """The reference as a backend (on whatever device the inputs live)."""
    t0 = time.perf_counter()
    outputs = [torch.empty((x.shape[0], y.shape[0]), dtype=out_dtype, device=x.device)
               for x, y in zip(a, b)]

    def run():
        for o, c in zip(outputs, reference_grouped_gemm(a, b, b2, out_dtype=out_dtype,
                                                        accumulate=accumulate)):
            o.copy_(c)

    return Runner(run, outputs, prepare_s=time.perf_counter() - t0,
                  notes="dequantize every call, fp32 matmul")


def relative_error(out, ref) -> float:
    """Normwise relative error ‖C − R‖_F / ‖R‖_F over all groups; inf if any output is not finite."""
    num = 0.0
    den = 0.0
    for o, r in zip(out, ref):
        if o.shape != r.shape:
            raise ValueError(f"output shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
        o64 = o.double().cpu()
        r64 = r.double().cpu()
        if not torch.isfinite(o64).all():
            return float("inf")
        num += float(((o64 - r64) ** 2).sum())
        den += float((r64 ** 2).sum())
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return (num / den) ** 0.5


def compare(out, ref) -> dict:
    """Elementwise comparison of outputs with a reference rounded to the same dtype: ``mismatched`` elements (an
    infinity equal to the reference's is a match: a value whose exact result overflows the output dtype), of which
    ``nonfinite_mismatched`` are non-finite on one side only; over the elements finite on both sides, the normwise
    ``rel_err`` and ``max_rel_err`` (largest absolute difference / largest reference magnitude)."""
    mism = nonfin = 0
    num = den = mx = 0.0
    big = 0.0
    for o, r in zip(out, ref):
        o64, r64 = o.double().cpu(), r.double().cpu()
        same = (o64 == r64) | (torch.isnan(o64) & torch.isnan(r64))
        mism += int((~same).sum())
        fin = torch.isfinite(o64) & torch.isfinite(r64)
        nonfin += int((~same & ~fin).sum())
        d = (o64 - r64)[fin]
        num += float((d ** 2).sum())
        den += float((r64[fin] ** 2).sum())
        if d.numel():
            mx = max(mx, float(d.abs().max()))
            big = max(big, float(r64[fin].abs().max()))
    return {"mismatched": mism, "nonfinite_mismatched": nonfin, "rel_err": (num / den) ** 0.5 if den else 0.0,
            "max_rel_err": mx / big if big else 0.0, "elements": sum(o.numel() for o in out)}
