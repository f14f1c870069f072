"""``cute-hopper`` with ``swap_ab``: weights decoded straight into wgmma's register operand (sm_90a, CuTe DSL).

The smem kernel (:mod:`..hopper_smem`) decodes both operands into shared memory for every output tile, so a
weight is decoded once per token tile and the tokens pad wgmma's 64-row M. Here the roles swap:

- the **weights** are wgmma's A operand (M = 64 weight rows per warpgroup), read from **registers**:
  each thread loads its 16 prepacked code bytes and 8 scale bytes of a 64-K unit from shared memory
  and decodes them into exactly the 16 fp16 registers of its wgmma fragment (:mod:`.layout`);
- the **tokens** are wgmma's N (any multiple of 8 up to 256): a group of 40 tokens costs a 40-wide
  MMA, not a 64- or 128-row tile; with ``tile_n`` ≥ the group's rows, each weight is decoded once;
- the **activations** are decoded once per call by a one-launch prologue (:mod:`.prologue`) that reads the
  caller's tensors in place (a table of row addresses, or up to ``param_groups`` groups' addresses as kernel
  parameters) into fp16 (value × scale × 2^-7, exact) and writes the per-group factors ``alpha``; they reach shared
  memory by TMA (128-byte swizzle, the K-major B operand) in boxes of ``token_step`` rows. The GEMM is launched with
  programmatic dependent launch: its set-up and first weight loads overlap the prologue, which it waits for
  (``griddepcontrol.wait``) before loading activations;
- two warpgroups per CTA, each with one or two 64-row wgmma blocks (``tile_m`` = 128 or 256 weight rows of one
  matrix), or (dual) the same 64 or 128 rows of B1 (warpgroup 0) and B2 (warpgroup 1). Warp 0 issues the TMA
  loads (weights: one contiguous prepacked block per stage) into an ``ab_stages``-deep mbarrier pipeline;
- per 64-K sub-block: two shared loads and 4 × 14 decode instructions per block, then 4 wgmma (k16) per block
  that run while the next sub-block is decoded into the other register set (``wait_group(1)`` before reuse);
- with ``token_step`` the kernel holds one wgmma N per multiple of the step up to ``tile_n`` and each tile runs
  the narrowest that covers its tokens (:func:`plan_token_tiles` chooses the tiles, widest first);
- epilogue: fp32 × ``alpha = gs_A·gs_B·2^14`` (the tile is Cᵀ: weight rows × tokens), rounded to the output type and
  stored per element (``epilogue="simt"``), or written to shared memory as C rows and copied out in 16-byte row
  chunks (``"staged"``, configs ``*_e``). Dual: both warpgroups hand half of their accumulators to the other and
  compute silu(gate)·up (fast exp and reciprocal) for their own half.

Knobs: :class:`~.config.RSConfig`; :func:`validate` refuses what cannot work before compiling. Configs are named
``rs_*`` in :data:`.config.RS_CONFIGS`. The structures that lost to this one (a decode warpgroup, the inline
activation decode, ping-pong) and the ablations are in git at commit f7c5079 (see :mod:`.config`).
"""
from __future__ import annotations

from ..common.packing import tile_fields
from .config import (  # noqa: F401  (hopper_rs.X: the names the study and the tests use)
    MAX_ACC_REGS,
    MAX_VARIANTS,
    NWG,
    ROW_BYTES,
    STAGE_PAD,
    THREADS,
    RSConfig,
    acc_registers,
    blocks_per_warpgroup,
    smem_plan,
    stage_bytes,
    stage_units,
    token_step,
    validate,
    xfer_bytes,
)
from .layout import UNIT_BYTES, UNIT_K
from .mainloop import tile_class
from .ops import (  # noqa: F401
    ACT_SMEM,
    ACT_THREADS,
    GROUP_PARAMS,
    PARAM_GROUPS,
    ROW_COLUMNS,
    ops,
)
from .prologue import prologue_class


