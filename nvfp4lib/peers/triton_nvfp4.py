"""``backend="triton"``: a Triton grouped NVFP4 GEMM that reads the packed codes and E4M3 scales directly.

Triton has no FP4 MMA on Hopper (``tl.dot_scaled`` with e2m1 needs Blackwell), so each program decodes its A and
B tiles in registers — the code bits placed into bf16 fields (value × 2^-126), one multiply by 2^126 and one by
the block scale, both exact — and runs ``tl.dot`` with fp32 accumulation. One launch for all groups: the same
grouped layout and tile table as the CuTe kernel (:mod:`nvfp4lib.kernels.packing`). The block sizes are chosen
at prepare time by timing a few candidates on the problem at hand (a small autotune; the winner is in ``info``).
"""
from __future__ import annotations

import time

import torch

from ..backends import Runner
from ..kernels.packing import ActivationPacker, stack_weights, tile_table

CANDIDATES = (  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
    (64, 128, 128, 4, 3),
    (128, 128, 128, 8, 3),
    (64, 64, 256, 4, 3),
    (128, 64, 128, 4, 4),
)

_kernel = None


def _build_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def decode(codes, scales, BLOCK_K: tl.constexpr, ROWS: tl.constexpr):
        """codes: [ROWS, BLOCK_K//2] uint8, scales: [ROWS, BLOCK_K//16] uint8 -> [ROWS, BLOCK_K] bf16, exact."""
        c = codes.to(tl.int16)
        lo = ((c & 8) << 12) | ((c & 7) << 6)
        hi = ((c & 0x80) << 8) | ((c & 0x70) << 2)
        v = tl.join(lo, hi).reshape(ROWS, BLOCK_K).to(tl.bfloat16, bitcast=True).to(tl.float32)
        v = v * 8.507059173023462e37  # 2^126: restores the e2m1 value (code 1 was a bf16 subnormal)
        s = scales.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        s = tl.broadcast_to(s[:, :, None], (ROWS, BLOCK_K // 16, 16)).reshape(ROWS, BLOCK_K)
        return (v * s).to(tl.bfloat16)

    @triton.jit
    def grouped_nvfp4(a_ptr, sfa_ptr, b_ptr, sfb_ptr, b2_ptr, sfb2_ptr, c_ptr, tiles_ptr, alpha_ptr,
                      stride_a, stride_sfa, stride_b, stride_sfb, stride_c,
                      DUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        t = tl.program_id(0)
        group = tl.load(tiles_ptr + t * 8 + 0)
        a_row0 = tl.load(tiles_ptr + t * 8 + 1)
        m_valid = tl.load(tiles_ptr + t * 8 + 2)
        n0 = tl.load(tiles_ptr + t * 8 + 3)
        n_valid = tl.load(tiles_ptr + t * 8 + 4)
        b_row0 = tl.load(tiles_ptr + t * 8 + 5)
        k_tiles = tl.load(tiles_ptr + t * 8 + 6)
        rm = tl.arange(0, BLOCK_M)
        rn = tl.arange(0, BLOCK_N)
        kb = tl.arange(0, BLOCK_K // 2)
        ks = tl.arange(0, BLOCK_K // 16)
        a_rows = (a_row0 + rm).to(tl.int64)
        b_rows = (b_row0 + rn).to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, k_tiles):
            a = decode(tl.load(a_ptr + a_rows[:, None] * stride_a + kt * (BLOCK_K // 2) + kb[None, :]),
                       tl.load(sfa_ptr + a_rows[:, None] * stride_sfa + kt * (BLOCK_K // 16) + ks[None, :]),
                       BLOCK_K, BLOCK_M)
            b = decode(tl.load(b_ptr + b_rows[:, None] * stride_b + kt * (BLOCK_K // 2) + kb[None, :]),
                       tl.load(sfb_ptr + b_rows[:, None] * stride_sfb + kt * (BLOCK_K // 16) + ks[None, :]),
                       BLOCK_K, BLOCK_N)
            acc = tl.dot(a, tl.trans(b), acc)
            if DUAL:
                b2 = decode(tl.load(b2_ptr + b_rows[:, None] * stride_b + kt * (BLOCK_K // 2) + kb[None, :]),
                            tl.load(sfb2_ptr + b_rows[:, None] * stride_sfb + kt * (BLOCK_K // 16) + ks[None, :]),
                            BLOCK_K, BLOCK_N)
                acc2 = tl.dot(a, tl.trans(b2), acc2)
        v = acc * tl.load(alpha_ptr + group * 2)
        if DUAL:
            up = acc2 * tl.load(alpha_ptr + group * 2 + 1)
            v = v / (1.0 + tl.exp(-v)) * up
        mask = (rm[:, None] < m_valid) & (rn[None, :] < n_valid)
        out = c_ptr + a_rows[:, None] * stride_c + (n0 + rn)[None, :]
        tl.store(out, v.to(c_ptr.dtype.element_ty), mask=mask)

    return grouped_nvfp4


def _setup(a, b, b2, out_dtype, cand):
    bm, bn, bk, warps, stages = cand
    device = a[0].data.device
    packed = stack_weights([b] if b2 is None else [b, b2], bn, bk)
    m = tuple(t.shape[0] for t in a)
    packer = ActivationPacker(m, packed.k, packed.k_pad, bm, device)
    tiles = tile_table(m, packed.n, packed.k, packer.row_offsets, packed.n_pad, bm, bn, bk, device)
    c_all = torch.empty((packer.rows, max(packed.n)), dtype=out_dtype, device=device)
    outputs = [c_all[o: o + mg, :ng] for o, mg, ng in zip(packer.row_offsets, m, packed.n)]
    alpha = torch.zeros((len(a), 2), dtype=torch.float32, device=device)
    w2 = 1 if b2 is not None else 0
    gs_b = packed.global_scales

    def run():
        gs_a = packer(a)
        alpha[:, 0] = gs_a * gs_b[0]
        alpha[:, 1] = gs_a * gs_b[-1]
        if len(tiles):
            _kernel[(len(tiles),)](
                packer.codes, packer.scales, packed.codes[0], packed.scales[0], packed.codes[w2], packed.scales[w2],
                c_all, tiles, alpha, packer.codes.stride(0), packer.scales.stride(0), packed.codes[0].stride(0),
                packed.scales[0].stride(0), c_all.stride(0), DUAL=b2 is not None, BLOCK_M=bm, BLOCK_N=bn,
                BLOCK_K=bk, num_warps=warps, num_stages=stages)

    return run, outputs, packed.nbytes


def prepare(a, b, b2, *, out_dtype=torch.float16, candidates=CANDIDATES, autotune: bool = True) -> Runner:
    global _kernel
    device = a[0].data.device
    if device.type != "cuda":
        raise RuntimeError(f"the triton backend needs a CUDA GPU; the operands are on {device}")
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError("the triton backend needs the triton package") from e
    if _kernel is None:
        _kernel = _build_kernel()
    t0 = time.perf_counter()
    cands = list(candidates) if autotune else [candidates[0]]
    best = None
    for cand in cands:
        run, outputs, held = _setup(a, b, b2, out_dtype, cand)
        run()  # compile
        torch.cuda.synchronize(device)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(5):
            run()
        e.record()
        torch.cuda.synchronize(device)
        ms = s.elapsed_time(e) / 5
        if best is None or ms < best[0]:
            best = (ms, cand, run, outputs, held)
    _, cand, run, outputs, held = best
    return Runner(run, outputs, prepare_s=time.perf_counter() - t0, held_bytes=held,
                  notes=f"Triton, in-register decode to bf16 + tl.dot; blocks {cand[:3]}, warps {cand[3]}, "
                        f"stages {cand[4]} (fastest of {len(cands)} timed at prepare)",
                  info={"block_m": cand[0], "block_n": cand[1], "block_k": cand[2]})


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
