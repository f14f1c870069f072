"""The device-scheduled kernel's tile search (:mod:`.kernel`): which output tile a CTA computes, found from the group
offsets on the device, as a base class built on first use (:func:`search_class`; importing nvfp4lib never imports
cutlass). The kernel class sets ``groups``, ``bt`` (tile_n), ``step``, ``n_blocks``, ``per_lane``, ``cfg`` and
``combine`` (whether the rows all groups cover are counted too)."""
from __future__ import annotations

# Up to this many groups each thread walks them to find its CTA's tile; above, every warp searches them with
# shuffles. The warp search (0b14006) ran the large-token tiles 6-11% slower at G = 8 on the H100 (graph replay, two
# alternating rounds on one card, 2026-11-26: S1 128.5-129.1 -> 136.7-146.9 us, S1-dual 224.3-227.0 -> 249.7-258.5,
# S2-dual 138.0-138.5 -> 150.1-154.9); the loop costs ~G dependent steps before the first weight load, which the
# search was written for (256 groups on a DeepSeek-like layer)
LOOP_GROUPS = 32

_CLASS = None


def search_class():
    """The base class ``TileSearch``, built on first use."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build()
    return _CLASS


def _build():
    import cutlass
    import cutlass.cute as cute

    class TileSearch:
        """:meth:`_schedule` and its two searches (a loop up to :data:`LOOP_GROUPS` groups, a warp's lanes above)."""

        @cute.jit
        def _schedule(self, mOffsets, rows, tile):
            """This CTA's tile: (group, first token row, tokens, first weight row of the group's N, and with
            ``combine`` the rows all groups cover, else 0) or tokens <= 0 when the split has fewer tiles than the grid.

            Group g owns rows ``lo_g .. hi_g`` with ``hi_g = min(T, max(0, offsets[0 .. g+1]))`` and ``lo_g =
            hi_{g-1}`` (offsets clamped to [0, T] and made non-decreasing). Up to :data:`LOOP_GROUPS` groups each
            thread walks them (:meth:`_find_by_loop`); above, every warp searches them at once
            (:meth:`_find_by_warp`)."""
            if cutlass.const_expr(self.groups <= LOOP_GROUPS):
                group, lo_sel, m_sel, ntt_sel, local, covered = self._find_by_loop(mOffsets, rows, tile)
            else:
                group, lo_sel, m_sel, ntt_sel, local, covered = self._find_by_warp(mOffsets, rows, tile)
            # (every operand is >= 0: unsigned divisions, shorter than signed ones)
            ntt1 = cutlass.Uint32(cutlass.max(ntt_sel, 1))
            nblk = cutlass.Int32(cutlass.Uint32(local) // ntt1)
            tt = local - nblk * ntt_sel
            size = cutlass.Int32(cutlass.Uint32(m_sel + ntt_sel - 1) // ntt1)
            size = (size + self.step - 1) // self.step * self.step
            m0 = tt * size
            tokens = cutlass.min(size, m_sel - m0)
            if ntt_sel == 0:
                tokens = cutlass.Int32(0)
            return group, lo_sel + m0, tokens, nblk * self.cfg.tile_m, covered

        @cute.jit
        def _find_by_loop(self, mOffsets, rows, bidx):
            """(group, its first row, its rows, its token tiles, this CTA's tile index within the group's tiles, the
            rows all groups cover or 0 without ``combine``): one thread walks the groups, ~G dependent steps before the
            first weight load. ``bidx``: the tile
            index (the CTA's block index, or its ticket in the fused call)."""
            acc = cutlass.Int32(0)
            group, lo_sel, hi_sel, local = cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0)
            lo = cutlass.min(cutlass.max(cutlass.Int32(mOffsets[0]), 0), rows)
            first = lo
            for g in cutlass.range(self.groups, unroll=min(self.groups, 16)):
                hi = cutlass.min(cutlass.max(cutlass.Int32(mOffsets[g + 1]), lo), rows)
                cnt = self._token_tiles(hi - lo) * self.n_blocks
                here = bidx - acc
                # acc <= bidx < acc + cnt. (Two signed compares: a compare of Uint32 casts came out signed where the
                # tile is a split-K CTA's, bidx // slices, selecting every later group: the decode GEMMs' outputs
                # unwritten, seen on the GPU)
                if here >= 0 and here < cnt:
                    group, lo_sel, hi_sel, local = g, lo, hi, here
                acc = acc + cnt
                lo = hi
            m_sel = hi_sel - lo_sel
            covered = cutlass.Int32(0)
            if cutlass.const_expr(self.combine):
                covered = lo - first
            return group, lo_sel, m_sel, self._token_tiles(m_sel), local, covered

        @cute.jit
        def _token_tiles(self, m):
            """The token tiles of a group of ``m >= 0`` rows, ceil(m / tile_n) (an unsigned division)."""
            return cutlass.Int32(cutlass.Uint32(m + self.bt - 1) // self.bt)

        @cute.jit
        def _find_by_warp(self, mOffsets, rows, bidx):
            """What :meth:`_find_by_loop` finds, by every warp on its own: its lanes each take ``ceil(G / 32)``
            consecutive groups, one round of loads, then a prefix maximum (the row bounds) and a prefix sum (the
            tile counts) over the lanes by shuffles, and the one lane whose groups hold tile ``bidx`` hands its values
            to the others."""
            lane = cute.arch.lane_idx()
            per = self.per_lane
            base = cutlass.max(cutlass.Int32(mOffsets[0]), 0)
            ends = []
            lane_max = cutlass.Int32(-1)
            for j in cutlass.range_constexpr(per):
                v = cutlass.Int32(-1)  # a lane's groups past G own no rows
                if lane * per + j < self.groups:
                    v = cutlass.Int32(mOffsets[lane * per + j + 1])
                ends.append(v)
                lane_max = cutlass.max(lane_max, v)
            run = self._lanes_before(lane_max, lane, base, True)  # max(0, offsets[0 .. first group of this lane])
            bounds, counts, lane_tiles = [], [], cutlass.Int32(0)
            for j in cutlass.range_constexpr(per):
                lo = cutlass.min(run, rows)
                run = cutlass.max(run, ends[j])
                m = cutlass.min(run, rows) - lo
                ntt = self._token_tiles(m)
                bounds.append((lo, m, ntt))
                counts.append(ntt * self.n_blocks)
                lane_tiles = lane_tiles + counts[j]
            acc = self._lanes_before(lane_tiles, lane, cutlass.Int32(0), False)  # tiles of the lanes before
            group, lo_sel, m_sel, ntt_sel, local = (cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0),
                                                    cutlass.Int32(0), cutlass.Int32(0))
            for j in cutlass.range_constexpr(per):
                if bidx >= acc and bidx < acc + counts[j]:
                    group, lo_sel, m_sel, ntt_sel, local = (lane * per + j, bounds[j][0], bounds[j][1], bounds[j][2],
                                                            bidx - acc)
                acc = acc + counts[j]
            # one lane at most found the tile; the others hold zeros (every value is >= 0): a maximum broadcasts it
            group, lo_sel, m_sel, ntt_sel, local = (cute.arch.warp_reduction_max(x)
                                                    for x in (group, lo_sel, m_sel, ntt_sel, local))
            covered = cutlass.Int32(0)
            if cutlass.const_expr(self.combine):  # (run grows lane by lane: the last lane's is every group's end)
                covered = cutlass.min(cute.arch.warp_reduction_max(run), rows) - cutlass.min(base, rows)
            return group, lo_sel, m_sel, ntt_sel, local, covered

        @cute.jit
        def _lanes_before(self, x, lane, first, use_max: cutlass.Constexpr):
            """Over the warp's lanes: the maximum (``use_max``) or the sum of ``x`` over the lanes before this one,
            with ``first`` for lane 0 (folded into the maximum)."""
            for s in cutlass.range_constexpr(5):
                y = cute.arch.shuffle_sync_up(x, offset=1 << s, mask_and_clamp=0)
                if lane >= (1 << s):
                    if cutlass.const_expr(use_max):
                        x = cutlass.max(x, y)
                    else:
                        x = x + y
            before = cute.arch.shuffle_sync_up(x, offset=1, mask_and_clamp=0)
            out = first
            if lane > 0:
                if cutlass.const_expr(use_max):
                    out = cutlass.max(first, before)
                else:
                    out = before
            return out

    return TileSearch
