"""torch peers of the NVFP4 grouped GEMM, all checked against the same exact reference.

Operands are dequantized to 16-bit with their block scales folded in (every E2M1 × E4M3 product is
exact in bf16 and fp16); the product of the FP32 global scales multiplies the fp32 result, as in
the CuTe kernel. The matmul accumulates in fp32 and returns fp32 where torch allows
(``torch.mm(..., out_dtype=torch.float32)``), so the only rounding is the final cast.

- ``torch-bf16``: weights dequantized once ahead of time (held as bf16: 2 B/element, 3.6× the
  memory of NVFP4's 0.5625 B), activations dequantized per call, cuBLAS per group.
- ``torch-grouped-mm``: the same bf16 operands through ``torch._grouped_mm`` (one launch).
- ``torch-bf16-predequant``: what a bf16 user runs: every operand dequantized to bf16 once with its global scale
  folded in, outside the timed call; per call one ``torch._grouped_mm`` with a bf16 result (two and ``silu·up`` for
  the dual form). The fair lower bound for "just use bf16" with memory to spare.
- ``torch-grouped-mm-fused``: what a tuned user runs: weights dequantized to bf16 once at prepare (held: 2 B/element,
  3.6× NVFP4), the activations of all groups decoded to bf16 by ONE Triton launch inside the call (reading each
  group's codes in place; an extra M·K·2 bytes buffer), then ``torch._grouped_mm`` (issue 20).
- ``torch-dequant``: everything dequantized inside every call, then cuBLAS — what the reference costs.
- ``torch-compile``: ``torch.compile`` of dequantize + matmul (+ SiLU·up), ``dynamic=True`` so the
  groups' different M do not trigger a recompile each.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ...formats import NVFP4Tensor
from ...runner import Runner

E2M1_LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


_LUTS: dict = {}


def _lut(device, dtype):
    # one copy per device: a host-to-device copy inside every call could not be graph-captured
    key = (str(device), dtype)
    if key not in _LUTS:
        _LUTS[key] = E2M1_LUT.to(device, dtype)
    return _LUTS[key]


def dequant16(codes: torch.Tensor, scales: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """e2m1(code) × e4m3(scale) in ``dtype`` — exact — without the global scale."""
    lut = _lut(codes.device, dtype)
    vals = torch.stack([lut[(codes & 0xF).long()], lut[(codes >> 4).long()]], dim=-1).flatten(-2)
    s = scales.to(dtype).repeat_interleave(16, dim=-1)
    return vals * s


def _dq(t: NVFP4Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    return dequant16(t.data, t.scales, dtype)


def _mm_out32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, w.t(), out_dtype=torch.float32)


def _mm_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(x.float(), w.float().t())


_MM_CACHE: dict = {}


def mm32_for(device: torch.device):
    """x @ wᵀ accumulated in fp32 with an fp32 result (``torch.mm(..., out_dtype=float32)``, CUDA only).
    Where that is missing (the CPU), an fp32 matmul of the same exact values. A bf16 result would fail
    the 1e-3 check on its own rounding, and an fp16 one overflows: without the global scale, products
    of block-scaled values reach 2688² ≈ 7e6."""
    key = device.type
    if key not in _MM_CACHE:
        fn = _mm_fp32
        if device.type == "cuda":
            try:
                x = torch.ones(16, 16, dtype=torch.bfloat16, device=device)
                _mm_out32(x, x)
                fn = _mm_out32
            except (TypeError, RuntimeError):
                pass
        _MM_CACHE[key] = fn
    return _MM_CACHE[key]


def _mm32(x, w):
    return mm32_for(x.device)(x, w)


def _finish(acc, acc2, alpha, alpha2, out: torch.Tensor) -> None:
    v = acc * alpha
    if acc2 is not None:
        v = F.silu(v) * (acc2 * alpha2)
    out.copy_(v)


def _outputs(a, b, out_dtype):
    return [torch.empty((x.shape[0], y.shape[0]), dtype=out_dtype, device=x.data.device) for x, y in zip(a, b)]


def _alphas(a, b):
    return [x.global_scale.float() * y.global_scale.float() for x, y in zip(a, b)]


def _outputs_and_alphas(a, b, b2, out_dtype):
    """Per-group outputs and the global-scale products for B (and B2, or Nones)."""
    al2 = _alphas(a, b2) if b2 is not None else [None] * len(a)
    return _outputs(a, b, out_dtype), _alphas(a, b), al2


def prepare_bf16(a, b, b2, *, out_dtype=torch.float16) -> Runner:
    t0 = time.perf_counter()
    wb = [_dq(t) for t in b]
    wb2 = [_dq(t) for t in b2] if b2 is not None else None
    outs, al, al2 = _outputs_and_alphas(a, b, b2, out_dtype)

    def run():
        for g, x in enumerate(a):
            if x.shape[0] == 0:
                continue
            xa = _dq(x)
            _finish(_mm32(xa, wb[g]), _mm32(xa, wb2[g]) if wb2 else None, al[g], al2[g], outs[g])

    held = sum(w.numel() * 2 for w in wb + (wb2 or []))
    return Runner(run, outs, prepare_s=time.perf_counter() - t0, held_bytes=held,
                  notes=f"weights held as bf16: {held / 1e6:.0f} MB, 3.6x NVFP4; activations dequantized per call")


def prepare_dequant(a, b, b2, *, out_dtype=torch.float16) -> Runner:
    outs, al, al2 = _outputs_and_alphas(a, b, b2, out_dtype)

    def run():
        for g, x in enumerate(a):
            if x.shape[0] == 0:
                continue
            xa = _dq(x)
            _finish(_mm32(xa, _dq(b[g])), _mm32(xa, _dq(b2[g])) if b2 is not None else None, al[g], al2[g],
                    outs[g])

    return Runner(run, outs, notes="everything dequantized to bf16 inside every call")


def prepare_bf16_predequant(a, b, b2, *, out_dtype=torch.float16) -> Runner:
    """What a bf16 user runs: every operand dequantized to bf16 once, outside the timed call, with its global scale
    folded in (weights ``W·gs_B``, each group's activation rows ``A·gs_A``), then per call one ``torch._grouped_mm``
    with a bf16 result (two for the dual form, then ``silu(gate) * up`` in bf16). Nothing else is timed. ``out_dtype``
    is ignored: the result is bf16, checked at a tolerance that covers its roundings."""
    if not hasattr(torch, "_grouped_mm"):
        raise RuntimeError(f"torch {torch.__version__} has no torch._grouped_mm")
    if len({t.shape[1] for t in a}) != 1 or len({t.shape[0] for t in b}) != 1:
        raise ValueError("torch-bf16-predequant needs one N and one K shared by all groups")
    t0 = time.perf_counter()
    dev = a[0].data.device
    m = [t.shape[0] for t in a]

    def weights(ws):  # [G, K, N] bf16, the global scale folded in (rounded once to bf16, as a bf16 checkpoint is)
        return torch.stack([(_dq(t, torch.float32) * t.global_scale.float()).to(torch.bfloat16) for t in ws]
                           ).transpose(1, 2)

    wst = weights(b)
    wst2 = weights(b2) if b2 is not None else None
    x = torch.cat([(_dq(t, torch.float32) * t.global_scale.float()).to(torch.bfloat16) for t in a])
    offs = torch.tensor(m, device=dev).cumsum(0).to(torch.int32)
    outs: list[torch.Tensor] = []

    def run():
        c = torch._grouped_mm(x, wst, offs=offs)
        if wst2 is not None:
            c = F.silu(c) * torch._grouped_mm(x, wst2, offs=offs)
        outs[:] = c.split(m)  # the op allocates its result: the outputs are its views

    try:
        run()  # probe: refuse clearly at prepare time if this GPU/torch cannot run it
    except RuntimeError as e:
        raise RuntimeError(f"torch._grouped_mm is not usable here (torch {torch.__version__}): {e}") from None
    held = (wst.numel() * (2 if b2 is not None else 1) + x.numel()) * 2
    tol = 8e-3 if b2 is not None else 4e-3  # bf16 results (2^-9 relative each; the dual form rounds three times)
    how = " per product, then silu(gate)*up in bf16" if b2 is not None else ""
    return Runner(run, outs, prepare_s=time.perf_counter() - t0, held_bytes=held, tolerance=tol,
                  notes=f"operands held as bf16 with the global scales folded in: {held / 1e6:.0f} MB; one "
                        f"torch._grouped_mm launch{how}; bf16 result (checked at {tol})")


def prepare_grouped_mm_fused(a, b, b2, *, out_dtype=torch.float16) -> Runner:
    """``torch-grouped-mm-fused``: the weights dequantized to bf16 once at prepare (held: 2 B/element, 3.6x the
    NVFP4 bytes, as every torch._grouped_mm peer), and per call ONE Triton launch that decodes the activations of all
    groups to bf16 (exact: value × E4M3 scale; codes read where they are, one extra [ΣM, K] bf16 buffer), then
    ``torch._grouped_mm`` for the grouped and dual forms and the same fp32 global-scale epilogue as
    ``torch-grouped-mm``. This is what a tuned user would run when the weights fit in bf16: decoding the weights in
    the call too would re-read and re-write 3.6x their bytes every call. Needs Triton and CUDA (or
    TRITON_INTERPRET=1 on the CPU) and refuses clearly otherwise."""
    return prepare_grouped_mm(a, b, b2, out_dtype=out_dtype, fused=True)


def _triton_decoder(a, n, device):
    """One launch of :func:`.triton_kernels.decode_rows` over every group: returns ``decode() -> [ΣM, K] bf16``."""
    from .triton_groups import group_table, require_triton_cuda

    require_triton_cuda("torch-grouped-mm-fused", device)
    from .triton_kernels import decode_rows

    m = [int(t.shape[0]) for t in a]
    k = int(a[0].shape[1])
    rows = [0, *torch.tensor(m).cumsum(0).tolist()]
    groups = group_table(a, n, rows[:-1], device)
    buf = torch.empty((max(rows[-1], 1), k), dtype=torch.bfloat16, device=device)
    block_r, block_k = 16, 256
    asm = torch.device(device).type == "cuda"  # inline PTX on the GPU; the portable form in the interpreter
    grid = (max(1, -(-max(m) // block_r)), -(-k // block_k), len(a))

    def decode():
        if rows[-1]:
            decode_rows[grid](groups, buf, buf.stride(0), BLOCK_R=block_r, BLOCK_K=block_k, ASM=asm, num_warps=4)
        return buf[: rows[-1]]

    return decode, (groups, buf)


def prepare_grouped_mm(a, b, b2, *, out_dtype=torch.float16, predequant: bool = False, fused: bool = False) -> Runner:
    if not hasattr(torch, "_grouped_mm"):
        raise RuntimeError(f"torch {torch.__version__} has no torch._grouped_mm")
    if len({t.shape[1] for t in a}) != 1 or len({t.shape[0] for t in b}) != 1:
        raise ValueError("torch-grouped-mm needs one N and one K shared by all groups")
    t0 = time.perf_counter()
    dev = a[0].data.device
    wst = torch.stack([_dq(t) for t in b]).transpose(1, 2)  # [G, K, N], N-major as _grouped_mm wants
    wst2 = torch.stack([_dq(t) for t in b2]).transpose(1, 2) if b2 is not None else None
    m = [t.shape[0] for t in a]
    offs = torch.tensor(m, device=dev).cumsum(0).to(torch.int32)
    rows = torch.repeat_interleave(torch.arange(len(a), device=dev), torch.tensor(m, device=dev))
    al = torch.stack(_alphas(a, b))[rows].unsqueeze(1)
    al2 = torch.stack(_alphas(a, b2))[rows].unsqueeze(1) if b2 is not None else None
    c_all = torch.empty((sum(m), b[0].shape[0]), dtype=out_dtype, device=dev)
    bounds = [0, *torch.tensor(m).cumsum(0).tolist()]
    outs = [c_all[bounds[g]: bounds[g + 1]] for g in range(len(a))]

    def gmm(x, w):
        return torch._grouped_mm(x, w, offs=offs).float()

    x_once = _dq_cat(a) if predequant else None
    decode, keep = _triton_decoder(a, [t.shape[0] for t in b], dev) if fused else (None, None)

    def run():
        xa = x_once if predequant else decode() if fused else _dq_cat(a)
        _finish(gmm(xa, wst), gmm(xa, wst2) if wst2 is not None else None, al, al2, c_all)

    held = wst.numel() * 2 * (2 if b2 is not None else 1) + (x_once.numel() * 2 if predequant else 0)
    held += keep[1].numel() * 2 if fused else 0  # the decoded-activation buffer
    try:
        run()  # probe: refuse clearly at prepare time if this GPU/torch cannot run it
    except RuntimeError as e:
        raise RuntimeError(f"torch._grouped_mm is not usable here (torch {torch.__version__}): {e}") from None
    # _grouped_mm returns bf16: its own rounding (2^-9 relative) is about 1.7e-3 normwise, over the
    # 1e-3 check meant for an fp16 result; checked against 4e-3 instead, and labelled so.
    how = (", activations dequantized once at prepare" if predequant else
           ", activations decoded to bf16 by one Triton launch per call" if fused else "")
    return Runner(run, outs, prepare_s=time.perf_counter() - t0, held_bytes=held, tolerance=4e-3, keepalive=keep,
                  notes=f"{'weights and activations' if predequant else 'weights'} held as bf16: {held / 1e6:.0f} MB "
                        f"(3.6x NVFP4){how}; one torch._grouped_mm launch; bf16 result (checked at 4e-3)")


def _dq_cat(a):
    return dequant16(torch.cat([t.data for t in a]), torch.cat([t.scales for t in a]))


def prepare_compile(a, b, b2, *, out_dtype=torch.float16) -> Runner:
    t0 = time.perf_counter()

    mm = mm32_for(a[0].data.device)

    def group(xc, xs, wc, ws, w2c, w2s, alpha, alpha2):
        xa = dequant16(xc, xs)
        acc = mm(xa, dequant16(wc, ws)) * alpha
        if w2c is not None:
            acc = F.silu(acc) * (mm(xa, dequant16(w2c, w2s)) * alpha2)
        return acc.to(out_dtype)

    fn = torch.compile(group, dynamic=True)
    outs, al, al2 = _outputs_and_alphas(a, b, b2, out_dtype)

    def run():
        for g, x in enumerate(a):
            if x.shape[0] == 0:
                continue
            w2 = b2[g] if b2 is not None else None
            outs[g].copy_(fn(x.data, x.scales, b[g].data, b[g].scales, w2.data if w2 else None,
                             w2.scales if w2 else None, al[g], al2[g]))

    run()  # compile now, not in the first timed call
    return Runner(run, outs, prepare_s=time.perf_counter() - t0,
                  notes="torch.compile(dequantize + matmul), dynamic=True; weights dequantized every call; "
                        + mm.__name__)


def probe_scaled_mm_fp4(device="cuda") -> dict:
    """Does ``torch._scaled_mm`` take NVFP4 operands (float4_e2m1fn_x2, blocked E4M3 scales) here?
    The study's round 5B hinged on it; on Hopper it is expected to refuse."""
    from ...formats import swizzle_scales

    info = {"torch": torch.__version__, "device": str(device), "supported": False, "error": ""}
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4 is None:
        info["error"] = "torch has no float4_e2m1fn_x2 dtype"
        return info
    if not torch.cuda.is_available():
        info["error"] = "no CUDA device"
        return info
    info["device"] = torch.cuda.get_device_name(device)
    m = n = k = 128
    a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device=device).view(fp4)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device).view(fp4)
    sa = swizzle_scales(torch.ones(m, k // 16, device=device).to(torch.float8_e4m3fn))
    sb = swizzle_scales(torch.ones(n, k // 16, device=device).to(torch.float8_e4m3fn))
    try:
        torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        info["supported"] = True
    except Exception as e:  # the refusal is the finding: keep its words
        info["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return info
