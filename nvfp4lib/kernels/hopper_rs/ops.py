"""Inline-PTX operations of the register-decode kernels (:mod:`.kernel`, :mod:`..hopper_varlen`): the weight
unit load and decode, the activation decode to global memory, 16-byte copies, the fast silu; built on first use
(importing nvfp4lib never imports cutlass)."""
from __future__ import annotations

from types import SimpleNamespace

from ..common.decode_ptx import _DECODE_REGS, CONVERT16_GLOBAL_PTX, CONVERT16_PTX, _convert_store_ptx
from .layout import A16_OWN_SHIFTS, A16_RS_SHIFTS, RS_DECODE_PTX, rs_decode_ptx

# activation prologue: one thread decodes 16 codes (8 bytes + 1 scale byte) into 32 bytes of fp16 in global memory
ACT_DECODE_PTX = "\n".join([
    "{", _DECODE_REGS, ".reg .b16 sp;",
    "ld.global.nc.v2.b32 {w0, w1}, [$0];",
    "ld.global.nc.u8 s, [$1];",
    _convert_store_ptx("$2", "$3", space="global"),
    "}",
])
ACT_THREADS = 256
# dynamic shared memory the prologue asks for (unused by it): enough that its SMs run with the large shared-memory
# carveout the GEMM needs, so that GEMM CTAs start beside prologue CTAs (PDL) instead of after them (H100, round 29:
# S4 17.06 vs 17.31 us with 0, the other shapes equal)
ACT_SMEM = 32768
# alpha[g] = gs_A[g] · (gs_B1[g], gs_B2[g]) · 2^14, from the 0-d global-scale tensor of A's group g
ALPHA_PTX = "\n".join([
    "{", ".reg .f32 a, b0, b1;",
    "ld.global.f32 a, [$0];", "ld.global.v2.f32 {b0, b1}, [$1];",
    "mul.rn.f32 b0, a, b0;", "mul.rn.f32 b1, a, b1;",
    "st.global.v2.f32 [$2], {b0, b1};", "}",
])
ROW_COLUMNS = ("codes_addr", "scales_addr", "chunks")  # per padded activation row; chunks = 0 for padding rows
# up to PARAM_GROUPS groups, the prologue takes these per group as kernel parameters instead of reading the row table
GROUP_PARAMS = ("codes_addr", "scales_addr", "codes_row_stride", "scales_row_stride", "row0", "rows", "chunks")
PARAM_GROUPS = 16
# act_decode="warpgroup": one 16-code block of an activation row from global memory ($0, $1 codes, $2 scale byte
# from addresses $3, $4), or zeros where $5 == 0 (past the row's K, a padding row): a zero scale decodes to zeros
ACT_LOAD_PTX = "\n".join([
    "{", ".reg .pred p;", "setp.ne.u32 p, $5, 0;", "mov.b32 $0, 0;", "mov.b32 $1, 0;", "mov.b32 $2, 0;",
    "@p ld.global.nc.v2.b32 {$0, $1}, [$3];", "@p ld.global.nc.u8 $2, [$4];", "}",
])

# zeros for 32 bytes of global memory ($0, $1: the two 16-byte halves)
ZERO32_PTX = "\n".join(["{", ".reg .b32 z;", "mov.b32 z, 0;", "st.global.v4.b32 [$0], {z, z, z, z};",
                        "st.global.v4.b32 [$1], {z, z, z, z};", "}"])

