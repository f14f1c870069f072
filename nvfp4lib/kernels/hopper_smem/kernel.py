"""``backend="cute-hopper"``: an exact NVFP4 grouped GEMM for Hopper (sm_90a) in CuTe DSL.

Hopper has no FP4 tensor cores. Each CTA owns one output tile of one group (a row of the tile
table of :mod:`..common.packing`); all groups run in one launch. Per K tile of ``tile_k`` FP4
elements:

1. TMA (``cp.async.bulk.tensor``) brings the packed E2M1 bytes of A and B (and B2), 128-byte
   swizzled, and their E4M3 scale bytes into shared memory through an ``ab_stages``-deep mbarrier
   pipeline;
2. the tile is decoded in sub-blocks of 64 K elements into a double-buffered fp16 tile in the
   swizzled K-major layout wgmma reads. The decode is a few integer ops per element pair: each
   code's sign and magnitude bits are placed into the high byte of an fp16 word (whose value is
   then e2m1 × 2^-14, a subnormal for code 1), and one fp16x2 multiply by (scale × 2^7) gives
   e2m1 × scale × 2^-7 — exact: at most 6 significant bits, inside fp16's range;
3. ``wgmma.mma_async`` (fp16 × fp16 → fp32) over the sub-block runs while the next sub-block is
   decoded;
4. the epilogue multiplies the fp32 accumulator by ``alpha = gs_A·gs_B·2^14`` (the 2^14 undoes the
   two 2^-7 factors exactly), applies silu(gate)·up for the dual GEMM, rounds once to fp16, and
   stores with per-element predicates (``simt``) or through shared memory and a TMA store
   (``tma``; safe on ragged groups because every group's output rows are padded to ``tile_m``).

Warp specialization: ``none`` — one warpgroup (128 threads) does everything, one elected thread
issues the TMA loads (the study's baseline structure); ``producer_consumer`` — a producer warpgroup
waits for TMA and decodes into a ring of fp16 buffers, ``tile_m/64`` consumer warpgroups run wgmma and
the epilogue. ``pingpong`` is not implemented in this kernel (refused by :func:`validate`). The
cooperative and two-producer structures and the decode/MMA ablations lost or were diagnostics; they are
in git at commit f7c5079.

``decode="batched"`` issues all of a thread's shared-memory loads of a sub-block before converting
(``chunked``: load, convert, store per 16 codes; a load after a store to shared memory cannot be
hoisted by ptxas). ``split_k`` splits the K tiles of every output tile over several CTAs writing fp32
partials that the runner sums (``0``: only when the tiles fill at most a quarter of the SMs).

Knobs live in :class:`~.config.SmemConfig`; :func:`validate` refuses a config that cannot work
before anything is compiled; compiled kernels are cached per (config, output dtype). The backend
``cute-hopper`` runs two kernel families: this one, and the register-decode kernel of :mod:`..hopper_rs`
(:class:`~..hopper_rs.config.RSConfig`, configs named ``rs_*``). Only configs in :data:`CONFIGS` (the two families'
tables) are shipped: each was run exactly on an H100. The default, ``config="auto"``, is resolved above
the kernels (:data:`nvfp4lib.bench.backends.AUTO_CANDIDATES`).
"""
from __future__ import annotations

import time

import torch

from ...runner import Runner
from ..common.decode_ptx import (  # noqa: F401  (re-exported: hopper_smem.kernel.X is the study's name for them)
    _DECODE_REGS,
    CONVERT16_PTX,
    DECODE16_PTX,
    LOAD16_PTX,
    OPERAND_EXPONENT,
    _convert_store_ptx,
    emulate_decode,
)
from ..common.packing import (
    WIDE_TILE_COLUMNS,
    ActivationPacker,
    check_scales_finite,
    stack_weights,
    tile_fields,
    tile_table,
)
from ..common.sm90 import _cute, _require_hopper
from ..hopper_rs.config import RS_CONFIGS, RSConfig
from ..hopper_rs.config import validate as validate_rs
from .config import (  # noqa: F401
    DECODE_ROWS,
    EPI_STAGES,
    MAX_ACC_REGS,
    OUT_DTYPES,
    POST_SCALE,
    RING,
    SMEM_CONFIGS,
    SMEM_LIMIT,
    SUB_K,
    SWEEP_CONFIGS,
    SmemConfig,
    acc_registers,
    epilogue_tile,
    math_warpgroups,
    register_split,
    smem_plan,
    threads_for,
)
from .config import validate as validate_smem

# The backend's named configs: the smem-decode kernel's (this module) and the register-decode kernel's (..hopper_rs).
CONFIGS: dict[str, SmemConfig | RSConfig] = {**SMEM_CONFIGS, **RS_CONFIGS}
DEFAULT_SINGLE = DEFAULT_DUAL = "auto"  # resolved above the kernels: nvfp4lib.bench.backends.AUTO_CANDIDATES


def validate(cfg):
    """Raise ValueError naming the rule a config of either family breaks; return it unchanged if it can work."""
    if isinstance(cfg, RSConfig):
        return validate_rs(cfg)
    return validate_smem(cfg)


