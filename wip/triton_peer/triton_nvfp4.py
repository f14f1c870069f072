"""``backend="triton"``: Triton grouped NVFP4 GEMMs that read the packed codes and E4M3 scales directly.

Triton has no NVFP4 MMA on Hopper (``tl.dot_scaled`` with e2m1 runs on sm_90 only for MX formats — E8M0 scales per
32 — see :func:`probe_dot_scaled`), so the kernels decode E2M1 × E4M3 to 16 bits in registers, exactly, and run
``tl.dot`` with fp32 accumulation. One launch covers all groups: a tile table (:mod:`nvfp4lib.kernels.packing`)
holds each tile's group, rows and K extent. The global scales multiply the fp32 accumulator. Two kernels:

``kernel="direct"`` (default; measured on the H100): output tiles ``[BLOCK_M tokens, BLOCK_N]``; each program
decodes its A and B tiles (bits placed into bf16 fields, value × 2^-126, then × 2^126 and × the scale in fp32).

``kernel="swap"`` (swap-AB; compiled for sm_90a and checked in Triton's interpreter, not yet run on a GPU):
- the weights' N is the MMA's M and the tokens its N, so a group of 40…256 tokens fills one tile without padding
  to 64-row MMA blocks and every weight element is decoded once per token tile (once for M_g ≤ BLOCK_T);
- the decoded weights feed ``wgmma`` from registers (no shared-memory round trip); codes arrive by TMA;
- the decode is inline PTX on 4 codes bytes at a time: the byte pairs spread to 16-bit lanes (``prmt``), sign and
  magnitude bits shifted into an fp16 word (value × 2^-14), then two exact ``mul.f16x2``: by 2^14 and by the
  scale (``cvt.f16x2.e4m3x2``) — about 3.5 instructions per element against ~8 for generic arithmetic;
- the activations are decoded once per call to fp16 by a small kernel (they are small), not once per weight tile;
- K is permuted inside each ``BLOCK_K`` chunk — even elements (low nibbles) then odd ones (high nibbles) — so
  that a byte's two codes land in two separate ``tl.dot`` calls and no interleave (join/reshape) is needed; the
  activations are written in the same order, and a dot product does not depend on the order of K.

Block sizes are chosen at prepare time by timing a few candidates on the problem at hand (the winner is in
``info``).
"""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import torch

from ..backends import Runner
from ..kernels.packing import ActivationPacker, stack_weights, tile_table

KERNELS = ("direct", "swap")
CANDIDATES = (  # direct: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
    (64, 128, 128, 4, 3),
    (128, 128, 128, 8, 3),
    (64, 64, 256, 4, 3),
    (128, 64, 128, 4, 4),
)
SWAP_CANDIDATES = (  # swap: (BLOCK_N weights rows, BLOCK_T tokens, BLOCK_K, num_warps, num_stages)
    (128, 128, 128, 8, 3),
    (128, 64, 128, 8, 3),
    (64, 128, 128, 4, 3),
    (128, 128, 256, 8, 2),
    (128, 256, 128, 8, 2),
)
# Registers: a [128, 256] fp32 accumulator per 8 warps is 128 per thread; the dual form holds two.
SWAP_DUAL_CANDIDATES = tuple(c for c in SWAP_CANDIDATES if c[1] <= 128)
ACT_DECODE_ROWS = 32

# E2M1 x E4M3 -> fp16, exact, 4 codes bytes (8 codes) and their 4 scale bytes per call. Elementwise: output element
# i (low, high nibble) depends on byte i and scale byte i only. A byte pair spread to 16-bit lanes (prmt), sign
# (bit 3 / 7) to bit 15, magnitude (bits 2..0 / 6..4) to bits 11..9: the fp16 word is the E2M1 value x 2^-14
# (code 1 is an fp16 subnormal); x 2^14 then x the scale are exact fp16 products (<= 6 significant bits, <= 2688).
_DECODE_PTX = """
{
.reg .b32 q01, q23, c01, c23, t, u, k;
.reg .b16 sl, sh;
mov.b32 {sl, sh}, $5;
cvt.rn.f16x2.e4m3x2 c01, sl;
cvt.rn.f16x2.e4m3x2 c23, sh;
mov.b32 k, 0x74007400;
prmt.b32 q01, $4, 0, 0x7170;
prmt.b32 q23, $4, 0, 0x7372;
""" + "".join(
    f"""shl.b32 t, {q}, {sign};
shl.b32 u, {q}, {mag};
and.b32 u, u, 0x0E000E00;
lop3.b32 t, t, 0x80008000, u, 0xEA;
mul.rn.f16x2 t, t, k;
mul.rn.f16x2 ${out}, t, {c};
""" for out, (q, c, sign, mag) in enumerate([("q01", "c01", 12, 9), ("q23", "c23", 12, 9),
                                               ("q01", "c01", 8, 5), ("q23", "c23", 8, 5)])) + "}"

