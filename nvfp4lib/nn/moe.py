"""The NVFP4 MoE expert layer: E experts' gate, up and down weights in NVFP4, one forward per step.

``NVFP4MoE(w_gate, w_up, w_down)`` prepares the weights once (:func:`nvfp4lib.serving.prepare_weights`: the fused
``silu(A·Gᵀ)·(A·Uᵀ)`` over gate and up, and the down projection). ``forward(x, topk_ids, topk_weights)`` then runs

1. routing (:mod:`.routing`): token copies sorted by expert, group offsets on the device;
2. ``activations="nvfp4"`` (W4A4): x to NVFP4 (a global scale per call from the device, or the static one given as
   ``input_scales``, as checkpoints calibrate them; ``quantizer``: two Triton launches, :mod:`.quant_triton`, or
   :func:`.quant.quantize_rows`, the same bits), its rows gathered in expert order; ``activations="bf16"``
   (W4A16): x (in bf16) gathered as it is (on a CUDA device routed and gathered in one launch:
   :data:`.routing.ROUTE_GATHER`);
3. the dual GEMM, writing the intermediate in bf16 (``INTERMEDIATE_DTYPE``), re-quantized in W4A4 mode (in W4A16
   mode the down GEMM reads it as it is: its weights were prepared with ``activations="bf16"``);
4. the down GEMM (bf16 out), then the weighted un-permute, a deterministic gather and sum in fp32.

Decode steps (at most ``gemv_max_tokens`` tokens, :data:`.moe_gemv.GEMV_MAX_TOKENS` by default) on the Hopper
backend run instead as weight-streaming GEMVs on the same packed weights (:mod:`.moe_gemv`): no routing, the same
numbers up to the order of fp32 sums.

No step reads a value back to the host, so the forward can be captured in a CUDA graph. Under ``torch.compile(
fullgraph=True)`` the forward is one opaque custom op, ``nvfp4lib::moe``, that runs it as it runs eagerly
(:mod:`.compiled`; traced instead, its GEMMs are the custom ops ``nvfp4lib::grouped_mm`` and, in W4A16 mode,
``nvfp4lib::grouped_mm_a16``). The layer lives on the device of its weights (``.to()`` does not move them: build it
where it runs).
"""
from __future__ import annotations

import torch

from ..formats import NVFP4Tensor, quantize
from ..kernels.common import pdl
from ..serving import SERVING_BACKENDS, prepare_weights
from . import compiled, routing
from .moe_gemv import GEMV_MAX_TOKENS, gemv_moe
from .quant import amax_of, global_scale_of, quantize_rows, static_scale
from .routing import amax_tile, route, route_gather, triton_importable, unpermute

__all__ = ["NVFP4MoE", "ACTIVATIONS", "INTERMEDIATE_DTYPE", "QUANTIZERS", "resolve_quantizer"]

ACTIVATIONS = ("nvfp4", "bf16")
# How W4A4 quantizes on the fly: "torch" (:func:`.quant.quantize_rows`, ~45 elementwise kernels, fused by
# torch.compile) or "triton" (:mod:`.quant_triton`, two launches with the same bits: checked in Triton's interpreter and
# on the H100); "auto" takes Triton for weights on a CUDA device where it imports, else torch. Under torch.compile the
# torch form is traced either way.
QUANTIZERS = ("auto", "torch", "triton")


def resolve_quantizer(quantizer: str, device) -> str:
    """The quantizer a layer on ``device`` runs for ``quantizer`` (one of :data:`QUANTIZERS`): "torch" or "triton"."""
    if quantizer not in QUANTIZERS:
        raise ValueError(f"quantizer must be one of {QUANTIZERS}, got {quantizer!r}")
    if not triton_importable():
        if quantizer == "triton":
            raise ValueError("quantizer='triton' needs Triton (not importable here); use quantizer='torch'")
        return "torch"
    if quantizer == "auto":
        return "triton" if torch.device(device).type == "cuda" else "torch"
    return quantizer
