"""``cute-hopper`` with ``swap_ab``: weights decoded straight into wgmma's register operand (sm_90a, CuTe DSL).

The smem kernel (:mod:`.hopper`) decodes both operands into shared memory for every output tile, so a
weight is decoded once per token tile and the tokens pad wgmma's 64-row M. Here the roles swap:

- the **weights** are wgmma's A operand (M = 64 weight rows per warpgroup), read from **registers**:
  each thread loads its 16 prepacked code bytes and 8 scale bytes of a 64-K unit from shared memory
  and decodes them into exactly the 16 fp16 registers of its wgmma fragment (:mod:`.rs_layout`);
- the **tokens** are wgmma's N (any multiple of 8 up to 256): a group of 40 tokens costs a 40-wide
  MMA, not a 64- or 128-row tile; with ``tile_n`` ≥ the group's rows, each weight is decoded once;
- the **activations** are decoded once per call by a one-launch prologue that reads the caller's tensors in
  place (a table of row addresses) into fp16 (value × scale × 2^-7, exact) and writes the per-group factors
  ``alpha``; they reach shared memory by TMA (128-byte swizzle, the K-major B operand) in boxes of
  ``token_step`` rows. The GEMM is launched with programmatic dependent launch: its set-up and first weight
  loads overlap the prologue, which it waits for (``griddepcontrol.wait``) before loading activations;
  Up to :data:`PARAM_GROUPS` groups the prologue takes the groups' addresses as kernel parameters (no row table to
  load first), and it asks for :data:`ACT_SMEM` bytes of shared memory so that its SMs already run with the GEMM's
  carveout and the GEMM's CTAs start beside it;
- or (``act_decode="warpgroup"``, configs ``*_dw``) a third warpgroup in every CTA decodes the tile's token rows from
  the caller's tensors straight into the fp16 ring and issues the weight loads: one launch, no prologue. Exact, and
  slower than the prologue pair on every benchmark shape on the H100 (its global loads, notebook 09 steps 21–23);
- or (``act_decode="inline"``, configs ``*_e_i``) the MMA warpgroups copy their raw activation rows into each stage
  with cp.async and decode them into a two-slot fp16 ring one K tile ahead. Exact, and slower still (a K tile costs
  1.26 instead of 0.66 us on S4; notebook 09 step 26);
- two warpgroups per CTA, each with one or two 64-row wgmma blocks (``tile_m`` = 128 or 256 weight rows of one
  matrix), or (dual) the same 64 or 128 rows of B1 (warpgroup 0) and B2 (warpgroup 1). One thread issues the TMA
  loads (weights: one contiguous prepacked block per stage) into an ``ab_stages``-deep mbarrier pipeline;
- per 64-K sub-block: two shared loads and 4 × 14 decode instructions per block, then 4 wgmma (k16) per block
  that run while the next sub-block is decoded into the other register set (``wait_group(1)`` before reuse);
- with ``token_step`` the kernel holds one wgmma N per multiple of the step up to ``tile_n`` and each tile runs
  the narrowest that covers its tokens (:func:`plan_token_tiles` chooses the tiles, widest first);
- epilogue: fp32 × ``alpha = gs_A·gs_B·2^14`` (the tile is Cᵀ: weight rows × tokens), rounded to the output type and
  stored per element (``epilogue="simt"``), or written to shared memory as C rows and copied out in 16-byte row
  chunks (``"staged"``, configs ``*_e``). Dual: both warpgroups hand half of their accumulators to the other and
  compute silu(gate)·up (fast exp and reciprocal) for their own half.

Knobs (``KernelConfig``): ``tile_m`` weight rows per CTA, ``tile_n`` tokens per CTA (the widest), ``token_step``,
``tile_k`` K per stage (128 or 256), ``ab_stages``, ``epilogue``, ``act_decode``; :func:`validate` refuses what cannot
work before compiling. Configs are named ``rs_*`` in :data:`nvfp4lib.kernels.hopper.CONFIGS`.
"""
from __future__ import annotations

from .config import KernelConfig
from .packing import (
    tile_fields,
)
from .rs_config import (  # noqa: F401  (hopper_rs.X: the names the study and the tests use)
    ABLATE,
    ACT_DECODES,
    CTA_OVERHEAD_TOKENS,
    DW_BATCH,
    DW_MAX_ACC_REGS,
    MAX_ACC_REGS,
    MAX_VARIANTS,
    NWG,
    ROW_BYTES,
    STAGE_PAD,
    TIMELINE_POINTS,
    ablated,
    acc_registers,
    block_threads,
    blocks_per_warpgroup,
    raw_stage_bytes,
    smem_plan,
    stage_bytes,
    stage_units,
    stage_warpgroups,
    token_step,
    validate,
    x_slots,
    xfer_bytes,
)
from .rs_layout import UNIT_BYTES, UNIT_CODE_BYTES, UNIT_K, UNIT_ROWS
from .rs_ops import (  # noqa: F401
    ACT_SMEM,
    ACT_THREADS,
    GROUP_PARAMS,
    PARAM_GROUPS,
    ROW_COLUMNS,
    ops,
)
from .rs_prologue import prologue_class


