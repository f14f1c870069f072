"""The register-decode tile shared by both swap-AB kernels (sm_90a, CuTe DSL), by stage.

Once a CTA knows its tile — from a host-built table (:mod:`.kernel`) or from the group offsets on the device
(:mod:`..hopper_varlen.kernel`) — both kernels run the same code, built here on first use as a base class
(:func:`tile_class`):

- **producer** (:meth:`_issue`, :meth:`_issue_w`, :meth:`_issue_x`): warp 0's TMA loads of a stage, weights (one
  prepacked box) and activation boxes of ``step`` rows;
- **decode and MMA** (:meth:`_mma_setup`, :meth:`_load_units`, :meth:`_decode_mma`): each thread's code and scale
  words from shared memory decoded into wgmma's register A operand (fp16, or bf16 with ``a16``), 4 wgmma per 64-K
  unit against the activation ring;
- **mainloop** (:meth:`_ring`, :meth:`_mainloop`): the ``ab_stages``-deep mbarrier pipeline and the shared-memory
  views it fills, and the loop that ties the stages together;
- **epilogue and store** (:meth:`_epilogue`, :meth:`_put`): fp32 × the tile's factors, per element or staged through
  shared memory as C rows; dual: silu(gate)·up split over the two warpgroups.

A subclass sets, in ``__init__``: ``cfg``, ``bt``, ``step``, ``nsub``, ``blocks``, ``stages``, ``dual``,
``threads``, ``stage_units``, ``w_rows``, ``op_dtype``, ``a16``; and defines ``_x_box(loads, j, prod, s)`` (the
activation box's coordinates in its TMA partition) and ``_alpha(*scales)`` (the epilogue factors (gate, up)).
``loads`` is ``(tma_w, tWs, tWg, w_tile0, tma_x, tXs, tXg, ..., boxes)``. The host side of a launch starts with
:meth:`_operands` (layouts, TMA atoms, shared storage). The kernel classes stay where they were defined: CuTe DSL
names a kernel's PTX entry after its qualified name (``..._buildlocalsGroupedVarlenGemmSm90...``), so moving one
changes its PTX (``ptx_sha256`` in the compile reports) though not its code.
"""
from __future__ import annotations

from .config import NWG, ROW_BYTES, STAGE_PAD, xfer_bytes
from .layout import UNIT_BYTES, UNIT_CODE_BYTES, UNIT_K, UNIT_ROWS
from .ops import ops

_CLASS = None


def _min_stages(stages: int, k_tiles):
    """The stages to fill first: a Python int for a compile-time K, an Int32 for the tile table's."""
    if isinstance(k_tiles, int):
        return min(stages, k_tiles)
    import cutlass

    return cutlass.min(stages, k_tiles)