def get_config(config, dual: bool) -> SmemConfig | RSConfig:
    """A config (validated) from a name or a config; ``dual`` is set from the operands."""
    if isinstance(config, (SmemConfig, RSConfig)):
        cfg = config
    else:
        name = config or (DEFAULT_DUAL if dual else DEFAULT_SINGLE)
        if name == "auto":
            raise ValueError("config 'auto' is a choice among nvfp4lib.bench.backends.AUTO_CANDIDATES made by "
                             "prepare, not one config")
        table = {**CONFIGS, **SWEEP_CONFIGS}
        if name not in table:
            raise ValueError(f"unknown cute-hopper config {name!r}; known: {', '.join(table)} (configs that lost or "
                             "were diagnostics are in git at commit f7c5079, their rows in data/bench.jsonl)")
        cfg = table[name]
    if isinstance(cfg, RSConfig) and cfg.dual != dual:  # a CTA's warpgroups split tile_m rows, or cover gate and up
        cfg = cfg.with_(tile_m=cfg.tile_m // 2 if dual else cfg.tile_m * 2)
    return validate(cfg.with_(dual=dual))


def _kernel_class():
    """Build the kernel class on first use (keeps cutlass out of ``import nvfp4lib``)."""
    global _KERNEL_CLASS
    if _KERNEL_CLASS is not None:
        return _KERNEL_CLASS

    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import dsl_user_op

    @dsl_user_op
    def decode16(src, sf, dst0, dst1, *, loc=None, ip=None):
        llvm.inline_asm(
            None,
            [cutlass.Int32(v).ir_value(loc=loc, ip=ip) for v in (src, sf, dst0, dst1)],
            DECODE16_PTX,
            "r,r,r,r",
            has_side_effects=True,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )

    @dsl_user_op
    def load16(src, sf, *, loc=None, ip=None):
        i32 = cutlass.Int32.mlir_type
        res = llvm.inline_asm(
            llvm.StructType.get_literal([i32, i32, i32]),
            [cutlass.Int32(v).ir_value(loc=loc, ip=ip) for v in (src, sf)],
            LOAD16_PTX,
            "=r,=r,=r,r,r",
            has_side_effects=True,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
        return tuple(llvm.extractvalue(i32, res, [i]) for i in range(3))

    @dsl_user_op
    def convert16(loaded, dst0, dst1, *, loc=None, ip=None):
        llvm.inline_asm(
            None,
            [*loaded, *(cutlass.Int32(v).ir_value(loc=loc, ip=ip) for v in (dst0, dst1))],
            CONVERT16_PTX,
            "r,r,r,r,r",
            has_side_effects=True,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )

    class GroupedNvfp4GemmSm90:
        """One CTA per output tile: TMA → decode to fp16 in smem → wgmma → epilogue."""

        def __init__(self, cfg: SmemConfig):
            self.cfg = validate_smem(cfg)
            self.tile_m, self.tile_n, self.tile_k = cfg.tile_m, cfg.tile_n, cfg.tile_k
            self.tile_kb = cfg.tile_k // 2  # packed bytes per row
            self.tile_ks = cfg.tile_k // 16  # scale bytes per row
            self.nsub = cfg.tile_k // SUB_K
            self.stages = cfg.ab_stages
            self.dual = cfg.dual
            self.nb = 2 if cfg.dual else 1
            self.pc = cfg.warp_spec == "producer_consumer"
            self.nmath = math_warpgroups(cfg)
            self.threads = threads_for(cfg)
            self.math_threads = 128 * self.nmath
            self.tma_epi = cfg.epilogue == "tma"
            self.split = cfg.split_k != 1
            self.acc_dtype = cutlass.Float32
            self.ab_dtype = cutlass.Float16
            self.epi_tile = epilogue_tile(cfg)
            self.regs_producer, self.regs_math = register_split(cfg)
            self.realloc = self.pc and self.threads >= 384
            self.ring_bars = RING * 2 if self.pc else 1

        def _plain_layout(self, rows: int, cols: int, stages: int):
            return cute.make_layout((rows, cols, stages), stride=(cols, 1, rows * cols))

        @cute.jit
        def __call__(self, mA: cute.Tensor, mSFA: cute.Tensor, mB: cute.Tensor, mSFB: cute.Tensor,
                     mB2: cute.Tensor, mSFB2: cute.Tensor, mC: cute.Tensor, mTiles: cute.Tensor,
                     mAlpha: cute.Tensor, stream):
            c_dtype = mC.element_type
            tiled_mma = sm90_utils.make_trivial_tiled_mma(
                self.ab_dtype, self.ab_dtype, cute.nvgpu.warpgroup.OperandMajorMode.K,
                cute.nvgpu.warpgroup.OperandMajorMode.K, self.acc_dtype, (self.nmath, 1, 1),
                tiler_mn=(64, self.tile_n))
            sub_mnk = (self.tile_m, self.tile_n, SUB_K)
            row_major = utils.LayoutEnum.ROW_MAJOR
            sA_layout = sm90_utils.make_smem_layout_a(row_major, sub_mnk, self.ab_dtype, RING)
            sB_layout = sm90_utils.make_smem_layout_b(row_major, sub_mnk, self.ab_dtype, RING)
            qa_layout = sm90_utils.make_smem_layout_a(
                row_major, (self.tile_m, self.tile_n, self.tile_kb), cutlass.Uint8, self.stages)
            qb_layout = sm90_utils.make_smem_layout_b(
                row_major, (self.tile_m, self.tile_n, self.tile_kb), cutlass.Uint8, self.stages)
            sfa_layout = self._plain_layout(self.tile_m, self.tile_ks, self.stages)
            sfb_layout = self._plain_layout(self.tile_n, self.tile_ks, self.stages)
            epi_layout = sm90_utils.make_smem_layout_epi(c_dtype, row_major, self.epi_tile, EPI_STAGES)

            g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()

            def tma(t, layout, box):
                return cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, t, cute.slice_(layout, (None, None, 0)), box)

            tma_a, tA = tma(mA, qa_layout, (self.tile_m, self.tile_kb))
            tma_sfa, tSFA = tma(mSFA, sfa_layout, (self.tile_m, self.tile_ks))
            tma_b, tB = tma(mB, qb_layout, (self.tile_n, self.tile_kb))
            tma_sfb, tSFB = tma(mSFB, sfb_layout, (self.tile_n, self.tile_ks))
            tma_b2, tB2 = tma(mB2, qb_layout, (self.tile_n, self.tile_kb))
            tma_sfb2, tSFB2 = tma(mSFB2, sfb_layout, (self.tile_n, self.tile_ks))
            tma_c, tC = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), mC, cute.slice_(epi_layout, (None, None, 0)),
                self.epi_tile)

            nb = self.nb

            @cute.struct
            class SharedStorage:
                load_bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
                ring_bars: cute.struct.MemRange[cutlass.Int64, self.ring_bars]
                qa: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(qa_layout)], 1024]
                qb: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(qb_layout) * nb], 1024]
                sfa: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(sfa_layout)], 128]
                sfb: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(sfb_layout) * nb], 128]
                sa: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sA_layout)], 1024]
                sb: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sB_layout) * nb], 1024]

            self.shared_storage = SharedStorage
            num_tiles = cute.size(mTiles, mode=[0])
            self.kernel(tiled_mma, tma_a, tA, tma_sfa, tSFA, tma_b, tB, tma_sfb, tSFB, tma_b2, tB2, tma_sfb2,
                        tSFB2, tma_c, tC, mC, mTiles, mAlpha, sA_layout, sB_layout, qa_layout, qb_layout,
                        sfa_layout, sfb_layout, epi_layout).launch(
                grid=(num_tiles, 1, 1), block=(self.threads, 1, 1), stream=stream)

        @cute.kernel
        def kernel(self, tiled_mma: cute.TiledMma, tma_a: cute.CopyAtom, tA: cute.Tensor,
                   tma_sfa: cute.CopyAtom, tSFA: cute.Tensor, tma_b: cute.CopyAtom, tB: cute.Tensor,
                   tma_sfb: cute.CopyAtom, tSFB: cute.Tensor, tma_b2: cute.CopyAtom, tB2: cute.Tensor,
                   tma_sfb2: cute.CopyAtom, tSFB2: cute.Tensor, tma_c: cute.CopyAtom, tC: cute.Tensor,
                   mC: cute.Tensor, mTiles: cute.Tensor, mAlpha: cute.Tensor,
                   sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
                   qa_layout: cute.ComposedLayout, qb_layout: cute.ComposedLayout,
                   sfa_layout: cute.Layout, sfb_layout: cute.Layout, epi_layout: cute.ComposedLayout):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            wg_idx = cute.arch.make_warp_uniform(tidx // 128)
            # The warp that issues TMA loads: warp 0 (none) or the producer warpgroup's first warp.
            tma_warp = self.nmath * 4 if self.pc else 0

            if warp_idx == tma_warp:
                for atom in (tma_a, tma_sfa, tma_b, tma_sfb):
                    cute.nvgpu.cpasync.prefetch_descriptor(atom)
                if cutlass.const_expr(self.dual):
                    cute.nvgpu.cpasync.prefetch_descriptor(tma_b2)
                    cute.nvgpu.cpasync.prefetch_descriptor(tma_sfb2)

            f = tile_fields(mTiles, bidx)
            group, row0, m_valid, n0, n_valid = f["group"], f["row0"], f["m_valid"], f["n0"], f["n_valid"]
            b_row0, k_tiles = f["b_row0"], f["k_tiles"]
            k_tile0 = f["k_tile0"]  # first K tile of this CTA's slice (split-K), else 0
            out_row0 = f["out_row0"]  # output row (split-K: the slice's block of the fp32 workspace), else row0

            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(self.shared_storage)
            nb = self.nb
            tx_bytes = (self.tile_m + nb * self.tile_n) * (self.tile_kb + self.tile_ks)
            load_pipe = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.load_bars.data_ptr(), num_stages=self.stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4),
                tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)), defer_sync=True)
            ring_pipe = None
            if cutlass.const_expr(self.pc):
                ring_pipe = pipeline.PipelineAsync.create(
                    barrier_storage=storage.ring_bars.data_ptr(), num_stages=RING,
                    producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
                    consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.math_threads),
                    defer_sync=True)
            cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()  # barriers initialised before anyone waits on them

            # Shared-memory tensors: TMA destinations, and the fp16 ring wgmma reads.
            def b_pair(region, layout, dtype):
                """B's and B2's swizzled views of one region holding ``nb`` copies of ``layout`` back to back."""
                flat = region.get_tensor(cute.make_layout((cute.cosize(layout) * nb,)))
                return flat, [cute.make_tensor(cute.recast_ptr(flat.iterator + i * cute.cosize(layout), layout.inner,
                                                               dtype=dtype), layout.outer) for i in (0, 1)]

            sQA = storage.qa.get_tensor(qa_layout.outer, swizzle=qa_layout.inner)
            qb_all, (sQB, sQB2) = b_pair(storage.qb, qb_layout, cutlass.Uint8)
            sSFA = storage.sfa.get_tensor(sfa_layout)
            sf_all = storage.sfb.get_tensor(cute.make_layout((cute.cosize(sfb_layout) * nb,)))
            sSFB = cute.make_tensor(sf_all.iterator, sfb_layout)
            sSFB2 = cute.make_tensor(sf_all.iterator + cute.cosize(sfb_layout), sfb_layout)
            sA = storage.sa.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
            sb_all, (sB, sB2) = b_pair(storage.sb, sB_layout, self.ab_dtype)

            # 32-bit shared addresses for the decode's own loads and stores.
            addr = {
                "qa": storage.qa.data_ptr().toint(), "qb": qb_all.iterator.toint(),
                "sfa": storage.sfa.data_ptr().toint(), "sfb": sf_all.iterator.toint(),
                "sa": storage.sa.data_ptr().toint(), "sb": sb_all.iterator.toint(),
            }

            # TMA partitions: (rows, bytes, k_tile) of this CTA's A and B rows.
            m_tile = row0 // self.tile_m
            n_tile = b_row0 // self.tile_n

            def part(atom, s, t, rows, cols, tile_idx):
                g = cute.local_tile(t, (rows, cols), (tile_idx, None))
                return cute.nvgpu.cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                                        cute.group_modes(g, 0, 2))

            loads = [
                (tma_a,) + part(tma_a, sQA, tA, self.tile_m, self.tile_kb, m_tile),
                (tma_sfa,) + part(tma_sfa, sSFA, tSFA, self.tile_m, self.tile_ks, m_tile),
                (tma_b,) + part(tma_b, sQB, tB, self.tile_n, self.tile_kb, n_tile),
                (tma_sfb,) + part(tma_sfb, sSFB, tSFB, self.tile_n, self.tile_ks, n_tile),
            ]
            if cutlass.const_expr(self.dual):
                loads.append((tma_b2,) + part(tma_b2, sQB2, tB2, self.tile_n, self.tile_kb, n_tile))
                loads.append((tma_sfb2,) + part(tma_sfb2, sSFB2, tSFB2, self.tile_n, self.tile_ks, n_tile))

            # wgmma fragments over the fp16 ring, and the accumulators.
            mtid = tidx % self.math_threads
            thr_mma = tiled_mma.get_slice(mtid)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            tCrB2 = tiled_mma.make_fragment_B(thr_mma.partition_B(sB2))
            cC = cute.make_identity_tensor((self.tile_m, self.tile_n))
            tCcC = thr_mma.partition_C(cC)
            acc = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
            acc2 = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)

            prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)

            if warp_idx == tma_warp:
                for _ in cutlass.range(cutlass.min(self.stages, k_tiles), unroll=1):
                    self._issue_loads(load_pipe, prod, loads, k_tile0)
                    prod.advance()

            if cutlass.const_expr(not self.pc):
                # --- one warpgroup: decode sub-block j while the wgmma of sub-block j-1 runs ---
                acc.fill(0.0)
                acc2.fill(0.0)
                wg_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=self.threads)
                for _kt in cutlass.range(k_tiles, unroll=1):
                    load_pipe.consumer_wait(cons)
                    for j in cutlass.range_constexpr(self.nsub):
                        buf = j % RING
                        # the wgmma that read this buffer (two sub-blocks ago) is done, in every warp
                        cute.nvgpu.warpgroup.wait_group(1)
                        wg_bar.arrive_and_wait()
                        self._decode_sub_block(addr, cons.index, buf, j, tidx)
                        # generic-proxy smem writes must be visible to wgmma's async proxy
                        cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared,
                                              space=cute.arch.SharedSpace.shared_cta)
                        wg_bar.arrive_and_wait()
                        self._mma_sub_block(tiled_mma, acc, acc2, tCrA, tCrB, tCrB2, buf)
                    load_pipe.consumer_release(cons)
                    cons.advance()
                    if warp_idx == tma_warp:
                        if prod.count < k_tiles:
                            self._issue_loads(load_pipe, prod, loads, k_tile0)
                            prod.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                self._epilogue(tiled_mma, thr_mma, acc, acc2, tCcC, storage, epi_layout, tma_c, tC, mC, mAlpha,
                               group, out_row0, m_valid, n0, n_valid, tidx, warp_idx)
            else:
                ring_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, RING)
                ring_cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, RING)
                ring_rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, RING)
                if wg_idx >= self.nmath:
                    # --- producer warpgroup(s): wait for TMA, decode into the fp16 ring ---
                    if cutlass.const_expr(self.realloc):
                        cute.arch.warpgroup_reg_dealloc(self.regs_producer)
                    ptid = tidx - self.math_threads
                    for _kt in cutlass.range(k_tiles, unroll=1):
                        load_pipe.consumer_wait(cons)
                        for j in cutlass.range_constexpr(self.nsub):
                            ring_pipe.producer_acquire(ring_prod)
                            self._decode_sub_block(addr, cons.index, ring_prod.index, j, ptid)
                            cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared,
                                                  space=cute.arch.SharedSpace.shared_cta)
                            ring_pipe.producer_commit(ring_prod)
                            ring_prod.advance()
                        cute.arch.sync_warp()
                        load_pipe.consumer_release(cons)
                        cons.advance()
                        if warp_idx == tma_warp:
                            if prod.count < k_tiles:
                                self._issue_loads(load_pipe, prod, loads, k_tile0)
                                prod.advance()
                else:
                    # --- wgmma warpgroups: one sub-block per ring slot, release it once its wgmma is done ---
                    if cutlass.const_expr(self.realloc):
                        cute.arch.warpgroup_reg_alloc(self.regs_math)
                    acc.fill(0.0)
                    acc2.fill(0.0)
                    for _s in cutlass.range(k_tiles * self.nsub, unroll=1):
                        ring_pipe.consumer_wait(ring_cons)
                        self._mma_sub_block(tiled_mma, acc, acc2, tCrA, tCrB, tCrB2, ring_cons.index)
                        ring_cons.advance()
                        cute.nvgpu.warpgroup.wait_group(1)
                        if ring_rel.count + 1 < ring_cons.count:
                            ring_pipe.consumer_release(ring_rel)
                            ring_rel.advance()
                    cute.nvgpu.warpgroup.wait_group(0)
                    ring_pipe.consumer_release(ring_rel)
                    self._epilogue(tiled_mma, thr_mma, acc, acc2, tCcC, storage, epi_layout, tma_c, tC, mC,
                                   mAlpha, group, out_row0, m_valid, n0, n_valid, tidx, warp_idx)

        @cute.jit
        def _issue_loads(self, pipe, prod, loads, k_tile0):
            pipe.producer_acquire(prod)
            bar = pipe.producer_get_barrier(prod)
            for atom, s, g in loads:
                cute.copy(atom, g[None, prod.count + k_tile0], s[None, prod.index], tma_bar_ptr=bar)
            pipe.producer_commit(prod)

        @cute.jit
        def _mma_sub_block(self, tiled_mma, acc, acc2, tCrA, tCrB, tCrB2, buf):
            cute.nvgpu.warpgroup.fence()
            for kb in cutlass.range_constexpr(SUB_K // 16):
                cute.gemm(tiled_mma, acc, tCrA[None, None, kb, buf], tCrB[None, None, kb, buf], acc)
                if cutlass.const_expr(self.dual):
                    cute.gemm(tiled_mma, acc2, tCrA[None, None, kb, buf], tCrB2[None, None, kb, buf], acc2)
            cute.nvgpu.warpgroup.commit_group()

        def _decode_sub_block(self, addr, stage, buf, j: int, t):
            """Decode K elements [64j, 64j+64) of this stage's A, B (and B2) into fp16 ring slot ``buf``.

            Plain Python, run while tracing: it emits one decode per 16-code chunk of this thread."""
            chunks = self._chunks(addr["qa"], addr["sfa"], addr["sa"], self.tile_m, stage, buf, j, t)
            chunks += self._chunks(addr["qb"], addr["sfb"], addr["sb"], self.tile_n, stage, buf, j, t)
            if self.dual:
                chunks += self._chunks(addr["qb"] + self.stages * self.tile_n * self.tile_kb,
                                       addr["sfb"] + self.stages * self.tile_n * self.tile_ks,
                                       addr["sb"] + RING * self.tile_n * SUB_K * 2,
                                       self.tile_n, stage, buf, j, t)
            if self.cfg.decode == "batched":
                loaded = [load16(src, sf) for src, sf, _, _ in chunks]
                for (_, _, d0, d1), v in zip(chunks, loaded):
                    convert16(v, d0, d1)
            else:
                for src, sf, d0, d1 in chunks:
                    decode16(src, sf, d0, d1)

        def _chunks(self, q_base, sf_base, out_base, rows: int, stage, buf, j: int, t) -> list:
            """(codes, scale, out0, out1) shared addresses of this thread's 16-code chunks of ``rows`` rows.

            A warp takes 8 rows × the sub-block's 4 × 8 bytes; the decode warpgroups 32 rows each per pass.
            Lane l: row l%8 of the warp's 8, 8-byte piece u = l//8. The 128-byte swizzle (16-byte
            chunk index XOR row%8) of both the packed TMA tile and the fp16 tile keeps the 8-byte
            loads and the 16-byte stores free of bank conflicts."""
            lane = t % 32
            w = t // 32
            x = lane % 8
            u = lane // 8
            panel = j // 4  # 128-byte panels of the packed row (two when tile_k = 512)
            jj = j % 4
            q_stage = q_base + stage * (rows * self.tile_kb) + panel * (rows * 128)
            sf_stage = sf_base + stage * (rows * self.tile_ks) + 4 * j + u
            out_buf = out_base + buf * (rows * SUB_K * 2)
            q_col = ((((2 * jj) + (u >> 1)) ^ x) << 4) + ((u & 1) << 3)
            o_col0 = ((2 * u) ^ x) << 4
            o_col1 = ((2 * u + 1) ^ x) << 4
            out = []
            step = DECODE_ROWS
            for p in range(rows // step):
                r = p * step + w * 8 + x
                out.append((q_stage + r * 128 + q_col, sf_stage + r * self.tile_ks,
                            out_buf + r * 128 + o_col0, out_buf + r * 128 + o_col1))
            return out

        @cute.jit
        def _epilogue(self, tiled_mma, thr_mma, acc, acc2, tCcC, storage, epi_layout, tma_c, tC, mC, mAlpha,
                      group, row0, m_valid, n0, n_valid, tidx, warp_idx):
            alpha = mAlpha[group, 0]
            alpha2 = mAlpha[group, 1]
            if cutlass.const_expr(self.split):
                # split-K: this slice's raw fp32 partial sums; the host adds the slices and applies the rest
                half = cute.size(mC, mode=[1]) // 2
                for i in cutlass.range_constexpr(cute.size(acc)):
                    m, n = tCcC[i]
                    if m < m_valid and n < n_valid:
                        mC[row0 + m, n0 + n] = acc[i]
                        if cutlass.const_expr(self.dual):
                            mC[row0 + m, half + n0 + n] = acc2[i]
            elif cutlass.const_expr(not self.tma_epi):
                for i in cutlass.range_constexpr(cute.size(acc)):
                    m, n = tCcC[i]
                    if m < m_valid and n < n_valid:
                        v = acc[i] * alpha
                        if cutlass.const_expr(self.dual):
                            v = v / (1.0 + cute.math.exp(-v)) * (acc2[i] * alpha2)
                        mC[row0 + m, n0 + n] = v.to(mC.element_type)
            else:
                self._epilogue_tma(tiled_mma, acc, acc2, alpha, alpha2, storage, epi_layout, tma_c, tC, mC,
                                   row0, n0, tidx, warp_idx)

        @cute.jit
        def _epilogue_tma(self, tiled_mma, acc, acc2, alpha, alpha2, storage, epi_layout, tma_c, tC, mC,
                          row0, n0, tidx, warp_idx):
            """Registers → swizzled smem (stmatrix) → TMA store, one epilogue subtile at a time.

            Output rows of every group are padded to tile_m, so a full-tile store stays inside the group."""
            c_dtype = mC.element_type
            epi_bar = pipeline.NamedBarrier(barrier_id=2, num_threads=self.math_threads)
            epi_bar.arrive_and_wait()  # every warp's last wgmma is done before the ring is reused
            sC = cute.make_tensor(cute.recast_ptr(storage.sa.data_ptr(), epi_layout.inner, dtype=c_dtype),
                                  epi_layout.outer)
            copy_atom_r2s = sm90_utils.sm90_get_smem_store_op(utils.LayoutEnum.ROW_MAJOR, elem_ty_d=c_dtype,
                                                              elem_ty_acc=self.acc_dtype)
            copy_atom_c = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), c_dtype)
            tiled_copy_c_atom = cute.make_tiled_copy_C_atom(copy_atom_c, tiled_mma)
            tiled_copy_r2s = cute.make_tiled_copy_S(copy_atom_r2s, tiled_copy_c_atom)
            thr_copy_r2s = tiled_copy_r2s.get_slice(tidx)
            tRS_sD = thr_copy_r2s.partition_D(sC)
            tRS_rAcc = tiled_copy_r2s.retile(acc)
            tRS_rAcc2 = tiled_copy_r2s.retile(acc2)
            rD_shape = cute.shape(thr_copy_r2s.partition_S(sC))
            tRS_rD_layout = cute.make_layout(rD_shape[:3])
            tRS_rD = cute.make_rmem_tensor_like(tRS_rD_layout, self.acc_dtype)
            size_rD = cute.size(tRS_rD)

            gC = cute.local_tile(tC, (self.tile_m, self.tile_n), (row0 // self.tile_m, n0 // self.tile_n))
            gC_epi = cute.zipped_divide(gC, self.epi_tile)
            bSG_sD, bSG_gD = cute.nvgpu.cpasync.tma_partition(tma_c, 0, cute.make_layout(1),
                                                              cute.group_modes(sC, 0, 2), gC_epi)
            epi_num = cute.size(gC_epi, mode=[1])
            epi_shape = gC_epi.shape[1]
            epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
            store_pipe = pipeline.PipelineTmaStore.create(
                num_stages=EPI_STAGES,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.math_threads))
            for e in cutlass.range_constexpr(epi_num):
                for v in cutlass.range_constexpr(size_rD):
                    x = tRS_rAcc[e * size_rD + v] * alpha
                    if cutlass.const_expr(self.dual):
                        x = x / (1.0 + cute.math.exp(-x)) * (tRS_rAcc2[e * size_rD + v] * alpha2)
                    tRS_rD[v] = x
                out = cute.make_rmem_tensor_like(tRS_rD_layout, c_dtype)
                out.store(tRS_rD.load().to(c_dtype))
                slot = e % EPI_STAGES
                cute.copy(tiled_copy_r2s, out, tRS_sD[(None, None, None, slot)])
                cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)
                epi_bar.arrive_and_wait()
                if warp_idx == 0:
                    cute.copy(tma_c, bSG_sD[(None, slot)], bSG_gD[(None, epi_order.get_hier_coord(e))])
                    store_pipe.producer_commit()
                    store_pipe.producer_acquire()
                epi_bar.arrive_and_wait()
            if warp_idx == 0:
                store_pipe.producer_tail()

    _KERNEL_CLASS = GroupedNvfp4GemmSm90
    return _KERNEL_CLASS


