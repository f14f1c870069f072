"""The warp-specialized, pipelined, persistent form of the sm_100a kernel (``warp_spec="producer_consumer"``,
compiled for sm_100a, not run): a TMA warp, an MMA warp and four epilogue warps, as a mixin of
:class:`~.kernel.Sm100NvFp4GroupedGemm` (its attributes and helpers come from that class)."""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait


class WarpSpecialized:
    # ---- device: warp-specialized, pipelined, persistent --------------------------------------
    @cute.kernel
    def kernel_ws(
        self,
        tiled_mma: cute.TiledMma,
        tiled_mma_sfb: cute.TiledMma,
        tma_atom_a: cute.CopyAtom,
        mA_mkl: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB_nkl: cute.Tensor,
        tma_atom_sfa: cute.CopyAtom,
        mSFA_mkl: cute.Tensor,
        tma_atom_sfb: cute.CopyAtom,
        mSFB_nkl: cute.Tensor,
        tma_atom_b2: cute.CopyAtom,
        tma_atom_sfb2: cute.CopyAtom,
        tma_atom_c: cute.CopyAtom,
        mC_mnl: cute.Tensor,
        cluster_layout_vmnk: cute.Layout,
        cluster_layout_sfb_vmnk: cute.Layout,
        a_smem_layout_staged: cute.ComposedLayout,
        b_smem_layout_staged: cute.ComposedLayout,
        sfa_smem_layout_staged: cute.Layout,
        sfb_smem_layout_staged: cute.Layout,
        c_smem_layout_staged: cute.ComposedLayout,
        tile_sched_params: utils.PersistentTileSchedulerParams,
        group_count: cutlass.Constexpr,
        problem_sizes: cute.Tensor,
        addresses: cute.Tensor,
        alphas: cute.Tensor,
        tensormaps: cute.Tensor,
    ):
        """Warp 5 loads, warp 4 multiplies, warps 0-3 drain the accumulators (NVIDIA's structure)."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        use_2cta_instrs = cute.size(tiled_mma.thr_id.shape) == 2
        bidx, bidy, bidz = cute.arch.block_idx()
        mma_tile_coord_v = bidx % cute.size(tiled_mma.thr_id.shape)
        is_leader_cta = mma_tile_coord_v == 0
        cta_rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        block_in_cluster_coord_vmnk = cluster_layout_vmnk.get_flat_coord(cta_rank_in_cluster)
        block_in_cluster_coord_sfb_vmnk = cluster_layout_sfb_vmnk.get_flat_coord(cta_rank_in_cluster)
        tidx, _, _ = cute.arch.thread_idx()

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        tmap_smem = storage.tensormap_buffer.data_ptr()
        tmap_i64 = self.bytes_per_tensormap // 8

        num_tma_producer = self.num_mcast_ctas_a + self.num_mcast_ctas_b - 1
        ab_pipeline = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_full_mbar_ptr.data_ptr(),
            num_stages=self.num_ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, num_tma_producer),
            tx_count=self.num_tma_load_bytes,
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        acc_pipeline = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_full_mbar_ptr.data_ptr(),
            num_stages=self.num_acc_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, len(self.epilog_warp_id) * (2 if use_2cta_instrs else 1)),
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        tmem = utils.TmemAllocator(
            storage.tmem_holding_buf,
            barrier_for_retrieve=self.tmem_alloc_barrier,
            allocator_warp_id=self.epilog_warp_id[0],
            is_two_cta=use_2cta_instrs,
            two_cta_tmem_dealloc_mbar_ptr=storage.tmem_dealloc_mbar_ptr,
        )
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        sA, sB, sSFA, sSFB, sB2, sSFB2 = self._smem_operands(
            storage, a_smem_layout_staged, b_smem_layout_staged, sfa_smem_layout_staged, sfb_smem_layout_staged)

        a_mcast = b_mcast = sfa_mcast = sfb_mcast = None
        if cutlass.const_expr(self.is_a_mcast or self.is_b_mcast or use_2cta_instrs):
            a_mcast = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, block_in_cluster_coord_vmnk, mcast_mode=2)
            b_mcast = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, block_in_cluster_coord_vmnk, mcast_mode=1)
            sfa_mcast = cpasync.create_tma_multicast_mask(
                cluster_layout_vmnk, block_in_cluster_coord_vmnk, mcast_mode=2)
            sfb_mcast = cpasync.create_tma_multicast_mask(
                cluster_layout_sfb_vmnk, block_in_cluster_coord_sfb_vmnk, mcast_mode=1)

        tCgA, tCgB, tCgSFA, tCgSFB, thr_mma, thr_mma_sfb = self._gmem_operands(
            tiled_mma, tiled_mma_sfb, mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, mma_tile_coord_v)

        a_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, 0, None, 0)).shape)
        b_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, None, 0, 0)).shape)
        sfb_cta_layout = cute.make_layout(cute.slice_(cluster_layout_sfb_vmnk, (0, None, 0, 0)).shape)
        cm_coord = block_in_cluster_coord_vmnk[2]
        cn_coord = block_in_cluster_coord_vmnk[1]
        cn_sfb_coord = block_in_cluster_coord_sfb_vmnk[1]
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a, cm_coord, a_cta_layout, cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3))
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b, cn_coord, b_cta_layout, cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3))
        tBsB2, tBgB2 = cpasync.tma_partition(
            tma_atom_b2, cn_coord, b_cta_layout, cute.group_modes(sB2, 0, 3), cute.group_modes(tCgB, 0, 3))
        tAsSFA, tAgSFA = cpasync.tma_partition(
            tma_atom_sfa, cm_coord, a_cta_layout, cute.group_modes(sSFA, 0, 3), cute.group_modes(tCgSFA, 0, 3))
        tAsSFA = cute.filter_zeros(tAsSFA)
        tAgSFA = cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cpasync.tma_partition(
            tma_atom_sfb, cn_sfb_coord, sfb_cta_layout, cute.group_modes(sSFB, 0, 3), cute.group_modes(tCgSFB, 0, 3))
        tBsSFB = cute.filter_zeros(tBsSFB)
        tBgSFB = cute.filter_zeros(tBgSFB)
        tBsSFB2, tBgSFB2 = cpasync.tma_partition(
            tma_atom_sfb2, cn_sfb_coord, sfb_cta_layout, cute.group_modes(sSFB2, 0, 3),
            cute.group_modes(tCgSFB, 0, 3))
        tBsSFB2 = cute.filter_zeros(tBsSFB2)
        tBgSFB2 = cute.filter_zeros(tBgSFB2)

        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        tCrB2 = tiled_mma.make_fragment_B(sB2)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        tCtAcc_fake = tiled_mma.make_fragment_C(cute.append(acc_shape, self.num_acc_stage * self.n_prod))

        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        grid_dim = cute.arch.grid_dim()
        slot = bidz * grid_dim[1] * grid_dim[0] + bidy * grid_dim[0] + bidx
        tensormap_manager = utils.TensorMapManager(utils.TensorMapUpdateMode.SMEM, self.bytes_per_tensormap)
        tmap_gmem = [tensormap_manager.get_tensormap_ptr(tensormaps[(slot, i, None)].iterator)
                     for i in range(self.num_tensormaps)]
        tmap_smem_ptrs = [tmap_smem + i * tmap_i64 for i in range(self.num_tensormaps)]
        load_atoms = [tma_atom_a, tma_atom_b, tma_atom_sfa, tma_atom_sfb]
        load_slots = [self.tm_a, self.tm_b, self.tm_sfa, self.tm_sfb]
        if cutlass.const_expr(self.dual):
            load_atoms += [tma_atom_b2, tma_atom_sfb2]
            load_slots += [self.tm_b2, self.tm_sfb2]

        #
        # TMA warp: per tile, re-point the descriptors when the group changes, then stream k-tiles.
        #
        if warp_idx == self.tma_warp_id:
            tile_sched = utils.StaticPersistentTileScheduler.create(tile_sched_params, cute.arch.block_idx(), grid_dim)
            group_helper = utils.GroupedGemmTileSchedulerHelper(
                group_count, tile_sched_params, self.cluster_tile_shape_mnk, utils.create_initial_search_state())
            tensormap_init_done = cutlass.Boolean(False)
            last_group_idx = cutlass.Int32(-1)
            work_tile = tile_sched.initial_work_tile_info()
            ab_producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stage)
            while work_tile.is_valid_tile:
                info = group_helper.delinearize_z(work_tile.tile_idx, problem_sizes)
                k_tile_cnt = info.cta_tile_count_k
                cur_group_idx = info.group_idx
                is_group_changed = cur_group_idx != last_group_idx
                if is_group_changed:
                    ga, gb, gsfa, gsfb, gb2, gsfb2 = self._group_operands(
                        cur_group_idx, info.problem_shape_m, info.problem_shape_n, info.problem_shape_k, addresses)
                    if tensormap_init_done == False:  # noqa: E712 (a DSL Boolean)
                        self.tensormap_init_barrier.arrive_and_wait()
                        tensormap_init_done = True
                    tensors = [ga, gb, gsfa, gsfb]
                    if cutlass.const_expr(self.dual):
                        tensors += [gb2, gsfb2]
                    tensormap_manager.update_tensormap(
                        tuple(tensors), tuple(load_atoms), tuple(tmap_gmem[s] for s in load_slots),
                        self.tma_warp_id, tuple(tmap_smem_ptrs[s] for s in load_slots))

                mma_tile_m = info.cta_tile_idx_m // cute.size(tiled_mma.thr_id.shape)
                mma_tile_n = info.cta_tile_idx_n
                sfb_n = self._sfb_n_slice(mma_tile_n)
                tAgA_slice = tAgA[(None, mma_tile_m, None, 0)]
                tBgB_slice = tBgB[(None, mma_tile_n, None, 0)]
                tBgB2_slice = tBgB2[(None, mma_tile_n, None, 0)]
                tAgSFA_slice = tAgSFA[(None, mma_tile_m, None, 0)]
                tBgSFB_slice = tBgSFB[(None, sfb_n, None, 0)]
                tBgSFB2_slice = tBgSFB2[(None, sfb_n, None, 0)]

                ab_producer_state.reset_count()
                peek_ab_empty_status = cutlass.Boolean(1)
                if ab_producer_state.count < k_tile_cnt:
                    peek_ab_empty_status = ab_pipeline.producer_try_acquire(ab_producer_state)
                if is_group_changed:
                    for s in load_slots:
                        tensormap_manager.fence_tensormap_update(tmap_gmem[s])

                for _k_tile in cutlass.range(0, k_tile_cnt, 1, unroll=1):
                    ab_pipeline.producer_acquire(ab_producer_state, peek_ab_empty_status)
                    bar = ab_pipeline.producer_get_barrier(ab_producer_state)
                    kc = ab_producer_state.count
                    ks = ab_producer_state.index
                    cute.copy(tma_atom_a, tAgA_slice[(None, kc)], tAsA[(None, ks)], tma_bar_ptr=bar,
                              mcast_mask=a_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                  tmap_gmem[self.tm_a], cute.AddressSpace.generic))
                    cute.copy(tma_atom_b, tBgB_slice[(None, kc)], tBsB[(None, ks)], tma_bar_ptr=bar,
                              mcast_mask=b_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                  tmap_gmem[self.tm_b], cute.AddressSpace.generic))
                    cute.copy(tma_atom_sfa, tAgSFA_slice[(None, kc)], tAsSFA[(None, ks)], tma_bar_ptr=bar,
                              mcast_mask=sfa_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                  tmap_gmem[self.tm_sfa], cute.AddressSpace.generic))
                    cute.copy(tma_atom_sfb, tBgSFB_slice[(None, kc)], tBsSFB[(None, ks)], tma_bar_ptr=bar,
                              mcast_mask=sfb_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                  tmap_gmem[self.tm_sfb], cute.AddressSpace.generic))
                    if cutlass.const_expr(self.dual):
                        cute.copy(tma_atom_b2, tBgB2_slice[(None, kc)], tBsB2[(None, ks)], tma_bar_ptr=bar,
                                  mcast_mask=b_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                      tmap_gmem[self.tm_b2], cute.AddressSpace.generic))
                        cute.copy(tma_atom_sfb2, tBgSFB2_slice[(None, kc)], tBsSFB2[(None, ks)], tma_bar_ptr=bar,
                                  mcast_mask=sfb_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                      tmap_gmem[self.tm_sfb2], cute.AddressSpace.generic))
                    ab_producer_state.advance()
                    peek_ab_empty_status = cutlass.Boolean(1)
                    if ab_producer_state.count < k_tile_cnt:
                        peek_ab_empty_status = ab_pipeline.producer_try_acquire(ab_producer_state)

                tile_sched.advance_to_next_work()
                work_tile = tile_sched.get_current_work()
                last_group_idx = cur_group_idx
            ab_pipeline.producer_tail(ab_producer_state)

        #
        # MMA warp: scales to tensor memory, block-scaled MMAs into the accumulator stage.
        #
        if warp_idx == self.mma_warp_id:
            self._load_descriptors(tensormap_manager, load_atoms, [tmap_smem_ptrs[s] for s in load_slots],
                                   self.mma_warp_id)
            self.tensormap_init_barrier.arrive_and_wait()
            tmem.wait_for_alloc()
            acc_tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
            tCtAcc_base, tCtSFA, (tCtSFB, tCtSFB2), (sfb_col0, sfb2_col0), tCtSFB_layout = self._tmem_tensors(
                tiled_mma, acc_tmem_ptr, tCtAcc_fake, sfa_smem_layout_staged, sfb_smem_layout_staged)
            tiled_copy_s2t_sfa, tCsSFA_s2t, tCtSFA_s2t = self._s2t_copy_and_partition(sSFA, tCtSFA)
            tiled_copy_s2t_sfb, tCsSFB_s2t, tCtSFB_s2t = self._s2t_copy_and_partition(sSFB, tCtSFB)
            tiled_copy_s2t_sfb2, tCsSFB2_s2t, tCtSFB2_s2t = self._s2t_copy_and_partition(sSFB2, tCtSFB2)

            tile_sched = utils.StaticPersistentTileScheduler.create(tile_sched_params, cute.arch.block_idx(), grid_dim)
            group_helper = utils.GroupedGemmTileSchedulerHelper(
                group_count, tile_sched_params, self.cluster_tile_shape_mnk, utils.create_initial_search_state())
            work_tile = tile_sched.initial_work_tile_info()
            ab_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stage)
            acc_producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_acc_stage)
            while work_tile.is_valid_tile:
                info = group_helper.delinearize_z(work_tile.tile_idx, problem_sizes)
                k_tile_cnt = info.cta_tile_count_k
                mma_tile_n = info.cta_tile_idx_n
                acc_index = acc_producer_state.index * self.n_prod
                tCtAcc = tCtAcc_base[(None, None, None, acc_index)]
                tCtAcc2 = tCtAcc_base[(None, None, None, acc_index + self.n_prod - 1)]
                tCtSFB_mma = self._sfb_for_tile(acc_tmem_ptr, sfb_col0, tCtSFB, tCtSFB_layout, mma_tile_n)
                tCtSFB2_mma = self._sfb_for_tile(acc_tmem_ptr, sfb2_col0, tCtSFB2, tCtSFB_layout, mma_tile_n)

                ab_consumer_state.reset_count()
                peek_ab_full_status = cutlass.Boolean(1)
                if ab_consumer_state.count < k_tile_cnt and is_leader_cta:
                    peek_ab_full_status = ab_pipeline.consumer_try_wait(ab_consumer_state)
                if is_leader_cta:
                    acc_pipeline.producer_acquire(acc_producer_state)
                tiled_mma.set(tcgen05.Field.ACCUMULATE, False)

                for _k_tile in range(k_tile_cnt):
                    if is_leader_cta:
                        ab_pipeline.consumer_wait(ab_consumer_state, peek_ab_full_status)
                        cs = ab_consumer_state.index
                        cute.copy(tiled_copy_s2t_sfa, tCsSFA_s2t[(None, None, None, None, cs)], tCtSFA_s2t)
                        cute.copy(tiled_copy_s2t_sfb, tCsSFB_s2t[(None, None, None, None, cs)], tCtSFB_s2t)
                        if cutlass.const_expr(self.dual):
                            cute.copy(tiled_copy_s2t_sfb2, tCsSFB2_s2t[(None, None, None, None, cs)], tCtSFB2_s2t)
                        num_kblocks = cute.size(tCrA, mode=[2])
                        for kblock_idx in cutlass.range(num_kblocks, unroll_full=True):
                            kblock_coord = (None, None, kblock_idx, cs)
                            tiled_mma.set(tcgen05.Field.SFA, tCtSFA[(None, None, kblock_idx)].iterator)
                            tiled_mma.set(tcgen05.Field.SFB, tCtSFB_mma[(None, None, kblock_idx)].iterator)
                            cute.gemm(tiled_mma, tCtAcc, tCrA[kblock_coord], tCrB[kblock_coord], tCtAcc)
                            if cutlass.const_expr(self.dual):
                                tiled_mma.set(tcgen05.Field.SFB, tCtSFB2_mma[(None, None, kblock_idx)].iterator)
                                cute.gemm(tiled_mma, tCtAcc2, tCrA[kblock_coord], tCrB2[kblock_coord], tCtAcc2)
                            tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                        ab_pipeline.consumer_release(ab_consumer_state)
                    ab_consumer_state.advance()
                    peek_ab_full_status = cutlass.Boolean(1)
                    if ab_consumer_state.count < k_tile_cnt:
                        if is_leader_cta:
                            peek_ab_full_status = ab_pipeline.consumer_try_wait(ab_consumer_state)

                if is_leader_cta:
                    acc_pipeline.producer_commit(acc_producer_state)
                acc_producer_state.advance()
                tile_sched.advance_to_next_work()
                work_tile = tile_sched.get_current_work()
            acc_pipeline.producer_tail(acc_producer_state)

        #
        # Epilogue warps: tensor memory -> registers -> (alpha, SiLU·up) -> fp16 -> global memory.
        #
        if warp_idx < self.mma_warp_id:
            if cutlass.const_expr(self.tma_store):
                tensormap_manager.init_tensormap_from_atom(
                    tma_atom_c, tmap_smem_ptrs[self.tm_c], self.epilog_warp_id[0])
            tmem.allocate(self.num_tmem_alloc_cols)
            tmem.wait_for_alloc()
            acc_tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
            tCtAcc_base = cute.make_tensor(acc_tmem_ptr, tCtAcc_fake.layout)

            tile_sched = utils.StaticPersistentTileScheduler.create(tile_sched_params, cute.arch.block_idx(), grid_dim)
            group_helper = utils.GroupedGemmTileSchedulerHelper(
                group_count, tile_sched_params, self.cluster_tile_shape_mnk, utils.create_initial_search_state())
            work_tile = tile_sched.initial_work_tile_info()
            acc_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_acc_stage)
            if cutlass.const_expr(self.tma_store):
                self._tma_store_epilogue_loop(
                    tidx, warp_idx, tCtAcc_base, thr_mma, tma_atom_c, mC_mnl, c_smem_layout_staged, storage,
                    tensormap_manager, tmap_gmem[self.tm_c], tmap_smem_ptrs[self.tm_c], tile_sched, group_helper,
                    work_tile, acc_pipeline, acc_consumer_state, problem_sizes, addresses, alphas)
            else:
                tCcC = thr_mma.partition_C(cute.make_identity_tensor(cute.slice_(self.mma_tiler, (None, None, 0))))
                while work_tile.is_valid_tile:
                    info = group_helper.delinearize_z(work_tile.tile_idx, problem_sizes)
                    g = info.group_idx
                    m = info.problem_shape_m
                    n = info.problem_shape_n
                    mC = self._group_output(g, m, n, addresses)
                    gC_mnl = cute.local_tile(mC, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
                    tCgC = thr_mma.partition_C(gC_mnl)
                    coord = (info.cta_tile_idx_m // cute.size(tiled_mma.thr_id.shape), info.cta_tile_idx_n, 0)
                    self._simt_epilogue(tidx, tCtAcc_base, tCgC, tCcC, acc_pipeline, acc_consumer_state, coord,
                                        m, n, alphas[(g, 0)], alphas[(g, 1)])
                    acc_consumer_state.advance()
                    tile_sched.advance_to_next_work()
                    work_tile = tile_sched.get_current_work()

            tmem.relinquish_alloc_permit()
            self.epilog_sync_barrier.arrive_and_wait()
            tmem.free(acc_tmem_ptr)

    @cute.jit
    def _tma_store_epilogue_loop(self, tidx: cutlass.Int32, warp_idx: cutlass.Int32, tCtAcc_base: cute.Tensor,
                                 thr_mma, tma_atom_c: cute.CopyAtom, mC_mnl: cute.Tensor, c_smem_layout_staged,
                                 storage, tensormap_manager, tmap_c_gmem, tmap_c_smem, tile_sched, group_helper,
                                 work_tile, acc_pipeline, acc_consumer_state, problem_sizes: cute.Tensor,
                                 addresses: cute.Tensor, alphas: cute.Tensor):
        """NVIDIA's epilogue: sub-tiles through shared memory, TMA-stored with this group's descriptor."""
        # The host's epilogue tile is an MLIR value of the host region; rebuild it on the device.
        epi_tile = sm100_utils.compute_epilogue_tile_shape(
            self.cta_tile_shape_mnk, self.use_2cta_instrs, self.c_layout, self.c_dtype)
        sC = storage.sC.get_tensor(c_smem_layout_staged.outer, swizzle=c_smem_layout_staged.inner)
        gC_mnl = cute.local_tile(mC_mnl, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
        tCgC = thr_mma.partition_C(gC_mnl)
        tiled_copy_t2r, thr_copy_t2r, tTR_tAcc_base, tTR_rAcc = self._epilog_t2r(tidx, tCtAcc_base, tCgC, epi_tile)
        tTR_rAcc2 = cute.make_rmem_tensor(tTR_rAcc.shape, self.acc_dtype)
        tTR_rC = cute.make_rmem_tensor(tTR_rAcc.shape, self.c_dtype)
        copy_atom_r2s = sm100_utils.get_smem_store_op(self.c_layout, self.c_dtype, self.acc_dtype, tiled_copy_t2r)
        tiled_copy_r2s = cute.make_tiled_copy_D(copy_atom_r2s, tiled_copy_t2r)
        thr_copy_r2s = tiled_copy_r2s.get_slice(tidx)
        tRS_sC = thr_copy_r2s.partition_D(sC)
        tRS_rC = tiled_copy_r2s.retile(tTR_rC)
        gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, None, None, None)], epi_tile)
        bSG_sC, bSG_gC_partitioned = cpasync.tma_partition(
            tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC_epi, 0, 2))
        c_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=self.num_c_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32 * len(self.epilog_warp_id)))
        last_group_idx = cutlass.Int32(-1)
        while work_tile.is_valid_tile:
            info = group_helper.delinearize_z(work_tile.tile_idx, problem_sizes)
            g = info.group_idx
            is_group_changed = g != last_group_idx
            if is_group_changed:
                real_c = self._group_output(g, info.problem_shape_m, info.problem_shape_n, addresses)
                tensormap_manager.update_tensormap(
                    (real_c,), (tma_atom_c,), (tmap_c_gmem,), self.epilog_warp_id[0], (tmap_c_smem,))
            alpha1 = alphas[(g, 0)]
            alpha2 = alphas[(g, 1)]
            mma_tile_coord_mnl = (info.cta_tile_idx_m // cute.size(thr_mma.thr_id.shape), info.cta_tile_idx_n, 0)
            bSG_gC = bSG_gC_partitioned[(None, None, None, *mma_tile_coord_mnl)]
            bSG_gC = cute.group_modes(bSG_gC, 1, cute.rank(bSG_gC))
            stage = acc_consumer_state.index
            tTR_tAcc = tTR_tAcc_base[(None, None, None, None, None, stage * self.n_prod)]
            tTR_tAcc = cute.group_modes(tTR_tAcc, 3, cute.rank(tTR_tAcc))
            tTR_tAcc2 = tTR_tAcc_base[(None, None, None, None, None, stage * self.n_prod + self.n_prod - 1)]
            tTR_tAcc2 = cute.group_modes(tTR_tAcc2, 3, cute.rank(tTR_tAcc2))

            acc_pipeline.consumer_wait(acc_consumer_state)
            if is_group_changed:
                if warp_idx == self.epilog_warp_id[0]:
                    tensormap_manager.fence_tensormap_update(tmap_c_gmem)

            subtile_cnt = cute.size(tTR_tAcc.shape, mode=[3])
            num_prev_subtiles = tile_sched.num_tiles_executed * subtile_cnt
            for subtile_idx in range(subtile_cnt):
                cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, subtile_idx)], tTR_rAcc)
                vals = [tiled_copy_r2s.retile(tTR_rAcc).load()]
                if cutlass.const_expr(self.dual):
                    cute.copy(tiled_copy_t2r, tTR_tAcc2[(None, None, None, subtile_idx)], tTR_rAcc2)
                    vals.append(tiled_copy_r2s.retile(tTR_rAcc2).load())
                tRS_rC.store(self._epilogue_values(vals, alpha1, alpha2).to(self.c_dtype))
                c_buffer = (num_prev_subtiles + subtile_idx) % self.num_c_stage
                cute.copy(tiled_copy_r2s, tRS_rC, tRS_sC[(None, None, None, c_buffer)])
                cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)
                self.epilog_sync_barrier.arrive_and_wait()
                if warp_idx == self.epilog_warp_id[0]:
                    cute.copy(tma_atom_c, bSG_sC[(None, c_buffer)], bSG_gC[(None, subtile_idx)],
                              tma_desc_ptr=tensormap_manager.get_tensormap_ptr(tmap_c_gmem, cute.AddressSpace.generic))
                    c_pipeline.producer_commit()
                    c_pipeline.producer_acquire()
                self.epilog_sync_barrier.arrive_and_wait()
            cute.arch.fence_view_async_tmem_load()
            with cute.arch.elect_one():
                acc_pipeline.consumer_release(acc_consumer_state)
            acc_consumer_state.advance()
            tile_sched.advance_to_next_work()
            work_tile = tile_sched.get_current_work()
            last_group_idx = g
        c_pipeline.producer_tail()
