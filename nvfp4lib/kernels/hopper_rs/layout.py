"""The weight prepack and the register decode of the swap-AB Hopper kernel (pure torch: no GPU, no cutlass).

With ``swap_ab`` the weights are wgmma's A operand, taken **from registers**: each thread of a
warpgroup decodes exactly the fp16 values its wgmma fragment holds, and decoded weights never
touch shared memory. For that, the weights are re-ordered once, offline (:func:`prepack_weights`),
so that one thread's codes for 64 K elements are 16 contiguous bytes and its scales 8:

- a *unit* is 64 weight rows × 64 K of one matrix, 2304 bytes: 2048 bytes of codes (thread t of
  the warpgroup owns bytes ``16t .. 16t+15``: one 32-bit word per k16 step j) and 256 bytes of
  E4M3 scales (entry ``8w + g``, 8 bytes: ``(s[row g][j], s[row g+8][j])`` for j = 0..3);
- thread ``t = 32w + 4g + c`` holds, per k16 step, rows ``r = 16w + g`` and ``r + 8`` at K columns
  ``2c, 2c+1, 2c+8, 2c+9``: wgmma's register fragment for A (PTX ISA, m64nNk16 f16);
- the 8 codes of a word are placed so that the decode is 9 integer instructions and 4 fp16x2
  multiplies (:data:`RS_WORD_PTX`): byte b of the word holds one code ``x`` at bits 1-3 (magnitude)
  and 7 (sign) — already where an fp16 high byte wants them — and one code ``y`` at bits 4-6 and 0;
  ``(x, y)`` are (row g+8, col 2c | 2c+8), (row g, 2c | 2c+8), (row g+8, 2c+1 | 2c+9),
  (row g, 2c+1 | 2c+9) for bytes 0..3;
- units are grouped into CTA blocks of ``nwg × blocks`` units (``blocks`` 64-row units per warpgroup):
  consecutive 64-row units of one matrix, or the same rows of B1 and B2 (the dual GEMM: warpgroup 0
  computes the gate, warpgroup 1 the up projection). The tensor is ``[ctas, K/64, nwg·blocks, 2304]``,
  so one pipeline stage (``tile_k`` K of one CTA block) is contiguous.

The decode of one word: ``r0 = w & F``, ``r1 = (w << 8) & F``, ``t = lop3(w << 7, w >> 3, 0x80808080)``,
``r2 = t & F``, ``r3 = (t << 8) & F`` with ``F = 0x8E008E00`` (sign and magnitude of both fp16 halves)
gives fp16x2 fields worth e2m1 × 2^-14; times the row's scale × 2^7 (exact, as in the smem kernel) each
operand is e2m1 × scale × 2^-7. :func:`emulate_rs_decode` runs this arithmetic on the CPU.
"""
from __future__ import annotations

import torch

UNIT_ROWS = 64  # weight rows per warpgroup (wgmma's M)
UNIT_K = 64  # K elements per unit (16 code bytes per thread)
UNIT_CODE_BYTES = 2048
UNIT_BYTES = 2304  # codes + 256 scale bytes
FIELDS = 0x8E008E00  # sign and magnitude bits of both fp16 halves
SIGN_BITS = 0x80808080
SCALE_FACTOR = 0x58005800  # fp16x2 (2^7, 2^7)


