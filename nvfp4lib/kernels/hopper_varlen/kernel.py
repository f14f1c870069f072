"""The device-scheduled swap-AB kernel (sm_90a, CuTe DSL): an activation prologue and the grouped GEMM.

Two launches per call, the second with programmatic dependent launch:

- **prologue** (:class:`ActivationDecodeSm90`): every row of the packed activations ``[T, K]`` (codes, E4M3
  scales) to fp16 ``value × scale × 2^-7`` (exact) in ``x16 [T, K_pad]`` (the padding columns written as zeros).
  It knows nothing of the groups;
- **GEMM** (:class:`GroupedVarlenGemmSm90`): CTA ``b`` reads the group offsets ``[G+1]`` and finds its tile
  (:meth:`_schedule`): group g owns rows ``offsets[g] .. offsets[g+1]`` (clamped to ``[0, T]``), split into
  ``ceil(m / tile_n)`` near-equal token tiles (multiples of ``token_step``), each crossed with the ``N / tile_m``
  weight blocks, in (group, weight block, token tile) order. The grid is sized for the worst split of T rows
  (:func:`~.config.max_token_tiles`); CTAs past this split's tiles exit before touching shared memory. Then, as in
  the host-scheduled kernel: weights by TMA from the prepacked tensor (a stage is one box), decoded per thread
  into wgmma's register A operand; the tile's tokens by TMA from ``x16`` in boxes of ``token_step`` rows starting
  at the group's first row (no alignment needed: rows past the tile belong to wgmma columns that are never
  stored, rows past T arrive as zeros); the narrowest compiled wgmma N that covers the tile; the epilogue
  multiplies by ``gs_A·gs_B·2^14`` (A's global scale one or per group; dual: silu(gate)·up, split over both
  warpgroups) and stores C rows ``[T, N]``.

Nothing here depends on the host knowing the split: the same launch is captured once in a CUDA graph and replayed
for any offsets.

With ``act="bf16"`` (W4A16) there is no prologue: the GEMM's B operand is the caller's bf16 activations ``[T, K]``
(TMA-loaded as they are; columns past K and rows past T arrive as zeros), the weights decode to bf16 value × scale ×
2^-14 (:data:`~..hopper_rs.ops.A16_DECODE_PTX`), wgmma runs bf16 × bf16 -> fp32, and the epilogue multiplies by the
weights' ``gs_B·2^14`` alone (the ``gs_A`` argument is not read).
"""
from __future__ import annotations

from ..hopper_rs.layout import UNIT_BYTES, UNIT_CODE_BYTES, UNIT_K, UNIT_ROWS
from ..hopper_rs.ops import ACT_SMEM, ACT_THREADS, ops
from .config import NWG, ROW_BYTES, STAGE_PAD, VarlenConfig, validate, xfer_bytes

_CLASSES = None


def kernel_classes():
    """(ActivationDecodeSm90, GroupedVarlenGemmSm90), built on first use (importing nvfp4lib never imports
    cutlass)."""
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _build()
    return _CLASSES


