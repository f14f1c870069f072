"""The roofline of the GPU at hand: its bf16 MMA rate and copy bandwidth, measured, and the floor.

floor(problem) = max(FLOPs / bf16 MMA rate, NVFP4 bytes / copy bandwidth). On Hopper the exact
NVFP4 path runs on the bf16 tensor cores, so bf16 is the compute roof; the bytes are the
packed NVFP4 operands, their scales and the fp16 output (what a kernel must at least move).
"""
from __future__ import annotations

import statistics

import torch

from .problems import GroupedProblem

__all__ = ["measure_ceilings", "floor_us", "ridge_flop_per_byte"]


def _median_ms(fn, iters=10, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def measure_ceilings(n: int = 8192, copy_bytes: int = 1 << 30) -> dict:
    """bf16 dense matmul rate (TFLOP/s, random data) and device copy bandwidth (GB/s, read+write)."""
    if not torch.cuda.is_available():
        raise RuntimeError("measuring ceilings needs a CUDA GPU")
    mma = 2 * n**3 / _time_matmul(n) * 1e-9
    bw = 2 * copy_bytes / _time_copy(copy_bytes) * 1e-6
    torch.cuda.empty_cache()  # the operands are gone with their functions' frames
    return {"bf16_tflops": mma, "copy_gbps": bw}


def _time_matmul(n: int) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return _median_ms(lambda: a @ b)


def _time_copy(nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return _median_ms(lambda: dst.copy_(src))


def floor_us(problem: GroupedProblem, ceilings: dict) -> float:
    t_mma = problem.flops() / (ceilings["bf16_tflops"] * 1e12)
    t_mem = problem.nvfp4_bytes() / (ceilings["copy_gbps"] * 1e9)
    return max(t_mma, t_mem) * 1e6


def ridge_flop_per_byte(ceilings: dict) -> float:
    return ceilings["bf16_tflops"] * 1e12 / (ceilings["copy_gbps"] * 1e9)
