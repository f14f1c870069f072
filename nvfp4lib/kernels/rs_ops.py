"""Inline-PTX operations of the register-decode kernels (:mod:`.hopper_rs`, :mod:`.hopper_varlen`): the weight
unit load and decode, the activation decode to global memory, 16-byte copies, the fast silu; built on first use
(importing nvfp4lib never imports cutlass)."""
from __future__ import annotations

from types import SimpleNamespace

from .decode_ptx import _DECODE_REGS, CONVERT16_PTX, _convert_store_ptx
from .rs_layout import RS_DECODE_PTX

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
    def decode_unit(loaded, *, loc=None, ip=None):
        return [cutlass.Uint32(v) for v in _asm(RS_DECODE_PTX, 16, loaded, ",".join(["=r"] * 16 + ["r"] * 6),
                                                False)]

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
    def stamp_to(addr, *, loc=None, ip=None):
        """%globaltimer (ns) to the shared address ``addr``."""
        _asm("{\n.reg .u64 t;\nmov.u64 t, %globaltimer;\nst.shared.u64 [$0], t;\n}", 0,
             [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)], "r", True)

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
    def load_f32(addr, *, loc=None, ip=None):
        return cutlass.Float32(llvm.inline_asm(cutlass.Float32.mlir_type, _i64((addr,), loc, ip),
                                               "ld.global.nc.f32 $0, [$1];", "=f,l", has_side_effects=True,
                                               is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))

    @dsl_user_op
    def zero32(dst, *, loc=None, ip=None):
        _asm(ZERO32_PTX, 0, _i64((dst, dst + 16), loc, ip), "l,l", True)

    return SimpleNamespace(
        zero32=zero32, _asm=_asm, load_unit=load_unit, decode_unit=decode_unit, copy16=copy16,
        cp_async8=cp_async8,
        cp_async_arrive=cp_async_arrive, load_raw16=load_raw16, stamp_to=stamp_to, _silu_mul=_silu_mul,
        _i64=_i64, decode_act16=decode_act16, load_row=load_row, alpha_row=alpha_row, load_act16=load_act16,
        store_act16=store_act16, load_f32=load_f32)