def tile_class():
    """The base class ``RegisterDecodeTile``, built on first use (importing nvfp4lib never imports cutlass)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build()
    return _CLASS


def _build():
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import warpgroup

    o = ops()
    load_unit, decode_unit, decode_unit_a16, copy16, _silu_mul = (
        o.load_unit, o.decode_unit, o.decode_unit_a16, o.copy16, o._silu_mul)

    class RegisterDecodeTile:
        """One swap-AB output tile: weights (register A, decoded per thread) × tokens (smem B) -> Cᵀ."""

        def _sx_layout(self, rows: int):
            """The activation ring (nsub·stages slots) for ``rows`` tokens: K-major, 128-byte swizzle."""
            return sm90_utils.make_smem_layout_b(utils.LayoutEnum.ROW_MAJOR, (UNIT_ROWS, rows, UNIT_K),
                                                 self.op_dtype, self.nsub * self.stages)

        @cute.jit
        def _operands(self, mW, mX):
            """Host side of a launch: the shared-memory layouts (activation ring, weight stages), the TMA atoms of
            the weights (a stage is one box) and of the activations (boxes of ``step`` rows: a tile of n tokens is
            n/step boxes per 64-K slot), and the shared storage struct (``self.shared_storage``)."""
            sx_layout = self._sx_layout(self.bt)
            box = self.w_rows // getattr(self, "boxes", 1)  # (a stage is one box, or two: a subclass's ``boxes``)
            sw_layout = cute.make_layout((box, ROW_BYTES, self.stages * (self.w_rows // box)),
                                         stride=(ROW_BYTES, 1, box * ROW_BYTES))
            g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
            tma_w, tW = cute.nvgpu.cpasync.make_tiled_tma_atom(
                g2s, mW, cute.slice_(sw_layout, (None, None, 0)), (box, ROW_BYTES))
            tma_x, tX = cute.nvgpu.cpasync.make_tiled_tma_atom(
                g2s, mX, cute.slice_(self._sx_layout(self.step), (None, None, 0)), (self.step, UNIT_K))
            i64, u8, op = cutlass.Int64, cutlass.Uint8, self.op_dtype  # (a class body sees no closure names)

            @cute.struct
            class SharedStorage:
                load_bars: cute.struct.MemRange[i64, self.stages * 2]
                ticket: cute.struct.MemRange[i64, 1]  # (the fused prologue's CTA ticket; within sw's alignment)
                # (the serving kernel's tile, handed from warp 0; its combine form hands the groups' rows too)
                tile: cute.struct.MemRange[cutlass.Int32, getattr(self, "tile_words", 4)]
                sw: cute.struct.Align[cute.struct.MemRange[u8, cute.cosize(sw_layout)], 1024]
                sx: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(sx_layout)], 1024]

            self.shared_storage = SharedStorage
            return sx_layout, sw_layout, tma_w, tW, tma_x, tX

        @cute.jit
        def _ring(self, nv: int, storage, sw_layout, sx_layout):
            """The stage pipeline (a stage is full when its weights and its activations have landed: TMA bytes,
            one arrive) and the shared-memory views: weights, the activation ring, and this variant's view of the
            ring (the first ``nv`` token rows of every slot)."""
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
            full = sx_layout.outer
            sXv = storage.sx.get_tensor(
                cute.make_layout(((8, nv // 8), full.shape[1], full.shape[2]),
                                 stride=(full.stride[0], full.stride[1], full.stride[2])),
                swizzle=sx_layout.inner)
            return load_pipe, sW, sX, sXv

        @cute.jit
        def _mainloop(self, nv: int, storage, load_pipe, loads, sXv, mC, scales, row0, tokens, n0, n_valid, k_tiles):
            """Both warpgroups decode their weights into registers and run wgmma against the ring; warp 0 also
            issues the loads: the first stages' weights before waiting for the activations (:meth:`_await_x`),
            then their activations. ``k_tiles``: an int, or the tile table's run-time count;
            ``scales``: the subclass's :meth:`_alpha` arguments, read after the loop."""
            tidx, warp_idx, wg, t, tiled_mma, tCrB, rA, rA32, tCcC, accs = self._mma_setup(nv, sXv)
            sw_base = storage.sw.data_ptr().toint()
            prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            first = _min_stages(self.stages, k_tiles)
            sink = cutlass.Uint32(0)  # (a subclass's ``ablation`` "no_mma": what keeps the decode alive)
            # the stages whose weights are asked for before the wait (a subclass's ``prewait``; 0: all the first)
            prewait = getattr(self, "prewait", 0)
            pre = first if prewait == 0 else _min_stages(prewait, first)
            if warp_idx == 0:
                for _ in cutlass.range(pre, unroll=1):
                    load_pipe.producer_acquire(prod)
                    self._issue_w(load_pipe, prod, loads)
                    prod.advance()
            self._await_x()
            if warp_idx == 0:
                early = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                for _ in cutlass.range(pre, unroll=1):
                    self._issue_x(load_pipe, early, loads)
                    early.advance()
                if cutlass.const_expr(prewait != 0):  # the other first stages: weights and activations together
                    for _ in cutlass.range(first - pre, unroll=1):
                        self._issue(load_pipe, prod, loads)
                        prod.advance()
            for kt in cutlass.range(k_tiles, unroll=1):
                self._wait_full(load_pipe, cons)
                if cutlass.const_expr(getattr(self, "timeline", 0) != 0):  # (a subclass's timeline: the first stage)
                    if kt == 0:
                        self._stamp(3)
                loaded = self._load_units(sw_base, cons.index, wg, t)
                for s in cutlass.range_constexpr(self.nsub):
                    sink = self._decode_mma(s, loaded, tiled_mma, rA, rA32, accs, tCrB, cons.index, sink)
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
            if cutlass.const_expr(getattr(self, "ablation", "") == "no_mma"):
                accs[0][0] = cutlass.Float32(sink)
            self._finish(nv, accs, tCcC, storage, mC, scales, row0, tokens, n0, n_valid, wg, t)

        @cute.jit
        def _finish(self, nv: int, accs, tCcC, storage, mC, scales, row0, tokens, n0, n_valid, wg, t):
            """After the mainloop: the epilogue (a subclass may first combine K slices, :mod:`..hopper_varlen`)."""
            self._epilogue(nv, accs, tCcC, storage, mC, self._alpha(*scales), row0, tokens, n0, n_valid, wg, t)

        @cute.jit
        def _wait_full(self, load_pipe, cons):
            """Until stage ``cons`` has landed. ``wait="suspend"``: the pipeline's wait (try_wait with a suspend-time
            hint, which ptxas may compile into a NANOSLEEP loop inline); ``"spin"``: try_wait without a hint (the
            hardware's own time limit per try) in a loop, no sleep; ``"once"``: one try without a hint, then (if the
            stage has not landed) the pipeline's wait (the config knob; see its doc)."""
            wait = getattr(self.cfg, "wait", "suspend")
            if cutlass.const_expr(wait == "suspend"):
                load_pipe.consumer_wait(cons)
            else:
                bar = load_pipe.sync_object_full.get_barrier(cons.index)
                done = cute.arch.mbarrier_try_wait(bar, cons.phase)
                if cutlass.const_expr(wait == "spin"):
                    while not done:
                        done = cute.arch.mbarrier_try_wait(bar, cons.phase)
                else:
                    if not done:
                        load_pipe.consumer_wait(cons)

        @cute.jit
        def _await_x(self):
            """Before the first activation load: wait for the kernel that writes the activations (programmatic
            dependent launch; with bf16 activations there is none and the wait returns at once)."""
            cute.arch.griddepcontrol_wait()

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
            ((sub·NWG + wg)·blocks + block)·UNIT_BYTES; from two boxes (a subclass's ``boxes``), each a stage of the
            packed layout of one block per warpgroup: the single GEMM's box wg holds its blocks, at ((wg·nsub +
            sub)·NWG + block)·UNIT_BYTES, the dual's box ``block`` holds gate and up, at ((block·nsub + sub)·NWG +
            wg)·UNIT_BYTES."""
            if cutlass.const_expr(getattr(self, "boxes", 1) == 1):
                wg_off = wg * self.blocks * UNIT_BYTES
                units = [((i // self.blocks) * NWG * self.blocks + i % self.blocks) * UNIT_BYTES
                         for i in range(self.nsub * self.blocks)]
            elif cutlass.const_expr(self.dual):
                wg_off = wg * UNIT_BYTES
                units = [((i % self.blocks) * self.nsub + i // self.blocks) * NWG * UNIT_BYTES
                         for i in range(self.nsub * self.blocks)]
            else:
                wg_off = wg * self.nsub * NWG * UNIT_BYTES
                units = [((i // self.blocks) * NWG + i % self.blocks) * UNIT_BYTES
                         for i in range(self.nsub * self.blocks)]
            code_off = wg_off + 16 * t
            scale_off = wg_off + UNIT_CODE_BYTES + 8 * (8 * (t // 32) + (t % 32) // 4)
            stage_base = sw_base + stage * (self.stage_units * UNIT_BYTES)
            return [load_unit(stage_base + u + code_off, stage_base + u + scale_off) for u in units]

        @cute.jit
        def _decode_mma(self, s: int, loaded, tiled_mma, rA, rA32, accs, tCrB, slot, sink):
            """Sub-block ``s``: decode its weights into register set s % 2, issue its wgmma against ring slot
            ``slot``, commit, and wait until only this group is in flight. A subclass's ``ablation`` (a diagnostic,
            wrong by design): "no_decode" takes the loaded words as the operands, "no_mma" issues no wgmma and folds
            the decoded words into ``sink`` (returned) instead."""
            ablation = getattr(self, "ablation", "")
            for b in cutlass.range_constexpr(self.blocks):
                words = loaded[s * self.blocks + b]
                if cutlass.const_expr(ablation == "no_decode"):
                    regs = [cutlass.Uint32(words[q % 4]) for q in range(16)]
                elif cutlass.const_expr(self.a16):
                    regs = decode_unit_a16(words)
                else:
                    regs = decode_unit(words, getattr(self, "raw_scale", False))
                for q in cutlass.range_constexpr(16):
                    if cutlass.const_expr(ablation == "no_mma"):
                        sink = sink ^ regs[q]
                    else:
                        rA32[s % 2][b][q] = regs[q]
            if cutlass.const_expr(ablation != "no_mma"):
                warpgroup.fence()
                for b in cutlass.range_constexpr(self.blocks):
                    for kb in cutlass.range_constexpr(UNIT_K // 16):
                        cute.gemm(tiled_mma, accs[b], rA[s % 2][b][None, None, kb],
                                  tCrB[None, None, kb, slot * self.nsub + s], accs[b])
            warpgroup.commit_group()
            warpgroup.wait_group(1)
            return sink

        @cute.jit
        def _issue(self, pipe, prod, loads, acquired: bool = False):
            """Acquire stage ``prod`` (``acquired``: a try_acquire already saw it free) and load it."""
            pipe.producer_acquire(prod, cutlass.Boolean(True) if acquired else None)
            self._issue_w(pipe, prod, loads)
            self._issue_x(pipe, prod, loads)

        @cute.jit
        def _issue_w(self, pipe, prod, loads):
            """Stage ``prod``'s weights: one box, or two (``boxes``: the next packed block's tile, ``k_tiles`` on)."""
            tma_w, tWs, tWg, w_tile0 = loads[:4]
            boxes = getattr(self, "boxes", 1)
            for i in cutlass.range_constexpr(boxes):
                tile = w_tile0 + prod.count + (i * self.k_tiles if cutlass.const_expr(i > 0) else 0)
                cute.copy(tma_w, tWg[None, tile], tWs[None, prod.index * boxes + i],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))

        @cute.jit
        def _issue_x(self, pipe, prod, loads):
            tma_x, tXs, tXg = loads[4:7]
            bar = pipe.producer_get_barrier(prod)
            for s in cutlass.range_constexpr(self.nsub):
                for j in cutlass.range_constexpr(loads[-1]):  # boxes of step rows per 64-K slot
                    cute.copy(tma_x, tXg[None, self._x_box(loads, j, prod, s)],
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

    return RegisterDecodeTile