_KERNEL_CLASS = None
_compiled: dict = {}


def kernel_for(cfg: SmemConfig):
    return _kernel_class()(cfg)


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------
def _compile(cfg: SmemConfig, args):
    """Compile once per (config, output dtype); tensors are passed with dynamic shapes."""
    import cutlass.cute as cute

    cfg = cfg.with_(split_k=min(cfg.split_k, 2))  # the kernel only knows split or not; the table has the slices
    key = (cfg, str(args[6].element_type))
    if key not in _compiled:
        _compiled[key] = cute.compile(kernel_for(cfg), *args)
    return _compiled[key]


def prepare(a, b, b2, *, out_dtype=torch.float16, config=None, **options) -> Runner:
    """Stack the weights, build the tile table, compile (cached); the runner packs A and launches once.
    The study's ``auto`` is resolved above the kernels (the bench's ``cute-hopper:config=study-auto`` times the
    register-decode configs and keeps the fastest): this function needs a named config; register-decode configs
    (:class:`~..hopper_rs.config.RSConfig`) are prepared by :func:`..hopper_rs.runner.prepare`.

    ``a``, ``b``, ``b2``: lists of NVFP4Tensor (one per group) on an sm_90 GPU."""
    if options:
        raise TypeError(f"cute-hopper: unknown option(s) {sorted(options)}; known: config")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"cute-hopper writes float16 (the only output checked on the H100), not {out_dtype}")
    t0 = time.perf_counter()
    device = a[0].data.device
    if (config or (DEFAULT_DUAL if b2 is not None else DEFAULT_SINGLE)) == "auto":
        _require_hopper(device)
        raise ValueError("the study's kernels need a named config here (the serving kernel resolves 'auto' itself: "
                         "nvfp4lib.prepare_weights)")
    cfg = get_config(config, dual=b2 is not None)  # refuse a bad config before touching the GPU
    if isinstance(cfg, RSConfig):
        from ..hopper_rs import runner as hopper_rs

        return hopper_rs.prepare(a, b, b2, cfg, out_dtype=out_dtype)
    _require_hopper(device)
    import cuda.bindings.driver as cuda

    check_scales_finite(a, "a")
    weights = stack_weights([b] if b2 is None else [b, b2], cfg.tile_n, cfg.tile_k)
    m = tuple(int(t.shape[0]) for t in a)
    packer = ActivationPacker(m, weights.k, weights.k_pad, cfg.tile_m, device)
    split = choose_split_k(cfg, m, weights.n, weights.k, torch.cuda.get_device_properties(device).multi_processor_count)
    if split != cfg.split_k:  # resolved "auto" (or clipped to the K tiles); split-K writes fp32 partials via SIMT
        cfg = cfg.with_(split_k=split, **({"epilogue": "simt"} if split > 1 else {}))
    tiles = tile_table(m, weights.n, weights.k, packer.row_offsets, weights.n_pad, cfg.tile_m, cfg.tile_n,
                       cfg.tile_k, device, split_k=split, rows=packer.rows, wide=True)
    c_all = torch.empty((packer.rows, weights.n_pad), dtype=out_dtype, device=device)
    outputs = [c_all[o: o + mg, :ng] for o, mg, ng in zip(packer.row_offsets, m, weights.n)]
    alpha = torch.zeros((len(a), 2), dtype=torch.float32, device=device)
    nb = 1 if b2 is None else 2
    # split-K: fp32 partial sums of every slice (and of B2 in the right half), summed after the kernel
    work = (torch.empty((split * packer.rows, nb * weights.n_pad), dtype=torch.float32, device=device)
            if split > 1 else None)
    w2 = 1 if b2 is not None else 0
    args = (_cute(packer.codes), _cute(packer.scales), _cute(weights.codes[0]), _cute(weights.scales[0]),
            _cute(weights.codes[w2]), _cute(weights.scales[w2]), _cute(c_all if work is None else work),
            _cute(tiles), _cute(alpha, 8))
    stream = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
    kernel = _compile(cfg, (*args, stream)) if len(tiles) else None
    gs_b = torch.stack([weights.global_scales[0], weights.global_scales[-1]], dim=1) * POST_SCALE  # [G, 2]
    row_group = None  # split-K: each workspace row's group, for its global scales (padding rows: any group)
    if work is not None:
        row_group = torch.zeros(packer.rows, dtype=torch.long, device=device)
        for g, (o, mg) in enumerate(zip(packer.row_offsets, m)):
            row_group[o: o + mg] = g

    def run():
        torch.mul(packer(a)[:, None], gs_b, out=alpha)  # one launch (eager calls are host-bound)
        if kernel is not None:
            kernel(*args, cuda.CUstream(torch.cuda.current_stream(device).cuda_stream))
            if work is not None:
                _finish_split(work, split, packer.rows, weights.n_pad, alpha[row_group], b2 is not None, c_all)

    torch.cuda.synchronize(device)
    return Runner(run, outputs, prepare_s=time.perf_counter() - t0, held_bytes=weights.nbytes,
                  notes=f"weights stacked once as NVFP4 ({weights.nbytes / 1e6:.1f} MB); config {cfg.name}",
                  info={"config": cfg.name, "tiles": len(tiles), "split_k": split},
                  keepalive=(packer, weights, tiles, c_all, alpha, work, row_group))