def _byte(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x at bits 1-3 (+ sign at 7), y at bits 4-6 (+ sign at 0)."""
    return ((x & 7) << 1) | ((x >> 3) << 7) | (y >> 3) | ((y & 7) << 4)


def prepack_units(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Natural-order codes ``[R, K/2]`` and scale bytes ``[R, K/16]`` (R % 64 == 0, K % 64 == 0) of one
    matrix -> units ``[R/64, K/64, 2304]`` uint8."""
    rows, kb = codes.shape
    k = 2 * kb
    if rows % UNIT_ROWS or k % UNIT_K or tuple(scales.shape) != (rows, k // 16):
        raise ValueError(f"prepack_units needs rows % 64 == 0, K % 64 == 0 and scales [rows, K/16]; got codes "
                         f"{tuple(codes.shape)}, scales {tuple(scales.shape)}")
    rb, kc = rows // UNIT_ROWS, k // UNIT_K
    nib = torch.stack((codes & 0xF, codes >> 4), dim=-1).reshape(rows, k)
    # row = 16w + 8h + g ; k = 16j + 8q + 2c + e
    nib = nib.reshape(rb, 4, 2, 8, kc, 4, 2, 4, 2)  # [rb, w, h, g, kc, j, q, c, e]
    byte = _byte(nib[:, :, :, :, :, :, 0], nib[:, :, :, :, :, :, 1])  # [rb, w, h, g, kc, j, c, e]
    # byte index within the word: 2e + (1 - h)
    byte = byte.flip(2).permute(0, 4, 1, 3, 6, 5, 7, 2)  # [rb, kc, w, g, c, j, e, h']
    code_part = byte.reshape(rb, kc, UNIT_CODE_BYTES)
    s = scales.reshape(rb, 4, 2, 8, kc, 4)  # [rb, w, h, g, kc, j]
    scale_part = s.permute(0, 4, 1, 3, 5, 2).reshape(rb, kc, 256)  # [rb, kc, w, g, j, h]
    return torch.cat((code_part, scale_part), dim=2).contiguous()


def prepack_weights(matrices: list[tuple[torch.Tensor, torch.Tensor]], nwg: int, blocks: int = 1) -> torch.Tensor:
    """The kernel's weight tensor ``[ctas, K/64, nwg * blocks, 2304]`` from one or two (codes, scales) matrices of
    ``R`` rows each; the third dim is ordered (warpgroup, block). One matrix: a CTA covers ``nwg * blocks``
    consecutive 64-row units, warpgroup w the ``blocks`` units from ``w * blocks``. Two (dual, ``nwg`` = 2): a CTA
    covers the same ``64 * blocks`` rows of each matrix, warpgroup 0 those of the first (gate), 1 of the second."""
    units = [prepack_units(c, s) for c, s in matrices]
    per = nwg * blocks
    if len(units) == 1:
        u = units[0]
        if u.shape[0] % per:
            raise ValueError(f"{u.shape[0]} units of 64 rows do not split into CTA blocks of {per}")
        ctas = u.reshape(u.shape[0] // per, per, *u.shape[1:])
    elif len(units) == 2 and nwg == 2:
        u0, u1 = units
        if u0.shape[0] % blocks:
            raise ValueError(f"{u0.shape[0]} units of 64 rows do not split into CTA blocks of {blocks}")
        ctas = torch.stack([x.reshape(x.shape[0] // blocks, blocks, *x.shape[1:]) for x in units], dim=1)
        ctas = ctas.reshape(ctas.shape[0], per, *ctas.shape[3:])
    else:
        raise ValueError(f"prepack_weights: {len(units)} matrices with nwg={nwg}: supported are one matrix, or "
                         "two (gate, up) with nwg=2")
    return ctas.permute(0, 2, 1, 3).contiguous()


def _rs_word_ptx(w: str, s: str, outs: tuple[str, str, str, str], raw: bool = False) -> str:
    """PTX for one k16 step: word ``w``, the 16-bit scale pair ``s`` (row g low, row g+8 high) -> 4 fp16x2; ``raw``:
    the scale as it converts, not × 2^7 (:data:`RAW_EXPONENT`)."""
    o0, o1, o2, o3 = outs
    return "\n".join([
        f"cvt.rn.f16x2.e4m3x2 f, {s};",
        *([] if raw else ["mul.rn.f16x2 f, f, k;"]),
        "mov.b32 {lo, hi}, f;",
        "mov.b32 sg, {lo, lo};",
        "mov.b32 sh, {hi, hi};",
        f"and.b32 t, {w}, m;",
        f"mul.rn.f16x2 {o0}, t, sg;",
        f"shl.b32 t, {w}, 8;",
        "and.b32 t, t, m;",
        f"mul.rn.f16x2 {o1}, t, sh;",
        f"shl.b32 t, {w}, 7;",
        f"shr.u32 u, {w}, 3;",
        "lop3.b32 t, t, u, sb, 0xE4;",
        "and.b32 u, t, m;",
        f"mul.rn.f16x2 {o2}, u, sg;",
        "shl.b32 t, t, 8;",
        "and.b32 t, t, m;",
        f"mul.rn.f16x2 {o3}, t, sh;",
    ])


def rs_decode_ptx(raw: bool = False) -> str:
    """One asm block for a thread's 64 K of one unit: $0..$15 out (4 fp16x2 per k16 step, in fragment order),
    $16..$19 the four code words, $20..$21 the two scale words; ``raw``: each operand e2m1 × scale × 2^-14
    (:data:`RAW_EXPONENT`), else × 2^-7."""
    lines = ["{", ".reg .b32 f, k, m, sb, t, u, sg, sh;", ".reg .b16 lo, hi, s0, s1, s2, s3;",
             f"mov.b32 k, {SCALE_FACTOR:#010x};", f"mov.b32 m, {FIELDS:#010x};", f"mov.b32 sb, {SIGN_BITS:#010x};",
             "mov.b32 {s0, s1}, $20;", "mov.b32 {s2, s3}, $21;"]
    for j in range(4):
        lines.append(_rs_word_ptx(f"${16 + j}", f"s{j}", tuple(f"${4 * j + q}" for q in range(4)), raw))
    lines.append("}")
    return "\n".join(lines)


RS_DECODE_PTX = rs_decode_ptx()
# The raw form (rs_decode_ptx(raw=True); the serving kernel's build knob hopper_varlen.kernel.RAW_SCALE): the scale
# pair as cvt.rn.f16x2.e4m3x2 gives it, without the × 2^7 (one mul.rn.f16x2 per k16 word: 8 of a K tile's ~200
# instructions per thread in the fp16 decode GEMMs' mainloop, SASS of the offline compile). Each operand is then
# e2m1 × scale × 2^-14, still exact in fp16: every such product is a multiple of 2^-24 (e2m1 of 2^-1, E4M3 of 2^-9)
# with at most 6 significant bits, at most 6·448·2^-14, so below 2^-14 it is an fp16 subnormal, which mul.rn.f16x2
# (no .ftz) keeps and wgmma reads. The epilogue's factor carries the 2^7 (hopper_varlen's _alpha).
RAW_EXPONENT = -14


CANONICAL_UNITS = 1 << 14  # units per step of canonical_units (~38 MB of packed bytes: temporaries of ~0.1 GB)


def canonical_units(packed: torch.Tensor) -> torch.Tensor:
    """Prepacked units (``[..., 2304]`` uint8, any leading dims, contiguous) made canonical in place and returned: each
    16-code block with a negative E4M3 scale takes the scale's magnitude and its codes' signs flipped; each block with
    a zero scale (either sign) has its codes zeroed. Every value ``e2m1 × scale`` stays the same (a NaN scale stays a
    NaN); the bf16 decode's integer scale route (``ops.A16_INT_SCALE``) needs it: it drops the scale's sign and maps a
    zero scale to a finite one."""
    u = packed.view(-1, UNIT_BYTES)
    for part in u.split(CANONICAL_UNITS):
        # codes: thread t = 32w + 4g + c, word j, byte 2e + h' (h' = 1 - h: row g + 8h); scales: (w, g, j, h)
        codes = part[:, :UNIT_CODE_BYTES].view(-1, 4, 8, 4, 4, 2, 2)  # [unit, w, g, c, j, e, h']
        scales = part[:, UNIT_CODE_BYTES:].view(-1, 4, 8, 4, 2)  # [unit, w, g, j, h]
        s = scales.flip(-1)[:, :, :, None, :, None, :]  # each code byte's row scale
        flip = (s >> 7) * 0x81  # both codes' sign bits (x at bit 7, y at bit 0) where the scale is negative
        codes.copy_((codes ^ flip) * ((s & 0x7F) != 0).to(torch.uint8))
        scales.bitwise_and_(0x7F)
    return packed


# W4A16's own word layout (``ops.A16_OWN_WORDS``, a build knob). The bf16 decode makes fragment register q's two
# bf16 fields (each half's sign at bit 15 and e2m1 magnitude at bits 8..6: ``ops.A16_FIELDS``) from the code word
# shifted left by (sign, magnitude) = shifts[q] bits (negative: right): t = lop3(w << sign, w << magnitude, sign bits)
# & fields, or, where the two shifts are equal, t = (w << shift) & fields. On the fp16 path's bytes (A16_RS_SHIFTS) no
# register has equal shifts: 15 integer instructions per word (7 shifts, 4 selects, 4 masks). A16_OWN_SHIFTS places the
# 8 codes where registers 0 and 1 take a mask and one shift (or none), registers 2 and 3 two shifts, a select and a
# mask: 11 (5 shifts, 4 of them left ones, which ptxas issues as IMAD.SHL off the integer pipe). No placement gives
# three registers one shift each: each register's 4 bits per half have the shape {15, 8, 7, 6} - s, and three such
# sets never leave a sign bit and 3 adjacent magnitude bits (searched exhaustively, rotations included).
A16_RS_SHIFTS = ((0, -3), (8, 5), (7, -6), (15, 2))
A16_OWN_SHIFTS = ((0, 0), (3, 3), (1, -3), (2, 6))
A16_RELAYOUT_UNITS = CANONICAL_UNITS // 4  # units per step of a16_units' relayout (int64 temporaries of ~16 MB each)


def _rs_registers(word):
    """The 4 fragment registers' fp16 fields (each half's sign at bit 15, magnitude at 11..9) that the fp16 decode's
    integer steps (:data:`RS_DECODE_PTX`) make of code words ``word`` (an int, or an int64 tensor, below 2^32)."""
    t = ((word << 7) & SIGN_BITS) | ((word >> 3) & ~SIGN_BITS)
    return word & FIELDS, (word << 8) & FIELDS, t & FIELDS, (t << 8) & FIELDS


def a16_words(words: torch.Tensor, shifts=A16_OWN_SHIFTS) -> torch.Tensor:
    """Code words in the fp16 path's layout (int64, any shape, values 0 .. 2^32-1) -> the same 8 codes placed where
    the bf16 decode with ``shifts`` finds each register's: register q's half h (wgmma's fragment: row g + 8(q % 2), K
    column 2c + 8(q // 2) + h) has its sign at bit 15 + 16h - sign, its magnitude at bits 6 + 16h - magnitude and up."""
    out = torch.zeros_like(words)
    for r, (sign, mag) in zip(_rs_registers(words), shifts):  # fp16 fields: sign 15, magnitude 11..9
        for h in (0, 16):
            out |= ((r >> (15 + h)) & 1) << (15 + h - sign)
            out |= ((r >> (9 + h)) & 7) << (6 + h - mag)
    return out


def a16_units(packed: torch.Tensor, own: bool) -> torch.Tensor:
    """Prepacked units (as :func:`canonical_units` takes them) made ready for the bf16 decode in place and returned:
    canonical (:func:`canonical_units`), then, with ``own``, every code word in W4A16's own layout (:func:`a16_words`).
    The scale bytes stay where they are."""
    canonical_units(packed)
    if own:
        for part in packed.view(-1, UNIT_BYTES).split(A16_RELAYOUT_UNITS):
            words = part[:, :UNIT_CODE_BYTES].view(torch.int32)
            out = a16_words(words.to(torch.int64) & 0xFFFFFFFF)
            words.copy_(out - ((out >> 31) << 32))  # (as int32: the top bit as the sign)
    return packed


def emulate_rs_decode(word: int, scale_pair: int, raw: bool = False) -> list[float]:
    """The decode of one k16 word on the CPU: 8 fp16 values in fragment order
    (reg0 lo/hi, reg1 lo/hi, reg2 lo/hi, reg3 lo/hi), each e2m1 × scale × 2^-7 (``raw``: × 2^-14)."""
    def f16(bits):
        return torch.tensor([bits - (1 << 16) if bits & 0x8000 else bits], dtype=torch.int16).view(torch.float16)

    sc = torch.tensor([scale_pair & 0xFF, scale_pair >> 8], dtype=torch.uint8).view(torch.float8_e4m3fn)
    sc = sc.to(torch.float16)
    if not raw:
        sc = sc * f16(SCALE_FACTOR & 0xFFFF)  # two fp16 multiplies, as mul.rn.f16x2
    out = []
    for q, r in enumerate(_rs_registers(word)):
        s = sc[q % 2]
        out += [float((f16(r & 0xFFFF) * s)[0]), float((f16((r >> 16) & 0xFFFF) * s)[0])]
    return out


def emulate_unit(unit: torch.Tensor, raw: bool = False) -> torch.Tensor:
    """Decode one 2304-byte unit as the 128 threads of a warpgroup would: the [64, 64] fp32 tile × 2^7 (``raw``:
    the raw form's operands, × 2^14)."""
    u = unit.to(torch.int64)
    out = torch.empty((64, 64), dtype=torch.float32)
    for t in range(128):
        w, g, c = t // 32, (t % 32) // 4, t % 4
        e = 2048 + 8 * (8 * w + g)
        for j in range(4):
            word = sum(int(u[16 * t + 4 * j + b]) << (8 * b) for b in range(4))
            vals = emulate_rs_decode(word, int(u[e + 2 * j]) | int(u[e + 2 * j + 1]) << 8, raw)
            r, k = 16 * w + g, 16 * j + 2 * c
            for q in range(4):
                rr, kk = r + 8 * (q % 2), k + 8 * (q // 2)
                out[rr, kk], out[rr, kk + 1] = vals[2 * q], vals[2 * q + 1]
    return out * 2.0 ** (-RAW_EXPONENT if raw else 7)