_KERNELS: dict = {}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _build_kernels():
    """Compile-on-first-use kernels (the interpreter, TRITON_INTERPRET=1, gets its own set)."""
    key = _interpreting()
    if key in _KERNELS:
        return _KERNELS[key]
    import triton
    import triton.language as tl

    decode_ptx = tl.constexpr(_DECODE_PTX)

    @triton.jit
    def decode_bf16(codes, scales, BLOCK_K: tl.constexpr, ROWS: tl.constexpr):
        """direct: [ROWS, BLOCK_K//2] uint8 codes, [ROWS, BLOCK_K//16] uint8 scales -> [ROWS, BLOCK_K] bf16."""
        c = codes.to(tl.int16)
        lo = ((c & 8) << 12) | ((c & 7) << 6)
        hi = ((c & 0x80) << 8) | ((c & 0x70) << 2)
        v = tl.join(lo, hi).reshape(ROWS, BLOCK_K).to(tl.bfloat16, bitcast=True).to(tl.float32)
        v = v * 8.507059173023462e37  # 2^126: restores the e2m1 value (code 1 was a bf16 subnormal)
        s = scales.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        s = tl.broadcast_to(s[:, :, None], (ROWS, BLOCK_K // 16, 16)).reshape(ROWS, BLOCK_K)
        return (v * s).to(tl.bfloat16)

    @triton.jit
    def decode_f16_pair(codes, scales, PTX: tl.constexpr):
        """swap: uint8 codes and one uint8 E4M3 scale per byte (same shape) -> (low-nibble, high-nibble) fp16."""
        if PTX:
            lo, hi = tl.inline_asm_elementwise(decode_ptx, "=r,=r,=r,=r,r,r", [codes, scales],
                                               dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
        else:  # the same bits in plain Triton (for the interpreter)
            c = codes.to(tl.uint16)
            s = scales.to(tl.float8e4nv, bitcast=True).to(tl.float16)
            lo = (((c & 0x8) << 12) | ((c & 0x7) << 9)).to(tl.float16, bitcast=True) * 16384.0 * s
            hi = (((c & 0x80) << 8) | ((c & 0x70) << 5)).to(tl.float16, bitcast=True) * 16384.0 * s
        return lo, hi

    @triton.jit
    def per_byte(s, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
        """[ROWS, BLOCK_K//16] scales -> [ROWS, BLOCK_K//2]: the 8 bytes (16 codes) of a block share one scale."""
        return tl.broadcast_to(s[:, :, None], (ROWS, BLOCK_K // 16, 8)).reshape(ROWS, BLOCK_K // 2)

    @triton.jit
    def tile_row(tiles_ptr, t):
        row = tiles_ptr + t * 8
        return (tl.load(row), tl.load(row + 1), tl.load(row + 2), tl.load(row + 3), tl.load(row + 4),
                tl.load(row + 5), tl.load(row + 6))

    @triton.jit
    def epilogue(acc, acc2, alpha_ptr, group, DUAL: tl.constexpr):
        v = acc * tl.load(alpha_ptr + group * 2)
        if DUAL:
            up = acc2 * tl.load(alpha_ptr + group * 2 + 1)
            v = v / (1.0 + tl.exp(-v)) * up
        return v

    @triton.jit
    def grouped_direct(a_ptr, sfa_ptr, b_ptr, sfb_ptr, b2_ptr, sfb2_ptr, c_ptr, tiles_ptr, alpha_ptr,
                       stride_a, stride_sfa, stride_b, stride_sfb, stride_c,
                       DUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        group, a_row0, m_valid, n0, n_valid, b_row0, k_tiles = tile_row(tiles_ptr, tl.program_id(0))
        rm = tl.arange(0, BLOCK_M)
        rn = tl.arange(0, BLOCK_N)
        kb = tl.arange(0, BLOCK_K // 2)
        ks = tl.arange(0, BLOCK_K // 16)
        a_rows = (a_row0 + rm).to(tl.int64)
        b_rows = (b_row0 + rn).to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, k_tiles):
            a = decode_bf16(tl.load(a_ptr + a_rows[:, None] * stride_a + kt * (BLOCK_K // 2) + kb[None, :]),
                            tl.load(sfa_ptr + a_rows[:, None] * stride_sfa + kt * (BLOCK_K // 16) + ks[None, :]),
                            BLOCK_K, BLOCK_M)
            b = decode_bf16(tl.load(b_ptr + b_rows[:, None] * stride_b + kt * (BLOCK_K // 2) + kb[None, :]),
                            tl.load(sfb_ptr + b_rows[:, None] * stride_sfb + kt * (BLOCK_K // 16) + ks[None, :]),
                            BLOCK_K, BLOCK_N)
            acc = tl.dot(a, tl.trans(b), acc)
            if DUAL:
                b2 = decode_bf16(
                    tl.load(b2_ptr + b_rows[:, None] * stride_b + kt * (BLOCK_K // 2) + kb[None, :]),
                    tl.load(sfb2_ptr + b_rows[:, None] * stride_sfb + kt * (BLOCK_K // 16) + ks[None, :]),
                    BLOCK_K, BLOCK_N)
                acc2 = tl.dot(a, tl.trans(b2), acc2)
        v = epilogue(acc, acc2, alpha_ptr, group, DUAL)
        mask = (rm[:, None] < m_valid) & (rn[None, :] < n_valid)
        out = c_ptr + a_rows[:, None] * stride_c + (n0 + rn)[None, :]
        tl.store(out, v.to(c_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def decode_activations(codes_ptr, sf_ptr, out_ptr, rows, stride_c, stride_s, stride_o,
                           BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, PTX: tl.constexpr):
        """[rows, Kp/2] codes -> [rows, Kp] fp16, each BLOCK_K chunk as (even elements, odd elements)."""
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        kt = tl.program_id(1)
        j = tl.arange(0, BLOCK_K // 2)
        ok = (r < rows)[:, None]
        rr = r.to(tl.int64)[:, None]
        c = tl.load(codes_ptr + rr * stride_c + kt * (BLOCK_K // 2) + j[None, :], mask=ok, other=0)
        s = tl.load(sf_ptr + rr * stride_s + kt * (BLOCK_K // 16) + (j // 8)[None, :], mask=ok, other=0)
        lo, hi = decode_f16_pair(c, s, PTX)
        o = out_ptr + rr * stride_o + kt * BLOCK_K + j[None, :]
        tl.store(o, lo, mask=ok)
        tl.store(o + BLOCK_K // 2, hi, mask=ok)

    @triton.jit
    def grouped_swap(w_desc, sfw_ptr, w2_desc, sfw2_ptr, x_desc, c_ptr, tiles_ptr, alpha_ptr, stride_sfw, stride_c,
                     DUAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
                     PTX: tl.constexpr):
        """acc[BLOCK_N weight rows, BLOCK_T tokens] = W·Xᵀ: weights decoded in registers, X pre-decoded fp16."""
        group, x_row0, m_valid, n0, n_valid, w_row0, k_tiles = tile_row(tiles_ptr, tl.program_id(0))
        rn = tl.arange(0, BLOCK_N)
        rt = tl.arange(0, BLOCK_T)
        sp = (w_row0 + rn).to(tl.int64)[:, None] * stride_sfw + tl.arange(0, BLOCK_K // 16)[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
        for kt in range(0, k_tiles):
            xe = x_desc.load([x_row0, kt * BLOCK_K])  # even K elements of the chunk
            xo = x_desc.load([x_row0, kt * BLOCK_K + BLOCK_K // 2])  # odd ones
            s = per_byte(tl.load(sfw_ptr + sp + kt * (BLOCK_K // 16)), BLOCK_N, BLOCK_K)
            wl, wh = decode_f16_pair(w_desc.load([w_row0, kt * (BLOCK_K // 2)]), s, PTX)
            acc = tl.dot(wl, xe.T, acc)
            acc = tl.dot(wh, xo.T, acc)
            if DUAL:
                s2 = per_byte(tl.load(sfw2_ptr + sp + kt * (BLOCK_K // 16)), BLOCK_N, BLOCK_K)
                ul, uh = decode_f16_pair(w2_desc.load([w_row0, kt * (BLOCK_K // 2)]), s2, PTX)
                acc2 = tl.dot(ul, xe.T, acc2)
                acc2 = tl.dot(uh, xo.T, acc2)
        v = epilogue(acc, acc2, alpha_ptr, group, DUAL)
        mask = (rn[:, None] < n_valid) & (rt[None, :] < m_valid)
        out = c_ptr + (x_row0 + rt).to(tl.int64)[None, :] * stride_c + (n0 + rn)[:, None]
        tl.store(out, v.to(c_ptr.dtype.element_ty), mask=mask)

    if key:  # the interpreter resolves a kernel's callees in its module's globals, not in this closure
        globals().update(decode_bf16=decode_bf16, decode_f16_pair=decode_f16_pair, per_byte=per_byte,
                         tile_row=tile_row, epilogue=epilogue, decode_ptx=decode_ptx)
    _KERNELS[key] = SimpleNamespace(direct=grouped_direct, swap=grouped_swap, decode_activations=decode_activations)
    return _KERNELS[key]


def _common(a, b, b2, out_dtype, tile_t, tile_n, tile_k):
    """Packed weights, the activation packer, tile table, outputs and the global-scale products for one config."""
    device = a[0].data.device
    packed = stack_weights([b] if b2 is None else [b, b2], tile_n, tile_k)
    m = tuple(t.shape[0] for t in a)
    packer = ActivationPacker(m, packed.k, packed.k_pad, tile_t, device)
    tiles = tile_table(m, packed.n, packed.k, packer.row_offsets, packed.n_pad, tile_t, tile_n, tile_k, device)
    c_all = torch.empty((packer.rows, max(packed.n)), dtype=out_dtype, device=device)
    outputs = [c_all[o: o + mg, :ng] for o, mg, ng in zip(packer.row_offsets, m, packed.n)]
    alpha = torch.zeros((len(a), 2), dtype=torch.float32, device=device)
    gs_b = packed.global_scales

    def pack_call():
        gs_a = packer(a)
        alpha[:, 0] = gs_a * gs_b[0]
        alpha[:, 1] = gs_a * gs_b[-1]
        return packer

    return SimpleNamespace(packed=packed, packer=packer, tiles=tiles, c_all=c_all, outputs=outputs, alpha=alpha,
                           pack_call=pack_call, w2=1 if b2 is not None else 0, dual=b2 is not None)


def _setup_direct(a, b, b2, out_dtype, cand):
    bm, bn, bk, warps, stages = cand
    kern = _build_kernels().direct
    s = _common(a, b, b2, out_dtype, bm, bn, bk)
    p, w2 = s.packed, s.w2

    def run():
        act = s.pack_call()
        if len(s.tiles):
            kern[(len(s.tiles),)](
                act.codes, act.scales, p.codes[0], p.scales[0], p.codes[w2], p.scales[w2], s.c_all, s.tiles, s.alpha,
                act.codes.stride(0), act.scales.stride(0), p.codes[0].stride(0), p.scales[0].stride(0),
                s.c_all.stride(0), DUAL=s.dual, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                num_stages=stages)

    return run, s.outputs, p.nbytes


def _weight_tile_major(tiles: torch.Tensor, n_pad: int) -> torch.Tensor:
    """Reorder the tile table so that the token tiles sharing one weight tile run side by side (L2 reuse)."""
    if len(tiles) == 0:
        return tiles
    key = tiles[:, 0].long() * n_pad + tiles[:, 3].long()
    return tiles[torch.sort(key, stable=True).indices].contiguous()


def _setup_swap(a, b, b2, out_dtype, cand):
    from triton.tools.tensor_descriptor import TensorDescriptor

    bn, bt, bk, warps, stages = cand
    ks = _build_kernels()
    ptx = not _interpreting()
    s = _common(a, b, b2, out_dtype, bt, bn, bk)
    p, w2 = s.packed, s.w2
    tiles = _weight_tile_major(s.tiles, p.n_pad)
    rows = s.packer.rows
    x16 = torch.zeros((rows, p.k_pad), dtype=torch.float16, device=a[0].data.device)
    x_desc = TensorDescriptor.from_tensor(x16, [bt, bk // 2])
    w_desc = [TensorDescriptor.from_tensor(c, [bn, bk // 2]) for c in p.codes]
    act_grid = (-(-rows // ACT_DECODE_ROWS), p.k_pad // bk)

    def run():
        act = s.pack_call()
        ks.decode_activations[act_grid](act.codes, act.scales, x16, rows, act.codes.stride(0), act.scales.stride(0),
                                        x16.stride(0), BLOCK_R=ACT_DECODE_ROWS, BLOCK_K=bk, PTX=ptx)
        if len(tiles):
            ks.swap[(len(tiles),)](
                w_desc[0], p.scales[0], w_desc[w2], p.scales[w2], x_desc, s.c_all, tiles, s.alpha,
                p.scales[0].stride(0), s.c_all.stride(0), DUAL=s.dual, BLOCK_N=bn, BLOCK_T=bt, BLOCK_K=bk, PTX=ptx,
                num_warps=warps, num_stages=stages)

    # held: the NVFP4 weights as packed, plus the per-call fp16 activation buffer
    return run, s.outputs, p.nbytes + x16.numel() * 2


_SETUPS = {"direct": _setup_direct, "swap": _setup_swap}


def _time_ms(run, device, reps: int = 5) -> float:
    run()  # compile
    torch.cuda.synchronize(device)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        run()
    e.record()
    torch.cuda.synchronize(device)
    return s.elapsed_time(e) / reps


def prepare(a, b, b2, *, out_dtype=torch.float16, kernel: str = "direct", candidates=None,
            autotune: bool = True) -> Runner:
    """``kernel``: "direct" or "swap" (see the module docstring); ``candidates``: block-size tuples to time
    (default: that kernel's list); ``autotune=False`` takes the first candidate untimed."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown triton kernel {kernel!r}; known: {', '.join(KERNELS)}")
    device = a[0].data.device
    if device.type != "cuda":
        raise RuntimeError(f"the triton backend needs a CUDA GPU; the operands are on {device}")
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError("the triton backend needs the triton package") from e
    if kernel == "swap" and torch.cuda.get_device_capability(device) < (9, 0):
        raise RuntimeError("triton kernel='swap' needs sm_90 or newer (TMA descriptors, e4m3 conversions)")
    if candidates is None:
        candidates = CANDIDATES if kernel == "direct" else (SWAP_DUAL_CANDIDATES if b2 is not None
                                                            else SWAP_CANDIDATES)
    setup = _SETUPS[kernel]
    t0 = time.perf_counter()
    cands = list(candidates) if autotune else [candidates[0]]
    best = None
    for cand in cands:
        run, outputs, held = setup(a, b, b2, out_dtype, cand)
        ms = _time_ms(run, device) if len(cands) > 1 else 0.0
        if best is None or ms < best[0]:
            best = (ms, cand, run, outputs, held)
    _, cand, run, outputs, held = best
    if len(cands) == 1:
        run()  # compile now, not in the first timed call
    how = {"direct": "in-register decode of A and B to bf16 + tl.dot",
           "swap": "swap-AB: weights decoded in registers (PTX, fp16) as the wgmma A operand, activations "
                   "decoded once per call"}[kernel]
    names = ("block_m", "block_n", "block_k") if kernel == "direct" else ("block_n", "block_t", "block_k")
    return Runner(run, outputs, prepare_s=time.perf_counter() - t0, held_bytes=held,
                  notes=f"Triton {kernel}, {how}; blocks {cand[:3]}, warps {cand[3]}, stages {cand[4]} "
                        f"(fastest of {len(cands)} timed at prepare)",
                  info={"kernel": kernel, **dict(zip(names, cand[:3])), "num_warps": cand[3],
                        "num_stages": cand[4]})


def probe_dot_scaled(device="cuda") -> dict:
    """Does this Triton's ``tl.dot_scaled`` take e2m1 operands here, and with which scale format?

    NVFP4 needs E4M3 scales per 16 elements; ``tl.dot_scaled`` is specified for MX formats (E8M0 scales per 32).
    We try e2m1 × e2m1 with E8M0 scales on a 128×128×128 problem and report what happens."""
    info = {"probe": "triton tl.dot_scaled e2m1", "supported": False, "error": ""}
    try:
        import triton
        import triton.language as tl

        info["triton"] = triton.__version__

        @triton.jit
        def k(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
            rm = tl.arange(0, M)
            rn = tl.arange(0, N)
            rk = tl.arange(0, K // 2)
            rs = tl.arange(0, K // 32)
            a = tl.load(a_ptr + rm[:, None] * (K // 2) + rk[None, :])
            b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
            sa = tl.load(as_ptr + rm[:, None] * (K // 32) + rs[None, :])
            sb = tl.load(bs_ptr + rn[:, None] * (K // 32) + rs[None, :])
            c = tl.dot_scaled(a, sa, "e2m1", b, sb, "e2m1")
            tl.store(c_ptr + rm[:, None] * N + rn[None, :], c)

        m = n = kk = 128
        a = torch.randint(0, 256, (m, kk // 2), dtype=torch.uint8, device=device)
        b = torch.randint(0, 256, (kk // 2, n), dtype=torch.uint8, device=device)
        sa = torch.full((m, kk // 32), 127, dtype=torch.uint8, device=device)
        sb = torch.full((n, kk // 32), 127, dtype=torch.uint8, device=device)
        c = torch.empty((m, n), dtype=torch.float32, device=device)
        k[(1,)](a, sa, b, sb, c, M=m, N=n, K=kk)
        torch.cuda.synchronize()
        info["supported"] = True
        info["note"] = "ran with E8M0 scales per 32 (MXFP4); NVFP4's E4M3 scales per 16 are not its input format"
    except Exception as e:  # the refusal is the finding
        info["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return info
