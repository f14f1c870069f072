"""The activation prologue of the register-decode kernel (:mod:`.kernel`): one launch per call that decodes
every activation row into the padded fp16 buffer the GEMM loads by TMA, and writes the per-group factors."""
from __future__ import annotations

from .ops import ACT_SMEM, ACT_THREADS, GROUP_PARAMS, ops

_CLASS = None


def prologue_class():
    """ActivationPrologueSm90, built on first use."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build()
    return _CLASS


def _build():
    import cutlass
    import cutlass.cute as cute

    o = ops()
    load_row, decode_act16, alpha_row = o.load_row, o.decode_act16, o.alpha_row

    class ActivationPrologueSm90:
        """One launch per call: every activation row decoded from the caller's own tensors into the padded fp16
        buffer (value × scale × 2^-7), and the per-group epilogue factors ``alpha``.

        ``mRows`` int64 [R, 3] (:data:`ROW_COLUMNS`): the row's code and scale addresses and its 16-code chunk
        count (0: a padding row, left as the zeros it was allocated with). ``mGsA`` int64 [G]: addresses of A's
        global scales; ``mGsB`` float32 [G, 2]: gs_B1·2^14, gs_B2·2^14. ``groups``: empty, or (for at most
        :data:`PARAM_GROUPS` groups) :data:`GROUP_PARAMS` per group as kernel parameters, from which each thread
        computes its row's addresses instead of loading them from ``mRows`` (one dependent memory round trip less).

        ``smem``: dynamic shared memory the launch asks for and does not use (a config's ``prologue_smem``), so that
        its SMs already run with the GEMM's shared-memory carveout."""

        def __init__(self, smem: int = ACT_SMEM):
            self.smem = smem

        @cute.jit
        def __call__(self, mRows: cute.Tensor, mX: cute.Tensor, mGsA: cute.Tensor, mGsB: cute.Tensor,
                     mAlpha: cute.Tensor, groups: tuple, stream):
            work = cute.size(mRows, mode=[0]) * (cute.size(mX, mode=[1]) // 16)
            self.kernel(mRows, mX, mGsA, mGsB, mAlpha, groups).launch(
                grid=((work + ACT_THREADS - 1) // ACT_THREADS, 1, 1), block=(ACT_THREADS, 1, 1), stream=stream,
                smem=self.smem)

        @cute.kernel
        def kernel(self, mRows: cute.Tensor, mX: cute.Tensor, mGsA: cute.Tensor, mGsB: cute.Tensor,
                   mAlpha: cute.Tensor, groups: tuple):
            cute.arch.griddepcontrol_launch_dependents()  # the GEMM may start its set-up and weight loads now
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            i = bidx * ACT_THREADS + tidx
            per_row = cute.size(mX, mode=[1]) // 16
            if i < cute.size(mRows, mode=[0]) * per_row:
                r = i // per_row
                c = i - r * per_row
                if cutlass.const_expr(len(groups) == 0):
                    codes, scales, chunks = load_row((mRows.iterator + r * mRows.stride[0]).toint())
                else:
                    codes, scales, chunks = self._group_row(groups, r)
                if c < chunks:
                    dst = (mX.iterator + r * mX.stride[0] + 16 * c).toint()
                    decode_act16(codes + 8 * c, scales + c, dst)
            if i < cute.size(mGsA):
                alpha_row(mGsA[i], (mGsB.iterator + 2 * i).toint(), (mAlpha.iterator + 2 * i).toint())

        @cute.jit
        def _group_row(self, groups, r):
            """(code address, scale address, 16-code chunks) of padded row ``r`` from the groups' parameters
            (chunks 0: a padding row)."""
            rr = cutlass.Int64(r)
            codes, scales, chunks = cutlass.Int64(0), cutlass.Int64(0), cutlass.Int64(0)
            for g in cutlass.range_constexpr(len(groups) // len(GROUP_PARAMS)):
                ca, sa, cs, ss, r0, n, ch = groups[g * len(GROUP_PARAMS): (g + 1) * len(GROUP_PARAMS)]
                if rr >= r0 and rr < r0 + n:
                    codes = ca + (rr - r0) * cs
                    scales = sa + (rr - r0) * ss
                    chunks = ch
            return codes, scales, chunks

    return ActivationPrologueSm90