# W4A16 (hopper_varlen act="bf16"): the register decode of one unit to bf16, from the same prepacked bytes.
# Per k16 word w (rs_layout: byte b holds code x at bits 1-3 with its sign at 7, code y at bits 4-6 with its sign at 0),
# fragment register q takes, in each 16-bit half, one code's sign to bit 15 and its magnitude bits (e1 e0 m) to bits
# 8..6: a bf16 worth e2m1 × 2^-126 (code 1 lands on a bf16 subnormal; the multiply renormalises it). The shifts that
# get them there, per register (left positive), are a16_shifts()[q] = (sign, magnitude) (A16_RS_SHIFTS on the fp16
# path's bytes: q0 x of the high byte (row g), q1 x of the low byte (row g+8), q2 y of the high byte, q3 y of the low
# byte; A16_OWN_SHIFTS on W4A16's own word layout, :data:`A16_OWN_WORDS`);
#   t = lop3(w << sign, w << magnitude, A16_SIGN) (sign bits from the first, the rest from the second) & A16_FIELDS,
#   or (w << shift) & A16_FIELDS where the two shifts are equal.
# The row's scale: cvt.rn.f16x2.e4m3x2 (exact), each half to f32, × 2^112 (exact: 2^-9·2^112 .. 448·2^112 < bf16 max),
# to bf16 (exact: ≤ 4 significant bits) broadcast to both halves; one mul.rn.bf16x2 then gives e2m1 × scale × 2^-14,
# exact (≤ 6 significant bits, 2^-24 .. 2688·2^-14: bf16 normals). The epilogue's gs_B·2^14 (POST_SCALE) restores it.
A16_SIGN = 0x80008000
A16_FIELDS = 0x81C081C0  # sign and magnitude bits of both bf16 halves
A16_SCALE_FACTOR = 0x77800000  # f32 2^112
A16_OPERAND_EXPONENT = -14  # each decoded weight is value × scale × 2^-14
# The row scales' conversion in integer arithmetic (:data:`A16_INT_SCALE`, a build knob, on): the pair's f16x2 from
# cvt.rn.f16x2.e4m3x2 (each half a normal f16, 2^-9 .. 448: its mantissa's low 7 bits zero), its signs and the low 3
# bits of each half cleared (:data:`A16_SCALE_MASK`: only a NaN has them set; without the mask a NaN's would spill into
# the other half), then one mad.hi.u32 by 2^29 adding :data:`A16_SCALE_BIAS`: (f >> 3) + 0x7000 per half moves each
# f16's exponent and mantissa to bf16's places and adds 224 to the exponent (disjoint bits: no carry), the bf16 of
# scale × 2^112 (a NaN stays a NaN) — 3 instructions where the f32 route takes 7. It drops the scale's sign and maps a
# zero scale to 2^97, so the weights are packed canonical for it (:func:`canonical_units`, at prepare: a negative
# scale's sign moved into its block's codes, a zero scale's block of codes zeroed; the values are the same). Why
# (issue 41): at decode the W4A16 GEMMs run 4.8 thread instructions per weight against W4A4's 4.0 (H100 ncu, in
# hopper_varlen/config.py), its mainloop ~0.48 us per K tile against 0.39, and the bf16 decode's PTX spends 8 of its
# 27 instructions per 8 weights on the two scales. In the SASS of the offline compile (sm_90a, the Qwen3-like layer's
# decode GEMMs vl_a16_dual_m64_t16_k128_s8_e_x and vl_a16_m128_t16_k128_s8_e_x) the f32 route is 7 instructions per
# k16 word (F2FP, 2 HADD2, 2 FMUL, 2 F2FP), this one 3 (F2FP, LOP3, LEA.HI; the broadcasts fold into HMUL2's .H0_H0 and
# .H1_H1 operands): the mainloop's body per K tile 359 -> 327 and 360 -> 328 instructions (-8.9%). Prediction
# (2026-11-29, before any GPU run), the decode mainloop being issue-bound: W4A16 GEMM mainloops ~8% shorter; Qwen3-like
# T = 1 W4A16 ~25.1 -> ~24.2 us (its mainloops ~10.6 us of the layer); Mixtral-like T = 1 and 8 W4A16 5-8% faster
# (101.9 -> ~95 us, 278 -> ~260); T = 64 alike; W4A4 unchanged (its kernels do not hold this decode). Outcome (H200,
# moe-bench --a16-int-scale 0 1 0 1, graph replay, each arm's mean of its two runs; notebook 11's rounds): Mixtral-like
# T = 1 101.4 -> 97.1 us, T = 8 277.8 -> 262.5 (Zipf 304.0 -> 286.1), T = 64 326.1 -> 311.5 (-4 to -6%: held at the
# prediction's low end); Qwen3-like T = 64 -3%, T = 8 -1 to -2%, T = 1 25.7 -> 25.7 (missed: no change, so its decode
# GEMMs at T = 1 are not bound by their mainloops' issue). The same bits (rel_err equal in both arms); the W4A16 GPU
# tests (every code x every finite scale, signed, subnormal and zero, through the canonical pack) exact, memcheck 0
# errors. A second run (its prediction in notebook 11: 3-6% on each): DeepSeek-like T = 1, 8, 64 -2.7 to -3.9% (93.5 ->
# 91.0 us, 549.9 -> 528.6, 2129 -> 2072); prefill T = 4096 Qwen3-like 881.0 -> 866.8 us (-1.6%, missed), Mixtral-like
# 5586 -> 5391 (-3.5%). On.
A16_INT_SCALE = True
A16_SCALE_MASK = 0x7FF87FF8
A16_SCALE_BIAS = 0x70007000
# W4A16's weights in their own word layout (a build knob, read at prepare as well: ``PackedWeights`` records the layout
# it packed and its runners build for it): the 8 codes of each k16 word moved (layout.a16_units, once, at prepare)
# where the bf16 decode takes two registers with one shift (or none) and a mask each (layout.A16_OWN_SHIFTS). Why: in
# the SASS of the W4A16 decode GEMMs (offline, sm_90a; the Qwen3-like layer's vl_a16_m128_t16_k128_s8_e_x) a k16 word's
# decode was 22 instructions at the integer scale route, 15 of them moving codes (8 LOP3, 2 SHF, 5 IMAD.SHL); with this
# layout 18 (6 LOP3, 1 SHF, 4 IMAD.SHL), the mainloop body per K tile 328 -> 296. Prediction (before the run): as the
# scale route's round, more where the integer pipe binds, Mixtral-like decode 4-8% faster, DeepSeek-like 3-6%,
# Qwen3-like T = 1 unchanged. Outcome (H200, moe-bench --a16-own-words, graph replay; notebook 11's rounds):
# Mixtral-like T = 1, 8, 64 -7 to -10% (97.1 -> 90.5 us, 262.3 -> 238.1, 312.8 -> 289.4), DeepSeek-like -6 to -11%
# (2024 -> 1800 us at T = 64), Qwen3-like T = 64 -8%, T = 1 unchanged; prefill T = 4096 Qwen3-like -3%, Mixtral-like
# -2% within the run's spread; the same bits in both arms. On.
A16_OWN_WORDS = True


