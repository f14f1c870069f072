"""Programmatic dependent launch (PDL) along the MoE layer's chain of kernels: the knob :data:`CHAIN`.

Without it, of the layer's kernels only the serving GEMM is launched with PDL, and only the activation prologue
before it lets it start early; every other kernel starts when the one before it has ended. With :data:`CHAIN` on,
the Triton kernels of the layer's forward (routing, row gather, amax, quantize, un-permute; inside :func:`scope`)
and the prologue are launched with PDL too; each waits for the kernel before it (``griddepcontrol.wait``) before
touching memory, then lets the next one launch (``griddepcontrol.launch_dependents``); with :data:`CHAIN_GEMM` as
well, the GEMM of an NVFP4-activation call lets the next kernel launch when its mainloop ends. So each kernel's
launch and set-up overlap the kernel before it, and a kernel that starts has every kernel before its predecessor
finished (its predecessor waited before it let it launch): what the GEMM reads before its own wait (the group
offsets, written by the routing two or more kernels earlier) is complete.
"""
from __future__ import annotations

from contextlib import contextmanager

__all__ = ["CHAIN", "CHAIN_GEMM", "CHAIN_GEMM_A16", "chained", "gemm_chained", "flag", "scope"]

# Prediction (issue 41, 2026-11-28, before any run): in the H200 profile of the Qwen3-like layer at T = 1 the
# small kernels take 0.9-2.7 us each, a trivial one (the 4-byte fill) 0.9 us: mostly launch, first load and
# completion. Each PDL link should hide ~0.5 us of that; the W4A16 layer (4 links) ~2 us faster, the W4A4 layer
# (9 links, and its two amax fills made one, before the routing) ~4-6 us faster; prefill unchanged.
CHAIN = True
# The GEMM's own trigger (read when a GEMM is built), only with CHAIN: NVFP4-activation GEMMs (W4A4 layers) let the
# next kernel launch when their mainloop ends; W4A16 GEMMs do not (the layer runs its down GEMM straight after the
# gate/up GEMM, and that early launch measured slower).
# Outcome, first A/B (H200, one run at 0797664, moe-bench --chain-pdl off on, T = 1, 8, 64, three layers, uniform
# routing; "on" then had every GEMM trigger): W4A4 faster in 8 of 9 cases (Qwen3-like T = 1 39.0 -> 36.0 us,
# DeepSeek-like T = 1 100.1 -> 93.5), W4A16 faster at T = 8 and 64 but slower at T = 1 (Qwen3-like 28.7 -> 29.4,
# Mixtral-like 108.0 -> 122.0 us, its down GEMM 36 -> 55 us in the profile): there the gate/up GEMM lets the down GEMM
# launch early and its CTAs, one per SM when launched on an idle GPU, take the SMs that have room as the gate/up CTAs
# finish (a reading, not measured: some SMs get two).
# Second A/B (one run, --chain-pdl off on gemm, "on" without any GEMM trigger, "gemm" with every GEMM's): "on" faster
# than "off" in 16 of 18 cases, "gemm" in W4A4 in 9 of 9 (Qwen3-like T = 1 39.1 -> 35.8 us), W4A16's Mixtral-like
# T = 1 again 108.0 -> 121.9. Shipped: CHAIN with the GEMM trigger for NVFP4-activation GEMMs only, i.e. each
# layer mode as its better arm ran (W4A4 "gemm", W4A16 "on"); notebook 11's round holds the rows.
CHAIN_GEMM = True
# The W4A16 GEMMs' trigger too (read when a GEMM is built, with CHAIN and CHAIN_GEMM): the gate/up GEMM lets the down
# GEMM launch at its mainloop's end, and the down GEMM the un-permute. Why again (issue 41): since the A/Bs above, the
# W4A16 decode GEMMs ask for only PREWAIT_STAGES stages of weights before their wait (hopper_varlen.kernel), and
# 'pair' gives the Mixtral-like T = 1 down GEMM two CTAs per SM by design; in the Qwen3-like T = 1 profile (H200) the
# down GEMM still starts only after the gate/up GEMM has ended (13.5 us after 13.3) and its first stage lands ~1 us
# after its wait. Prediction (2026-11-29, before the run): the down GEMM's launch, tile search and first two stages of
# weights under the gate/up GEMM's epilogue: Qwen3-like T = 1 W4A16 ~1-1.5 us faster, T = 8 alike; Mixtral-like T = 1
# within +-3% (the placement that lost 14 us before was one CTA per SM filling SMs unevenly). Outcome (H200, moe-bench
# --chain-gemm-a16 0 1 0 1 --profile, W4A16, uniform; notebook 11's rounds): Qwen3-like T = 1 24.1 -> 25.0 us, its
# down GEMM 6.4 -> 8.0 us in the profile (it starts ~0.6 us sooner and ends ~0.8 us later: its early CTAs share SMs
# with the gate/up GEMM's); T = 8 70.3 -> 69.9; Mixtral-like T = 1 86.0 -> 84.8, T = 8 237.6 -> 234.7; DeepSeek-like
# T = 1 and 8 within 0.2%. The same bits (GPU test, memcheck 0 errors). Off: slower where it was meant to help.
CHAIN_GEMM_A16 = False


_DEPTH = [0]  # open scope() blocks


@contextmanager
def scope():
    """Inside the block, Triton kernels launch chained (where :data:`CHAIN` is on): the single-GPU MoE layer's
    forward, where the chain was measured. Outside it (the expert-parallel layer's steps between collectives, direct
    calls of the routing and quantizer functions) they launch as before."""
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1


def chained(device) -> bool:
    """Whether Triton kernels on ``device`` launch chained now: :data:`CHAIN` on, inside :func:`scope`, and a CUDA
    device (Triton's interpreter has no grid dependency control)."""
    return CHAIN and _DEPTH[0] > 0 and getattr(device, "type", device) == "cuda"


def flag(device) -> dict:
    """The ``GDC`` constexpr of a chained Triton kernel launched on ``device`` (:func:`chained`), as launch consts."""
    return {"GDC": chained(device)}


def gemm_chained(a16: bool = False) -> bool:
    """Whether an NVFP4-activation GEMM (``a16``: a bf16-activation one) built now lets the next kernel launch when its
    mainloop ends (:data:`CHAIN` and :data:`CHAIN_GEMM`; and :data:`CHAIN_GEMM_A16` for ``a16``)."""
    return CHAIN and CHAIN_GEMM and (CHAIN_GEMM_A16 or not a16)
