"""The MoE layer's decode path: a step of at most :data:`GEMV_MAX_TOKENS` tokens as weight-streaming GEMVs.

:class:`~.moe.NVFP4MoE` takes it for such steps on a CUDA device (Triton importable, not traced by torch.compile),
reading the weights the serving kernel packed (:mod:`nvfp4lib.kernels.hopper_varlen.gemv_triton`): no routing, no
gather, no un-permute; W4A16 is three launches (gate/up, down forming the intermediate from the gate/up partial
sums, the weighted combine), W4A4 adds its two quantizations and the intermediate's finalize. The numbers are the
grouped GEMM path's up to the order of fp32 sums.

Off by default (:data:`GEMV_MAX_TOKENS`): measured slower. Why it was built (prediction, 2026-11-27, before any GPU
run): the H200 profile of the Qwen3-like layer at T = 1 spent 15.0 + 8.2 µs in its two GEMMs for 19 MB of weights;
streaming them at 2-2.5 TB/s with every SM busy takes 8-10 µs, and the routing, gather and un-permute (~7 µs) go; the
W4A16 call from ~34 µs to ~12-15 µs on the H100.
"""
from __future__ import annotations

import torch

__all__ = ["GEMV_MAX_TOKENS", "PROGRAMS", "pick_split", "gemv_moe"]

# Steps of at most this many tokens take the GEMV path by default (a token copy re-reads its expert's rows: past a few
# copies per expert the grouped GEMM's reuse wins). Off: measured slower than the GEMM path on every layer. Outcome
# (H100, one run with the path on then off, data/moe.jsonl, notebook 11's rounds): Qwen3-like T = 1 W4A16 58.6 us
# against 35.0; the GEMVs streamed 0.8-1.1 TB/s (their CUDA-core decode and in-register reductions cost more per byte
# than the tensor-core GEMM's), and the down GEMV forming the intermediate from 8 K-slices of partials read them ~16
# times per element. What was predicted fails on the decode's instruction cost, not on the launch chain; split-K in
# the tensor-core GEMM is the next lever. Kept as a knob (NVFP4MoE.gemv_max_tokens) for that A/B.
GEMV_MAX_TOKENS = 0
PROGRAMS = 1024  # programs a GEMV aims for (K is split until it has about this many; ~8 per SM of an H100)
MIN_CHUNKS = 2  # 64-column units of K per program at least


def pick_split(copies: int, blocks: int, k_chunks: int) -> int:
    """K slices for a GEMV of ``copies`` × ``blocks`` programs over ``k_chunks`` units of 64 columns: the largest
    divisor of ``k_chunks`` up to what brings the programs to about :data:`PROGRAMS`, each slice at least
    :data:`MIN_CHUNKS` units (or 1)."""
    want = -(-PROGRAMS // max(1, copies * blocks))
    return max([d for d in range(1, min(want, k_chunks // MIN_CHUNKS) + 1) if k_chunks % d == 0] or [1])


def gemv_moe(x, topk_ids, topk_weights, gate_up, down, *, quantize=None, static=(None, None),
             out_dtype=None) -> torch.Tensor:
    """``[T, H]`` of the layer on packed weights ``gate_up`` and ``down``
    (:class:`~nvfp4lib.kernels.hopper_varlen.gemv_triton.GemvWeights`). ``quantize(rows, global_scale)`` -> (codes,
    scales, global scale) makes it W4A4 (``static``: the gate/up and down inputs' static global scales or None);
    None: W4A16 (x in bf16)."""
    from ..kernels.hopper_varlen import gemv_triton as gt

    out_dtype = out_dtype or x.dtype
    r = topk_ids.numel()
    s1 = pick_split(r, gate_up.blocks, gate_up.k_pad // 64)
    s2 = pick_split(r, down.blocks, down.k_pad // 64)
    if quantize is None:
        part = gt.gemv(gate_up, topk_ids, x.to(torch.bfloat16).contiguous(), split=s1)
        y = gt.gemv(down, topk_ids, None, partials=part, split=s2)
    else:
        codes, scales, g = quantize(x, static[0])
        part = gt.gemv(gate_up, topk_ids, codes, act_scales=scales, act_gs=g, split=s1)
        codes, scales, g = quantize(gt.finalize(part), static[1])
        y = gt.gemv(down, topk_ids, codes, act_scales=scales, act_gs=g, split=s2)
    return gt.combine(y, topk_weights, out_dtype)