def a16_shifts(own: bool | None = None) -> tuple[tuple[int, int], ...]:
    """Each fragment register's (sign, magnitude) shifts of the bf16 decode on the weights' word layout (``own``:
    W4A16's own, else the fp16 path's; None: :data:`A16_OWN_WORDS` as it is now)."""
    return A16_OWN_SHIFTS if (A16_OWN_WORDS if own is None else own) else A16_RS_SHIFTS


def _shift_ptx(dst: str, src: str, n: int) -> list[str]:
    if n == 0:
        return [f"mov.b32 {dst}, {src};"]
    return [f"shl.b32 {dst}, {src}, {n};" if n > 0 else f"shr.u32 {dst}, {src}, {-n};"]


def _a16_word_ptx(w: str, s: str, outs: tuple[str, str, str, str], int_scale: bool, shifts) -> str:
    """One k16 step: word ``w``, the 16-bit scale pair ``s`` (row g low, row g+8 high) -> 4 bf16x2 in fragment order;
    the scales by ``int_scale``'s route (:data:`A16_INT_SCALE`), the codes by ``shifts`` (:func:`a16_shifts`)."""
    if int_scale:
        lines = [f"cvt.rn.f16x2.e4m3x2 f, {s};", f"and.b32 f, f, {A16_SCALE_MASK:#010x};",
                 f"mad.hi.u32 f, f, 0x20000000, {A16_SCALE_BIAS:#010x};", "mov.b32 {lo, hi}, f;",
                 "mov.b32 sg, {lo, lo};", "mov.b32 sh, {hi, hi};"]
    else:
        lines = [f"cvt.rn.f16x2.e4m3x2 f, {s};", "mov.b32 {lo, hi}, f;", "cvt.f32.f16 x, lo;", "cvt.f32.f16 y, hi;",
                 f"mul.rn.f32 x, x, 0f{A16_SCALE_FACTOR:08X};", f"mul.rn.f32 y, y, 0f{A16_SCALE_FACTOR:08X};",
                 "cvt.rn.bf16x2.f32 sg, x, x;", "cvt.rn.bf16x2.f32 sh, y, y;"]
    for q, (sign, mag) in enumerate(shifts):
        if sign == mag:  # one shift (or none) and the mask
            lines += _shift_ptx("b", w, mag) if mag else []
            lines += [f"and.b32 t, {'b' if mag else w}, mf;"]
        else:
            src = w if sign == 0 else "a"
            if sign:
                lines += _shift_ptx("a", w, sign)
            lines += _shift_ptx("b", w, mag)
            lines += [f"lop3.b32 t, {src}, b, sm, 0xE4;", "and.b32 t, t, mf;"]
        lines += [f"mul.rn.bf16x2 {outs[q]}, t, {'sg' if q % 2 == 0 else 'sh'};"]
    return "\n".join(lines)


