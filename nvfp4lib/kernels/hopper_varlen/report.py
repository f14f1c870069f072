"""Compile-time facts of the device-scheduled kernel, on any machine (no GPU): fake arguments of the shapes the
runner passes, an offline compile for sm_90a through the TVM-FFI entry, and the PTX's instruction counts."""
from __future__ import annotations

from ..common import pdl
from .config import VarlenConfig, partials_width
from .kernel import kernel_classes

TVM_FFI = "--enable-tvm-ffi"


def _fake(dtype, shape, align=16):
    from cutlass.cute.runtime import make_fake_compact_tensor

    return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)),
                                    assumed_align=align)


def env_stream():
    """The stream argument of every compiled kernel: TVM-FFI passes torch's current stream itself."""
    from cutlass.cute.runtime import make_fake_stream

    return make_fake_stream(use_tvm_ffi_env_stream=True)


def prologue_arguments():
    """(codes [T, K/2] u8, scales [T, K/16] E4M3 (the NVFP4Tensor's own dtype: a call passes them without a view),
    x16 [T, K_pad] f16)."""
    import cutlass
    import cutlass.cute as cute

    rows, half_k, sk, k_pad = cute.sym_int(), cute.sym_int(divisibility=8), cute.sym_int(), cute.sym_int(
        divisibility=128)
    return (_fake(cutlass.Uint8, (rows, half_k), 8), _fake(cutlass.Float8E4M3FN, (rows, sk), 1),
            _fake(cutlass.Float16, (cute.sym_int(), k_pad)), env_stream())


def gemm_arguments(cfg: VarlenConfig, groups: int, n: int, k_pad: int, out_dtype: str = "Float16",
                   k: int | None = None):
    """(weights [rows, 128] u8, x16 [T, K_pad] f16 — with ``act="bf16"`` the activations [T, K] bf16 (``k``, default
    ``k_pad``) —, C [T, N], offsets [G+1] i32, gs_a [1 or G] f32 (not read with bf16), gs_b [G, 2] f32)."""
    import cutlass
    import cutlass.cute as cute

    x = (_fake(cutlass.BFloat16, (cute.sym_int(), k or k_pad)) if cfg.act == "bf16"
         else _fake(cutlass.Float16, (cute.sym_int(), k_pad)))
    return (_fake(cutlass.Uint8, (cute.sym_int(), 128)), x,
            _fake(getattr(cutlass, out_dtype), (cute.sym_int(), n)), _fake(cutlass.Int32, (groups + 1,), 4),
            _fake(cutlass.Float32, (cute.sym_int(),), 4), _fake(cutlass.Float32, (groups, 2), 8),
            *split_arguments(cfg, n), env_stream())


def combine_arguments(cfg: VarlenConfig, groups: int, n: int, k_pad: int, out_dtype: str = "BFloat16",
                      k: int | None = None, combine_dtype: str = "BFloat16", top_k: int = 8):
    """:func:`gemm_arguments` (C: the copies' rows, bf16), then the combine's (the copies' rows int64 [T·top_k], their
    weights fp32 [T, top_k] row-major, the output [T, N] of ``combine_dtype``, the column blocks' counters int32),
    stream: :meth:`~.kernel.GroupedVarlenGemmSm90.call_combine`'s."""
    import cutlass
    import cutlass.cute as cute

    *gemm, stream = gemm_arguments(cfg, groups, n, k_pad, out_dtype, k=k)
    return (*gemm, _fake(cutlass.Int64, (cute.sym_int(),), 8), _fake(cutlass.Float32, (cute.sym_int(), top_k), 4),
            _fake(getattr(cutlass, combine_dtype), (cute.sym_int(), n)), _fake(cutlass.Int32, (cute.sym_int(),), 4),
            stream)


def split_arguments(cfg: VarlenConfig, n: int):
    """(the K slices' fp32 partial sums [S, R, W] (W = N, or 2N for dual: gate then up), the tiles' counters int32
    [tiles]): read by ``split_k`` configs only; every config takes them (one calling convention)."""
    import cutlass
    import cutlass.cute as cute

    return (_fake(cutlass.Float32, (cute.sym_int(), cute.sym_int(), partials_width(cfg, n)), 4),
            _fake(cutlass.Int32, (cute.sym_int(),), 4))


def call_arguments(cfg: VarlenConfig, groups: int, n: int, k_pad: int, out_dtype: str = "Float16"):
    """The call's arguments (:class:`~.kernel.DecodeThenGemmSm90`): codes, scales, x16 (one tensor, written by the
    prologue and read by the GEMM), weights, C, offsets, gs_a, gs_b, the fused call's counters (int32 [4], zeros
    at first; :class:`~.runner.Scratch`), the split arguments (:func:`split_arguments`), stream."""
    import cutlass

    codes, scales, x16, _ = prologue_arguments()
    w, _, c, offsets, gs_a, gs_b, part, splits, stream = gemm_arguments(cfg, groups, n, k_pad, out_dtype)
    return codes, scales, x16, w, c, offsets, gs_a, gs_b, _fake(cutlass.Int32, (4,), 16), part, splits, stream


def compile_report(cfg: VarlenConfig, groups: int = 8, n: int = 4096, k_pad: int = 7168,
                   dump_dir: str | None = None, ptxas: bool = True, k: int | None = None) -> dict:
    """Compile the GEMM and the prologue for sm_90a with no GPU; return the PTX's key instruction counts (and ptxas
    resources where ptxas is installed). With ``act="bf16"`` there is no prologue (its entries are None) and ``k``
    is the activations' K (default ``k_pad``)."""
    from ..common.compiling import compile_offline

    pro_cls, gemm_cls, _ = kernel_classes()
    gemm = compile_offline(gemm_cls(cfg, groups, n, k_pad), *gemm_arguments(cfg, groups, n, k_pad, k=k),
                           arch="sm_90a", dump_dir=dump_dir, ptxas=ptxas, extra_options=TVM_FFI)
    pro = None
    if cfg.act != "bf16":
        pro = compile_offline(pro_cls(pdl.CHAIN), *prologue_arguments(), arch="sm_90a", dump_dir=dump_dir,
                              ptxas=ptxas, extra_options=TVM_FFI)
    return {"config": cfg.name, "groups": groups, "n": n, "k_pad": k_pad, "gemm": gemm.instructions,
            "gemm_ptxas": gemm.ptxas, "prologue": pro and pro.instructions, "prologue_ptxas": pro and pro.ptxas,
            "ptx": gemm.ptx, "prologue_ptx": pro and pro.ptx}
