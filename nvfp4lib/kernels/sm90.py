"""NVFP4 grouped GEMM for Hopper (sm_90a) in CuTe DSL: exact, by dequantizing to bf16 for wgmma.

Hopper has no FP4 tensor cores. Each CTA owns one output tile of one group (a row of the tile
table, see :mod:`.packing`); all groups run in one launch. Per K tile:

1. TMA (``cp.async.bulk.tensor``) brings the packed E2M1 bytes and the E4M3 scale bytes of A and
   B (and B2 for the dual GEMM) into shared memory, through an ``ab_stages``-deep mbarrier pipeline;
2. every thread dequantizes its share: value = e2m1(code) × e4m3(scale), exact in fp32 and in
   bf16, written to bf16 tiles in the swizzled layout wgmma reads; the packed stage is released
   at once so the next TMA overlaps the MMA;
3. ``wgmma.mma_async`` (bf16 × bf16 → fp32) over the tile;
4. after the last K tile, the epilogue multiplies the fp32 accumulator by the product of the
   global scales (exact where it matters: in fp32), applies silu(gate)·up for the dual GEMM,
   rounds once to fp16 and stores with per-element predicates (SIMT epilogue).

The knobs live in :class:`~nvfp4lib.kernels.config.KernelConfig` (tile, stages, ``decode`` = scalar |
vec4, ``warpgroups`` doing MMA + decode, extra decode-only ``decode_warpgroups``, diagnostics ``ablate``);
``validate`` refuses a config that cannot work before anything is compiled.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .config import KernelConfig

SMEM_LIMIT = 232448  # bytes of shared memory one CTA may use on sm_90 (227 KB)
MAX_ACC_REGS = 192
# The swizzle of a wgmma smem layout acts on byte offsets (S<3,4,3>: 16-byte chunks XOR-ed by row);
# our stores index bf16 elements, so offsets are scaled to bytes and back.
SWIZZLE_UNIT = 2  # fp32 accumulator registers per thread we allow before calling a config a spill risk


# ---------------------------------------------------------------------------------------------
# The decode: E2M1 and E4M3 bit patterns placed into fp32 fields, then exact power-of-two scaling.
# ---------------------------------------------------------------------------------------------
def _pure_asm(ret_type, operands, text: str, constraints: str):
    """One side-effect-free inline-PTX expression (the decode ops below)."""
    return llvm.inline_asm(ret_type, operands, text, constraints, has_side_effects=False, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def e2m1_times(code: cutlass.Int32, scale: cutlass.Float32, *, loc=None, ip=None) -> cutlass.Float32:
    """e2m1(code & 0xF) × scale. The code's sign goes to bit 31 and its magnitude bits (e1 e0 m) to
    bits 24..22, so the fp32 word is the value × 2^-126 (code 1 lands on a subnormal); × 2^126 restores it."""
    return cutlass.Float32(
        _pure_asm(
            T.f32(),
            [cutlass.Int32(code).ir_value(loc=loc, ip=ip), cutlass.Float32(scale).ir_value(loc=loc, ip=ip)],
            "{\n\t.reg .b32 s, m;\n\t.reg .f32 v;\n\t"
            "and.b32 s, $1, 8;\n\tshl.b32 s, s, 28;\n\t"
            "and.b32 m, $1, 7;\n\tshl.b32 m, m, 22;\n\t"
            "or.b32 s, s, m;\n\tmov.b32 v, s;\n\t"
            "mul.f32 v, v, 0f7E800000;\n\tmul.f32 $0, v, $2;\n\t}",
            "=f,r,f",
        )
    )


@dsl_user_op
def e4m3_value(byte: cutlass.Int32, *, loc=None, ip=None) -> cutlass.Float32:
    """The E4M3 byte as fp32: its 7 magnitude bits go to fp32 bits 26..20 (value × 2^-120), sign to 31."""
    return cutlass.Float32(
        _pure_asm(
            T.f32(),
            [cutlass.Int32(byte).ir_value(loc=loc, ip=ip)],
            "{\n\t.reg .b32 s, m;\n\t.reg .f32 v;\n\t"
            "and.b32 s, $1, 128;\n\tshl.b32 s, s, 24;\n\t"
            "and.b32 m, $1, 127;\n\tshl.b32 m, m, 20;\n\t"
            "or.b32 s, s, m;\n\tmov.b32 v, s;\n\t"
            "mul.f32 $0, v, 0f7B800000;\n\t}",
            "=f,r",
        )
    )


@dsl_user_op
def e2m1x2_times_bf16x2(byte: cutlass.Int32, scale2: cutlass.Int32, *, loc=None, ip=None) -> cutlass.Int32:
    """Both codes of the low byte of ``byte`` as a packed bf16x2 (low code in the low half) times ``scale2``
    (the block scale as bf16x2). The code bits go straight into bf16 fields (value × 2^-126), one bf16x2
    multiply by 2^126 restores them, a second applies the scale: both products are exact."""
    return cutlass.Int32(
        _pure_asm(
            T.i32(),
            [cutlass.Int32(byte).ir_value(loc=loc, ip=ip), cutlass.Int32(scale2).ir_value(loc=loc, ip=ip)],
            "{\n\t.reg .b32 t, u, v;\n\t"
            "and.b32 t, $1, 8;\n\tshl.b32 t, t, 12;\n\t"
            "and.b32 u, $1, 7;\n\tshl.b32 u, u, 6;\n\tor.b32 t, t, u;\n\t"
            "and.b32 u, $1, 128;\n\tshl.b32 u, u, 24;\n\tor.b32 t, t, u;\n\t"
            "and.b32 u, $1, 112;\n\tshl.b32 u, u, 18;\n\tor.b32 t, t, u;\n\t"
            "mov.b32 v, 0x7E807E80;\n\tmul.rn.bf16x2 t, t, v;\n\tmul.rn.bf16x2 $0, t, $2;\n\t}",
            "=r,r,r",
        )
    )


@dsl_user_op
def e4m3_as_bf16x2(byte: cutlass.Int32, *, loc=None, ip=None) -> cutlass.Int32:
    """The E4M3 byte as a bf16 pair (both halves equal); exact, since every E4M3 value fits bf16."""
    f = e4m3_value(byte, loc=loc, ip=ip)
    return cutlass.Int32(
        _pure_asm(
            T.i32(),
            [cutlass.Float32(f).ir_value(loc=loc, ip=ip)],
            "cvt.rn.bf16x2.f32 $0, $1, $1;",
            "=r,f",
        )
    )


# ---------------------------------------------------------------------------------------------
# Validity and the storage plan: asked before compiling.
# ---------------------------------------------------------------------------------------------
def smem_plan(cfg: KernelConfig) -> dict:
    """Bytes of shared memory per buffer, from the kernel's own storage plan."""
    nb = 2 if cfg.dual else 1
    kb = cfg.tile_k // 2
    ks = cfg.tile_k // 16
    plan = {
        "packed_a": cfg.ab_stages * cfg.tile_m * kb,
        "packed_b": nb * cfg.ab_stages * cfg.tile_n * kb,
        "scales": cfg.ab_stages * (cfg.tile_m + nb * cfg.tile_n) * ks,
        "bf16_a": cfg.tile_m * cfg.tile_k * 2,
        "bf16_b": nb * cfg.tile_n * cfg.tile_k * 2,
        "barriers": cfg.ab_stages * 2 * 8,
    }
    align = 1024 * 7  # each buffer is 1024-byte aligned
    plan["total"] = sum(plan.values()) + align
    return plan