def a16_decode_ptx(int_scale: bool | None = None, own: bool | None = None) -> str:
    """As ``rs_layout.rs_decode_ptx`` for bf16: $0..$15 out, $16..$19 the code words, $20..$21 the scale words;
    ``int_scale``: the scales' route, ``own``: the words' layout (None: :data:`A16_INT_SCALE`, :data:`A16_OWN_WORDS`
    as they are now)."""
    int_scale = A16_INT_SCALE if int_scale is None else int_scale
    shifts = a16_shifts(own)
    lines = ["{", ".reg .b32 f, a, b, t, sm, mf, sg, sh;", ".reg .f32 x, y;", ".reg .b16 lo, hi, s0, s1, s2, s3;",
             f"mov.b32 sm, {A16_SIGN:#010x};", f"mov.b32 mf, {A16_FIELDS:#010x};",
             "mov.b32 {s0, s1}, $20;", "mov.b32 {s2, s3}, $21;"]
    for j in range(4):
        lines.append(_a16_word_ptx(f"${16 + j}", f"s{j}", tuple(f"${4 * j + q}" for q in range(4)), int_scale,
                                   shifts))
    lines.append("}")
    return "\n".join(lines)



def emulate_a16_decode(words, scale_pairs, int_scale: bool | None = None, own: bool | None = None):
    """The bf16 decode's arithmetic on the CPU, vectorised: ``words`` and ``scale_pairs`` int64 tensors of one shape
    (a 32-bit code word, a 16-bit scale pair each) -> bf16 ``[..., 8]`` in fragment order (reg0 lo/hi .. reg3 lo/hi),
    each as the PTX of :func:`a16_decode_ptx` computes it (``int_scale``: the scales' route, ``own``: the words'
    layout; None: the knob's)."""
    import torch

    m32 = 0xFFFFFFFF
    w = words.to(torch.int64) & m32
    sp = scale_pairs.to(torch.int64)

    def shift(v, n):
        return (v << n) & m32 if n >= 0 else v >> -n

    def as_bf16(bits16):
        return (bits16 - ((bits16 & 0x8000) << 1)).to(torch.int16).view(torch.bfloat16)

    e4m3 = torch.stack([sp & 0xFF, (sp >> 8) & 0xFF], -1).to(torch.uint8).view(torch.float8_e4m3fn)
    if A16_INT_SCALE if int_scale is None else int_scale:
        h = e4m3.to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF  # cvt e4m3x2 -> f16x2
        f = (h[..., 0] | h[..., 1] << 16) & A16_SCALE_MASK  # and.b32
        f = (((f << 29) >> 32) + A16_SCALE_BIAS) & m32  # mad.hi.u32 f, f, 2^29, bias
        sc = torch.stack([as_bf16(f & 0xFFFF), as_bf16(f >> 16)], -1)  # (row g, row g+8)
    else:
        f32 = e4m3.to(torch.float16).to(torch.float32) * torch.tensor(A16_SCALE_FACTOR, dtype=torch.int32).view(
            torch.float32)  # cvt e4m3x2 -> f16x2 -> f32, mul.rn.f32
        sc = f32.to(torch.bfloat16)  # cvt.rn.bf16x2.f32 (row g, row g+8)
    out = []
    for q, (sign, mag) in enumerate(a16_shifts(own)):
        t = ((shift(w, sign) & A16_SIGN) | (shift(w, mag) & ~A16_SIGN)) & A16_FIELDS
        s = sc[..., q % 2]
        out += [as_bf16(t & 0xFFFF) * s, as_bf16(t >> 16) * s]  # mul.rn.bf16x2
    return torch.stack(out, -1)