def choose_split_k(cfg: SmemConfig, m, n, k, sms: int) -> int:
    """K slices per output tile: ``cfg.split_k``, or for 0 ("auto") enough slices to fill ``sms`` SMs twice
    when the output tiles alone fill at most a quarter of them (at least 2 K tiles per slice, at most 8
    slices). Never more slices than the fewest K tiles of a non-empty group.

    Measured on the H100 (2026-11-22), the split path (fp32 partials through the SIMT epilogue, summed by
    torch) won at 32 tiles with 28 K tiles (M<=64, G=1, N=4096, K=7168: 52 vs 72 us) and lost at 56 tiles with
    8 K tiles (N=7168, K=2048: 46 vs 36 us), at 64 tiles (M=128, N=4096: 80 vs 75 us) and at 120-128 tiles
    (S3-dual 199 vs 119 us, S4-dual 172 vs 62 us): hence the quarter."""
    kts = [-(-kg // cfg.tile_k) for mg, ng, kg in zip(m, n, k) if mg and ng]
    if not kts:
        return 1
    if cfg.split_k:
        return max(1, min(cfg.split_k, min(kts)))
    out_tiles = sum(-(-mg // cfg.tile_m) * -(-ng // cfg.tile_n) for mg, ng in zip(m, n))
    if 4 * out_tiles > sms:
        return 1
    return max(1, min(8, min(kts) // 2, -(-2 * sms // out_tiles)))


def _finish_split(work, split, rows, n_pad, alpha_rows, dual, out):
    """Sum the K slices' fp32 partials, apply the global scales (and silu·up), round once to ``out``."""
    part = work.view(split, rows, -1).sum(0)
    v = part[:, :n_pad] * alpha_rows[:, :1]
    if dual:
        v = torch.nn.functional.silu(v) * (part[:, n_pad:] * alpha_rows[:, 1:])
    out.copy_(v)


def grouped_gemm_raw(a_codes, a_scales, a_gs, b_codes, b_scales, b_gs, b2_codes=None, b2_scales=None,
                     b2_gs=None, *, config=None, out_dtype=torch.float16) -> list[torch.Tensor]:
    """Raw-tensor entry point: per-group uint8 codes [rows, K/2], float8_e4m3fn scales [rows, K/16] and
    float32 global scales (floats or 0-d tensors). Builds NVFP4Tensors and runs one call."""
    from ...formats import NVFP4Tensor

    def wrap(codes, scales, gss):
        return [NVFP4Tensor(c, s, g if isinstance(g, torch.Tensor) else float(g))
                for c, s, g in zip(codes, scales, gss)]

    b2 = None if b2_codes is None else wrap(b2_codes, b2_scales, b2_gs)
    if config in (None, "auto"):  # a one-call entry: the heuristic default, never a benchmark inside the call
        config = "rs_dual_m128_t128_k128_s3" if b2 is not None else "rs_m128_t128_k128_s3_e"
    return prepare(wrap(a_codes, a_scales, a_gs), wrap(b_codes, b_scales, b_gs), b2, out_dtype=out_dtype,
                   config=config)()


# ---------------------------------------------------------------------------------------------
# Compile reports (no GPU needed)
# ---------------------------------------------------------------------------------------------
def fake_arguments(cfg: SmemConfig, out_dtype: str | None = None):
    """Fake tensors with symbolic sizes, as the kernel receives them at run time."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    def fake(dtype, shape, align=16):
        return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=align)

    s = cute.sym_int
    rows_a, rows_b = s(), s()
    kb, ks = s(divisibility=cfg.tile_k // 2), s(divisibility=cfg.tile_k // 16)
    u8 = cutlass.Uint8
    b, sfb = fake(u8, (rows_b, kb)), fake(u8, (rows_b, ks))
    return (fake(u8, (rows_a, kb)), fake(u8, (rows_a, ks)), b, sfb, b, sfb,
            fake(getattr(cutlass, out_dtype or ("Float32" if cfg.split_k != 1 else "Float16")),
                 (s(), s(divisibility=8))),
            fake(cutlass.Int32, (s(), len(WIDE_TILE_COLUMNS))),
            fake(cutlass.Float32, (s(), 2), 8), cuda.CUstream(0))


def compile_report(cfg: SmemConfig, arch: str = "sm_90a", dump_dir: str | None = None) -> dict:
    """Compile ``cfg`` for sm_90a with fake tensors; PTX instruction counts, ptxas resources, smem plan."""
    from ..common.compiling import compile_offline, count_instructions

    if arch != "sm_90a":
        raise ValueError(f"the Hopper kernel compiles for sm_90a, not {arch}")
    validate(cfg)
    if isinstance(cfg, RSConfig):
        from ..hopper_rs import runner as hopper_rs

        return hopper_rs.compile_report(cfg, dump_dir=dump_dir)
    if cfg.split_k == 0:  # "auto" runs unsplit wherever the tiles fill the GPU: report that kernel
        cfg = cfg.with_(split_k=1)
    t0 = time.perf_counter()
    art = compile_offline(kernel_for(cfg), *fake_arguments(cfg), arch=arch, dump_dir=dump_dir)
    plan = smem_plan(cfg)
    res = {k: v for k, v in art.ptxas.items() if k != "ptxas_log"}
    extra = count_instructions(art.ptx, ("prmt.b32", "lop3.b32", "mul.rn.f16x2", "cvt.rn.f16x2.e4m3x2",
                                         "st.shared.v4.b32", "ld.shared.v2.b32", "setmaxnreg",
                                         "cp.async.bulk.commit_group", "bar.sync", "barrier.sync"))
    log = art.ptxas.get("ptxas_log", "")
    return {
        **cfg.as_dict(), "compile_s": round(time.perf_counter() - t0, 2), "threads": threads_for(cfg),
        "math_warpgroups": math_warpgroups(cfg), "acc_registers": acc_registers(cfg),
        "smem_bytes": plan["total"], "smem_per_stage": plan["per_stage"],
        "smem_fp16_ring": plan["fp16_a"] + plan["fp16_b"],
        "ctas_per_sm_by_smem": 233472 // (plan["total"] + 1024),
        **res, **art.instructions, **extra, "setmaxnreg_ignored": "C7508" in log, "ptx_path": art.ptx_path,
    }