# What the dual GEMM writes and the down GEMM reads (then quantized in W4A4 mode): bf16 keeps the range of silu(g)·u,
# which fp16 could overflow.
INTERMEDIATE_DTYPE = torch.bfloat16
# The knob (W4A4 with the Triton quantizer, not traced by torch.compile): each quantization writes the GEMM's fp16
# operand itself (:func:`.quant_triton.quantize_to_operand`, e2m1 · block scale · 2^-7, the values the activation
# prologue would decode from its codes) and the GEMM runs alone (:meth:`~nvfp4lib.serving.PreparedWeights.
# call_operand`): two launches fewer per step, the same bits. Why (issue 41): in the Qwen3-like W4A4 layer at T = 1
# (H200 profile, chained launches) each prologue ends 1.1-1.2 us after its quantization, on the path to its GEMM.
# Prediction (2026-11-28, before any run): Qwen3-like T = 1 W4A4 ~2-2.5 us faster (34.4 -> ~32 us); every W4A4 case
# faster by about that at decode; prefill T = 4096 some 20-40 us faster (the prologue's pass over the codes and the
# fp16 rows gone; the quantizer writes fp16 rows instead of codes). Outcome (H200, moe-bench --quant-operand off on,
# W4A4, uniform; notebook 11's rounds): the first form, storing even and odd elements apart (2-byte stores 4 bytes
# apart), won at T = 1 (Qwen3-like 34.2 -> 32.4 us) and lost past it (DeepSeek-like T = 64's input quantization
# 54.6 us against 10.6 + 6.1, prefill 1092 -> 1676 us). Stored as one contiguous run per block: Qwen3-like T = 1
# 34.2 -> 30.5 us, T = 8 84.0 -> 78.7, prefill 1085 -> 1062, DeepSeek-like T = 1 and 8 -3 and -5 us, the rest within
# 1% but Mixtral-like T = 1 (101.1 -> 108.3 us), which a repeat in one run had the other way (112.2 -> 107.1 uniform,
# 111.3 -> 107.3 Zipf): that case moves by ~10 us from run to run. The same bits as codes and prologue (GPU test,
# memcheck 0 errors). On.
QUANT_TO_OPERAND = True
# Steps of at most COMBINE_MAX_COPIES token copies run the down GEMM and the weighted un-permute as one launch
# (PreparedWeights.combine: each column block's last CTA sums the copies in fp32, in the order of the unfused launch;
# W4A16, and W4A4 on the operand path); False: the un-permute is a launch of its own. Why (issue 41): in the
# Qwen3-like W4A16 layer at T = 1 (H200 profiles, graph replay) the un-permute launch takes 1.6-1.9 us after the down
# GEMM, which ends ~0.2 us before it starts: ~8% of a 23 us step. The tail costs its column block's last CTA a count
# (one atomic), then k loads from L2 per output. Prediction (2026-11-29, before any run): T = 1 ~1-1.5 us faster in
# both modes on every layer (Qwen3-like W4A16 ~24 -> ~22.8 us), T = 8 ~0.5-1 us faster; larger steps unchanged.
# Outcome (H200, moe-bench --combine-in-gemm 0 1 0 1 --profile, T = 1 and 8, both modes; notebook 11's rounds):
# slower. The first form loaded each copy's row, then its value, one copy after the other: Qwen3-like T = 1 W4A16
# 23.9 -> 26.6 us (the down GEMM with the sum 10.1 us against 6.4 + 1.6 for the two launches), T = 8 70.2 -> 81.5.
# The second (top-k fixed at compile time, a thread's k copies loaded together, its first output's rows and weights
# read before the count): 24.0 -> 25.6 us (8.9 against 6.4 + 1.7), T = 8 70.3 -> 77.0, Mixtral-like T = 1 86.7 ->
# 86.8, DeepSeek-like T = 8 475 -> 497. The same bits in every case (GPU tests; memcheck 0 errors). Why: the last
# CTA of a column block starts its sum only after every CTA of the block has stored its rows, then pays a GPU-scope
# fence, the count's atomic and the loads from L2 in turn (~2.5 us at T = 1), where the un-permute launch, started
# ~0.2 us after the GEMM, pays its loads alone (1.6-1.7 us); and one CTA per column block sums all T tokens (T = 8:
# 8 outputs per column, 4 per thread). Eager calls (host-bound) were cheaper with it in both of the second run's
# W4A16 pairs (Qwen3-like T = 1 215.5, 311.7 -> 123.3, 131.2 us per call: one Triton launch fewer), W4A4 mixed (387.3,
# 257.1 -> 226.6, 253.5); host time swings 2-3x between runs, so this is a lead for eager callers, not a result.
# Off; kept as a knob, with PreparedWeights.combine.
COMBINE_IN_GEMM = False
COMBINE_MAX_COPIES = 64  # (T·k: one CTA per column block sums every token's copies over its columns)


def _expert_list(ws, what: str, shape: tuple[int, int] | None = None) -> list[NVFP4Tensor]:
    if not isinstance(ws, (list, tuple)) or not ws or not all(isinstance(w, NVFP4Tensor) for w in ws):
        raise TypeError(f"{what} must be a non-empty list of NVFP4Tensor, one per expert, got {type(ws).__name__}")
    for e, w in enumerate(ws):
        if len(w.shape) != 2 or (shape is not None and tuple(w.shape) != shape):
            raise ValueError(f"{what}[{e}] is {tuple(w.shape)}; expected {shape or 'a 2-D [N, K] matrix'}")
    return list(ws)


