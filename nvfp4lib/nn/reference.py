"""The exact reference of :class:`~nvfp4lib.nn.NVFP4MoE`: what the layer computes, token copy by token copy.

Weights are dequantized exactly and every product runs in fp32 (TF32 off). In W4A4 mode the activations are the ones
the layer quantizes: x through :func:`.quant.quantize_rows` (bit-identical to the layer's), the intermediate rounded
to ``INTERMEDIATE_DTYPE`` (what the dual GEMM writes) and quantized with one global scale over all copies. In W4A16
mode x is used as it is. The weighted sum over the k experts of a token is fp32; the result is fp32, not rounded to
x's dtype, so a test sees the layer's own roundings as its error. With ``input_scales`` (a layer's static activation
scales) both quantizations use them instead. :func:`calibrate_input_scales` gives the scales a calibration batch
would record: the global scales W4A4 computes for its x and its intermediate.

Routing here is the plain loop (each expert picks its copies with ``nonzero``), independent of :mod:`.routing`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..formats import NVFP4Tensor, dequantize
from ..reference import exact_matmuls
from .moe import ACTIVATIONS, INTERMEDIATE_DTYPE
from .quant import global_scale_of, quantize_rows

__all__ = ["reference_moe", "calibrate_input_scales"]


def _as_quantized(x: torch.Tensor, global_scale=None) -> torch.Tensor:
    codes, scales, g = quantize_rows(x, global_scale)
    return dequantize(NVFP4Tensor(codes, scales, g.reshape(())), torch.float32)


def _intermediate(a: torch.Tensor, topk_ids, w_gate, w_up) -> torch.Tensor:
    """``silu(a·gate_eᵀ)·(a·up_eᵀ)`` of every token copy, fp32 ``[T, k, I]``, rounded to ``INTERMEDIATE_DTYPE``."""
    t, k = topk_ids.shape
    h = torch.zeros((t, k, w_gate[0].shape[0]), dtype=torch.float32, device=a.device)
    for e in range(len(w_gate)):
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)
        if tok.numel():
            ae = a[tok]
            h[tok, slot] = F.silu(ae @ dequantize(w_gate[e]).T) * (ae @ dequantize(w_up[e]).T)
    return h.to(INTERMEDIATE_DTYPE)


def _scales(input_scales, device):
    if input_scales is None:
        return None, None
    return tuple(torch.as_tensor(s, dtype=torch.float32, device=device).reshape(1) for s in input_scales)


def reference_moe(x, topk_ids, topk_weights, w_gate, w_up, w_down, *, activations: str = "nvfp4",
                  input_scales=None) -> torch.Tensor:
    """fp32 ``[T, H]``: ``Σ_j topk_weights[t, j] · down_e(silu(gate_e(x_t)) · up_e(x_t))``, ``e = topk_ids[t, j]``,
    with weights given as lists of :class:`NVFP4Tensor` (gate, up ``[I, H]``, down ``[H, I]`` per expert).
    ``input_scales`` (W4A4): ``(gate_up, down)`` static global scales of x and of the intermediate, as the layer's."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
    gs_x, gs_h = _scales(input_scales, x.device)
    with exact_matmuls():
        a = _as_quantized(x, gs_x) if activations == "nvfp4" else x.to(torch.float32)
        h = _intermediate(a, topk_ids, w_gate, w_up)
        h = _as_quantized(h, gs_h) if activations == "nvfp4" else h.to(torch.float32)
        t, k = topk_ids.shape
        y = torch.zeros((t, k, w_down[0].shape[0]), dtype=torch.float32, device=x.device)
        for e in range(len(w_down)):
            tok, slot = (topk_ids == e).nonzero(as_tuple=True)
            if tok.numel():
                y[tok, slot] = h[tok, slot] @ dequantize(w_down[e]).T
    return (y * topk_weights.to(torch.float32).unsqueeze(-1)).sum(dim=1)


def calibrate_input_scales(x, topk_ids, w_gate, w_up) -> tuple[float, float]:
    """``(gate_up, down)``: the global scales W4A4 computes per call for the calibration batch ``x`` (routed by
    ``topk_ids``) and for its intermediate, as floats: what a checkpoint's static activation scales record
    (``NVFP4MoE(..., input_scales=...)``)."""
    with exact_matmuls():
        h = _intermediate(_as_quantized(x), topk_ids, w_gate, w_up)
    return float(global_scale_of(x)), float(global_scale_of(h))
