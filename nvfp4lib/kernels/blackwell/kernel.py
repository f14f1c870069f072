"""The sm_100a NVFP4 grouped GEMM kernel class (compiled for sm_100a, not run): the study's form (warp 0 loads and
issues the MMAs, a SIMT epilogue) and, from :mod:`.warp_specialized`, the warp-specialized form."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
import torch
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from .plan import (
    _ALIGN,
    ADDR_A,
    ADDR_B,
    ADDR_B2,
    ADDR_C,
    ADDR_SFA,
    ADDR_SFB,
    ADDR_SFB2,
    BYTES_PER_TENSORMAP,
    C_STAGES,
    NUM_ADDR,
    SF_VEC,
    TMEM_ALLOC_COLUMNS,
    BlackwellConfig,
    _CapturedStderr,
    _clean,
    _round_up,
    epilogue_columns,
    mma_shape,
    num_products,
    num_tensormaps,
    threads_per_cta,
    validate,
)
from .warp_specialized import WarpSpecialized


def cutlass_scale_offsets(rows: int, k: int) -> torch.Tensor:
    """Element offsets [rows, k // 16] of each scale in CUTLASS's scale layout for a (rows, k) operand.

    Evaluates ``blockscaled_layout.tile_atom_to_shape_SF`` -- the layout the kernel's TMA descriptors
    are built from -- while tracing (nothing runs on a device), so tests can check it against
    :func:`nvfp4lib.formats.swizzle_scales`.
    """
    found = {}

    @cute.jit
    def probe(r: cutlass.Constexpr, kk: cutlass.Constexpr):
        layout = blockscaled_utils.tile_atom_to_shape_SF((r, kk, 1), SF_VEC)
        # A comprehension is plain Python to the DSL's preprocessor: evaluated while tracing.
        found["offsets"] = [[layout((i, j * SF_VEC, 0)) for j in range(kk // SF_VEC)] for i in range(r)]

    try:
        with _CapturedStderr():
            cute.compile(probe, rows, k)
    except Exception as e:  # no driver to load the (empty) host module: expected, the layout is traced
        if "offsets" not in found:
            raise RuntimeError(f"tracing tile_atom_to_shape_SF({rows}, {k}) failed: {_clean(e)}") from e
    return torch.tensor(found["offsets"], dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
class Sm100NvFp4GroupedGemm(WarpSpecialized):
    """NVFP4 block-scaled grouped GEMM for sm_100a (compiled for sm_100a, not run).

    ``__init__`` takes a validated :class:`BlackwellConfig`; ``_setup_attributes`` derives the MMA,
    layouts and shared-memory plan (inside the trace); ``__call__`` is the host side (TMA atoms,
    grid, launch); ``kernel_study`` and ``kernel_ws`` are the two device structures.

    While tracing, the kernel records what CuTe computed (``self.facts``: shared-memory struct
    size, tensor-memory column offsets) so that :func:`compile_report` can check them against the
    Python plans :func:`storage_plan` and :func:`tmem_columns`.
    """

    bytes_per_tensormap = BYTES_PER_TENSORMAP
    # B's scale factors are loaded in 128-row tiles (the scale atom's rows). False reproduces the
    # study's round-2 edit (only mma_tiler changed), which the compiler rejects for tile_n=64.
    pad_sfb_tile = True

    def __init__(self, cfg: BlackwellConfig):
        self.cfg = validate(cfg)
        self.dual = cfg.dual
        self.n_prod = num_products(cfg)
        self.use_2cta_instrs = cfg.use_2cta
        self.cluster_shape_mn = (cfg.cluster_m, cfg.cluster_n)
        self.mma_inst_shape_mn = mma_shape(cfg)[:2]
        self.cta_group = tcgen05.CtaGroup.TWO if cfg.use_2cta else tcgen05.CtaGroup.ONE
        self.num_ab_stage = cfg.ab_stages
        self.num_acc_stage = cfg.acc_stages
        self.num_c_stage = C_STAGES
        self.warp_specialized = cfg.warp_spec != "none"
        self.tma_store = cfg.epilogue == "tma"
        self.threads_per_cta = threads_per_cta(cfg)
        self.epilog_warp_id = (0, 1, 2, 3)
        self.mma_warp_id = 4 if self.warp_specialized else 0
        self.tma_warp_id = 5 if self.warp_specialized else 0
        self.num_tmem_alloc_cols = TMEM_ALLOC_COLUMNS
        self.epi_cols = epilogue_columns(cfg)
        # Tensormap slots in each CTA's workspace row.
        self.num_tensormaps = num_tensormaps(cfg)
        self.tm_a, self.tm_b, self.tm_sfa, self.tm_sfb = 0, 1, 2, 3
        self.tm_b2, self.tm_sfb2 = (4, 5) if self.dual else (1, 3)
        self.tm_c = self.num_tensormaps - 1
        self.epilog_sync_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=32 * len(self.epilog_warp_id))
        self.tmem_alloc_barrier = pipeline.NamedBarrier(
            barrier_id=2,
            num_threads=32 * (len(self.epilog_warp_id) + 1) if self.warp_specialized else self.threads_per_cta,
        )
        # The MMA warp writes the initial descriptors to shared memory; the TMA warp then edits them.
        self.tensormap_init_barrier = pipeline.NamedBarrier(barrier_id=3, num_threads=64)
        self.a_dtype = cutlass.Float4E2M1FN
        self.b_dtype = cutlass.Float4E2M1FN
        self.sf_dtype = cutlass.Float8E4M3FN
        self.c_dtype = cutlass.Float16
        self.acc_dtype = cutlass.Float32
        self.sf_vec_size = SF_VEC
        self.a_major_mode = tcgen05.OperandMajorMode.K
        self.b_major_mode = tcgen05.OperandMajorMode.K
        self.c_layout = utils.LayoutEnum.ROW_MAJOR
        self.facts: dict = {}

    def __str__(self) -> str:
        # CuTe DSL names the compiled function after str(self): one name per config, or a second
        # config compiled in the same process is looked up under the first one's name.
        c = self.cfg
        return (f"Sm100NvFp4_{c.name}_{'dual' if c.dual else 'single'}_{c.tile_m}x{c.tile_n}x{c.tile_k}"
                f"_s{c.ab_stages}a{c.acc_stages}_{c.epilogue}_{c.warp_spec}_c{c.cluster_m}x{c.cluster_n}"
                f"{'_2cta' if c.use_2cta else ''}")

    # ---- derived attributes (inside the trace) ----------------------------------------------
    def _setup_attributes(self):
        self.mma_inst_shape_mn_sfb = (
            self.mma_inst_shape_mn[0] // (2 if self.use_2cta_instrs else 1),
            _round_up(self.mma_inst_shape_mn[1], 128) if self.pad_sfb_tile else self.mma_inst_shape_mn[1],
        )
        tiled_mma, tiled_mma_sfb = self._make_tiled_mmas()
        self.mma_tiler = (*self.mma_inst_shape_mn, self.cfg.tile_k)
        self.mma_tiler_sfb = (*self.mma_inst_shape_mn_sfb, self.cfg.tile_k)
        atom_thr = cute.size(tiled_mma.thr_id.shape)
        self.cta_tile_shape_mnk = (self.mma_tiler[0] // atom_thr, self.mma_tiler[1], self.mma_tiler[2])
        self.cluster_tile_shape_mnk = tuple(
            x * y for x, y in zip(self.cta_tile_shape_mnk, (*self.cluster_shape_mn, 1)))
        self.cluster_layout_vmnk = cute.tiled_divide(
            cute.make_layout((*self.cluster_shape_mn, 1)), (tiled_mma.thr_id.shape,))
        self.cluster_layout_sfb_vmnk = cute.tiled_divide(
            cute.make_layout((*self.cluster_shape_mn, 1)), (tiled_mma_sfb.thr_id.shape,))
        self.num_mcast_ctas_a = cute.size(self.cluster_layout_vmnk.shape[2])
        self.num_mcast_ctas_b = cute.size(self.cluster_layout_vmnk.shape[1])
        self.is_a_mcast = self.num_mcast_ctas_a > 1
        self.is_b_mcast = self.num_mcast_ctas_b > 1
        if self.tma_store:
            self.epi_tile = sm100_utils.compute_epilogue_tile_shape(
                self.cta_tile_shape_mnk, self.use_2cta_instrs, self.c_layout, self.c_dtype)
        else:
            self.epi_tile = (self.cta_tile_shape_mnk[0], self.epi_cols)
        stages = self.num_ab_stage
        self.a_smem_layout_staged = sm100_utils.make_smem_layout_a(tiled_mma, self.mma_tiler, self.a_dtype, stages)
        self.b_smem_layout_staged = sm100_utils.make_smem_layout_b(tiled_mma, self.mma_tiler, self.b_dtype, stages)
        self.sfa_smem_layout_staged = blockscaled_utils.make_smem_layout_sfa(
            tiled_mma, self.mma_tiler, self.sf_vec_size, stages)
        self.sfb_smem_layout_staged = blockscaled_utils.make_smem_layout_sfb(
            tiled_mma, self.mma_tiler, self.sf_vec_size, stages)
        self.c_smem_layout_staged = None
        if self.tma_store:
            self.c_smem_layout_staged = sm100_utils.make_smem_layout_epi(
                self.c_dtype, self.c_layout, self.epi_tile, self.num_c_stage)
        return tiled_mma, tiled_mma_sfb

    def _make_tiled_mmas(self):
        tiled_mma = sm100_utils.make_blockscaled_trivial_tiled_mma(
            self.a_dtype, self.a_major_mode, self.b_major_mode, self.sf_dtype, self.sf_vec_size,
            self.cta_group, self.mma_inst_shape_mn)
        # The scale-factor tile of B is loaded for 128-row (rounded) N tiles, one CTA at a time.
        tiled_mma_sfb = sm100_utils.make_blockscaled_trivial_tiled_mma(
            self.a_dtype, self.a_major_mode, self.b_major_mode, self.sf_dtype, self.sf_vec_size,
            tcgen05.CtaGroup.ONE, self.mma_inst_shape_mn_sfb)
        return tiled_mma, tiled_mma_sfb

    def _make_shared_storage(self):
        """One struct: descriptors, barriers, TMEM address, epilogue buffer, then the operand stages."""
        n_tmap_i64 = self.num_tensormaps * self.bytes_per_tensormap // 8
        ab, acc = self.num_ab_stage, self.num_acc_stage
        align = _ALIGN
        fields = {
            "tensormap_buffer": cute.struct.MemRange[cutlass.Int64, n_tmap_i64],
            "ab_full_mbar_ptr": cute.struct.MemRange[cutlass.Int64, ab],
            "ab_empty_mbar_ptr": cute.struct.MemRange[cutlass.Int64, ab],
            "acc_full_mbar_ptr": cute.struct.MemRange[cutlass.Int64, acc],
            "acc_empty_mbar_ptr": cute.struct.MemRange[cutlass.Int64, acc],
            "tmem_dealloc_mbar_ptr": cutlass.Int64,
            "tmem_holding_buf": cutlass.Int32,
        }
        if self.tma_store:
            fields["sC"] = cute.struct.Align[cute.struct.MemRange[
                self.c_dtype, cute.cosize(self.c_smem_layout_staged.outer)], align]
        fields["sA"] = cute.struct.Align[cute.struct.MemRange[
            self.a_dtype, cute.cosize(self.a_smem_layout_staged.outer)], align]
        fields["sB"] = cute.struct.Align[cute.struct.MemRange[
            self.b_dtype, cute.cosize(self.b_smem_layout_staged.outer)], align]
        fields["sSFA"] = cute.struct.Align[cute.struct.MemRange[
            self.sf_dtype, cute.cosize(self.sfa_smem_layout_staged)], align]
        fields["sSFB"] = cute.struct.Align[cute.struct.MemRange[
            self.sf_dtype, cute.cosize(self.sfb_smem_layout_staged)], align]
        if self.dual:
            fields["sB2"] = cute.struct.Align[cute.struct.MemRange[
                self.b_dtype, cute.cosize(self.b_smem_layout_staged.outer)], align]
            fields["sSFB2"] = cute.struct.Align[cute.struct.MemRange[
                self.sf_dtype, cute.cosize(self.sfb_smem_layout_staged)], align]
        storage = cute.struct(type("SharedStorage", (), {"__annotations__": fields}))
        self.facts["smem_struct_bytes"] = storage.size_in_bytes()
        return storage

    # ---- host side ----------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        ptr_a: cute.Pointer,
        ptr_b: cute.Pointer,
        ptr_c: cute.Pointer,
        ptr_sfa: cute.Pointer,
        ptr_sfb: cute.Pointer,
        init_m: cutlass.Int32,
        init_n: cutlass.Int32,
        init_k: cutlass.Int32,
        ptr_sizes: cute.Pointer,
        ptr_addresses: cute.Pointer,
        ptr_alphas: cute.Pointer,
        ptr_tensormaps: cute.Pointer,
        tensormap_slots: cutlass.Int32,
        total_clusters: cutlass.Int32,
        group_count: cutlass.Constexpr[int],
        max_active_clusters: cutlass.Constexpr[int],
        stream: cuda.CUstream,
    ):
        """Build the TMA atoms from one group's operands (the device re-points them per group),
        wrap the device tables, and launch one grid for all groups."""
        tiled_mma, tiled_mma_sfb = self._setup_attributes()
        # Operands of the group the host descriptors are made from (K-major A/B, row-major C).
        k32 = cute.assume(init_k, divby=32)
        n8 = cute.assume(init_n, divby=8)
        a = cute.make_tensor(ptr_a, cute.make_layout((init_m, k32, 1), stride=(k32, 1, init_m * k32)))
        b = cute.make_tensor(ptr_b, cute.make_layout((init_n, k32, 1), stride=(k32, 1, init_n * k32)))
        c = cute.make_tensor(ptr_c, cute.make_layout((init_m, n8, 1), stride=(n8, 1, init_m * n8)))
        sfa = cute.make_tensor(ptr_sfa, blockscaled_utils.tile_atom_to_shape_SF(a.shape, self.sf_vec_size))
        sfb = cute.make_tensor(ptr_sfb, blockscaled_utils.tile_atom_to_shape_SF(b.shape, self.sf_vec_size))
        sizes = cute.make_tensor(ptr_sizes, cute.make_layout((group_count, 4), stride=(4, 1)))
        addresses = cute.make_tensor(ptr_addresses, cute.make_layout((group_count, NUM_ADDR), stride=(NUM_ADDR, 1)))
        alphas = cute.make_tensor(ptr_alphas, cute.make_layout((group_count, 2), stride=(2, 1)))
        tensormaps = cute.make_tensor(
            ptr_tensormaps,
            cute.make_layout((tensormap_slots, self.num_tensormaps, self.bytes_per_tensormap // 8),
                             stride=(self.num_tensormaps * self.bytes_per_tensormap // 8,
                                     self.bytes_per_tensormap // 8, 1)))

        atom_thr_size = cute.size(tiled_mma.thr_id.shape)
        cluster_shape = self.cluster_layout_vmnk.shape
        a_smem_layout = cute.slice_(self.a_smem_layout_staged, (None, None, None, 0))
        b_smem_layout = cute.slice_(self.b_smem_layout_staged, (None, None, None, 0))
        sfa_smem_layout = cute.slice_(self.sfa_smem_layout_staged, (None, None, None, 0))
        sfb_smem_layout = cute.slice_(self.sfb_smem_layout_staged, (None, None, None, 0))
        a_op = sm100_utils.cluster_shape_to_tma_atom_A(self.cluster_shape_mn, tiled_mma.thr_id)
        b_op = sm100_utils.cluster_shape_to_tma_atom_B(self.cluster_shape_mn, tiled_mma.thr_id)
        sfb_op = sm100_utils.cluster_shape_to_tma_atom_SFB(self.cluster_shape_mn, tiled_mma.thr_id)
        tma_atom_a, tma_tensor_a = cute.nvgpu.make_tiled_tma_atom_A(
            a_op, a, a_smem_layout, self.mma_tiler, tiled_mma, cluster_shape)
        tma_atom_b, tma_tensor_b = cute.nvgpu.make_tiled_tma_atom_B(
            b_op, b, b_smem_layout, self.mma_tiler, tiled_mma, cluster_shape)
        tma_atom_sfa, tma_tensor_sfa = cute.nvgpu.make_tiled_tma_atom_A(
            a_op, sfa, sfa_smem_layout, self.mma_tiler, tiled_mma, cluster_shape, internal_type=cutlass.Int16)
        tma_atom_sfb, tma_tensor_sfb = cute.nvgpu.make_tiled_tma_atom_B(
            sfb_op, sfb, sfb_smem_layout, self.mma_tiler_sfb, tiled_mma_sfb,
            self.cluster_layout_sfb_vmnk.shape, internal_type=cutlass.Int16)
        # The up projection's descriptors start as copies of B's; the device points them at B2.
        tma_atom_b2, tma_atom_sfb2 = tma_atom_b, tma_atom_sfb
        if cutlass.const_expr(self.dual):
            tma_atom_b2, _ = cute.nvgpu.make_tiled_tma_atom_B(
                b_op, b, b_smem_layout, self.mma_tiler, tiled_mma, cluster_shape)
            tma_atom_sfb2, _ = cute.nvgpu.make_tiled_tma_atom_B(
                sfb_op, sfb, sfb_smem_layout, self.mma_tiler_sfb, tiled_mma_sfb,
                self.cluster_layout_sfb_vmnk.shape, internal_type=cutlass.Int16)
        per_b = cute.size_in_bytes(self.b_dtype, b_smem_layout) + cute.size_in_bytes(self.sf_dtype, sfb_smem_layout)
        self.num_tma_load_bytes = (
            cute.size_in_bytes(self.a_dtype, a_smem_layout) + cute.size_in_bytes(self.sf_dtype, sfa_smem_layout)
            + self.n_prod * per_b) * atom_thr_size
        self.facts["tma_bytes_per_stage"] = self.num_tma_load_bytes

        tma_atom_c, tma_tensor_c = tma_atom_a, c
        if cutlass.const_expr(self.tma_store):
            epi_smem_layout = cute.slice_(self.c_smem_layout_staged, (None, None, 0))
            tma_atom_c, tma_tensor_c = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), c, epi_smem_layout, self.epi_tile)

        tile_sched_params = utils.PersistentTileSchedulerParams(
            (*self.cluster_shape_mn, total_clusters), (*self.cluster_shape_mn, 1))
        if cutlass.const_expr(self.warp_specialized):
            grid = utils.StaticPersistentTileScheduler.get_grid_shape(tile_sched_params, max_active_clusters)
        else:
            grid = (1, 1, total_clusters)

        self.shared_storage = self._make_shared_storage()
        kernel = self.kernel_ws if cutlass.const_expr(self.warp_specialized) else self.kernel_study
        kernel(
            tiled_mma, tiled_mma_sfb,
            tma_atom_a, tma_tensor_a, tma_atom_b, tma_tensor_b,
            tma_atom_sfa, tma_tensor_sfa, tma_atom_sfb, tma_tensor_sfb,
            tma_atom_b2, tma_atom_sfb2, tma_atom_c, tma_tensor_c,
            self.cluster_layout_vmnk, self.cluster_layout_sfb_vmnk,
            self.a_smem_layout_staged, self.b_smem_layout_staged,
            self.sfa_smem_layout_staged, self.sfb_smem_layout_staged,
            self.c_smem_layout_staged if self.tma_store else self.sfa_smem_layout_staged,
            tile_sched_params, group_count, sizes, addresses, alphas, tensormaps,
        ).launch(
            grid=grid,
            block=[self.threads_per_cta, 1, 1],
            cluster=(*self.cluster_shape_mn, 1),
            smem=self.shared_storage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )
        return

    # ---- device-side helpers --------------------------------------------------------------------
    @cute.jit
    def _group_operands(self, group_idx: cutlass.Int32, m: cutlass.Int32, n: cutlass.Int32, k: cutlass.Int32,
                        addresses: cute.Tensor):
        """The real A, B, SFA, SFB (B2, SFB2) global tensors of one group, for descriptor updates."""
        c1 = cutlass.Int32(1)
        c0 = cutlass.Int32(0)

        def gmem(dtype, col):
            return cute.make_ptr(dtype, addresses[(group_idx, col)], cute.AddressSpace.gmem, assumed_align=16)

        a = cute.make_tensor(gmem(self.a_dtype, ADDR_A), cute.make_layout((m, k, c1), stride=(k, c1, c0)))
        b = cute.make_tensor(gmem(self.b_dtype, ADDR_B), cute.make_layout((n, k, c1), stride=(k, c1, c0)))
        sfa = cute.make_tensor(gmem(self.sf_dtype, ADDR_SFA),
                               blockscaled_utils.tile_atom_to_shape_SF((m, k, c1), self.sf_vec_size))
        sfb = cute.make_tensor(gmem(self.sf_dtype, ADDR_SFB),
                               blockscaled_utils.tile_atom_to_shape_SF((n, k, c1), self.sf_vec_size))
        b2 = cute.make_tensor(gmem(self.b_dtype, ADDR_B2), cute.make_layout((n, k, c1), stride=(k, c1, c0)))
        sfb2 = cute.make_tensor(gmem(self.sf_dtype, ADDR_SFB2),
                                blockscaled_utils.tile_atom_to_shape_SF((n, k, c1), self.sf_vec_size))
        return a, b, sfa, sfb, b2, sfb2

    @cute.jit
    def _group_output(self, group_idx: cutlass.Int32, m: cutlass.Int32, n: cutlass.Int32, addresses: cute.Tensor):
        c1 = cutlass.Int32(1)
        c0 = cutlass.Int32(0)
        ptr = cute.make_ptr(self.c_dtype, addresses[(group_idx, ADDR_C)], cute.AddressSpace.gmem, assumed_align=16)
        return cute.make_tensor(ptr, cute.make_layout((m, n, c1), stride=(n, c1, c0)))

    def _load_descriptors(self, tensormap_manager, atoms, smem_ptrs, warp_id):
        for atom, ptr in zip(atoms, smem_ptrs):
            tensormap_manager.init_tensormap_from_atom(atom, ptr, warp_id)

    def _s2t_copy_and_partition(self, sSF: cute.Tensor, tSF: cute.Tensor):
        """tcgen05.cp of one k-tile of scale factors from shared to tensor memory."""
        tCsSF_compact = cute.filter_zeros(sSF)
        tCtSF_compact = cute.filter_zeros(tSF)
        copy_atom_s2t = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(self.cta_group), self.sf_dtype)
        tiled_copy_s2t = tcgen05.make_s2t_copy(copy_atom_s2t, tCtSF_compact)
        thr_copy_s2t = tiled_copy_s2t.get_slice(0)
        tCsSF_compact_s2t_ = thr_copy_s2t.partition_S(tCsSF_compact)
        tCsSF_compact_s2t = tcgen05.get_s2t_smem_desc_tensor(tiled_copy_s2t, tCsSF_compact_s2t_)
        tCtSF_compact_s2t = thr_copy_s2t.partition_D(tCtSF_compact)
        return tiled_copy_s2t, tCsSF_compact_s2t, tCtSF_compact_s2t

    def _tmem_tensors(self, tiled_mma, acc_tmem_ptr, tCtAcc_fake, sfa_smem_layout_staged, sfb_smem_layout_staged):
        """Accumulators (all stages and products), then SFA, SFB (and SFB2) columns of one k-tile."""
        tCtAcc_base = cute.make_tensor(acc_tmem_ptr, tCtAcc_fake.layout)
        acc_cols = tcgen05.find_tmem_tensor_col_offset(tCtAcc_base)
        tCtSFA_layout = blockscaled_utils.make_tmem_layout_sfa(
            tiled_mma, self.mma_tiler, self.sf_vec_size, cute.slice_(sfa_smem_layout_staged, (None, None, None, 0)))
        tCtSFA = cute.make_tensor(cute.recast_ptr(acc_tmem_ptr + acc_cols, dtype=self.sf_dtype), tCtSFA_layout)
        sfa_cols = tcgen05.find_tmem_tensor_col_offset(tCtSFA)
        tCtSFB_layout = blockscaled_utils.make_tmem_layout_sfb(
            tiled_mma, self.mma_tiler, self.sf_vec_size, cute.slice_(sfb_smem_layout_staged, (None, None, None, 0)))
        sfb_col0 = acc_cols + sfa_cols
        tCtSFB = cute.make_tensor(cute.recast_ptr(acc_tmem_ptr + sfb_col0, dtype=self.sf_dtype), tCtSFB_layout)
        sfb_cols = tcgen05.find_tmem_tensor_col_offset(tCtSFB)
        sfb2_col0 = sfb_col0 + sfb_cols
        tCtSFB2 = cute.make_tensor(cute.recast_ptr(acc_tmem_ptr + sfb2_col0, dtype=self.sf_dtype), tCtSFB_layout)
        self.facts["tmem_acc_cols"] = acc_cols
        self.facts["tmem_sf_cols"] = sfa_cols + self.n_prod * sfb_cols
        return tCtAcc_base, tCtSFA, (tCtSFB, tCtSFB2), (sfb_col0, sfb2_col0), tCtSFB_layout

    def _sfb_for_tile(self, acc_tmem_ptr, sfb_col0, tCtSFB, tCtSFB_layout, n_tile_idx):
        """With tile_n=64 a 128-row scale tile serves two N tiles: odd tiles start 2 columns in."""
        if cutlass.const_expr(self.cta_tile_shape_mnk[1] == 64 and self.pad_sfb_tile):
            offset = cutlass.Int32((n_tile_idx % 2) * 2)
            return cute.make_tensor(
                cute.recast_ptr(acc_tmem_ptr + sfb_col0 + offset, dtype=self.sf_dtype), tCtSFB_layout)
        return tCtSFB

    def _sfb_n_slice(self, n_tile_idx):
        if cutlass.const_expr(self.cta_tile_shape_mnk[1] == 64 and self.pad_sfb_tile):
            return n_tile_idx // 2
        return n_tile_idx

    def _epilog_t2r(self, tidx, tCtAcc_base, tCgC_or_coord, epi_tile):
        """tcgen05.ld partition of the accumulators: (T2R, T2R_M, T2R_N, EPI_M, EPI_N, STAGE*PRODUCT)."""
        copy_atom_t2r = sm100_utils.get_tmem_load_op(
            self.cta_tile_shape_mnk, self.c_layout, self.c_dtype, self.acc_dtype, epi_tile, self.use_2cta_instrs)
        tAcc_epi = cute.flat_divide(tCtAcc_base[((None, None), 0, 0, None)], epi_tile)
        tiled_copy_t2r = tcgen05.make_tmem_copy(copy_atom_t2r, tAcc_epi[(None, None, 0, 0, 0)])
        thr_copy_t2r = tiled_copy_t2r.get_slice(tidx)
        tTR_tAcc = thr_copy_t2r.partition_S(tAcc_epi)
        gC_epi = cute.flat_divide(tCgC_or_coord[((None, None), 0, 0, None, None, None)], epi_tile)
        tTR_gC = thr_copy_t2r.partition_D(gC_epi)
        tTR_rAcc = cute.make_rmem_tensor(tTR_gC[(None, None, None, 0, 0, 0, 0, 0)].shape, self.acc_dtype)
        return tiled_copy_t2r, thr_copy_t2r, tTR_tAcc, tTR_rAcc

    def _epilogue_values(self, acc_vecs, alpha1, alpha2):
        """fp32 epilogue math: alpha * acc, or silu(alpha1 * acc1) * (alpha2 * acc2)."""
        if cutlass.const_expr(self.dual):
            gate = acc_vecs[0] * alpha1
            up = acc_vecs[1] * alpha2
            return gate * up / (cute.math.exp(-gate, fastmath=True) + 1.0)
        return acc_vecs[0] * alpha1

    @cute.jit
    def _smem_operands(self, storage, a_layout, b_layout, sfa_layout, sfb_layout):
        """The staged shared-memory operands: A, B, their scale factors, and (dual) B2 and its scale factors (B's
        own where there is no dual)."""
        sA = storage.sA.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        sB = storage.sB.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        sSFA = storage.sSFA.get_tensor(sfa_layout)
        sSFB = storage.sSFB.get_tensor(sfb_layout)
        sB2, sSFB2 = sB, sSFB
        if cutlass.const_expr(self.dual):
            sB2 = storage.sB2.get_tensor(b_layout.outer, swizzle=b_layout.inner)
            sSFB2 = storage.sSFB2.get_tensor(sfb_layout)
        return sA, sB, sSFA, sSFB, sB2, sSFB2

    @cute.jit
    def _gmem_operands(self, tiled_mma, tiled_mma_sfb, mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, v):
        """The MMA's view of the global operands ((bM, bK, RestM, RestK, RestL) etc. over the coordinate tensors of
        the TMA atoms) for MMA peer ``v`` (0 without 2-CTA instructions), and the thread MMAs."""
        gA_mkl = cute.local_tile(mA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gB_nkl = cute.local_tile(mB_nkl, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None))
        gSFA_mkl = cute.local_tile(mSFA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gSFB_nkl = cute.local_tile(mSFB_nkl, cute.slice_(self.mma_tiler_sfb, (0, None, None)), (None, None, None))
        thr_mma = tiled_mma.get_slice(v)
        thr_mma_sfb = tiled_mma_sfb.get_slice(v)
        return (thr_mma.partition_A(gA_mkl), thr_mma.partition_B(gB_nkl), thr_mma.partition_A(gSFA_mkl),
                thr_mma_sfb.partition_B(gSFB_nkl), thr_mma, thr_mma_sfb)

    # ---- device: the study's structure ----------------------------------------------------------
    @cute.kernel
    def kernel_study(
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
        c_smem_layout_staged: cute.Layout,
        tile_sched_params: utils.PersistentTileSchedulerParams,
        group_count: cutlass.Constexpr,
        problem_sizes: cute.Tensor,
        addresses: cute.Tensor,
        alphas: cute.Tensor,
        tensormaps: cute.Tensor,
    ):
        """One CTA per output tile, 128 threads; warp 0 rewrites descriptors, loads and multiplies;
        all four warps run the SIMT epilogue (the study's kernel)."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, bidz = cute.arch.block_idx()

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        tmap_smem = storage.tensormap_buffer.data_ptr()
        tmap_i64 = self.bytes_per_tensormap // 8

        ab_pipeline = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_full_mbar_ptr.data_ptr(),
            num_stages=self.num_ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            tx_count=self.num_tma_load_bytes,
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        acc_pipeline = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_full_mbar_ptr.data_ptr(),
            num_stages=self.num_acc_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, len(self.epilog_warp_id)),
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        tmem = utils.TmemAllocator(
            storage.tmem_holding_buf, barrier_for_retrieve=self.tmem_alloc_barrier, allocator_warp_id=0)
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        sA, sB, sSFA, sSFB, sB2, sSFB2 = self._smem_operands(
            storage, a_smem_layout_staged, b_smem_layout_staged, sfa_smem_layout_staged, sfb_smem_layout_staged)

        tCgA, tCgB, tCgSFA, tCgSFB, thr_mma, thr_mma_sfb = self._gmem_operands(
            tiled_mma, tiled_mma_sfb, mA_mkl, mB_nkl, mSFA_mkl, mSFB_nkl, 0)

        one = cute.make_layout(1)
        tAsA, tAgA = cpasync.tma_partition(tma_atom_a, 0, one, cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3))
        tBsB, tBgB = cpasync.tma_partition(tma_atom_b, 0, one, cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3))
        tBsB2, tBgB2 = cpasync.tma_partition(tma_atom_b2, 0, one, cute.group_modes(sB2, 0, 3),
                                             cute.group_modes(tCgB, 0, 3))
        tAsSFA, tAgSFA = cpasync.tma_partition(tma_atom_sfa, 0, one, cute.group_modes(sSFA, 0, 3),
                                               cute.group_modes(tCgSFA, 0, 3))
        tAsSFA = cute.filter_zeros(tAsSFA)
        tAgSFA = cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cpasync.tma_partition(tma_atom_sfb, 0, one, cute.group_modes(sSFB, 0, 3),
                                               cute.group_modes(tCgSFB, 0, 3))
        tBsSFB = cute.filter_zeros(tBsSFB)
        tBgSFB = cute.filter_zeros(tBgSFB)
        tBsSFB2, tBgSFB2 = cpasync.tma_partition(tma_atom_sfb2, 0, one, cute.group_modes(sSFB2, 0, 3),
                                                 cute.group_modes(tCgSFB, 0, 3))
        tBsSFB2 = cute.filter_zeros(tBsSFB2)
        tBgSFB2 = cute.filter_zeros(tBgSFB2)

        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        tCrB2 = tiled_mma.make_fragment_B(sB2)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        tCtAcc_fake = tiled_mma.make_fragment_C(cute.append(acc_shape, self.num_acc_stage * self.n_prod))

        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        # This CTA's tile: find its group from the device table of problem sizes.
        group_helper = utils.GroupedGemmTileSchedulerHelper(
            group_count, tile_sched_params, self.cluster_tile_shape_mnk, utils.create_initial_search_state())
        tile_info = group_helper.delinearize_z((bidx, bidy, bidz), problem_sizes)
        group_idx = tile_info.group_idx
        m = tile_info.problem_shape_m
        n = tile_info.problem_shape_n
        k = tile_info.problem_shape_k
        k_tile_cnt = tile_info.cta_tile_count_k
        mma_tile_m = tile_info.cta_tile_idx_m
        mma_tile_n = tile_info.cta_tile_idx_n

        tensormap_manager = utils.TensorMapManager(utils.TensorMapUpdateMode.SMEM, self.bytes_per_tensormap)
        tmap_gmem = [tensormap_manager.get_tensormap_ptr(tensormaps[(bidz, i, None)].iterator)
                     for i in range(self.num_tensormaps)]
        tmap_smem_ptrs = [tmap_smem + i * tmap_i64 for i in range(self.num_tensormaps)]
        load_atoms = [tma_atom_a, tma_atom_b, tma_atom_sfa, tma_atom_sfb]
        slots = [self.tm_a, self.tm_b, self.tm_sfa, self.tm_sfb]
        if cutlass.const_expr(self.dual):
            load_atoms += [tma_atom_b2, tma_atom_sfb2]
            slots += [self.tm_b2, self.tm_sfb2]

        if warp_idx == 0:
            # Point this CTA's descriptors at its group (in shared memory), publish them to its slot.
            self._load_descriptors(tensormap_manager, load_atoms, [tmap_smem_ptrs[s] for s in slots], 0)
            ga, gb, gsfa, gsfb, gb2, gsfb2 = self._group_operands(group_idx, m, n, k, addresses)
            tensors = [ga, gb, gsfa, gsfb]
            if cutlass.const_expr(self.dual):
                tensors += [gb2, gsfb2]
            tensormap_manager.update_tensormap(
                tuple(tensors), tuple(load_atoms), tuple(tmap_gmem[s] for s in slots), 0,
                tuple(tmap_smem_ptrs[s] for s in slots))
            for s in slots:
                tensormap_manager.fence_tensormap_update(tmap_gmem[s])

        tmem.allocate(self.num_tmem_alloc_cols)
        tmem.wait_for_alloc()
        acc_tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
        tCtAcc_base, tCtSFA, (tCtSFB, tCtSFB2), (sfb_col0, sfb2_col0), tCtSFB_layout = self._tmem_tensors(
            tiled_mma, acc_tmem_ptr, tCtAcc_fake, sfa_smem_layout_staged, sfb_smem_layout_staged)

        if warp_idx == 0:
            tiled_copy_s2t_sfa, tCsSFA_s2t, tCtSFA_s2t = self._s2t_copy_and_partition(sSFA, tCtSFA)
            tiled_copy_s2t_sfb, tCsSFB_s2t, tCtSFB_s2t = self._s2t_copy_and_partition(sSFB, tCtSFB)
            tiled_copy_s2t_sfb2, tCsSFB2_s2t, tCtSFB2_s2t = self._s2t_copy_and_partition(sSFB2, tCtSFB2)
            tCtSFB_mma = self._sfb_for_tile(acc_tmem_ptr, sfb_col0, tCtSFB, tCtSFB_layout, mma_tile_n)
            tCtSFB2_mma = self._sfb_for_tile(acc_tmem_ptr, sfb2_col0, tCtSFB2, tCtSFB_layout, mma_tile_n)

            sfb_n = self._sfb_n_slice(mma_tile_n)
            tAgA_slice = tAgA[(None, mma_tile_m, None, 0)]
            tBgB_slice = tBgB[(None, mma_tile_n, None, 0)]
            tBgB2_slice = tBgB2[(None, mma_tile_n, None, 0)]
            tAgSFA_slice = tAgSFA[(None, mma_tile_m, None, 0)]
            tBgSFB_slice = tBgSFB[(None, sfb_n, None, 0)]
            tBgSFB2_slice = tBgSFB2[(None, sfb_n, None, 0)]

            desc = [tensormap_manager.get_tensormap_ptr(t, cute.AddressSpace.generic) for t in tmap_gmem]
            ab_producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stage)
            ab_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stage)
            acc_producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_acc_stage)
            acc_pipeline.producer_acquire(acc_producer_state)
            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)

            for _k_tile in cutlass.range(0, k_tile_cnt, 1, unroll=1):
                # Load k-tile: wait until its buffer is free (its previous MMAs are done) ...
                ab_pipeline.producer_acquire(ab_producer_state)
                bar = ab_pipeline.producer_get_barrier(ab_producer_state)
                kc = ab_producer_state.count
                ks = ab_producer_state.index
                cute.copy(tma_atom_a, tAgA_slice[(None, kc)], tAsA[(None, ks)],
                          tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_a])
                cute.copy(tma_atom_b, tBgB_slice[(None, kc)], tBsB[(None, ks)],
                          tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_b])
                cute.copy(tma_atom_sfa, tAgSFA_slice[(None, kc)], tAsSFA[(None, ks)],
                          tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_sfa])
                cute.copy(tma_atom_sfb, tBgSFB_slice[(None, kc)], tBsSFB[(None, ks)],
                          tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_sfb])
                if cutlass.const_expr(self.dual):
                    cute.copy(tma_atom_b2, tBgB2_slice[(None, kc)], tBsB2[(None, ks)],
                              tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_b2])
                    cute.copy(tma_atom_sfb2, tBgSFB2_slice[(None, kc)], tBsSFB2[(None, ks)],
                              tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_sfb2])
                ab_producer_state.advance()

                # ... then wait for it to land and multiply (the same warp: nothing else overlaps).
                ab_pipeline.consumer_wait(ab_consumer_state)
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
                    tCtAcc = tCtAcc_base[(None, None, None, 0)]
                    cute.gemm(tiled_mma, tCtAcc, tCrA[kblock_coord], tCrB[kblock_coord], tCtAcc)
                    if cutlass.const_expr(self.dual):
                        tiled_mma.set(tcgen05.Field.SFB, tCtSFB2_mma[(None, None, kblock_idx)].iterator)
                        tCtAcc2 = tCtAcc_base[(None, None, None, 1)]
                        cute.gemm(tiled_mma, tCtAcc2, tCrA[kblock_coord], tCrB2[kblock_coord], tCtAcc2)
                    tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                ab_pipeline.consumer_release(ab_consumer_state)
                ab_consumer_state.advance()

            acc_pipeline.producer_commit(acc_producer_state)
            ab_pipeline.producer_tail(ab_producer_state)

        # SIMT epilogue, all four warps: thread t owns accumulator row t (tensor-memory lane t).
        mC = self._group_output(group_idx, m, n, addresses)
        gC_mnl = cute.local_tile(mC, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
        tCgC = thr_mma.partition_C(gC_mnl)
        # Coordinates inside one MMA tile (static), offset by the tile's origin below.
        tCcC = thr_mma.partition_C(cute.make_identity_tensor(cute.slice_(self.mma_tiler, (None, None, 0))))
        acc_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_acc_stage)
        self._simt_epilogue(tidx, tCtAcc_base, tCgC, tCcC, acc_pipeline, acc_consumer_state,
                            (mma_tile_m, mma_tile_n, 0), m, n, alphas[(group_idx, 0)], alphas[(group_idx, 1)])

        tmem.relinquish_alloc_permit()
        self.epilog_sync_barrier.arrive_and_wait()
        tmem.free(acc_tmem_ptr)

    @cute.jit
    def _simt_epilogue(self, tidx: cutlass.Int32, tCtAcc_base: cute.Tensor, tCgC: cute.Tensor, tCcC: cute.Tensor,
                       acc_pipeline, acc_consumer_state, mma_tile_coord_mnl,
                       m: cutlass.Int32, n: cutlass.Int32, alpha1: cutlass.Float32, alpha2: cutlass.Float32):
        """tcgen05.ld a slice of the accumulator row(s), scale (and SiLU·up) in fp32, round to fp16,
        store the row slice to global memory if it lies inside C."""
        epi_tile = self.epi_tile
        tiled_copy_t2r, thr_copy_t2r, tTR_tAcc_base, tTR_rAcc = self._epilog_t2r(tidx, tCtAcc_base, tCgC, epi_tile)
        tTR_rAcc2 = cute.make_rmem_tensor(tTR_rAcc.shape, self.acc_dtype)
        tTR_rC = cute.make_rmem_tensor(tTR_rAcc.shape, self.c_dtype)
        simt_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.c_dtype)
        gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, None, None, None)], epi_tile)
        cC_epi = cute.flat_divide(tCcC[((None, None), 0, 0)], epi_tile)
        tTR_gC = thr_copy_t2r.partition_D(gC_epi)[(None, None, None, None, None, *mma_tile_coord_mnl)]
        tTR_cC = thr_copy_t2r.partition_D(cC_epi)
        tTR_gC = cute.group_modes(tTR_gC, 3, cute.rank(tTR_gC))
        tTR_cC = cute.group_modes(tTR_cC, 3, cute.rank(tTR_cC))

        stage = acc_consumer_state.index
        tTR_tAcc = tTR_tAcc_base[(None, None, None, None, None, stage * self.n_prod)]
        tTR_tAcc = cute.group_modes(tTR_tAcc, 3, cute.rank(tTR_tAcc))
        tTR_tAcc2 = tTR_tAcc_base[(None, None, None, None, None, stage * self.n_prod + self.n_prod - 1)]
        tTR_tAcc2 = cute.group_modes(tTR_tAcc2, 3, cute.rank(tTR_tAcc2))

        acc_pipeline.consumer_wait(acc_consumer_state)
        subtile_cnt = cute.size(tTR_tAcc.shape, mode=[3])
        for subtile_idx in cutlass.range(subtile_cnt):
            cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, subtile_idx)], tTR_rAcc)
            vals = [tTR_rAcc.load()]
            if cutlass.const_expr(self.dual):
                cute.copy(tiled_copy_t2r, tTR_tAcc2[(None, None, None, subtile_idx)], tTR_rAcc2)
                vals.append(tTR_rAcc2.load())
            tTR_rC.store(self._epilogue_values(vals, alpha1, alpha2).to(self.c_dtype))
            # Rows past M (and slices past N) belong to no one: M is ragged and C is exactly [M, N].
            # (A coordinate tensor over the whole dynamic-shaped C crashes CuTe DSL 4.3.5's compiler;
            # coordinates inside the static MMA tile plus the tile origin do not.)
            coord = tTR_cC[(None, None, None, subtile_idx)][0]
            row = mma_tile_coord_mnl[0] * self.mma_tiler[0] + coord[0]
            col = mma_tile_coord_mnl[1] * self.mma_tiler[1] + coord[1]
            if row < m and col < n:
                cute.copy(simt_atom, tTR_rC, tTR_gC[(None, None, None, subtile_idx)])
        cute.arch.fence_view_async_tmem_load()
        with cute.arch.elect_one():
            acc_pipeline.consumer_release(acc_consumer_state)