def validate(cfg: KernelConfig) -> KernelConfig:
    """Raise ValueError naming the rule a config breaks; return it unchanged if it can work."""
    if cfg.tile_m not in (64, 128):
        raise ValueError(f"{cfg.name}: tile_m={cfg.tile_m}: one warpgroup's wgmma covers 64 rows per "
                         "instruction; this kernel supports tile_m 64 or 128")
    if cfg.decode_warpgroups not in (0, 1, 2):
        raise ValueError(f"{cfg.name}: decode_warpgroups={cfg.decode_warpgroups}: 0, 1 or 2 (at most 512 threads)")
    if cfg.warpgroups not in (1, 2) or cfg.tile_m < 64 * cfg.warpgroups:
        raise ValueError(f"{cfg.name}: warpgroups={cfg.warpgroups}: each warpgroup takes 64 rows of the tile, "
                         f"so 1 or 2 with tile_m >= 64 x warpgroups (tile_m={cfg.tile_m})")
    if cfg.tile_n % 8 or not 8 <= cfg.tile_n <= 256:
        raise ValueError(f"{cfg.name}: tile_n={cfg.tile_n}: wgmma's N must be a multiple of 8 in [8, 256]")
    if cfg.tile_k % 256:
        raise ValueError(f"{cfg.name}: tile_k={cfg.tile_k}: must be a multiple of 256 FP4 elements, so that a "
                         "TMA box of scale bytes (tile_k/16 per row) is a multiple of 16 bytes")
    if cfg.ab_stages < 1:
        raise ValueError(f"{cfg.name}: ab_stages={cfg.ab_stages} must be >= 1")
    if cfg.epilogue != "simt":
        raise ValueError(f"{cfg.name}: epilogue={cfg.epilogue!r} is not implemented in this kernel (only 'simt')")
    if cfg.warp_spec != "none":
        raise ValueError(f"{cfg.name}: warp_spec={cfg.warp_spec!r} is not implemented in this kernel (only 'none')")
    if cfg.swap_ab:
        raise ValueError(f"{cfg.name}: swap_ab is not implemented in this kernel")
    if cfg.decode not in ("scalar", "vec4"):
        raise ValueError(f"{cfg.name}: decode={cfg.decode!r}: must be 'scalar' or 'vec4'")
    if cfg.ablate not in ("", "no_dequant", "no_mma"):
        raise ValueError(f"{cfg.name}: ablate={cfg.ablate!r}: must be '', 'no_dequant' or 'no_mma'")
    acc = acc_registers(cfg)
    if acc > MAX_ACC_REGS:
        raise ValueError(f"{cfg.name}: {acc} fp32 accumulator registers per thread (tile {cfg.tile_m}x{cfg.tile_n}"
                         f"{', two accumulators' if cfg.dual else ''}, {128 * cfg.warpgroups} threads) exceed "
                         f"{MAX_ACC_REGS}: it would spill; use a smaller tile_n or more warpgroups")
    smem = smem_plan(cfg)["total"]
    if smem > SMEM_LIMIT:
        raise ValueError(f"{cfg.name}: needs {smem} bytes of shared memory > the sm_90 limit {SMEM_LIMIT} "
                         f"(tile {cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k}, {cfg.ab_stages} stages)")
    return cfg


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
class GroupedNvfp4GemmSm90:
    """One CTA per output tile, one warpgroup, TMA → dequantize → wgmma → SIMT epilogue."""

    def __init__(self, cfg: KernelConfig):
        self.cfg = validate(cfg)
        self.tile_m, self.tile_n, self.tile_k = cfg.tile_m, cfg.tile_n, cfg.tile_k
        self.tile_kb = cfg.tile_k // 2  # packed bytes per row
        self.tile_ks = cfg.tile_k // 16  # scale bytes per row
        self.stages = cfg.ab_stages
        self.dual = cfg.dual
        self.ablate = cfg.ablate
        self.decode = cfg.decode
        self.mma_threads = 128 * cfg.warpgroups
        self.threads = 128 * (cfg.warpgroups + cfg.decode_warpgroups)
        self.acc_dtype = cutlass.Float32
        self.ab_dtype = cutlass.BFloat16

    def _packed_layout(self, rows: int, cols: int):
        return cute.make_layout((rows, cols, self.stages), stride=(cols, 1, rows * cols))

    @cute.jit
    def __call__(self, mA: cute.Tensor, mSFA: cute.Tensor, mB: cute.Tensor, mSFB: cute.Tensor,
                 mB2: cute.Tensor, mSFB2: cute.Tensor, mC: cute.Tensor, mTiles: cute.Tensor,
                 mAlpha: cute.Tensor, stream):
        tile_mnk = (self.tile_m, self.tile_n, self.tile_k)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype, self.ab_dtype, cute.nvgpu.warpgroup.OperandMajorMode.K,
            cute.nvgpu.warpgroup.OperandMajorMode.K, self.acc_dtype, (self.cfg.warpgroups, 1, 1),
            tiler_mn=(64, self.tile_n))
        sA_layout = sm90_utils.make_smem_layout_a(utils.LayoutEnum.ROW_MAJOR, tile_mnk, self.ab_dtype, 1)
        sB_layout = sm90_utils.make_smem_layout_b(utils.LayoutEnum.ROW_MAJOR, tile_mnk, self.ab_dtype, 1)
        qa_layout = self._packed_layout(self.tile_m, self.tile_kb)
        qb_layout = self._packed_layout(self.tile_n, self.tile_kb)
        sfa_layout = self._packed_layout(self.tile_m, self.tile_ks)
        sfb_layout = self._packed_layout(self.tile_n, self.tile_ks)

        g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        tma_a, tA = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, mA, cute.slice_(qa_layout, (None, None, 0)), (self.tile_m, self.tile_kb))
        tma_sfa, tSFA = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, mSFA, cute.slice_(sfa_layout, (None, None, 0)), (self.tile_m, self.tile_ks))
        tma_b, tB = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, mB, cute.slice_(qb_layout, (None, None, 0)), (self.tile_n, self.tile_kb))
        tma_sfb, tSFB = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, mSFB, cute.slice_(sfb_layout, (None, None, 0)), (self.tile_n, self.tile_ks))
        tma_b2, tB2 = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, mB2, cute.slice_(qb_layout, (None, None, 0)), (self.tile_n, self.tile_kb))
        tma_sfb2, tSFB2 = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, mSFB2, cute.slice_(sfb_layout, (None, None, 0)), (self.tile_n, self.tile_ks))

        nb = 2 if self.dual else 1

        @cute.struct
        class SharedStorage:
            barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            qa: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(qa_layout)], 1024]
            qb: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(qb_layout) * nb], 1024]
            sfa: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(sfa_layout)], 1024]
            sfb: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(sfb_layout) * nb], 1024]
            sa: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sA_layout)], 1024]
            sb: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sB_layout) * nb], 1024]

        self.shared_storage = SharedStorage
        num_tiles = cute.size(mTiles, mode=[0])
        self.kernel(tiled_mma, tma_a, tA, tma_sfa, tSFA, tma_b, tB, tma_sfb, tSFB, tma_b2, tB2, tma_sfb2,
                    tSFB2, mC, mTiles, mAlpha, sA_layout, sB_layout, qa_layout, qb_layout, sfa_layout,
                    sfb_layout).launch(grid=(num_tiles, 1, 1), block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, tma_a: cute.CopyAtom, tA: cute.Tensor, tma_sfa: cute.CopyAtom,
               tSFA: cute.Tensor, tma_b: cute.CopyAtom, tB: cute.Tensor, tma_sfb: cute.CopyAtom, tSFB: cute.Tensor,
               tma_b2: cute.CopyAtom, tB2: cute.Tensor, tma_sfb2: cute.CopyAtom, tSFB2: cute.Tensor,
               mC: cute.Tensor, mTiles: cute.Tensor, mAlpha: cute.Tensor,
               sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout, qa_layout: cute.Layout,
               qb_layout: cute.Layout, sfa_layout: cute.Layout, sfb_layout: cute.Layout):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        if warp_idx == 0:
            for atom in (tma_a, tma_sfa, tma_b, tma_sfb):
                cute.nvgpu.cpasync.prefetch_descriptor(atom)
            if cutlass.const_expr(self.dual):
                cute.nvgpu.cpasync.prefetch_descriptor(tma_b2)
                cute.nvgpu.cpasync.prefetch_descriptor(tma_sfb2)

        # This CTA's tile, from the table.
        group = mTiles[bidx, 0]
        a_row0 = mTiles[bidx, 1]
        m_valid = mTiles[bidx, 2]
        n0 = mTiles[bidx, 3]
        n_valid = mTiles[bidx, 4]
        b_row0 = mTiles[bidx, 5]
        k_tiles = mTiles[bidx, 6]

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        nb = 2 if self.dual else 1
        tx_bytes = (self.tile_m + nb * self.tile_n) * (self.tile_kb + self.tile_ks) * 1
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.barriers.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.threads // 32),
            tx_count=tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )

        sQA = storage.qa.get_tensor(qa_layout)
        sSFA = storage.sfa.get_tensor(sfa_layout)
        qb_all = storage.qb.get_tensor(cute.make_layout((cute.cosize(qb_layout) * nb,)))
        sf_all = storage.sfb.get_tensor(cute.make_layout((cute.cosize(sfb_layout) * nb,)))
        sQB = cute.make_tensor(qb_all.iterator, qb_layout)
        sSFB = cute.make_tensor(sf_all.iterator, sfb_layout)
        sQB2 = cute.make_tensor(qb_all.iterator + cute.cosize(qb_layout), qb_layout)
        sSFB2 = cute.make_tensor(sf_all.iterator + cute.cosize(sfb_layout), sfb_layout)
        sA = storage.sa.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sA_flat = storage.sa.get_tensor(cute.make_layout((cute.cosize(sA_layout),)))
        sb_all = storage.sb.get_tensor(cute.make_layout((cute.cosize(sB_layout) * nb,)))
        sB = cute.make_tensor(cute.recast_ptr(sb_all.iterator, sB_layout.inner, dtype=self.ab_dtype), sB_layout.outer)
        sB2 = cute.make_tensor(cute.recast_ptr(sb_all.iterator + cute.cosize(sB_layout), sB_layout.inner,
                                               dtype=self.ab_dtype), sB_layout.outer)

        # Global tiles: (rows, bytes, k_tile) for this CTA's A and B rows.
        m_tile = a_row0 // self.tile_m
        n_tile = b_row0 // self.tile_n
        gA = cute.local_tile(tA, (self.tile_m, self.tile_kb), (m_tile, None))
        gSFA = cute.local_tile(tSFA, (self.tile_m, self.tile_ks), (m_tile, None))
        gB = cute.local_tile(tB, (self.tile_n, self.tile_kb), (n_tile, None))
        gSFB = cute.local_tile(tSFB, (self.tile_n, self.tile_ks), (n_tile, None))
        gB2 = cute.local_tile(tB2, (self.tile_n, self.tile_kb), (n_tile, None))
        gSFB2 = cute.local_tile(tSFB2, (self.tile_n, self.tile_ks), (n_tile, None))

        def part(atom, s, g):
            return cute.nvgpu.cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                                    cute.group_modes(g, 0, 2))

        tAs, tAg = part(tma_a, sQA, gA)
        tSFAs, tSFAg = part(tma_sfa, sSFA, gSFA)
        tBs, tBg = part(tma_b, sQB, gB)
        tSFBs, tSFBg = part(tma_sfb, sSFB, gSFB)
        tB2s, tB2g = part(tma_b2, sQB2, gB2)
        tSFB2s, tSFB2g = part(tma_sfb2, sSFB2, gSFB2)

        is_mma = tidx < self.mma_threads  # decode-only warpgroups (if any) come after the MMA ones
        thr_mma = tiled_mma.get_slice(tidx % self.mma_threads)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        tCrB2 = tiled_mma.make_fragment_B(thr_mma.partition_B(sB2))
        cC = cute.make_identity_tensor((self.tile_m, self.tile_n))
        tCcC = thr_mma.partition_C(cC)
        acc = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
        acc2 = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
        acc.fill(0.0)
        acc2.fill(0.0)
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        num_k_blocks = cute.size(tCrA, mode=[2])

        cute.arch.sync_threads()  # barriers initialised before anyone waits on them

        prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)

        # Prologue: fill the pipeline.
        if warp_idx == 0:
            for _ in cutlass.range(cutlass.min(self.stages, k_tiles), unroll=1):
                self._issue_loads(pipe, prod, tma_a, tAg, tAs, tma_sfa, tSFAg, tSFAs, tma_b, tBg, tBs,
                                  tma_sfb, tSFBg, tSFBs, tma_b2, tB2g, tB2s, tma_sfb2, tSFB2g, tSFB2s)
                prod.advance()

        for _kt in cutlass.range(k_tiles, unroll=1):
            pipe.consumer_wait(cons)
            stage = cons.index
            if cutlass.const_expr(self.ablate != "no_dequant"):
                self._dequant(sQA, sSFA, sA_flat, sA_layout, 0, self.tile_m, stage, tidx)
                self._dequant(sQB, sSFB, sb_all, sB_layout, 0, self.tile_n, stage, tidx)
                if cutlass.const_expr(self.dual):
                    self._dequant(sQB2, sSFB2, sb_all, sB_layout, cute.cosize(sB_layout), self.tile_n, stage, tidx)
            # generic-proxy smem writes must be visible to wgmma's async proxy
            cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)
            cute.arch.sync_threads()
            pipe.consumer_release(cons)
            cons.advance()
            if warp_idx == 0:
                if prod.count < k_tiles:
                    self._issue_loads(pipe, prod, tma_a, tAg, tAs, tma_sfa, tSFAg, tSFAs, tma_b, tBg, tBs,
                                      tma_sfb, tSFBg, tSFBs, tma_b2, tB2g, tB2s, tma_sfb2, tSFB2g, tSFB2s)
                    prod.advance()
            if cutlass.const_expr(self.ablate != "no_mma"):
                if is_mma:
                    cute.nvgpu.warpgroup.fence()
                    for kb in cutlass.range(num_k_blocks, unroll_full=True):
                        cute.gemm(tiled_mma, acc, tCrA[None, None, kb, 0], tCrB[None, None, kb, 0], acc)
                        if cutlass.const_expr(self.dual):
                            cute.gemm(tiled_mma, acc2, tCrA[None, None, kb, 0], tCrB2[None, None, kb, 0], acc2)
                    cute.nvgpu.warpgroup.commit_group()
                    cute.nvgpu.warpgroup.wait_group(0)
            cute.arch.sync_threads()  # nobody rewrites the bf16 tiles while another warp's MMA may read them

        # Epilogue: fp32 global scales, (silu·up), one rounding, predicated stores.
        alpha = mAlpha[group, 0]
        alpha2 = mAlpha[group, 1]
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            m, n = tCcC[i]
            if is_mma and m < m_valid and n < n_valid:
                v = acc[i] * alpha
                if cutlass.const_expr(self.dual):
                    up = acc2[i] * alpha2
                    v = v / (1.0 + cute.math.exp(-v)) * up
                mC[a_row0 + m, n0 + n] = v.to(mC.element_type)

    @cute.jit
    def _issue_loads(self, pipe, prod, tma_a, tAg, tAs, tma_sfa, tSFAg, tSFAs, tma_b, tBg, tBs,
                     tma_sfb, tSFBg, tSFBs, tma_b2, tB2g, tB2s, tma_sfb2, tSFB2g, tSFB2s):
        pipe.producer_acquire(prod)
        bar = pipe.producer_get_barrier(prod)
        k, s = prod.count, prod.index
        cute.copy(tma_a, tAg[None, k], tAs[None, s], tma_bar_ptr=bar)
        cute.copy(tma_sfa, tSFAg[None, k], tSFAs[None, s], tma_bar_ptr=bar)
        cute.copy(tma_b, tBg[None, k], tBs[None, s], tma_bar_ptr=bar)
        cute.copy(tma_sfb, tSFBg[None, k], tSFBs[None, s], tma_bar_ptr=bar)
        if cutlass.const_expr(self.dual):
            cute.copy(tma_b2, tB2g[None, k], tB2s[None, s], tma_bar_ptr=bar)
            cute.copy(tma_sfb2, tSFB2g[None, k], tSFB2s[None, s], tma_bar_ptr=bar)
        pipe.producer_commit(prod)

    @cute.jit
    def _dequant(self, sQ: cute.Tensor, sSF: cute.Tensor, sOut_flat: cute.Tensor, out_layout: cute.ComposedLayout,
                 base: cutlass.Constexpr, rows: cutlass.Constexpr, stage, tidx):
        """Decode this stage's packed tile into the bf16 tile; consecutive threads take consecutive bytes.

        The bf16 tile is in wgmma's swizzled K-major layout; element stores through a swizzled tensor
        are not supported by the DSL, so the swizzle (a static XOR of offset bits) is applied by hand."""
        bbits, mbase, sshift = _swizzle_params(out_layout.inner)
        if cutlass.const_expr(self.decode == "vec4"):
            # one 32-bit word = 8 codes sharing one scale -> four bf16x2 words, one 16-byte chunk of the tile
            words = self.tile_kb // 4
            q32 = cute.make_tensor(cute.recast_ptr(sQ.iterator, dtype=cutlass.Uint32),
                                   cute.make_layout((rows, words, self.stages), stride=(words, 1, rows * words)))
            o32 = cute.make_tensor(cute.recast_ptr(sOut_flat.iterator, dtype=cutlass.Uint32),
                                   cute.make_layout((cute.size(sOut_flat) // 2,)))
            for i in cutlass.range(rows * words // self.threads, unroll=2):
                idx = i * self.threads + tidx
                r = idx // words
                w = idx % words
                word = cutlass.Int32(q32[r, w, stage])
                scale2 = e4m3_as_bf16x2(cutlass.Int32(sSF[r, w // 2, stage]))
                lin = cute.crd2idx((r, 8 * w, 0), out_layout.outer) * SWIZZLE_UNIT
                off = (base + _swizzle_offset(lin, bbits, mbase, sshift) // SWIZZLE_UNIT) // 2
                for j in cutlass.range_constexpr(4):
                    o32[off + j] = cutlass.Uint32(e2m1x2_times_bf16x2(word >> (8 * j), scale2))
        else:
            for i in cutlass.range(rows * self.tile_kb // self.threads, unroll=4):
                idx = i * self.threads + tidx
                r = idx // self.tile_kb
                cb = idx % self.tile_kb
                byte = cutlass.Int32(sQ[r, cb, stage])
                scale = e4m3_value(cutlass.Int32(sSF[r, cb // 8, stage]))
                lin = cute.crd2idx((r, 2 * cb, 0), out_layout.outer) * SWIZZLE_UNIT
                off = _swizzle_offset(lin, bbits, mbase, sshift) // SWIZZLE_UNIT
                sOut_flat[base + off] = e2m1_times(byte, scale).to(self.ab_dtype)
                sOut_flat[base + off + 1] = e2m1_times(byte >> 4, scale).to(self.ab_dtype)


def _swizzle_offset(lin, bbits: int, mbase: int, sshift: int):
    return lin ^ ((lin >> (mbase + sshift)) & ((1 << bbits) - 1)) << mbase


def _swizzle_params(swizzle) -> tuple[int, int, int]:
    """(BBits, MBase, SShift) of a static swizzle, from its printed form S<B,M,S>."""
    import re

    m = re.search(r"S<(\d+),(\d+),(\d+)>", str(swizzle))
    if not m:
        raise ValueError(f"unexpected swizzle {swizzle}")
    return tuple(int(x) for x in m.groups())


def acc_registers(cfg: KernelConfig) -> int:
    return (2 if cfg.dual else 1) * cfg.tile_m * cfg.tile_n // (128 * cfg.warpgroups)


__all__ = ["GroupedNvfp4GemmSm90", "validate", "smem_plan", "acc_registers", "e2m1_times", "e4m3_value",
           "e2m1x2_times_bf16x2", "e4m3_as_bf16x2"]