_OPS = None


def ops() -> SimpleNamespace:
    """The operations, as ``dsl_user_op`` functions (and ``_silu_mul``, ``_i64``, ``_asm``)."""
    global _OPS
    if _OPS is None:
        _OPS = _build()
    return _OPS


def _build() -> SimpleNamespace:
    import cutlass
    import cutlass.cute as cute
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import dsl_user_op

    def _asm(ptx, outs, ins, constraints, side_effects):
        """Inline PTX over MLIR values ``ins``; returns its ``outs`` 32-bit results."""
        i32 = cutlass.Int32.mlir_type
        res = llvm.inline_asm(llvm.StructType.get_literal([i32] * outs) if outs else None, ins, ptx, constraints,
                              has_side_effects=side_effects, is_align_stack=False,
                              asm_dialect=llvm.AsmDialect.AD_ATT)
        return [llvm.extractvalue(i32, res, [i]) for i in range(outs)] if outs else None

    @dsl_user_op
    def load_unit(codes, scales, *, loc=None, ip=None):
        """A thread's 16 code bytes and 8 scale bytes of one unit (shared addresses)."""
        return _asm("{\nld.shared.v4.b32 {$0, $1, $2, $3}, [$6];\nld.shared.v2.b32 {$4, $5}, [$7];\n}",
                    6, [cutlass.Int32(v).ir_value(loc=loc, ip=ip) for v in (codes, scales)],
                    "=r,=r,=r,=r,=r,=r,r,r", True)

    @dsl_user_op
    def decode_unit(loaded, raw: bool = False, *, loc=None, ip=None):
        """The fp16 decode of one unit (``raw``: the scale not × 2^7, ``layout.rs_decode_ptx``)."""
        ptx = rs_decode_ptx(True) if raw else RS_DECODE_PTX
        return [cutlass.Uint32(v) for v in _asm(ptx, 16, loaded, ",".join(["=r"] * 16 + ["r"] * 6), False)]

    @dsl_user_op
    def copy16(src, dst, *, loc=None, ip=None):
        """16 bytes from shared address ``src`` to global address ``dst``."""
        _asm("{\n.reg .b32 a, b, c, d;\nld.shared.v4.b32 {a, b, c, d}, [$0];\nst.global.v4.b32 [$1], {a, b, c, d};\n}",
             0, [cutlass.Int32(src).ir_value(loc=loc, ip=ip), cutlass.Int64(dst).ir_value(loc=loc, ip=ip)], "r,l",
             True)

    @dsl_user_op
    def cp_async8(dst, src, size, *, loc=None, ip=None):
        """8 bytes from global ``src`` to shared ``dst`` by cp.async; ``size`` (8 or 0) bytes are read, zeros fill."""
        _asm("cp.async.ca.shared.global [$0], [$1], 8, $2;", 0,
             [cutlass.Int32(dst).ir_value(loc=loc, ip=ip), cutlass.Int64(src).ir_value(loc=loc, ip=ip),
              cutlass.Int32(size).ir_value(loc=loc, ip=ip)], "r,l,r", True)

    @dsl_user_op
    def cp_async_arrive(bar, *, loc=None, ip=None):
        """Arrive on the mbarrier at shared ``bar`` once this thread's earlier cp.async copies have landed (counts as
        one of its expected arrivals: .noinc)."""
        _asm("cp.async.mbarrier.arrive.noinc.shared.b64 [$0];", 0, [cutlass.Int32(bar).ir_value(loc=loc, ip=ip)], "r",
             True)

    @dsl_user_op
    def load_raw16(codes, scale, *, loc=None, ip=None):
        """A 16-code block in shared memory: its two code words and its scale byte."""
        return [cutlass.Uint32(v) for v in _asm("{\nld.shared.v2.b32 {$0, $1}, [$3];\nld.shared.u8 $2, [$4];\n}", 3,
                                                [cutlass.Int32(v).ir_value(loc=loc, ip=ip) for v in (codes, scale)],
                                                "=r,=r,=r,r,r", True)]

    @dsl_user_op
    def stamp_to(addr, timer: str = "clock64", *, loc=None, ip=None):
        """``%clock64`` (this SM's cycles) or ``%globaltimer`` (ns, every SM's) to the global address ``addr``."""
        _asm(f"{{\n.reg .u64 t;\nmov.u64 t, %{timer};\nst.global.u64 [$0], t;\n}}", 0,
             [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)], "l", True)

    def _silu_mul(g, u):
        """silu(g)·u with the fast exp and reciprocal (~2 ulp of fp32 before the rounding to the output type)."""
        return g * cute.arch.rcp_approx(1.0 + cute.math.exp(-g, fastmath=True)) * u

    def _i64(vals, loc, ip):
        return [cutlass.Int64(v).ir_value(loc=loc, ip=ip) for v in vals]

    @dsl_user_op
    def decode_act16(src, sf, dst, *, loc=None, ip=None):
        _asm(ACT_DECODE_PTX, 0, _i64((src, sf, dst, dst + 16), loc, ip), "l,l,l,l", True)

    @dsl_user_op
    def load_row(addr, *, loc=None, ip=None):
        """A row of the activation table (:data:`ROW_COLUMNS`) in one go: the three loads issue together (loaded
        where used, the chunk count's branch put the two address loads a memory round trip later)."""
        i64 = cutlass.Int64.mlir_type
        res = llvm.inline_asm(llvm.StructType.get_literal([i64] * 3), _i64((addr,), loc, ip),
                              "{\nld.global.nc.u64 $0, [$3];\nld.global.nc.u64 $1, [$3+8];\n"
                              "ld.global.nc.u64 $2, [$3+16];\n}", "=l,=l,=l,l", has_side_effects=True,
                              is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
        return [cutlass.Int64(llvm.extractvalue(i64, res, [i])) for i in range(3)]

    @dsl_user_op
    def alpha_row(gs_a, gs_b, out, *, loc=None, ip=None):
        _asm(ALPHA_PTX, 0, _i64((gs_a, gs_b, out), loc, ip), "l,l,l", True)

    @dsl_user_op
    def load_act16(src, sf, valid, *, loc=None, ip=None):
        """A 16-code block of one activation row (2 code words, the scale byte), zeros unless ``valid``."""
        return [cutlass.Uint32(v) for v in _asm(
            ACT_LOAD_PTX, 3, [*_i64((src, sf), loc, ip), cutlass.Int32(valid).ir_value(loc=loc, ip=ip)],
            "=r,=r,=r,l,l,r", True)]

    @dsl_user_op
    def store_act16(words, dst0, dst1, *, loc=None, ip=None):
        """Decode a loaded block to fp16 (value × scale × 2^-7) and store its two 16-byte halves to shared memory."""
        _asm(CONVERT16_PTX, 0, [cutlass.Uint32(w).ir_value(loc=loc, ip=ip) for w in words]
             + [cutlass.Int32(d).ir_value(loc=loc, ip=ip) for d in (dst0, dst1)], "r,r,r,r,r", True)

    @dsl_user_op
    def store_act16_global(words, dst, *, loc=None, ip=None):
        """:func:`store_act16` to global memory: the two 16-byte halves at ``dst`` and ``dst + 16``."""
        _asm(CONVERT16_GLOBAL_PTX, 0, [cutlass.Uint32(w).ir_value(loc=loc, ip=ip) for w in words]
             + _i64((dst, dst + 16), loc, ip), "r,r,r,l,l", True)

    @dsl_user_op
    def load_f32(addr, *, loc=None, ip=None):
        return cutlass.Float32(llvm.inline_asm(cutlass.Float32.mlir_type, _i64((addr,), loc, ip),
                                               "ld.global.nc.f32 $0, [$1];", "=f,l", has_side_effects=True,
                                               is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))

    @dsl_user_op
    def decode_unit_a16(loaded, *, loc=None, ip=None):
        """:func:`decode_unit` to bf16 (:func:`a16_decode_ptx`, the scales' route as :data:`A16_INT_SCALE` is)."""
        return [cutlass.Uint32(v) for v in _asm(a16_decode_ptx(), 16, loaded, ",".join(["=r"] * 16 + ["r"] * 6),
                                                False)]

    @dsl_user_op
    def zero32(dst, *, loc=None, ip=None):
        _asm(ZERO32_PTX, 0, _i64((dst, dst + 16), loc, ip), "l,l", True)

    # the fused prologue's counters (hopper_varlen kernel_fused): u32 words in global memory at ``count``: word 0 the
    # call's epoch (bits 20..31) and tickets taken (bits 0..19), words 1 and 2 the done slices of even and odd epochs
    @dsl_user_op
    def take_ticket(count, slot, grid, *, loc=None, ip=None):
        """Take the next ticket of word 0 at global ``count`` (the old word: epoch and ticket) and store it to the
        shared word ``slot``. The grid's last ticket moves word 0 to the next epoch with no tickets taken and zeroes
        the next epoch's done word (the previous call's, which no CTA of this call reads)."""
        _asm("{\n.reg .u32 v, t, z;\n.reg .u64 a;\n.reg .pred p;\n"
             "atom.relaxed.gpu.global.add.u32 v, [$0], 1;\nst.shared.u32 [$1], v;\n"
             "and.b32 t, v, 0xFFFFF;\nsetp.eq.u32 p, t, $2;\n@p red.relaxed.gpu.global.add.u32 [$0], $3;\n"
             "shr.u32 t, v, 20;\nand.b32 t, t, 1;\nxor.b32 t, t, 1;\nmul.wide.u32 a, t, 4;\nadd.u64 a, a, $0;\n"
             "mov.u32 z, 0;\n@p st.relaxed.gpu.global.u32 [a+4], z;\n}", 0,
             [cutlass.Int64(count).ir_value(loc=loc, ip=ip), cutlass.Int32(slot).ir_value(loc=loc, ip=ip),
              cutlass.Int32(grid - 1).ir_value(loc=loc, ip=ip),
              cutlass.Int32((1 << 20) - grid).ir_value(loc=loc, ip=ip)], "l,r,r,r", True)

    @dsl_user_op
    def load_shared_u32(addr, *, loc=None, ip=None):
        return cutlass.Int32(_asm("ld.shared.u32 $0, [$1];", 1, [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)],
                                  "=r,r", True)[0])

    @dsl_user_op
    def fence_async_global(*, loc=None, ip=None):
        """Order this thread's earlier generic-proxy global writes before later async-proxy (TMA) accesses."""
        _asm("fence.proxy.async.global;", 0, [], "", True)

    @dsl_user_op
    def release_add(addr, *, loc=None, ip=None):
        """Add 1 to the u32 at global ``addr`` with release semantics at GPU scope (after a fence.acq_rel.gpu)."""
        _asm("{\nfence.acq_rel.gpu;\nred.release.gpu.global.add.u32 [$0], 1;\n}", 0, _i64((addr,), loc, ip), "l",
             True)

    @dsl_user_op
    def load_acquire(addr, *, loc=None, ip=None):
        return cutlass.Int32(_asm("ld.acquire.gpu.global.u32 $0, [$1];", 1, _i64((addr,), loc, ip), "=r,l", True)[0])

    # split-K (hopper_varlen, ``split_k`` configs): the CTAs of one output tile count themselves at a global u32; the
    # last one sums the others' fp32 partials and runs the epilogue
    @dsl_user_op
    def fence_acq_rel(*, loc=None, ip=None):
        """Order this thread's global accesses before (release) and after (acquire) at GPU scope."""
        _asm("fence.acq_rel.gpu;", 0, [], "", True)

    @dsl_user_op
    def split_arrive(count, slot, last, add=None, *, loc=None, ip=None):
        """Count this CTA in at global ``count`` (acq_rel, GPU scope): add 1, or ``add`` (an Int32: the combine counts
        rows); store 1 to the shared word ``slot`` if it is the last CTA (the old count was ``last``), which also
        zeroes the count for the next call, else 0."""
        args = [cutlass.Int64(count).ir_value(loc=loc, ip=ip), cutlass.Int32(slot).ir_value(loc=loc, ip=ip),
                cutlass.Int32(last).ir_value(loc=loc, ip=ip)]
        if add is not None:
            args.append(cutlass.Int32(add).ir_value(loc=loc, ip=ip))
        _asm("{\n.reg .u32 v, r;\n.reg .pred p;\n"
             f"atom.acq_rel.gpu.global.add.u32 v, [$0], {1 if add is None else '$3'};\nsetp.eq.u32 p, v, $2;\n"
             "mov.u32 r, 0;\n@p st.relaxed.gpu.global.u32 [$0], r;\nselp.u32 r, 1, 0, p;\nst.shared.u32 [$1], r;\n}",
             0, args, "l,r,r" if add is None else "l,r,r,r", True)

    @dsl_user_op
    def load_f32_gpu(addr, *, loc=None, ip=None):
        """An fp32 another CTA of this kernel wrote (relaxed, GPU scope: from L2, never a stale L1 line)."""
        return cutlass.Float32(llvm.inline_asm(cutlass.Float32.mlir_type, _i64((addr,), loc, ip),
                                               "ld.relaxed.gpu.global.f32 $0, [$1];", "=f,l", has_side_effects=True,
                                               is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))

    @dsl_user_op
    def load_bf16_gpu(addr, *, loc=None, ip=None):
        """A bf16 another CTA of this kernel wrote (relaxed, GPU scope), as fp32 (exact: its bits moved up 16)."""
        return cutlass.Float32(llvm.inline_asm(
            cutlass.Float32.mlir_type, _i64((addr,), loc, ip),
            "{\n.reg .b16 h, z;\nld.relaxed.gpu.global.b16 h, [$1];\nmov.b16 z, 0;\nmov.b32 $0, {z, h};\n}", "=f,l",
            has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))

    @dsl_user_op
    def fma_f32(a, b, c, *, loc=None, ip=None):
        """a · b + c, rounded once (fma.rn.f32: what a Triton ``acc += y * w`` compiles to)."""
        return cutlass.Float32(llvm.inline_asm(
            cutlass.Float32.mlir_type, [cutlass.Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c)],
            "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f", has_side_effects=False, is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT))

    return SimpleNamespace(
        load_bf16_gpu=load_bf16_gpu, fma_f32=fma_f32,
        fence_acq_rel=fence_acq_rel, split_arrive=split_arrive, load_f32_gpu=load_f32_gpu,
        zero32=zero32, _asm=_asm, load_unit=load_unit, decode_unit=decode_unit, copy16=copy16,
        cp_async8=cp_async8,
        cp_async_arrive=cp_async_arrive, load_raw16=load_raw16, stamp_to=stamp_to, _silu_mul=_silu_mul,
        _i64=_i64, decode_act16=decode_act16, load_row=load_row, alpha_row=alpha_row, load_act16=load_act16,
        store_act16=store_act16, load_f32=load_f32, decode_unit_a16=decode_unit_a16, take_ticket=take_ticket,
        load_shared_u32=load_shared_u32, fence_async_global=fence_async_global, release_add=release_add,
        load_acquire=load_acquire, store_act16_global=store_act16_global)
