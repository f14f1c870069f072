"""The E2M1 × E4M3 → fp16 decode of the Hopper kernels as inline PTX, and its CPU emulation (checked bit for bit
by tests/test_hopper_compile.py). Shared by the smem-decode kernel and the activation decode of the register-decode
kernels.
"""
from __future__ import annotations

import torch

# ---------------------------------------------------------------------------------------------
# One thread decodes 16 consecutive E2M1 codes (8 bytes) sharing one E4M3 scale into two 16-byte
# chunks of fp16. $0: packed codes (shared address), $1: scale byte, $2/$3: the two fp16 chunks.
# Per code byte j of a 32-bit word (code e_2j in the low nibble, e_2j+1 in the high one):
#   lc = lop3(w << 4, w << 1, SIGN_BITS): byte j = the low code as an fp16 high byte (sign at bit 7,
#        magnitude bits e1 e0 m at bits 3..1); hc = lop3(w, w >> 3, SIGN_BITS): the same for the high code;
#   prmt puts lc_j in byte 1 and hc_j in byte 3 (PRMT_SELECTORS[j]); FP16_FIELDS clears the rest:
#        fp16x2 (e_2j, e_2j+1) × 2^-14 (code 1 is an fp16 subnormal, which fp16 arithmetic keeps);
#   × (scale × 2^7) as fp16x2 (cvt.e4m3x2 then × 128: exact, ≤ 448·128 < 65504) gives value × scale × 2^-7.
# Checked bit for bit against the exact values by tests/test_hopper_compile.py (emulate_decode).
SIGN_BITS = 0x80808080
LOP3_SELECT = 0xE4  # lop3 truth table of (a & c) | (b & ~c)
PRMT_SELECTORS = (0x4000, 0x5111, 0x6222, 0x7333)
FP16_FIELDS = 0x8E008E00  # sign and the three magnitude bits of both fp16 halves
SCALE_FACTOR = 0x58005800  # fp16x2 (128, 128) = 2^7
OPERAND_EXPONENT = -7  # each decoded operand is value × 2^-7


def _word_ptx(w: str, first: int) -> str:
    lines = [
        f"shl.b32 a, {w}, 4;", f"shl.b32 b, {w}, 1;", f"lop3.b32 lc, a, b, sg, 0x{LOP3_SELECT:02X};",
        f"shr.u32 b, {w}, 3;", f"lop3.b32 hc, {w}, b, sg, 0x{LOP3_SELECT:02X};",
    ]
    for j, sel in enumerate(PRMT_SELECTORS):
        o = f"o{first + j}"
        lines += [f"prmt.b32 {o}, lc, hc, {sel:#06x};", f"and.b32 {o}, {o}, mk;", f"mul.rn.f16x2 {o}, {o}, f;"]
    return "\n".join(lines)


_DECODE_REGS = ".reg .b32 w0, w1, s, f, k, a, b, lc, hc, mk, sg, o0, o1, o2, o3, o4, o5, o6, o7;"


def _convert_store_ptx(dst0: str, dst1: str, space: str = "shared") -> str:
    """fp16 operands from words w0, w1 and scale byte s, stored as two 16-byte chunks to ``space``."""
    return "\n".join([
        "mul.lo.u32 s, s, 257;",
        "cvt.u16.u32 sp, s;",
        "cvt.rn.f16x2.e4m3x2 f, sp;",
        f"mov.b32 k, {SCALE_FACTOR:#010x};",
        "mul.rn.f16x2 f, f, k;",
        f"mov.b32 mk, 0x{FP16_FIELDS:08X};",
        f"mov.b32 sg, {SIGN_BITS:#010x};",
        _word_ptx("w0", 0),
        _word_ptx("w1", 4),
        f"st.{space}.v4.b32 [{dst0}], {{o0, o1, o2, o3}};",
        f"st.{space}.v4.b32 [{dst1}], {{o4, o5, o6, o7}};",
    ])


# decode="chunked": load, convert and store 16 codes in one asm block ($0 codes, $1 scale, $2/$3 outputs).
DECODE16_PTX = "\n".join([
    "{", _DECODE_REGS, ".reg .b16 sp;",
    "ld.shared.v2.b32 {w0, w1}, [$0];",
    "ld.shared.u8 s, [$1];",
    _convert_store_ptx("$2", "$3"),
    "}",
])
# decode="batched": every load of a sub-block is issued first (LOAD16: $0,$1 words, $2 scale byte from
# addresses $3, $4), then each chunk is converted and stored (CONVERT16: $0..$2 the loaded values, $3/$4 the
# outputs). A load placed after a shared store cannot be hoisted above it by ptxas (it may alias), so the
# chunked form pays the shared-memory latency once per 16 codes; the batched form once per sub-block.
LOAD16_PTX = "{\nld.shared.v2.b32 {$0, $1}, [$3];\nld.shared.u8 $2, [$4];\n}"


def _convert16_ptx(space: str) -> str:
    return "\n".join([
        "{", _DECODE_REGS, ".reg .b16 sp;",
        "mov.b32 w0, $0;", "mov.b32 w1, $1;", "mov.b32 s, $2;",
        _convert_store_ptx("$3", "$4", space=space),
        "}",
    ])


CONVERT16_PTX = _convert16_ptx("shared")
CONVERT16_GLOBAL_PTX = _convert16_ptx("global")  # the same, outputs in global memory (the fused call's slices)


def emulate_decode(word: int, scale_byte: int) -> list[float]:
    """The decode's arithmetic on one 32-bit word of codes, emulated on the CPU: its 8 fp16 operands."""
    m32 = 0xFFFFFFFF

    def lop3_select(a, b, c):  # what LOP3_SELECT computes
        return ((a & c) | (b & ~c)) & m32

    def prmt(a, b, sel):
        pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
        return sum(pool[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))

    def as_f16(bits16):
        return torch.tensor([bits16 - (1 << 16) if bits16 & 0x8000 else bits16], dtype=torch.int16).view(torch.float16)

    scale = torch.tensor([scale_byte], dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float16)
    factor = scale * as_f16(SCALE_FACTOR & 0xFFFF)  # fp16 multiply, as mul.rn.f16x2
    lc = lop3_select((word << 4) & m32, (word << 1) & m32, SIGN_BITS)
    hc = lop3_select(word, word >> 3, SIGN_BITS)
    out = []
    for sel in PRMT_SELECTORS:
        o = prmt(lc, hc, sel) & FP16_FIELDS
        out += [float((as_f16(o & 0xFFFF) * factor)[0]), float((as_f16(o >> 16) * factor)[0])]
    return out