def _kernel_classes():
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES

    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import warpgroup

    o = ops()
    (_asm, load_unit, decode_unit, copy16, cp_async8, cp_async_arrive, load_raw16, stamp_to, _silu_mul, _i64,
     load_row, load_act16, store_act16, load_f32) = (
        o._asm, o.load_unit, o.decode_unit, o.copy16, o.cp_async8, o.cp_async_arrive, o.load_raw16, o.stamp_to,
        o._silu_mul, o._i64, o.load_row, o.load_act16, o.store_act16, o.load_f32)

    ActivationPrologueSm90 = prologue_class()

    class GroupedNvfp4GemmSm90RS:
        """Swap-AB: weights (register A, decoded per thread) × tokens (smem B, fp16) -> Cᵀ tiles.

        Every tile row carries its token count class: the CTA runs the variant of the kernel whose wgmma N is the
        tile's tokens rounded up to ``token_step`` (one specialised mainloop per multiple of the step)."""

        def __init__(self, cfg: KernelConfig):
            self.cfg = validate(cfg)
            self.bt = cfg.tile_n
            self.step = token_step(cfg)
            self.variants = tuple(range(self.step, self.bt + 1, self.step))
            self.nsub = cfg.tile_k // UNIT_K
            self.blocks = blocks_per_warpgroup(cfg)
            self.stages = cfg.ab_stages
            self.dual = cfg.dual
            self.threads = 128 * NWG  # the MMA warpgroups (the epilogue's barriers count these)
            self.dw = cfg.act_decode == "warpgroup"
            self.inline = cfg.act_decode == "inline"
            self.direct = self.dw or self.inline  # no prologue: the kernel reads the caller's activations itself
            self.raw_bytes = raw_stage_bytes(cfg)
            self.pp = cfg.warp_spec == "pingpong"  # each MMA warpgroup runs its K loop alone, one after the other
            self.stage_wgs = stage_warpgroups(cfg)
            self.stage_units = stage_units(cfg)
            self.w_rows = self.stage_units * UNIT_BYTES // ROW_BYTES  # 128-byte rows per stage
            self.rows_per_cta = cfg.tile_m
            self.stores = not ablated(cfg, "no_store")  # False: the no_store diagnostic

        def _sx_layout(self, rows: int):
            """The fp16 activation ring (nsub·stages slots) for ``rows`` tokens: K-major, 128-byte swizzle."""
            return sm90_utils.make_smem_layout_b(utils.LayoutEnum.ROW_MAJOR, (UNIT_ROWS, rows, UNIT_K),
                                                 cutlass.Float16, self.nsub * x_slots(self.cfg))

        @cute.jit
        def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mC: cute.Tensor, mTiles: cute.Tensor,
                     mAlpha: cute.Tensor, mGsA: cute.Tensor, stream):
            """``mX``: the fp16 activations written by the prologue, with ``mAlpha`` its per-group factors
            (act_decode="prologue"); or the row table of :func:`activation_rows`, with ``mAlpha`` = gs_B·2^14 and
            ``mGsA`` the addresses of A's global scales (act_decode="warpgroup"). ``mGsA`` [G] also gives G."""
            sx_layout = self._sx_layout(self.bt)
            sw_layout = cute.make_layout((self.w_rows, ROW_BYTES, self.stages),
                                         stride=(ROW_BYTES, 1, self.w_rows * ROW_BYTES))
            g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
            tma_w, tW = cute.nvgpu.cpasync.make_tiled_tma_atom(
                g2s, mW, cute.slice_(sw_layout, (None, None, 0)), (self.w_rows, ROW_BYTES))
            if cutlass.const_expr(self.direct):
                tma_x, tX = tma_w, tW  # (unused: the CTA writes the ring itself)
            else:
                # activations move in boxes of token_step rows: a tile of n tokens is n/step boxes per 64-K slot
                tma_x, tX = cute.nvgpu.cpasync.make_tiled_tma_atom(
                    g2s, mX, cute.slice_(self._sx_layout(self.step), (None, None, 0)), (self.step, UNIT_K))

            i64, u8, f16 = cutlass.Int64, cutlass.Uint8, cutlass.Float16  # (a class body sees no closure names)

            @cute.struct
            class SharedStorage:
                load_bars: cute.struct.MemRange[i64, self.stages * 2]
                stamps: cute.struct.MemRange[i64, 8]  # ablate="timeline"
                sw: cute.struct.Align[cute.struct.MemRange[u8, cute.cosize(sw_layout)], 1024]
                sx: cute.struct.Align[cute.struct.MemRange[f16, cute.cosize(sx_layout)], 1024]

            @cute.struct
            class SharedStorageInline:  # act_decode="inline": also the raw activation stages
                load_bars: cute.struct.MemRange[i64, self.stages * 2]
                stamps: cute.struct.MemRange[i64, 8]
                sw: cute.struct.Align[cute.struct.MemRange[u8, cute.cosize(sw_layout)], 1024]
                sx: cute.struct.Align[cute.struct.MemRange[f16, cute.cosize(sx_layout)], 1024]
                sa: cute.struct.Align[cute.struct.MemRange[u8, self.stages * self.raw_bytes], 128]

            self.shared_storage = SharedStorageInline if self.inline else SharedStorage
            # prologue: programmatic dependent launch, so set-up and the first weight loads overlap the prologue
            self.kernel(tma_w, tW, tma_x, tX, mX, mC, mTiles, mAlpha, mGsA, sw_layout, sx_layout).launch(
                grid=(cute.size(mTiles, mode=[0]), 1, 1), block=(block_threads(self.cfg), 1, 1), stream=stream,
                use_pdl=not self.direct)

        @cute.kernel
        def kernel(self, tma_w: cute.CopyAtom, tW: cute.Tensor, tma_x: cute.CopyAtom, tX: cute.Tensor,
                   mX: cute.Tensor, mC: cute.Tensor, mTiles: cute.Tensor, mAlpha: cute.Tensor, mGsA: cute.Tensor,
                   sw_layout: cute.Layout, sx_layout: cute.ComposedLayout):
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            bidx, _, _ = cute.arch.block_idx()
            if warp_idx == 0:
                cute.nvgpu.cpasync.prefetch_descriptor(tma_w)
                if cutlass.const_expr(not self.direct):
                    cute.nvgpu.cpasync.prefetch_descriptor(tma_x)
            storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
            self._stamp(storage, 0)
            variant = tile_fields(mTiles, bidx)["pad"]  # the swap-AB table keeps the wgmma N variant in "pad"
            for v in cutlass.range_constexpr(len(self.variants)):
                if variant == v:
                    self._tile(self.variants[v], storage, tma_w, tW, tma_x, tX, mX, mC, mTiles, mAlpha, mGsA,
                               sw_layout, sx_layout)

        @cute.jit
        def _tile(self, nv: int, storage, tma_w, tW, tma_x, tX, mX, mC, mTiles, mAlpha, mGsA, sw_layout,
                  sx_layout):
            """One output tile with a wgmma N of ``nv`` tokens."""
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            wg = cute.arch.make_warp_uniform(tidx // 128)
            f = tile_fields(mTiles, bidx)  # tokens are the tile's rows: row0/m_valid count tokens
            group, tok_row0, tok_valid, n0, n_valid = f["group"], f["row0"], f["m_valid"], f["n0"], f["n_valid"]
            b_row0, k_tiles, k_tile0, out_row0 = f["b_row0"], f["k_tiles"], f["k_tile0"], f["out_row0"]

            boxes = nv // self.step
            tx_bytes = self.stage_units * UNIT_BYTES
            if cutlass.const_expr(not ablated(self.cfg, "no_x") and not self.direct):
                tx_bytes += self.nsub * nv * UNIT_K * 2
            # a stage is full when its weights have landed (TMA bytes, one arrive) and, with a decode warpgroup,
            # when its 128 threads have each arrived after writing their activations, or (inline) when the
            # cp.async copies of the raw activations of each of the CTA's threads have landed (one arrive each)
            writers = 128 if self.dw else (self.threads if self.inline else 0)
            load_pipe = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.load_bars.data_ptr(), num_stages=self.stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1 + writers),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.stage_wgs),
                tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)), defer_sync=True)
            cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()

            sW = storage.sw.get_tensor(sw_layout)
            sX = storage.sx.get_tensor(sx_layout.outer, swizzle=sx_layout.inner)
            # this variant's view of the ring: the first nv token rows of every slot
            full = sx_layout.outer
            sXv = storage.sx.get_tensor(
                cute.make_layout(((8, nv // 8), full.shape[1], full.shape[2]),
                                 stride=(full.stride[0], full.stride[1], full.stride[2])),
                swizzle=sx_layout.inner)

            # TMA partitions. Weights: stage tiles of w_rows 128-byte rows, CTA-block-major (a block's K tiles
            # adjacent): G·n_pad/tile_m blocks of k_tiles_all stage tiles (n_pad is C's width); with pingpong each
            # block holds the K tiles of warpgroup 0, then those of warpgroup 1
            w_parts = NWG // self.stage_wgs
            k_tiles_all = cute.size(tW, mode=[0]) * self.rows_per_cta // (
                self.w_rows * w_parts * cute.size(mGsA, mode=[0]) * cute.size(mC, mode=[1]))
            w_tile0 = (b_row0 // self.rows_per_cta) * (w_parts * k_tiles_all) + k_tile0
            gW = cute.local_tile(tW, (self.w_rows, ROW_BYTES), (None, 0))
            tWs, tWg = cute.nvgpu.cpasync.tma_partition(tma_w, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2),
                                                        cute.group_modes(gW, 0, 2))
            loads = (tma_w, tWs, tWg, w_tile0)
            if cutlass.const_expr(not self.direct):
                # Activations: boxes of step rows; smem (box, (row block, 1, slot)), gmem (box, (row block, 64-K
                # block))
                tXs, tXg = cute.nvgpu.cpasync.tma_partition(tma_x, 0, cute.make_layout(1),
                                                            cute.zipped_divide(sX, (self.step, UNIT_K)),
                                                            cute.zipped_divide(tX, (self.step, UNIT_K)))
                loads = (*loads, tma_x, tXs, tXg, tok_row0 // self.step, k_tile0 * self.nsub, boxes)

            if cutlass.const_expr(self.inline):
                self._mma_inline(nv, storage, load_pipe, loads, sXv, mX, mC, mAlpha, mGsA, group, tok_row0,
                                 out_row0, tok_valid, n0, n_valid, k_tiles, k_tile0)
            elif cutlass.const_expr(self.dw):
                if wg == NWG:
                    self._decode_warpgroup(nv, storage, load_pipe, loads, mX, tok_row0, tok_valid, k_tiles, k_tile0,
                                           k_tiles_all)
                else:
                    self._mma_warpgroups(nv, storage, load_pipe, loads, sXv, mC, mAlpha, mGsA, group, out_row0,
                                         tok_valid, n0, n_valid, k_tiles)
            else:
                self._mma_warpgroups(nv, storage, load_pipe, loads, sXv, mC, mAlpha, mGsA, group, out_row0, tok_valid,
                                     n0, n_valid, k_tiles)

        @cute.jit
        def _mma_warpgroups(self, nv: int, storage, load_pipe, loads, sXv, mC, mAlpha, mGsA, group, out_row0,
                            tok_valid, n0, n_valid, k_tiles):
            """Warpgroups 0 and 1: decode their weights into registers, wgmma against the ring, the epilogue. With
            the prologue, warp 0 also issues the loads."""
            tidx, warp_idx, wg, t, tiled_mma, tCrB, rA, rA32, tCcC, accs = self._mma_setup(nv, sXv)
            sw_base = storage.sw.data_ptr().toint()

            prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            if cutlass.const_expr(self.pp):
                # warpgroup w consumes pipeline iterations w·k_tiles ... (w+1)·k_tiles - 1; warpgroup 1 starts once
                # warpgroup 0 has issued its last wgmma (the ping-pong order: one K loop on the tensor cores at a
                # time, the first warpgroup's epilogue under the second's K loop)
                base = wg * k_tiles
                cons = self._pipeline_state(base, producer=False)
                rel = cons.clone()
                order = pipeline.NamedBarrier(barrier_id=2, num_threads=self.threads)
                if wg == 1:
                    order.arrive_and_wait()  # 128 arrivals here + warpgroup 0's 128 after its K loop
            else:
                cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
                rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)

            if cutlass.const_expr(not self.dw):
                # first stages: the weights (independent of the prologue) before waiting for the prologue's grid,
                # then their activations; every thread waits before it can read what the prologue wrote
                first = cutlass.min(self.stages, k_tiles)
                if warp_idx == 0:
                    for _ in cutlass.range(first, unroll=1):
                        load_pipe.producer_acquire(prod)
                        self._issue_w(load_pipe, prod, loads)
                        prod.advance()
                self._stamp(storage, 1)
                cute.arch.griddepcontrol_wait()
                self._stamp(storage, 2)
                if warp_idx == 0:
                    early = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                    for _ in cutlass.range(first, unroll=1):
                        self._issue_x(load_pipe, early, loads)
                        early.advance()

            sink = cutlass.Uint32(0)
            for kt in cutlass.range(k_tiles, unroll=1):
                load_pipe.consumer_wait(cons)
                if cutlass.const_expr(ablated(self.cfg, "timeline")):
                    if kt == 0:
                        self._stamp(storage, 3)
                loaded = self._load_units(sw_base, cons.index, wg, t)
                for s in cutlass.range_constexpr(self.nsub):
                    sink = self._decode_mma(s, loaded, tiled_mma, rA, rA32, accs, tCrB, cons.index, sink)
                    if cutlass.const_expr(s == 0):
                        # the previous stage's last wgmma group is done: hand its buffers back, and (prologue mode)
                        # refill them if the other warpgroup has too. Warp 0 must not wait for it here: wgmma is
                        # warpgroup-wide, so a blocked warp 0 would stall all of warpgroup 0; if the slot is not
                        # free yet, warp 0 refills it at the end of this stage instead.
                        if kt > 0:
                            load_pipe.consumer_release(rel)
                            rel.advance()
                            if cutlass.const_expr(not self.dw):
                                if warp_idx == 0:
                                    if prod.count < k_tiles:
                                        if load_pipe.producer_try_acquire(prod):
                                            self._issue(load_pipe, prod, loads, acquired=True)
                                            prod.advance()
                if cutlass.const_expr(not self.dw):
                    if warp_idx == 0:
                        if kt > 0:
                            if prod.count < cutlass.min(k_tiles, kt - 1 + self.stages):
                                self._issue(load_pipe, prod, loads)
                                prod.advance()
                cons.advance()
            if cutlass.const_expr(self.pp):
                if wg == 0:
                    order.arrive()
            warpgroup.wait_group(0)
            self._stamp(storage, 4)
            if cutlass.const_expr(self.pp):
                load_pipe.consumer_release(rel)  # the last stage too: the other warpgroup's K tiles follow in it
            if cutlass.const_expr(ablated(self.cfg, "no_mma")):
                accs[0][0] = cutlass.Float32(sink)
            self._epilogue(nv, accs, tCcC, storage, mC, self._alpha(mAlpha, mGsA, group), out_row0, tok_valid, n0,
                           n_valid, wg, t)

        @cute.jit
        def _mma_inline(self, nv: int, storage, load_pipe, loads, sXv, mRows, mC, mAlpha, mGsA, group, tok_row0,
                        out_row0, tok_valid, n0, n_valid, k_tiles, k_tile0):
            """act_decode="inline": both warpgroups copy their tile's raw activation rows (codes, scales) from the
            caller's tensors into the stage with cp.async beside the weights' TMA, and decode them into the two-slot
            fp16 ring one K tile ahead: the activations of K tile kt+1 are decoded, half after each sub-block's wgmma
            of K tile kt is issued, then a barrier of both warpgroups publishes the slot and frees the stage for
            K tile kt+stages. Thread i of the CTA owns 16-code blocks i, i+256, ... of the tile (block j: token row
            j // (tile_k/16), block j % (tile_k/16) of the K tile) for the copies and the decode alike."""
            tidx, warp_idx, wg, t, tiled_mma, tCrB, rA, rA32, tCcC, accs = self._mma_setup(nv, sXv)
            sw_base = storage.sw.data_ptr().toint()
            per_row = self.cfg.tile_k // 16  # 16-code blocks of a row per K tile
            # this thread's blocks: (code address, scale address, bytes to copy (0: a padding row, zeros), token row,
            # block); a padding row reads a valid row of the tile with a copy size of 0
            items = []
            for j in cutlass.range_constexpr(-(-nv * per_row // self.threads)):
                i = tidx + self.threads * j
                n = i // per_row
                codes, scales, _ = load_row(
                    (mRows.iterator + (tok_row0 + cutlass.min(n, tok_valid - 1)) * mRows.stride[0]).toint())
                size = cutlass.Int32(8)
                if n >= tok_valid:
                    size = cutlass.Int32(0)
                items.append((codes, scales, size, n, i - n * per_row, i < nv * per_row))
            half = -(-len(items) // 2)
            sa_base = storage.sa.data_ptr().toint()
            sx_base = storage.sx.data_ptr().toint()
            slot_bytes = self.nsub * self.bt * UNIT_K * 2
            fence_bar = pipeline.NamedBarrier(barrier_id=3, num_threads=self.threads)

            first = cutlass.min(self.stages, k_tiles)
            if warp_idx == 0:
                for it in cutlass.range(first, unroll=1):
                    st = self._pipeline_state(it, producer=True)
                    load_pipe.producer_acquire(st)
                    self._issue_w(load_pipe, st, loads, loads[3] + it)
            for it in cutlass.range(first, unroll=1):
                self._inline_copy(load_pipe, items, sa_base, it, k_tile0)
            self._stamp(storage, 1)
            # K tile 0's activations, then every K tile: its wgmma, and the next K tile's activations decoded under it
            load_pipe.consumer_wait(self._pipeline_state(0, producer=False))
            self._stamp(storage, 3)
            self._inline_decode(items, 0, len(items), sa_base, 0, sx_base)
            cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)
            fence_bar.arrive_and_wait()
            sink = cutlass.Uint32(0)
            for kt in cutlass.range(k_tiles, unroll=1):
                cur = self._pipeline_state(kt, producer=False)
                loaded = self._load_units(sw_base, cur.index, wg, t)
                slot = kt % 2
                nxt = self._pipeline_state(kt + 1, producer=False)
                for s in cutlass.range_constexpr(self.nsub):
                    sink = self._decode_mma(s, loaded, tiled_mma, rA, rA32, accs, tCrB, slot, sink)
                    # K tile kt+1's activations into the other slot (its last reader, K tile kt-1, has retired)
                    lo, hi = (0, half) if cutlass.const_expr(s == 0) else (half, len(items))
                    if cutlass.const_expr(s == 0 or s == self.nsub - 1):
                        if kt + 1 < k_tiles:
                            if cutlass.const_expr(s == 0):
                                load_pipe.consumer_wait(nxt)
                            self._inline_decode(items, lo, hi, sa_base, nxt.index, sx_base + (1 - slot) * slot_bytes)
                cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)
                # both warpgroups: the next slot is written, and stage kt is read (weights and activations)
                fence_bar.arrive_and_wait()
                if kt + self.stages < k_tiles:
                    load_pipe.consumer_release(cur)
                    ref = self._pipeline_state(kt + self.stages, producer=True)
                    if warp_idx == 0:
                        load_pipe.producer_acquire(ref)
                        self._issue_w(load_pipe, ref, loads, loads[3] + kt + self.stages)
                    self._inline_copy(load_pipe, items, sa_base, kt + self.stages, k_tile0)
            warpgroup.wait_group(0)
            self._stamp(storage, 4)
            if cutlass.const_expr(ablated(self.cfg, "no_mma")):
                accs[0][0] = cutlass.Float32(sink)
            self._epilogue(nv, accs, tCcC, storage, mC, self._alpha(mAlpha, mGsA, group), out_row0, tok_valid, n0,
                           n_valid, wg, t)

        @cute.jit
        def _alpha(self, mAlpha, mGsA, group):
            """The group's epilogue factors (gate, up): written by the prologue, or (no prologue) gs_A, read from the
            caller's 0-d tensor, times gs_B·2^14."""
            if cutlass.const_expr(self.direct):
                gs_a = load_f32(mGsA[group])
                return gs_a * mAlpha[group, 0], gs_a * mAlpha[group, 1]
            return mAlpha[group, 0], mAlpha[group, 1]

        @cute.jit
        def _inline_copy(self, load_pipe, items, sa_base, it, k_tile0):
            """cp.async this thread's raw blocks of K tile ``it`` into its stage; then arrive on the stage's barrier
            when they have landed (every thread arrives, with or without blocks)."""
            st = self._pipeline_state(it, producer=True)
            base = sa_base + st.index * self.raw_bytes
            per_row = self.cfg.tile_k // 16
            scales0 = base + self.bt * (self.cfg.tile_k // 2)
            kb = (k_tile0 + it) * per_row  # the K tile's first 16-code block in the row
            for codes, scales, size, n, c, active in items:
                if active:
                    cp_async8(base + n * (self.cfg.tile_k // 2) + 8 * c, codes + 8 * (kb + c), size)
                    if c % 8 == 0:  # the row's scale bytes of blocks c .. c+7
                        cp_async8(scales0 + n * per_row + c, scales + kb + c, size)
            cp_async_arrive(load_pipe.producer_get_barrier(st).toint())

        @cute.jit
        def _inline_decode(self, items, lo: int, hi: int, sa_base, stage, slot_base):
            """Decode this thread's blocks ``lo`` .. ``hi`` - 1 of raw stage ``stage`` into the fp16 slot at
            ``slot_base``."""
            base = sa_base + stage * self.raw_bytes
            per_row = self.cfg.tile_k // 16
            scales0 = base + self.bt * (self.cfg.tile_k // 2)
            for j in cutlass.range_constexpr(lo, hi):
                _, _, _, n, c, active = items[j]
                if active:
                    words = load_raw16(base + n * (self.cfg.tile_k // 2) + 8 * c, scales0 + n * per_row + c)
                    store_act16(words, *self._ring_halves(*self._ring_block(slot_base, n, c)))

        @cute.jit
        def _mma_setup(self, nv: int, sXv):
            """This thread's indices (in the CTA, its warp, its warpgroup, in the warpgroup) and the wgmma of N = ``nv``
            tokens for it: the tiled MMA, the B fragments over the ring, two register sets of A fragments (sub-blocks
            alternate; one fragment per block), the C coordinates and the zeroed accumulators."""
            tidx, _, _ = cute.arch.thread_idx()
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            wg = cute.arch.make_warp_uniform(tidx // 128)
            t = tidx % 128
            tiled_mma = sm90_utils.make_trivial_tiled_mma(
                cutlass.Float16, cutlass.Float16, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                cutlass.Float32, (1, 1, 1), (UNIT_ROWS, nv), warpgroup.OperandSource.RMEM)
            thr_mma = tiled_mma.get_slice(t)
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sXv))
            a_shape = thr_mma.partition_shape_A((UNIT_ROWS, UNIT_K))
            rA = [[tiled_mma.make_fragment_A(a_shape) for _ in range(self.blocks)] for _ in range(2)]
            rA32 = [[cute.recast_tensor(r, cutlass.Uint32) for r in rs] for rs in rA]
            tCcC = thr_mma.partition_C(cute.make_identity_tensor((UNIT_ROWS, nv)))
            accs = [cute.make_rmem_tensor(tCcC.shape, cutlass.Float32) for _ in range(self.blocks)]
            for acc in accs:
                acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            return tidx, warp_idx, wg, t, tiled_mma, tCrB, rA, rA32, tCcC, accs

        @cute.jit
        def _load_units(self, sw_base, stage, wg, t):
            """This thread's code and scale words of every unit of weight stage ``stage``: unit (sub, wg, block) at
            ((sub·NWG + wg)·blocks + block)·UNIT_BYTES; pingpong (a stage holds one warpgroup's units) at
            (sub·blocks + block)·UNIT_BYTES."""
            wg_off = 0 if cutlass.const_expr(self.pp) else wg * self.blocks * UNIT_BYTES
            code_off = wg_off + 16 * t
            scale_off = wg_off + UNIT_CODE_BYTES + 8 * (8 * (t // 32) + (t % 32) // 4)
            stage_base = sw_base + stage * (self.stage_units * UNIT_BYTES)
            units = [((i // self.blocks) * self.stage_wgs * self.blocks + i % self.blocks) * UNIT_BYTES
                     for i in range(self.nsub * self.blocks)]
            return [load_unit(stage_base + u + code_off, stage_base + u + scale_off) for u in units]

        @cute.jit
        def _decode_mma(self, s: int, loaded, tiled_mma, rA, rA32, accs, tCrB, slot, sink):
            """Sub-block ``s``: decode its weights into register set s % 2, issue its wgmma against ring slot ``slot``,
            commit, and wait until only this group is in flight. Returns the no_mma diagnostic's sink."""
            for b in cutlass.range_constexpr(self.blocks):
                words = loaded[s * self.blocks + b]
                if cutlass.const_expr(ablated(self.cfg, "no_dequant")):  # diagnostic: loaded words as operands
                    regs = [cutlass.Uint32(words[q % 4]) for q in range(16)]
                else:
                    regs = decode_unit(words)
                if cutlass.const_expr(ablated(self.cfg, "no_mma")):  # diagnostic: keep the decode alive
                    for q in cutlass.range_constexpr(16):
                        sink = sink ^ regs[q]
                else:
                    for q in cutlass.range_constexpr(16):
                        rA32[s % 2][b][q] = regs[q]
            if cutlass.const_expr(not ablated(self.cfg, "no_mma")):
                warpgroup.fence()
                for b in cutlass.range_constexpr(self.blocks):
                    for kb in cutlass.range_constexpr(UNIT_K // 16):
                        cute.gemm(tiled_mma, accs[b], rA[s % 2][b][None, None, kb],
                                  tCrB[None, None, kb, slot * self.nsub + s], accs[b])
            warpgroup.commit_group()
            warpgroup.wait_group(1)
            return sink

        @cute.jit
        def _decode_warpgroup(self, nv: int, storage, load_pipe, loads, mRows, tok_row0, tok_valid, k_tiles,
                              k_tile0, k_tiles_all):
            """act_decode="warpgroup", warpgroup 2: the weight loads (its first warp) and the activations. Per K tile,
            thread t decodes 16-code block t mod (tile_k/16) of every (128·16/tile_k)-th token row of the tile from
            the caller's tensors into the ring slot (128-byte swizzle: 16-byte chunk c of row n at c ^ n%8), then
            arrives on the stage's barrier. Consecutive threads read consecutive 8-byte pieces of one row (a first
            version gave each thread a row: every warp load touched 32 rows, and the loads cost 9 us on S4). The raw
            codes of DW_BATCH K tiles are loaded together, after the last proxy fence of the batch before."""
            tidx, _, _ = cute.arch.thread_idx()
            t = tidx % 128
            per_row = self.cfg.tile_k // 16  # 16-code blocks of a row per K tile
            rows_per_pass = 128 // per_row
            blk = t % per_row  # the same block of each of this thread's rows: a warp reads whole row segments
            # per row this thread owns: code and scale addresses of the row, index of the block in K tile 0, the
            # row's chunk count, smem offset of the row in its sub-block, its swizzle, the block's 32-byte half,
            # and the threads that store it (t < limit; past the limit a thread's row is past the tile's
            # ``nv`` tokens: it loads a clamped row but never stores)
            items = []
            for i in cutlass.range_constexpr(-(-nv // rows_per_pass)):
                n = t // per_row + rows_per_pass * i
                limit = per_row * (nv - rows_per_pass * i)
                row = n if cutlass.const_expr(limit >= 128) else cutlass.min(n, nv - 1)
                codes, scales, chunks = load_row((mRows.iterator + (tok_row0 + row) * mRows.stride[0]).toint())
                chunks = cutlass.Int32(chunks)
                if n >= tok_valid:
                    chunks = cutlass.Int32(0)
                items.append((codes, scales, k_tile0 * per_row + blk, chunks, *self._ring_block(0, n, blk), limit))
            xr = cute.make_rmem_tensor((DW_BATCH * len(items) * 3,), cutlass.Uint32)
            slot_bytes = self.nsub * self.bt * UNIT_K * 2
            sx_base = storage.sx.data_ptr().toint()

            # the first stages' weights, then every K tile: its activations (and, past the first stages, its weights).
            # Stage states are computed from the K tile, not carried: nothing to keep in step between the threads.
            # pipeline iterations: the K tiles, or (pingpong) those of warpgroup 0, then those of warpgroup 1, whose
            # weights follow warpgroup 0's in the CTA block and whose activations are decoded again
            iters = k_tiles * (NWG if cutlass.const_expr(self.pp) else 1)
            first = cutlass.min(self.stages, iters)
            # the weights' producer is a whole warp: the TMA copy and the arrive with its byte count elect one lane
            # (elect.sync), which a single diverged thread must not run (the first version hung past the first
            # stages)
            w_warp = cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 4 * NWG
            if w_warp:
                for it in cutlass.range(first, unroll=1):
                    st = self._pipeline_state(it, producer=True)
                    load_pipe.producer_acquire(st)
                    self._issue_w(load_pipe, st, loads, self._w_tile(loads, it, k_tiles, k_tiles_all))
            self._dw_load(xr, items, 0, iters, k_tiles)
            for kb in cutlass.range(0, iters, DW_BATCH, unroll=1):
                for p in cutlass.range_constexpr(DW_BATCH):
                    it = kb + p
                    if it < iters:
                        st = self._pipeline_state(it, producer=True)
                        if w_warp:
                            if it >= first:
                                load_pipe.producer_acquire(st)
                                self._issue_w(load_pipe, st, loads, self._w_tile(loads, it, k_tiles, k_tiles_all))
                        load_pipe.sync_object_empty.wait(st.index, st.phase)
                        base = sx_base + st.index * slot_bytes
                        for i in cutlass.range_constexpr(len(items)):
                            self._dw_store(xr, p * len(items) + i, items[i], base, t)
                        # the ring is read by wgmma (the async proxy): publish the generic stores to it first
                        cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)
                        cute.arch.mbarrier_arrive(load_pipe.producer_get_barrier(st))
                self._dw_load(xr, items, kb + DW_BATCH, iters, k_tiles)

        def _w_tile(self, loads, it, k_tiles, k_tiles_all):
            """The weights' stage tile of pipeline iteration ``it``."""
            if cutlass.const_expr(self.pp):
                return loads[3] + (it // k_tiles) * k_tiles_all + it % k_tiles
            return loads[3] + it

        def _pipeline_state(self, it, producer: bool):
            """The state of pipeline iteration ``it``, computed rather than carried: its slot and the parity of the
            phase to wait for (a producer's parity starts at 1: a fresh slot is free; a consumer's at 0)."""
            return pipeline.PipelineState(self.stages, it, it % self.stages,
                                          ((it // self.stages) % 2) ^ 1 if producer else (it // self.stages) % 2)

        def _ring_block(self, slot, n, c):
            """Where 16-code block ``c`` (of a K tile) of token row ``n`` goes in the fp16 ring slot at ``slot``: the
            start of its row in its 64-K sub-block, the row's swizzle (n % 8) and the block's 32-byte half (c % 4)."""
            return slot + (c // 4) * (self.bt * UNIT_K * 2) + n * (UNIT_K * 2), n % 8, c % 4

        def _ring_halves(self, dst, swizzle, half):
            """The two 16-byte chunks of a block whose row starts at ``dst`` (128-byte swizzle: chunk q of a row at
            q ^ row % 8)."""
            return dst + (swizzle ^ (2 * half)) * 16, dst + (swizzle ^ (2 * half + 1)) * 16

        @cute.jit
        def _dw_store(self, xr, j, item, base, t):
            """Decode raw block ``j`` of ``xr`` into its two 16-byte chunks of the slot at ``base``."""
            words = [xr[j * 3 + w] for w in range(3)]
            halves = self._ring_halves(base + item[4], item[5], item[6])
            if cutlass.const_expr(item[7] >= 128):  # every thread holds this block
                store_act16(words, *halves)
            elif t < item[7]:
                store_act16(words, *halves)

        @cute.jit
        def _dw_load(self, xr, items, it0, iters, k_tiles):
            """The raw blocks of pipeline iterations it0 .. it0 + DW_BATCH - 1 (those below ``iters``) into ``xr``."""
            per_row = self.cfg.tile_k // 16
            for p in cutlass.range_constexpr(DW_BATCH):
                if it0 + p < iters:
                    kt = (it0 + p) % k_tiles if cutlass.const_expr(self.pp) else it0 + p
                    for i in cutlass.range_constexpr(len(items)):
                        codes, scales, blk0, chunks = items[i][:4]
                        c = blk0 + kt * per_row
                        if cutlass.const_expr(ablated(self.cfg, "no_xload")):  # diagnostic: zeros, no loads
                            w = [cutlass.Uint32(c * 0), cutlass.Uint32(0), cutlass.Uint32(0)]
                        else:
                            w = load_act16(codes + 8 * c, scales + c, cutlass.Int32(c < chunks))
                        for q in cutlass.range_constexpr(3):
                            xr[(p * len(items) + i) * 3 + q] = w[q]

        @cute.jit
        def _issue(self, pipe, prod, loads, acquired: bool = False):
            """Acquire stage ``prod`` (its barrier then expects the whole stage; ``acquired``: a try_acquire already
            saw it free) and load it."""
            pipe.producer_acquire(prod, cutlass.Boolean(True) if acquired else None)
            self._issue_w(pipe, prod, loads)
            self._issue_x(pipe, prod, loads)

        @cute.jit
        def _issue_w(self, pipe, prod, loads, tile=None):
            """The weights of stage ``prod``: stage tile ``tile``, by default the next of this CTA block."""
            tma_w, tWs, tWg, w_tile0 = loads[:4]
            cute.copy(tma_w, tWg[None, w_tile0 + prod.count if tile is None else tile], tWs[None, prod.index],
                      tma_bar_ptr=pipe.producer_get_barrier(prod))

        @cute.jit
        def _issue_x(self, pipe, prod, loads):
            tma_x, tXs, tXg, x_blk0, x_sub0, boxes = loads[4:]
            bar = pipe.producer_get_barrier(prod)
            for s in cutlass.range_constexpr(self.nsub if not ablated(self.cfg, "no_x") else 0):
                for j in cutlass.range_constexpr(boxes):
                    cute.copy(tma_x, tXg[None, (x_blk0 + j, x_sub0 + prod.count * self.nsub + s)],
                              tXs[None, (j, 0, prod.index * self.nsub + s)], tma_bar_ptr=bar)

        @cute.jit
        def _epilogue(self, nv: int, accs, tCcC, storage, mC, alpha, out_row0, tok_valid, n0, n_valid, wg, t):
            """Cᵀ tiles -> C: element (weight row m of block b, token n) to C[out_row0 + n, n0 + col].

            epilogue="simt": each element stored by its thread (2-byte stores, 4 token rows per warp store);
            "staged": the tile is written to shared memory as C rows, then copied out in 16-byte row chunks."""
            size = cute.size(accs[0])
            staged = self.cfg.epilogue == "staged"
            bar = pipeline.NamedBarrier(barrier_id=1, num_threads=self.threads)
            if cutlass.const_expr(not self.pp):  # (pingpong stores per element: it reuses no buffer)
                bar.arrive_and_wait()  # every wgmma of both warpgroups has read its operands: the buffers are free
            sx = storage.sx.data_ptr()
            cols = self.cfg.tile_m  # output columns of the tile (dual: the rows of gate = the rows of up)
            ld = cols + STAGE_PAD
            stage_ptr = cute.recast_ptr(sx + xfer_bytes(self.cfg) // 2, dtype=mC.element_type)
            sC = cute.make_tensor(stage_ptr, cute.make_layout((self.bt, ld), stride=(ld, 1)))
            if cutlass.const_expr(self.dual):
                # the two warpgroups hold gate and up of the same elements: each hands the other half of its
                # accumulators over in shared memory, then computes silu(gate)·up for its own half
                xfer = cute.make_tensor(cute.recast_ptr(sx, dtype=cutlass.Float32),
                                        cute.make_layout((size * self.blocks, 128), stride=(128, 1)))
                half = size // 2
                if wg == 1:
                    for b in cutlass.range_constexpr(self.blocks):
                        for i in cutlass.range_constexpr(half):
                            xfer[b * size + i, t] = accs[b][i]
                else:
                    for b in cutlass.range_constexpr(self.blocks):
                        for i in cutlass.range_constexpr(half, size):
                            xfer[b * size + i, t] = accs[b][i]
                bar.arrive_and_wait()
                a_gate, a_up = alpha
                if wg == 0:
                    for b in cutlass.range_constexpr(self.blocks):
                        for i in cutlass.range_constexpr(half):
                            self._put(staged, sC, mC, _silu_mul(accs[b][i] * a_gate, xfer[b * size + i, t] * a_up),
                                      tCcC[i], b * UNIT_ROWS, out_row0, tok_valid, n0, n_valid)
                else:
                    for b in cutlass.range_constexpr(self.blocks):
                        for i in cutlass.range_constexpr(half, size):
                            self._put(staged, sC, mC, _silu_mul(xfer[b * size + i, t] * a_gate, accs[b][i] * a_up),
                                      tCcC[i], b * UNIT_ROWS, out_row0, tok_valid, n0, n_valid)
            else:
                for b in cutlass.range_constexpr(self.blocks):
                    for i in cutlass.range_constexpr(size):
                        self._put(staged, sC, mC, accs[b][i] * alpha[0], tCcC[i], (wg * self.blocks + b) * UNIT_ROWS,
                                  out_row0, tok_valid, n0, n_valid)
            if cutlass.const_expr(staged):
                bar.arrive_and_wait()
                tidx, _, _ = cute.arch.thread_idx()
                per_row = cols // 8  # 16-byte chunks per token row
                total = nv * per_row
                for r in cutlass.range_constexpr(-(-total // self.threads)):
                    q = tidx + self.threads * r
                    n = q // per_row
                    c8 = (q - n * per_row) * 8
                    if q < total and n < tok_valid and c8 < n_valid and cutlass.const_expr(self.stores):
                        copy16((sC.iterator + n * ld + c8).toint(),
                               (mC.iterator + (out_row0 + n) * mC.stride[0] + n0 + c8).toint())

            if cutlass.const_expr(ablated(self.cfg, "timeline")):
                bar.arrive_and_wait()  # every thread has issued its stores
                self._stamp(storage, 5)
                tidx, _, _ = cute.arch.thread_idx()
                base = storage.stamps.data_ptr().toint()
                if tidx == 0:
                    for part in cutlass.range_constexpr(4):
                        copy16(base + 16 * part, (mC.iterator + out_row0 * mC.stride[0] + n0 + 8 * part).toint())

        @cute.jit
        def _stamp(self, storage, point: int):
            """ablate="timeline": thread 0 keeps the %globaltimer at ``point`` (:data:`TIMELINE_POINTS`)."""
            if cutlass.const_expr(ablated(self.cfg, "timeline")):
                tidx, _, _ = cute.arch.thread_idx()
                addr = storage.stamps.data_ptr().toint() + 8 * point
                if tidx == 0:
                    stamp_to(addr)

        @cute.jit
        def _put(self, staged: bool, sC, mC, v, coord, col0, out_row0, tok_valid, n0, n_valid):
            """Element (m, n) of a block starting at tile column col0: to the staging tile, or straight to C."""
            m, n = coord
            if cutlass.const_expr(staged):
                sC[n, col0 + m] = v.to(mC.element_type)
            elif n < tok_valid and col0 + m < n_valid and cutlass.const_expr(self.stores):
                mC[out_row0 + n, n0 + col0 + m] = v.to(mC.element_type)

    _CLASSES = (ActivationPrologueSm90, GroupedNvfp4GemmSm90RS)
    return _CLASSES




_CLASSES = None

# the host side: token-tile planning, prepare, compile reports (after the kernel: they build it lazily)
from .rs_runner import (  # noqa: E402, F401
    activation_rows,
    check_inline,
    compile_report,
    fake_arguments,
    fake_prologue_arguments,
    group_parameters,
    kernel_for,
    makespan,
    plan_token_tiles,
    prepare,
    prologue_kernel,
    prologue_report,
    read_timeline,
    split_tokens,
    swap_tile_table,
)