def _kernel_classes():
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES

    import cutlass
    import cutlass.cute as cute

    ActivationPrologueSm90 = prologue_class()

    class GroupedNvfp4GemmSm90RS(tile_class()):
        """Swap-AB: weights (register A, decoded per thread) × tokens (smem B, fp16) -> Cᵀ tiles.

        Every tile row carries its token count class: the CTA runs the variant of the kernel whose wgmma N is the
        tile's tokens rounded up to ``token_step`` (one specialised mainloop per multiple of the step)."""

        def __init__(self, cfg: RSConfig):
            self.cfg = validate(cfg)
            self.bt = cfg.tile_n
            self.step = token_step(cfg)
            self.variants = tuple(range(self.step, self.bt + 1, self.step))
            self.nsub = cfg.tile_k // UNIT_K
            self.blocks = blocks_per_warpgroup(cfg)
            self.stages = cfg.ab_stages
            self.dual = cfg.dual
            self.threads = THREADS  # the MMA warpgroups (the epilogue's barriers count these)
            self.stage_units = stage_units(cfg)
            self.w_rows = self.stage_units * UNIT_BYTES // ROW_BYTES  # 128-byte rows per stage
            self.rows_per_cta = cfg.tile_m
            self.a16, self.op_dtype = False, cutlass.Float16  # fp16 activations from the prologue

        @cute.jit
        def __call__(self, mW: cute.Tensor, mX: cute.Tensor, mC: cute.Tensor, mTiles: cute.Tensor,
                     mAlpha: cute.Tensor, mGsA: cute.Tensor, stream):
            """``mX``: the fp16 activations written by the prologue, with ``mAlpha`` its per-group factors. ``mGsA``
            [G]: the addresses of A's global scales (the prologue's input); here it gives G."""
            sx_layout, sw_layout, tma_w, tW, tma_x, tX = self._operands(mW, mX)
            # programmatic dependent launch, so set-up and the first weight loads overlap the prologue
            self.kernel(tma_w, tW, tma_x, tX, mX, mC, mTiles, mAlpha, mGsA, sw_layout, sx_layout).launch(
                grid=(cute.size(mTiles, mode=[0]), 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True)

        @cute.kernel
        def kernel(self, tma_w: cute.CopyAtom, tW: cute.Tensor, tma_x: cute.CopyAtom, tX: cute.Tensor,
                   mX: cute.Tensor, mC: cute.Tensor, mTiles: cute.Tensor, mAlpha: cute.Tensor, mGsA: cute.Tensor,
                   sw_layout: cute.Layout, sx_layout: cute.ComposedLayout):
            # (mX is read through tX; it stays a parameter: the kernel's ABI is the one the H100 runs measured)
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            bidx, _, _ = cute.arch.block_idx()
            if warp_idx == 0:
                cute.nvgpu.cpasync.prefetch_descriptor(tma_w)
                cute.nvgpu.cpasync.prefetch_descriptor(tma_x)
            storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
            variant = tile_fields(mTiles, bidx)["pad"]  # the swap-AB table keeps the wgmma N variant in "pad"
            for v in cutlass.range_constexpr(len(self.variants)):
                if variant == v:
                    self._tile(self.variants[v], storage, tma_w, tW, tma_x, tX, mC, mTiles, mAlpha, mGsA,
                               sw_layout, sx_layout)

        @cute.jit
        def _tile(self, nv: int, storage, tma_w, tW, tma_x, tX, mC, mTiles, mAlpha, mGsA, sw_layout, sx_layout):
            """One output tile with a wgmma N of ``nv`` tokens."""
            bidx, _, _ = cute.arch.block_idx()
            f = tile_fields(mTiles, bidx)  # tokens are the tile's rows: row0/m_valid count tokens
            group, tok_row0, tok_valid, n0, n_valid = f["group"], f["row0"], f["m_valid"], f["n0"], f["n_valid"]
            b_row0, k_tiles, k_tile0, out_row0 = f["b_row0"], f["k_tiles"], f["k_tile0"], f["out_row0"]

            boxes = nv // self.step
            load_pipe, sW, sX, sXv = self._ring(nv, storage, sw_layout, sx_layout)

            # TMA partitions. Weights: stage tiles of w_rows 128-byte rows, CTA-block-major (a block's K tiles
            # adjacent): G·n_pad/tile_m blocks of k_tiles_all stage tiles (n_pad is C's width)
            k_tiles_all = cute.size(tW, mode=[0]) * self.rows_per_cta // (
                self.w_rows * cute.size(mGsA, mode=[0]) * cute.size(mC, mode=[1]))
            w_tile0 = (b_row0 // self.rows_per_cta) * k_tiles_all + k_tile0
            gW = cute.local_tile(tW, (self.w_rows, ROW_BYTES), (None, 0))
            tWs, tWg = cute.nvgpu.cpasync.tma_partition(tma_w, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2),
                                                        cute.group_modes(gW, 0, 2))
            # Activations: boxes of step rows; smem (box, (row block, 1, slot)), gmem (box, (row block, 64-K block))
            tXs, tXg = cute.nvgpu.cpasync.tma_partition(tma_x, 0, cute.make_layout(1),
                                                        cute.zipped_divide(sX, (self.step, UNIT_K)),
                                                        cute.zipped_divide(tX, (self.step, UNIT_K)))
            loads = (tma_w, tWs, tWg, w_tile0, tma_x, tXs, tXg, tok_row0 // self.step, k_tile0 * self.nsub, boxes)
            self._mainloop(nv, storage, load_pipe, loads, sXv, mC, (mAlpha, group), out_row0, tok_valid, n0, n_valid,
                           k_tiles)

        @cute.jit
        def _x_box(self, loads, j, prod, s: int):
            """Box j of 64-K block s of stage ``prod``: the tile's first box row and K block come from the table."""
            return (loads[7] + j, loads[8] + prod.count * self.nsub + s)

        def _alpha(self, mAlpha, group):
            """The group's epilogue factors (gate, up), written by the prologue."""
            return mAlpha[group, 0], mAlpha[group, 1]

    _CLASSES = (ActivationPrologueSm90, GroupedNvfp4GemmSm90RS)
    return _CLASSES


_CLASSES = None
