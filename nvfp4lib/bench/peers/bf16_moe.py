"""The bf16 peer of :class:`nvfp4lib.nn.NVFP4MoE`: the same expert layer with its weights dequantized once to bf16,
as a user without an NVFP4 kernel would run it.

``BF16GroupedMoE(w_gate, w_up, w_down)`` (lists of E ``NVFP4Tensor``, as the layer takes) dequantizes every expert
once into ``w13 [E, 2I, H]`` (gate rows then up rows: one grouped product for both, as vLLM's fused ``w13`` does)
and ``w2 [E, H, I]``, in bf16: 3.6x the NVFP4 bytes. ``forward(x, topk_ids, topk_weights)`` runs the layer's own
routing (:func:`nvfp4lib.nn.routing.route`: copies sorted by expert, int32 offsets on the device), one
``torch._grouped_mm`` over gate and up, ``silu(gate) * up`` in bf16, one ``torch._grouped_mm`` for down, and the
layer's weighted un-permute. Nothing is read back to the host, so the forward is capturable in a CUDA graph. It also
serves as the local experts of an expert-parallel bf16 peer (``EPMoE(..., local_layer=BF16GroupedMoE)``: the same
``gate_up``/``down`` over rows grouped by expert with int32 offsets as the NVFP4 layer's W4A16 path).

Its semantics are W4A16's (:func:`nvfp4lib.nn.reference_moe` with ``activations="bf16"``) up to bf16 roundings:
the dequantized weights (one rounding of ``code * scale * global_scale`` each), the two grouped products' bf16
outputs, ``silu(gate)`` and its product with ``up``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...formats import NVFP4Tensor, dequantize
from ...nn.moe import NVFP4MoE
from ...nn.routing import route, unpermute

__all__ = ["BF16GroupedMoE"]


class BF16GroupedMoE(torch.nn.Module):
    """E experts in bf16 (``w13 [E, 2I, H]``, ``w2 [E, H, I]``), grouped products by ``torch._grouped_mm``."""

    def __init__(self, w_gate: list[NVFP4Tensor], w_up: list[NVFP4Tensor], w_down: list[NVFP4Tensor]):
        super().__init__()
        if not hasattr(torch, "_grouped_mm"):
            raise RuntimeError(f"torch {torch.__version__} has no torch._grouped_mm")
        if not (len(w_gate) == len(w_up) == len(w_down)) or not w_gate:
            raise ValueError(f"w_gate, w_up, w_down hold {len(w_gate)}, {len(w_up)}, {len(w_down)} experts; they "
                             "must hold the same, nonzero number")
        inter, hidden = tuple(w_gate[0].shape)
        dev = w_gate[0].data.device
        self.experts, self.hidden, self.intermediate = len(w_gate), hidden, inter
        # filled expert by expert: the whole fp32 dequantization of a large layer would not fit beside it
        w13 = torch.empty((self.experts, 2 * inter, hidden), dtype=torch.bfloat16, device=dev)
        w2 = torch.empty((self.experts, hidden, inter), dtype=torch.bfloat16, device=dev)
        for e in range(self.experts):
            w13[e, :inter] = dequantize(w_gate[e], torch.bfloat16)
            w13[e, inter:] = dequantize(w_up[e], torch.bfloat16)
            w2[e] = dequantize(w_down[e], torch.bfloat16)
        self.register_buffer("w13", w13, persistent=False)
        self.register_buffer("w2", w2, persistent=False)

    @property
    def weight_bytes(self) -> int:
        return (self.w13.numel() + self.w2.numel()) * self.w13.element_size()

    # What EPMoE uses of a local layer (its ``local_layer`` knob): W4A16's interface, the serving path's offsets
    activations = "bf16"
    input_scales = None
    _check = NVFP4MoE._check  # the same shape, dtype and device rules as the NVFP4 layer

    @property
    def device(self) -> torch.device:
        return self.w13.device

    def gate_up(self, xs: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """``silu(xs·Gᵀ) * (xs·Uᵀ)`` in bf16 for rows grouped by expert, ``offsets`` int32 ``[E + 1]`` (group e: rows
        ``offsets[e] .. offsets[e+1]``; rows past ``offsets[-1]`` come out unspecified)."""
        # _grouped_mm takes each group's end row; a copy keeps the argument at the start of its own allocation
        offs = offsets[1:].to(torch.int32).clone()
        # [E, K, N] views of the [E, N, K] weights (K contiguous), the layout _grouped_mm reads without a copy
        h = torch._grouped_mm(xs, self.w13.transpose(1, 2), offs=offs)
        return F.silu(h[:, :self.intermediate]) * h[:, self.intermediate:]

    def down(self, h: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """``h·Dᵀ`` in bf16, grouped as :meth:`gate_up`."""
        return torch._grouped_mm(h, self.w2.transpose(1, 2), offs=offsets[1:].to(torch.int32).clone())

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        r = route(topk_ids, self.experts)
        xs = x.to(torch.bfloat16).index_select(0, r.token)
        return unpermute(self.down(self.gate_up(xs, r.offsets), r.offsets), r, topk_weights, x.dtype)
