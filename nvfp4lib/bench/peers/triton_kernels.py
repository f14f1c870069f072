"""The Triton kernels of the Triton peers (imported only by them, after checking that Triton is there).

- ``decode_bytes``: the exact E2M1 × E4M3 → fp16 decode of :mod:`.triton_groups` (3 integer ops + 1 fp16 multiply
  per element);
- ``grouped_nvfp4``: the grouped GEMM of ``backend="triton"`` (:mod:`.triton_nvfp4`);
- ``decode_rows``: every group's activations decoded to 16-bit rows in one launch (``torch-grouped-mm-fused``).

Both kernels read the activations through the per-group table of :func:`.triton_groups.group_table` (columns:
codes, scales, global scale addresses, the two row strides, M, K, N, first output row).
"""
import triton
import triton.language as tl

from . import triton_groups

DECODE_PTX = tl.constexpr(triton_groups.DECODE_PTX)


@triton.jit
def decode_bytes(codes, scales, ROWS: tl.constexpr, BYTES: tl.constexpr, ASM: tl.constexpr):
    """codes uint8 [ROWS, BYTES], scales uint8 (E4M3 bytes) [ROWS, BYTES // 8] -> (even, odd) fp16 [ROWS, BYTES]:
    the low- and high-nibble elements, each value × scale × 2^-7, exact. ``ASM``: the bit placement as inline PTX
    (:data:`DECODE_PTX`, GPU only), else as portable Triton integer operations (also in the interpreter)."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise(DECODE_PTX, "=r,=r,=r,=r,r", [codes], dtype=(tl.float16, tl.float16),
                                           is_pure=True, pack=4)
    else:
        c = codes.to(tl.uint16)
        lo = (((c & 0x08) << 12) | ((c & 0x07) << 9)).to(tl.float16, bitcast=True)
        hi = (((c & 0x80) << 8) | ((c & 0x70) << 5)).to(tl.float16, bitcast=True)
    s = scales.to(tl.float8e4nv, bitcast=True).to(tl.float16) * 128.0
    s = tl.broadcast_to(s[:, :, None], (ROWS, BYTES // 8, 8)).reshape(ROWS, BYTES)
    return lo * s, hi * s


@triton.jit
def load_raw(codes, scales, rows, stride_c, stride_s, kt, k, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The code and scale bytes of rows ``rows``, K tile ``kt``: uint8 [ROWS, BLOCK_K // 2], [ROWS, BLOCK_K // 16].
    (The caller states the alignment of addresses and strides with ``tl.multiple_of``: inside this helper Triton
    would not see it, and the loads would be byte by byte.)"""
    cb = kt * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    cs = kt * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16)
    pc = codes + rows[:, None] * stride_c + cb[None, :]
    ps = scales + rows[:, None] * stride_s + cs[None, :]
    if EVEN_K:
        c = tl.load(pc)
        s = tl.load(ps)
    else:
        c = tl.load(pc, mask=(cb < k // 2)[None, :], other=0)
        s = tl.load(ps, mask=(cs < k // 16)[None, :], other=0)
    return c, s


@triton.jit
def decode_tile(c, s, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr):
    """Raw bytes of :func:`load_raw` -> fp16 [ROWS, BLOCK_K] (value × scale × 2^-7)."""
    lo, hi = decode_bytes(c, s, ROWS, BLOCK_K // 2, ASM)
    return tl.join(lo, hi).reshape(ROWS, BLOCK_K)


@triton.jit
def grouped_nvfp4(groups_ptr, tiles_ptr, b_ptr, sfb_ptr, b2_ptr, sfb2_ptr, gsb_ptr, c_ptr,
                  stride_b, stride_sfb, stride_c, n_pad, post,
                  DUAL: tl.constexpr, SWAP: tl.constexpr, EVEN_K: tl.constexpr, ALIGN_A: tl.constexpr,
                  ALIGN_SFA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  ASM: tl.constexpr):
    """One program per output tile (tiles_ptr: int32 (group, m0, n0, 0) rows). ``post`` (2^14) undoes the two
    operands' 2^-7; the product of the fp32 global scales multiplies the fp32 accumulator. (A register double
    buffer of the next K tile's bytes was tried on the H100: no faster single, spills in the dual form.)"""
    t = tl.program_id(0)
    g = tl.load(tiles_ptr + t * 4)
    m0 = tl.load(tiles_ptr + t * 4 + 1)
    n0 = tl.load(tiles_ptr + t * 4 + 2)
    row = groups_ptr + g * 10
    # the alignments the host checked (ALIGN_*: addresses and strides of every group), so that loads are vectorized
    a_codes = tl.multiple_of(tl.load(row + 0).to(tl.pointer_type(tl.uint8)), ALIGN_A)
    a_scales = tl.multiple_of(tl.load(row + 1).to(tl.pointer_type(tl.uint8)), ALIGN_SFA)
    gs_a = tl.load(tl.load(row + 2).to(tl.pointer_type(tl.float32)))
    stride_a = tl.multiple_of(tl.load(row + 3), ALIGN_A)
    stride_sfa = tl.multiple_of(tl.load(row + 4), ALIGN_SFA)
    stride_b = tl.multiple_of(stride_b, 16)  # K_pad / 2, K_pad a multiple of BLOCK_K
    stride_sfb = tl.multiple_of(stride_sfb, BLOCK_K // 16)
    m = tl.load(row + 5).to(tl.int32)
    k = tl.load(row + 6).to(tl.int32)
    n = tl.load(row + 7).to(tl.int32)
    rm = m0 + tl.arange(0, BLOCK_M)
    rn = n0 + tl.arange(0, BLOCK_N)
    a_rows = tl.minimum(rm, m - 1).to(tl.int64)  # rows past M re-read row M-1 and are never stored
    b_rows = (g * n_pad + rn).to(tl.int64)  # weights are zero-padded to n_pad rows and to whole K tiles
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros_like(acc)
    for kt in range(0, tl.cdiv(k, BLOCK_K)):
        ac, as_ = load_raw(a_codes, a_scales, a_rows, stride_a, stride_sfa, kt, k, EVEN_K, BLOCK_K)
        bc, bs = load_raw(b_ptr, sfb_ptr, b_rows, stride_b, stride_sfb, kt, k, True, BLOCK_K)
        a = decode_tile(ac, as_, BLOCK_M, BLOCK_K, ASM)
        b = decode_tile(bc, bs, BLOCK_N, BLOCK_K, ASM)
        if SWAP:
            acc = tl.dot(b, tl.trans(a), acc)
        else:
            acc = tl.dot(a, tl.trans(b), acc)
        if DUAL:
            b2c, b2s = load_raw(b2_ptr, sfb2_ptr, b_rows, stride_b, stride_sfb, kt, k, True, BLOCK_K)
            b2 = decode_tile(b2c, b2s, BLOCK_N, BLOCK_K, ASM)
            if SWAP:
                acc2 = tl.dot(b2, tl.trans(a), acc2)
            else:
                acc2 = tl.dot(a, tl.trans(b2), acc2)
    v = acc * (gs_a * tl.load(gsb_ptr + g * 2) * post)
    if DUAL:
        up = acc2 * (gs_a * tl.load(gsb_ptr + g * 2 + 1) * post)
        v = v / (1.0 + tl.exp(-v)) * up
    if SWAP:
        v = tl.trans(v)
    out = c_ptr + (tl.load(row + 8) + rm)[:, None].to(tl.int64) * stride_c + rn[None, :]
    tl.store(out, v.to(c_ptr.dtype.element_ty), mask=(rm < m)[:, None] & (rn < n)[None, :])


@triton.jit
def decode_rows(groups_ptr, out_ptr, stride_out, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr):
    """Grid (row blocks of the largest M, K blocks of the largest K, groups): group g's rows, decoded to
    value × scale (exact in bf16 and fp16; no global scale), at output rows out_row0 + r. Programs past their
    group's M or K return at once."""
    g = tl.program_id(2)
    row = groups_ptr + g * 10
    m = tl.load(row + 5)
    k = tl.load(row + 6)
    r0 = tl.program_id(0) * BLOCK_R
    k0 = tl.program_id(1) * BLOCK_K
    if (r0 >= m) | (k0 >= k):
        return
    codes = tl.load(row + 0).to(tl.pointer_type(tl.uint8))
    scales = tl.load(row + 1).to(tl.pointer_type(tl.uint8))
    rows = (r0 + tl.arange(0, BLOCK_R)).to(tl.int64)
    cb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    cs = k0 // 16 + tl.arange(0, BLOCK_K // 16)
    rmask = (rows < m)[:, None]
    c = tl.load(codes + rows[:, None] * tl.load(row + 3) + cb[None, :], mask=rmask & (cb < k // 2)[None, :],
                other=0)
    s = tl.load(scales + rows[:, None] * tl.load(row + 4) + cs[None, :], mask=rmask & (cs < k // 16)[None, :],
                other=0)
    lo, hi = decode_bytes(c, s, BLOCK_R, BLOCK_K // 2, ASM)
    v = tl.join(lo, hi).reshape(BLOCK_R, BLOCK_K).to(tl.float32) * 128.0  # undo the decode's 2^-7: exact
    cols = k0 + tl.arange(0, BLOCK_K)
    out = out_ptr + (tl.load(row + 8) + rows)[:, None] * stride_out + cols[None, :]
    tl.store(out, v.to(out_ptr.dtype.element_ty), mask=rmask & (cols < k)[None, :])