def _build():
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import warpgroup

    o = ops()
    load_unit, decode_unit, copy16, decode_act16, zero32, _silu_mul = (
        o.load_unit, o.decode_unit, o.copy16, o.decode_act16, o.zero32, o._silu_mul)
    decode_unit_a16 = o.decode_unit_a16

    class ActivationDecodeSm90:
        """``mCodes`` uint8 [T, K/2], ``mScales`` E4M3 bytes [T, K/16] (row-major, the caller's tensors), ``mX``
        fp16 [R >= T, K_pad]: rows 0 .. T-1 written (a runner keeps one buffer for every T up to R)."""

        @cute.jit
        def __call__(self, mCodes: cute.Tensor, mScales: cute.Tensor, mX: cute.Tensor, stream):
            work = cute.size(mCodes, mode=[0]) * (cute.size(mX, mode=[1]) // 16)
            self.kernel(mCodes, mScales, mX).launch(
                grid=((work + ACT_THREADS - 1) // ACT_THREADS, 1, 1), block=(ACT_THREADS, 1, 1), stream=stream,
                smem=ACT_SMEM)

        @cute.kernel
        def kernel(self, mCodes: cute.Tensor, mScales: cute.Tensor, mX: cute.Tensor):
            cute.arch.griddepcontrol_launch_dependents()  # the GEMM may start its set-up and weight loads now
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            i = bidx * ACT_THREADS + tidx
            per_row = cute.size(mX, mode=[1]) // 16  # 16-code chunks of a padded row
            chunks = cute.size(mScales, mode=[1])  # those that hold codes
            if i < cute.size(mCodes, mode=[0]) * per_row:
                r = i // per_row
                c = i - r * per_row
                dst = (mX.iterator + r * mX.stride[0] + 16 * c).toint()
                if c < chunks:
                    decode_act16((mCodes.iterator + r * mCodes.stride[0] + 8 * c).toint(),
                                 (mScales.iterator + r * mScales.stride[0] + c).toint(), dst)
                else:
                    zero32(dst)  # a zero operand: the weights' padding is zero too, but 0 × NaN is not

    class GroupedVarlenGemmSm90:
        """Swap-AB: weights (register A, decoded per thread) × tokens (smem B, fp16; bf16 with ``act="bf16"``) -> Cᵀ
        tiles, one per CTA, each found from the group offsets on the device. ``groups``, ``n`` (columns of C) and
        ``k_pad`` are those of the prepared weights and fixed per compile."""

        def __init__(self, cfg: VarlenConfig, groups: int, n: int, k_pad: int):
            self.cfg = validate(cfg)
            self.groups, self.n, self.k_tiles = groups, n, k_pad // cfg.tile_k
            self.n_blocks = -(-n // cfg.tile_m)
            self.bt, self.step = cfg.tile_n, cfg.step
            self.variants = tuple(range(self.step, self.bt + 1, self.step))
            self.nsub = cfg.tile_k // UNIT_K
            self.blocks = cfg.blocks
            self.stages = cfg.ab_stages
            self.dual = cfg.dual
            self.threads = 128 * NWG
            self.stage_units = cfg.stage_units
            self.w_rows = self.stage_units * UNIT_BYTES // ROW_BYTES  # 128-byte rows per stage
            self.a16 = cfg.act == "bf16"  # bf16 activations as they are, weights decoded to bf16
            self.op_dtype = cutlass.BFloat16 if self.a16 else cutlass.Float16

        def _sx_layout(self, rows: int):
            """The activation ring (nsub·stages slots) for ``rows`` tokens: K-major, 128-byte swizzle."""
            return sm90_utils.make_smem_layout_b(utils.LayoutEnum.ROW_MAJOR, (UNIT_ROWS, rows, UNIT_K),
                                                 self.op_dtype, self.nsub * self.stages)

        @cute.jit
        def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mC: cute.Tensor, mOffsets: cute.Tensor,
                     mGsA: cute.Tensor, mGsB: cute.Tensor, stream):
            sx_layout = self._sx_layout(self.bt)
            sw_layout = cute.make_layout((self.w_rows, ROW_BYTES, self.stages),
                                         stride=(ROW_BYTES, 1, self.w_rows * ROW_BYTES))
            g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
            tma_w, tW = cute.nvgpu.cpasync.make_tiled_tma_atom(
                g2s, mW, cute.slice_(sw_layout, (None, None, 0)), (self.w_rows, ROW_BYTES))
            tma_x, tX = cute.nvgpu.cpasync.make_tiled_tma_atom(
                g2s, mX, cute.slice_(self._sx_layout(self.step), (None, None, 0)), (self.step, UNIT_K))
            i64, u8, op = cutlass.Int64, cutlass.Uint8, self.op_dtype

            @cute.struct
            class SharedStorage:
                load_bars: cute.struct.MemRange[i64, self.stages * 2]
                sw: cute.struct.Align[cute.struct.MemRange[u8, cute.cosize(sw_layout)], 1024]
                sx: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(sx_layout)], 1024]

            self.shared_storage = SharedStorage
            rows = cute.size(mC, mode=[0])  # T (x16 may have more rows: stale, finite, never stored)
            tiles_max = cutlass.min(rows, (rows + self.groups * (self.bt - 1)) // self.bt) * self.n_blocks
            self.kernel(tma_w, tW, tma_x, tX, mC, mOffsets, mGsA, mGsB, sw_layout, sx_layout).launch(
                grid=(tiles_max, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=True)

        @cute.jit
        def _schedule(self, mOffsets, rows):
            """This CTA's tile: (group, first token row, tokens, first weight row of the group's N) or tokens <= 0
            when the split has fewer tiles than the grid."""
            bidx, _, _ = cute.arch.block_idx()
            acc = cutlass.Int32(0)
            group, lo_sel, m_sel, ntt_sel, local = (cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0),
                                                    cutlass.Int32(0), cutlass.Int32(0))
            lo = cutlass.min(cutlass.max(cutlass.Int32(mOffsets[0]), 0), rows)
            for g in cutlass.range(self.groups, unroll=min(self.groups, 16)):
                hi = cutlass.min(cutlass.max(cutlass.Int32(mOffsets[g + 1]), lo), rows)
                m = hi - lo
                ntt = (m + self.bt - 1) // self.bt
                cnt = ntt * self.n_blocks
                if bidx >= acc and bidx < acc + cnt:
                    group, lo_sel, m_sel, ntt_sel, local = g, lo, m, ntt, bidx - acc
                acc = acc + cnt
                lo = hi
            nblk = local // cutlass.max(ntt_sel, 1)
            tt = local - nblk * ntt_sel
            size = ((m_sel + ntt_sel - 1) // cutlass.max(ntt_sel, 1) + self.step - 1) // self.step * self.step
            m0 = tt * size
            tokens = cutlass.min(size, m_sel - m0)
            if ntt_sel == 0:
                tokens = cutlass.Int32(0)
            return group, lo_sel + m0, tokens, nblk * self.cfg.tile_m

        @cute.kernel
        def kernel(self, tma_w: cute.CopyAtom, tW: cute.Tensor, tma_x: cute.CopyAtom, tX: cute.Tensor,
                   mC: cute.Tensor, mOffsets: cute.Tensor, mGsA: cute.Tensor, mGsB: cute.Tensor, sw_layout: cute.Layout,
                   sx_layout: cute.ComposedLayout):
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            group, tok_row0, tokens, n0 = self._schedule(mOffsets, cute.size(mC, mode=[0]))
            if tokens > 0:
                if warp_idx == 0:
                    cute.nvgpu.cpasync.prefetch_descriptor(tma_w)
                    cute.nvgpu.cpasync.prefetch_descriptor(tma_x)
                storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
                variant = (tokens + self.step - 1) // self.step - 1
                for v in cutlass.range_constexpr(len(self.variants)):
                    if variant == v:
                        self._tile(self.variants[v], storage, tma_w, tW, tma_x, tX, mC, (mGsA, mGsB, group),
                                   tok_row0, tokens, n0, sw_layout, sx_layout)

        @cute.jit
        def _tile(self, nv: int, storage, tma_w, tW, tma_x, tX, mC, scales, tok_row0, tokens, n0, sw_layout, sx_layout):
            """One output tile with a wgmma N of ``nv`` tokens."""
            n_valid = cutlass.min(self.cfg.tile_m, self.n - n0)
            boxes = nv // self.step
            tx_bytes = self.stage_units * UNIT_BYTES + self.nsub * nv * UNIT_K * 2
            load_pipe = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.load_bars.data_ptr(), num_stages=self.stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * NWG),
                tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)), defer_sync=True)
            cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()

            sW = storage.sw.get_tensor(sw_layout)
            sX = storage.sx.get_tensor(sx_layout.outer, swizzle=sx_layout.inner)
            full = sx_layout.outer  # this variant's view of the ring: the first nv token rows of every slot
            sXv = storage.sx.get_tensor(
                cute.make_layout(((8, nv // 8), full.shape[1], full.shape[2]),
                                 stride=(full.stride[0], full.stride[1], full.stride[2])),
                swizzle=sx_layout.inner)

            group = scales[2]
            # weights: stage tiles of w_rows 128-byte rows, CTA-block-major (a block's K tiles adjacent)
            w_tile0 = (group * self.n_blocks + n0 // self.cfg.tile_m) * self.k_tiles
            gW = cute.local_tile(tW, (self.w_rows, ROW_BYTES), (None, 0))
            tWs, tWg = cute.nvgpu.cpasync.tma_partition(tma_w, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2),
                                                        cute.group_modes(gW, 0, 2))
            # activations: boxes of step rows from the tile's first token row (any row: TMA takes element
            # coordinates); smem (box, (row block, 1, slot)), gmem (box, (row block, 64-K block))
            tXs, tXg = cute.nvgpu.cpasync.tma_partition(
                tma_x, 0, cute.make_layout(1), cute.zipped_divide(sX, (self.step, UNIT_K)),
                cute.zipped_divide(cute.domain_offset((tok_row0, 0), tX), (self.step, UNIT_K)))
            loads = (tma_w, tWs, tWg, w_tile0, tma_x, tXs, tXg, boxes)
            self._mainloop(nv, storage, load_pipe, loads, sXv, mC, scales, tok_row0, tokens, n0, n_valid)

        @cute.jit
        def _mainloop(self, nv: int, storage, load_pipe, loads, sXv, mC, scales, tok_row0, tokens, n0, n_valid):
            """Both warpgroups decode their weights into registers and run wgmma against the ring; warp 0 also
            issues the loads: the first stages' weights before waiting for the prologue, then their activations."""
            tidx, warp_idx, wg, t, tiled_mma, tCrB, rA, rA32, tCcC, accs = self._mma_setup(nv, sXv)
            sw_base = storage.sw.data_ptr().toint()
            k_tiles = self.k_tiles
            prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            first = min(self.stages, k_tiles)
            if warp_idx == 0:
                for _ in cutlass.range(first, unroll=1):
                    load_pipe.producer_acquire(prod)
                    self._issue_w(load_pipe, prod, loads)
                    prod.advance()
            cute.arch.griddepcontrol_wait()  # x16 is the prologue's (bf16: the activations, the previous kernel's)
            if warp_idx == 0:
                early = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                for _ in cutlass.range(first, unroll=1):
                    self._issue_x(load_pipe, early, loads)
                    early.advance()
            for kt in cutlass.range(k_tiles, unroll=1):
                load_pipe.consumer_wait(cons)
                loaded = self._load_units(sw_base, cons.index, wg, t)
                for s in cutlass.range_constexpr(self.nsub):
                    self._decode_mma(s, loaded, tiled_mma, rA, rA32, accs, tCrB, cons.index)
                    if cutlass.const_expr(s == 0):
                        # the previous stage's last wgmma group is done: hand its buffers back and refill them if the
                        # other warpgroup has too. Warp 0 must not wait here (wgmma is warpgroup-wide: a blocked
                        # warp 0 stalls warpgroup 0); if the slot is not free yet it refills it after this stage.
                        if kt > 0:
                            load_pipe.consumer_release(rel)
                            rel.advance()
                            if warp_idx == 0:
                                if prod.count < k_tiles:
                                    if load_pipe.producer_try_acquire(prod):
                                        self._issue(load_pipe, prod, loads, acquired=True)
                                        prod.advance()
                if warp_idx == 0:
                    if kt > 0:
                        if prod.count < cutlass.min(k_tiles, kt - 1 + self.stages):
                            self._issue(load_pipe, prod, loads)
                            prod.advance()
                cons.advance()
            warpgroup.wait_group(0)
            self._epilogue(nv, accs, tCcC, storage, mC, self._alpha(*scales), tok_row0, tokens, n0, n_valid, wg, t)

        @cute.jit
        def _alpha(self, mGsA, mGsB, group):
            """The group's epilogue factors (gate, up): A's global scale (one, or the group's) times gs_B·2^14; bf16
            activations have no global scale (their weights' 2^-14 is what the 2^14 undoes)."""
            if cutlass.const_expr(self.a16):
                return mGsB[group, 0], mGsB[group, 1]
            gs = mGsA[0]
            if cute.size(mGsA, mode=[0]) > 1:
                gs = mGsA[group]
            return gs * mGsB[group, 0], gs * mGsB[group, 1]

        @cute.jit
        def _mma_setup(self, nv: int, sXv):
            """This thread's indices and the wgmma of N = ``nv`` tokens for it: the tiled MMA, the B fragments over
            the ring, two register sets of A fragments (sub-blocks alternate), the C coordinates, zeroed
            accumulators."""
            tidx, _, _ = cute.arch.thread_idx()
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            wg = cute.arch.make_warp_uniform(tidx // 128)
            t = tidx % 128
            tiled_mma = sm90_utils.make_trivial_tiled_mma(
                self.op_dtype, self.op_dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
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
            ((sub·NWG + wg)·blocks + block)·UNIT_BYTES."""
            wg_off = wg * self.blocks * UNIT_BYTES
            code_off = wg_off + 16 * t
            scale_off = wg_off + UNIT_CODE_BYTES + 8 * (8 * (t // 32) + (t % 32) // 4)
            stage_base = sw_base + stage * (self.stage_units * UNIT_BYTES)
            units = [((i // self.blocks) * NWG * self.blocks + i % self.blocks) * UNIT_BYTES
                     for i in range(self.nsub * self.blocks)]
            return [load_unit(stage_base + u + code_off, stage_base + u + scale_off) for u in units]

        @cute.jit
        def _decode_mma(self, s: int, loaded, tiled_mma, rA, rA32, accs, tCrB, slot):
            """Sub-block ``s``: decode its weights into register set s % 2, issue its wgmma against ring slot
            ``slot``, commit, and wait until only this group is in flight."""
            for b in cutlass.range_constexpr(self.blocks):
                if cutlass.const_expr(self.a16):
                    regs = decode_unit_a16(loaded[s * self.blocks + b])
                else:
                    regs = decode_unit(loaded[s * self.blocks + b])
                for q in cutlass.range_constexpr(16):
                    rA32[s % 2][b][q] = regs[q]
            warpgroup.fence()
            for b in cutlass.range_constexpr(self.blocks):
                for kb in cutlass.range_constexpr(UNIT_K // 16):
                    cute.gemm(tiled_mma, accs[b], rA[s % 2][b][None, None, kb],
                              tCrB[None, None, kb, slot * self.nsub + s], accs[b])
            warpgroup.commit_group()
            warpgroup.wait_group(1)

        @cute.jit
        def _issue(self, pipe, prod, loads, acquired: bool = False):
            """Acquire stage ``prod`` (``acquired``: a try_acquire already saw it free) and load it."""
            pipe.producer_acquire(prod, cutlass.Boolean(True) if acquired else None)
            self._issue_w(pipe, prod, loads)
            self._issue_x(pipe, prod, loads)

        @cute.jit
        def _issue_w(self, pipe, prod, loads):
            tma_w, tWs, tWg, w_tile0 = loads[:4]
            cute.copy(tma_w, tWg[None, w_tile0 + prod.count], tWs[None, prod.index],
                      tma_bar_ptr=pipe.producer_get_barrier(prod))

        @cute.jit
        def _issue_x(self, pipe, prod, loads):
            tma_x, tXs, tXg, boxes = loads[4:]
            bar = pipe.producer_get_barrier(prod)
            for s in cutlass.range_constexpr(self.nsub):
                for j in cutlass.range_constexpr(boxes):
                    cute.copy(tma_x, tXg[None, (j, prod.count * self.nsub + s)],
                              tXs[None, (j, 0, prod.index * self.nsub + s)], tma_bar_ptr=bar)

        @cute.jit
        def _epilogue(self, nv: int, accs, tCcC, storage, mC, alpha, row0, tokens, n0, n_valid, wg, t):
            """Cᵀ tiles -> C: element (weight row m of block b, token n) to C[row0 + n, n0 + col]; per element
            ("simt"), or through shared memory as C rows copied out in 16-byte row chunks ("staged")."""
            size = cute.size(accs[0])
            staged = self.cfg.epilogue == "staged"
            bar = pipeline.NamedBarrier(barrier_id=1, num_threads=self.threads)
            bar.arrive_and_wait()  # every wgmma of both warpgroups has read its operands: the ring is free
            sx = storage.sx.data_ptr()
            cols = self.cfg.tile_m
            ld = cols + STAGE_PAD
            sC = cute.make_tensor(cute.recast_ptr(sx + xfer_bytes(self.cfg) // 2, dtype=mC.element_type),
                                  cute.make_layout((self.bt, ld), stride=(ld, 1)))
            put = (sC, mC, row0, tokens, n0, n_valid)
            if cutlass.const_expr(self.dual):
                # the warpgroups hold gate and up of the same elements: each hands the other half of its accumulators
                # over in shared memory, then computes silu(gate)·up for its own half
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
                            self._put(staged, put, _silu_mul(accs[b][i] * a_gate, xfer[b * size + i, t] * a_up),
                                      tCcC[i], b * UNIT_ROWS)
                else:
                    for b in cutlass.range_constexpr(self.blocks):
                        for i in cutlass.range_constexpr(half, size):
                            self._put(staged, put, _silu_mul(xfer[b * size + i, t] * a_gate, accs[b][i] * a_up),
                                      tCcC[i], b * UNIT_ROWS)
            else:
                for b in cutlass.range_constexpr(self.blocks):
                    for i in cutlass.range_constexpr(size):
                        self._put(staged, put, accs[b][i] * alpha[0], tCcC[i], (wg * self.blocks + b) * UNIT_ROWS)
            if cutlass.const_expr(staged):
                bar.arrive_and_wait()
                tidx, _, _ = cute.arch.thread_idx()
                per_row = cols // 8  # 16-byte chunks per token row
                total = nv * per_row
                for r in cutlass.range_constexpr(-(-total // self.threads)):
                    q = tidx + self.threads * r
                    n = q // per_row
                    c8 = (q - n * per_row) * 8
                    if q < total and n < tokens and c8 < n_valid:
                        copy16((sC.iterator + n * ld + c8).toint(),
                               (mC.iterator + (row0 + n) * mC.stride[0] + n0 + c8).toint())

        @cute.jit
        def _put(self, staged: bool, put, v, coord, col0):
            """Element (m, n) of a block starting at tile column col0: to the staging tile, or straight to C."""
            sC, mC, row0, tokens, n0, n_valid = put
            m, n = coord
            if cutlass.const_expr(staged):
                sC[n, col0 + m] = v.to(mC.element_type)
            elif n < tokens and col0 + m < n_valid:
                mC[row0 + n, n0 + col0 + m] = v.to(mC.element_type)

    return ActivationDecodeSm90, GroupedVarlenGemmSm90