class NVFP4MoE(torch.nn.Module):
    """MoE experts with NVFP4 weights: gate and up ``[I, H]``, down ``[H, I]`` per expert (see the module doc).

    ``activations``: "nvfp4" (W4A4: activations and the intermediate quantized to NVFP4 on the fly) or "bf16" (W4A16:
    activations kept in bf16 — x is rounded to bf16 if it is another float type — and fed to the GEMMs as they are).
    ``backend``: a serving backend,
    "cute-hopper" (the Hopper kernel) or "reference" (the same semantics in torch, on any device). ``quantizer``: how
    W4A4 quantizes activations and the intermediate (``QUANTIZERS``, resolved to "torch" or "triton" in
    ``self.quantizer``; the same bits either way). ``input_scales``: None (W4A4 computes the activations' global scale
    per call) or ``(gate_up, down)``, the static NVFP4 global scales of x and of the intermediate (one number each,
    for every expert: a value is ``e2m1 · block scale · global scale``). ``keep_weights=False`` drops the NVFP4Tensor
    lists (``w_gate``, ``w_up``, ``w_down`` become None) once the serving path holds its own copy: a model loader keeps
    one copy of the experts."""

    def __init__(self, w_gate, w_up, w_down, *, activations: str = "nvfp4", backend: str = "cute-hopper",
                 quantizer: str = "auto", input_scales=None, keep_weights: bool = True):
        super().__init__()
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
        if backend not in SERVING_BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; known: {', '.join(SERVING_BACKENDS)}")
        w_gate = _expert_list(w_gate, "w_gate")
        inter, hidden = tuple(w_gate[0].shape)
        w_gate = _expert_list(w_gate, "w_gate", (inter, hidden))
        w_up = _expert_list(w_up, "w_up", (inter, hidden))
        w_down = _expert_list(w_down, "w_down", (hidden, inter))
        if not len(w_gate) == len(w_up) == len(w_down):
            raise ValueError(f"w_gate, w_up, w_down hold {len(w_gate)}, {len(w_up)}, {len(w_down)} experts; they must "
                             "hold the same number")
        self.experts, self.hidden, self.intermediate = len(w_gate), hidden, inter
        self.activations, self.backend = activations, backend
        self.device = w_gate[0].device
        self.quantizer = resolve_quantizer(quantizer, self.device)
        self.input_scales = None if input_scales is None else _static_scales(input_scales, self.device)
        self.gate_up = prepare_weights(w_gate, w_up, backend=backend, out_dtype=INTERMEDIATE_DTYPE,
                                       activations=activations)
        self.down = prepare_weights(w_down, backend=backend, out_dtype=INTERMEDIATE_DTYPE, activations=activations)
        self.w_gate, self.w_up, self.w_down = (w_gate, w_up, w_down) if keep_weights else (None, None, None)
        # steps of at most this many tokens take the GEMV decode path (:mod:`.moe_gemv`) where it can run; 0: never
        self.gemv_max_tokens = GEMV_MAX_TOKENS
        self._gemv = None  # (gate_up, down) GemvWeights, made on first use
        self._handle = compiled.handle(self)  # the module's name in the op torch.compile records (:mod:`.compiled`)

    @classmethod
    def from_float(cls, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, **kwargs) -> "NVFP4MoE":
        """Quantize float weights (bf16 ``[E, I, H]``, ``[E, I, H]``, ``[E, H, I]``) expert by expert, each with its
        own global scale (``formats.quantize``'s default), and build the layer on their device."""
        for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
            if not isinstance(w, torch.Tensor) or w.dim() != 3 or not w.is_floating_point():
                raise TypeError(f"{name} must be a 3-D float tensor [E, N, K], got "
                                f"{getattr(w, 'dtype', type(w).__name__)} {tuple(getattr(w, 'shape', ()))}")
        return cls(*([quantize(m) for m in w] for w in (w_gate, w_up, w_down)), **kwargs)

    def extra_repr(self) -> str:
        return (f"experts={self.experts}, hidden={self.hidden}, intermediate={self.intermediate}, "
                f"activations={self.activations!r}, backend={self.backend!r}, quantizer={self.quantizer!r}"
                + (", static activation scales" if self.input_scales is not None else ""))

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """``x [T, H]``, ``topk_ids [T, k]`` (int, in ``[0, E)``), ``topk_weights [T, k]`` -> ``[T, H]`` in x's
        dtype: ``Σ_j topk_weights[t, j] · down_e(silu(gate_e(x_t)) · up_e(x_t))``, ``e = topk_ids[t, j]``."""
        self._check(x, topk_ids, topk_weights)
        if torch.compiler.is_compiling() and compiled.opaque(x, topk_weights):
            return compiled.moe(x, topk_ids, topk_weights, self._handle)
        if self._gemv_step(x):
            return self._forward_gemv(x, topk_ids, topk_weights)
        with pdl.scope():  # (kernels.common.pdl: the Triton launches chained)
            return self._forward_gemm(x, topk_ids, topk_weights)

    def _forward_gemm(self, x, topk_ids, topk_weights) -> torch.Tensor:
        if self.activations == "bf16":
            # x's rows in packed order (routed and gathered in one launch where it can), the intermediate already
            # bf16 (INTERMEDIATE_DTYPE): the down GEMM's activations as they are
            r, rows = route_gather(topk_ids, self.experts, x.to(torch.bfloat16))
            h = self.gate_up(rows, r.offsets)
            if self._combine_step(topk_ids):  # (the down GEMM and the un-permute in one launch: COMBINE_IN_GEMM)
                return self.down.combine(h, r.offsets, r.row, topk_weights, out_dtype=x.dtype)
            return unpermute(self.down(h, r.offsets), r, topk_weights, x.dtype)
        static = self.input_scales or (None, None)
        # chained launches (kernels.common.pdl): the amax words of the two dynamic quantizations zeroed by the
        # routing launch instead of a fill kernel each (a fill is not chained)
        words, amax = None, (None, None)
        if self.quantizer == "triton" and pdl.chained(x.device) and None in static:
            words = torch.empty(2, dtype=torch.int32, device=x.device)
            amax = words.split(1)
        if x.stride(1) != 1:
            x = x.contiguous()
        # x's amax found by the routing launch (routing.AMAX_IN_ROUTE; the operand path with x's scale per call)
        early = (routing.AMAX_IN_ROUTE and words is not None and static[0] is None and self._operand_path()
                 and amax_tile(x) is not None)
        r = route(topk_ids, self.experts, clear=words[1:] if early else words,
                  amax_of=(x, amax[0]) if early else None)
        if self._operand_path():
            from .quant_triton import quantize_to_operand

            # the same quantizations, each writing the next GEMM's operand (QUANT_TO_OPERAND)
            x16, g = quantize_to_operand(x, self.gate_up.operand_k, static[0], r.token, amax_word=amax[0],
                                         amax_ready=early)
            h = self.gate_up.call_operand(x16, r.offsets, g)
            x16, g = quantize_to_operand(h, self.down.operand_k, static[1], amax_word=amax[1])
            if self._combine_step(topk_ids):
                return self.down.combine(x16, r.offsets, r.row, topk_weights, global_scale=g, out_dtype=x.dtype)
            y = self.down.call_operand(x16, r.offsets, g)
        else:
            # The T·k copies quantized in packed order with x's global scale: quantization is row-local, so these
            # are the bits of quantizing x then gathering (the Triton quantizer reads each copy's row itself, one
            # launch instead of a quantization and two gathers; the torch form gathers after quantizing)
            codes, scales, g = self._quantize(x, static[0], r.token, amax_word=amax[0])
            h = self.gate_up(_packed(codes, scales.view(torch.uint8), g), r.offsets, global_scale=g)
            codes, scales, g = self._quantize(h, static[1], amax_word=amax[1])
            y = self.down(_packed(codes, scales.view(torch.uint8), g), r.offsets, global_scale=g)
        return unpermute(y, r, topk_weights, x.dtype)

    def _operand_path(self) -> bool:
        """Whether W4A4 quantizes straight into the GEMMs' operands (:data:`QUANT_TO_OPERAND`): the Triton quantizer,
        not traced by torch.compile."""
        return QUANT_TO_OPERAND and self.quantizer == "triton" and not torch.compiler.is_compiling()

    def _combine_step(self, topk_ids: torch.Tensor) -> bool:
        """Whether the down GEMM and the un-permute run as one launch (:data:`COMBINE_IN_GEMM`): the Hopper backend,
        1 to :data:`COMBINE_MAX_COPIES` copies, not traced by torch.compile."""
        return (COMBINE_IN_GEMM and self.backend == "cute-hopper" and 0 < topk_ids.numel() <= COMBINE_MAX_COPIES
                and not torch.compiler.is_compiling())

    def _gemv_step(self, x: torch.Tensor) -> bool:
        """Whether this step takes the GEMV decode path: 1 to ``gemv_max_tokens`` tokens, the Hopper backend's packed
        weights on a CUDA device, Triton importable, not traced by torch.compile (which keeps the GEMM path)."""
        return (0 < x.shape[0] <= self.gemv_max_tokens and self.backend == "cute-hopper" and x.is_cuda
                and triton_importable() and not torch.compiler.is_compiling())

    def _forward_gemv(self, x, topk_ids, topk_weights) -> torch.Tensor:
        if self._gemv is None:
            from ..kernels.hopper_varlen.gemv_triton import gemv_weights

            self._gemv = (gemv_weights(self.gate_up.impl.weights), gemv_weights(self.down.impl.weights))
        quant = self._quantize if self.activations == "nvfp4" else None
        return gemv_moe(x, topk_ids, topk_weights, *self._gemv, quantize=quant,
                        static=self.input_scales or (None, None))

    def _quantize(self, x: torch.Tensor, global_scale: torch.Tensor | None = None, index=None, amax_reduce=None,
                  valid=None, amax_word=None):
        """(codes, scales, global scale) of x's rows, or of the rows ``x[index]`` with x's global scale (a negative
        index: an unspecified row).
        ``amax_reduce`` (without ``global_scale``): replaces x's ``amax(|x|)`` (float32 [1]) in place before the
        global scale is computed from it (expert parallelism: the group's max). ``valid`` (int32 [1] on the device):
        only x's first ``valid[0]`` rows count and are quantized (the others' outputs unspecified). ``amax_word``
        (the Triton form, without ``global_scale``): an int32 [1] zeroed for this call on the device, the amax's."""
        if self.quantizer == "triton" and not torch.compiler.is_compiling():
            from .quant_triton import quantize_rows_triton

            rows_ok = x.dim() == 2 and x.stride(1) == 1  # (a row stride is fine: the EP transport's gathered rows)
            return quantize_rows_triton(x if rows_ok else x.contiguous(), global_scale, index, amax_reduce, valid,
                                        amax_word=amax_word)
        if global_scale is None and (amax_reduce is not None or valid is not None):
            counted = x if valid is None else torch.where(
                (torch.arange(x.shape[0], device=x.device) < valid).unsqueeze(1), x, 0)
            amax = amax_of(counted)
            if amax_reduce is not None:
                amax_reduce(amax)
            global_scale = global_scale_of(amax)
        codes, scales, g = quantize_rows(x, global_scale)
        if index is None:
            return codes, scales, g
        index = index.clamp(min=0)  # (a negative index: an unspecified row)
        return codes.index_select(0, index), scales.view(torch.uint8).index_select(0, index).view(scales.dtype), g

    def _check(self, x, topk_ids, topk_weights) -> None:
        # shapes and dtypes only: static under torch.compile, no read-back
        if x.dim() != 2 or x.shape[1] != self.hidden or not x.is_floating_point():
            raise ValueError(f"x must be a float [T, H={self.hidden}] tensor, got {x.dtype} {tuple(x.shape)}")
        if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_ids.dtype.is_floating_point:
            raise ValueError(f"topk_ids must be an integer [T={x.shape[0]}, k] tensor, got {topk_ids.dtype} "
                             f"{tuple(topk_ids.shape)}")
        if tuple(topk_weights.shape) != tuple(topk_ids.shape):
            raise ValueError(f"topk_weights is {tuple(topk_weights.shape)} but topk_ids is {tuple(topk_ids.shape)}")
        if not (x.device == topk_ids.device == topk_weights.device == self.device):
            raise ValueError(f"x ({x.device}), topk_ids ({topk_ids.device}), topk_weights ({topk_weights.device}) "
                             f"must be on the weights' device {self.device}")


def _static_scales(scales, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gate_up, down)`` static activation global scales as float32 ``[1]`` tensors on ``device`` (checked finite and
    positive here, once: the forward reads nothing back)."""
    if not isinstance(scales, (tuple, list)) or len(scales) != 2:
        raise TypeError(f"input_scales must be a pair (gate_up, down) of numbers or one-element tensors, got "
                        f"{type(scales).__name__}")
    gate_up, down = (static_scale(s, device, f"input_scales ({what})") for what, s in zip(("gate_up", "down"), scales))
    return gate_up, down


def _packed(codes: torch.Tensor, scale_bytes: torch.Tensor, g: torch.Tensor) -> NVFP4Tensor:
    # The global scale stays a device tensor (it is also passed as global_scale=): no read-back.
    return NVFP4Tensor(codes, scale_bytes.view(torch.float8_e4m3fn), g.reshape(()))

