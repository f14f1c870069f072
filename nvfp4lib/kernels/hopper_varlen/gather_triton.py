"""The gather's Triton code (:mod:`.gather`: what it does, its table and its plan). Imported on the first launch."""
import triton
import triton.language as tl


@triton.jit
def _unit_loads(cptr, sptr, kc, kc_end, j, r0, r1, sr, sj, n, cols, SWZ_B: tl.constexpr, SCALES: tl.constexpr):
    # unit kc's code pairs (rows r0 and r1, pair j; nothing read past kc_end) and (SCALES) its scale bytes.
    # (kc < kc_end is written as kc * 4 + j < kc_end * 4, j < 4: masks as blocks, as Triton's interpreter needs)
    kp = kc * 4 + j  # code pair along K
    ok = (kp < cols) & (kp < kc_end * 4)
    p0 = tl.load(cptr + (r0 * cols + kp), mask=ok & (r0 < n), other=0)
    p1 = tl.load(cptr + (r1 * cols + kp), mask=ok & (r1 < n), other=0)
    if SCALES:
        sk = kc * 4 + sj
        sv = tl.load(sptr + _scale_at(sr, sk, cols, SWZ_B), mask=(sr < n) & (sk < cols) & (sk < kc_end * 4),
                     other=0)
    else:
        sv = 0
    return p0, p1, sv


@triton.jit
def _program_scales(sptr, packed, rb, kc0, kc_end, n, n_pad, cols, unit0, per, SWZ_B: tl.constexpr,
                    KCU: tl.constexpr):
    # the scale bytes of all KCU units of a program, each source byte loaded once: the rows' KCU * 4 consecutive
    # columns (one sector per row for KCU = 8, against one per row and unit), moved to output byte order
    # (w, g, j, h) per unit (:func:`gather`) by a permute, stored as KCU rows of 256 bytes
    w = tl.arange(0, 4)[:, None, None, None]
    h = tl.arange(0, 2)[None, :, None, None]
    g = tl.arange(0, 8)[None, None, :, None]
    sr = (rb * 64 + 16 * w + 8 * h + g) % n_pad
    col = kc0 * 4 + tl.arange(0, KCU * 4)[None, None, None, :]  # (one axis: a warp's lanes along a row)
    v = tl.load(sptr + _scale_at(sr, col, cols, SWZ_B), mask=(sr < n) & (col < cols) & (col < kc_end * 4), other=0)
    v = tl.reshape(tl.permute(tl.reshape(v, [4, 2, 8, KCU, 4]), (3, 0, 2, 4, 1)), [KCU, 256])
    uu = tl.arange(0, KCU)[:, None]
    dst = (unit0 + uu * per).to(tl.int64) * 2304 + 2048 + tl.arange(0, 256)[None, :]
    tl.store(packed + dst, v, mask=(tl.zeros_like(dst) + kc0 + uu) < kc_end)


@triton.jit
def _words(b0, b1):
    # the output words of source code pairs shifted right by 8c (byte c of each half in the low byte of each half;
    # b0: row hp = 0, b1: hp = 1): byte (e, hp) packs nibble e of byte c of words x and y of the pair
    xs = ((b0 & 255) | ((b1 & 255) << 8)).to(tl.uint32)  # byte c of x, hp = 0 | 1
    ys = (((b0 >> 32) & 255) | (((b1 >> 32) & 255) << 8)).to(tl.uint32)
    x = (xs & 0x0F0F) | ((xs & 0xF0F0) << 12)  # nibbles to bytes (e, hp)
    y = (ys & 0x0F0F) | ((ys & 0xF0F0) << 12)
    return ((x & 0x07070707) << 1) | ((x & 0x08080808) << 4) | ((y & 0x08080808) >> 3) | ((y & 0x07070707) << 4)


@triton.jit
def _scale_at(r, col, cols, SWZ: tl.constexpr):
    # byte offset of scale (r, col) of a [rows, cols] scale matrix: row-major, or (SWZ) the 128x4 blocked layout of
    # formats.swizzle_scales: atoms row-atom-major, inside one (r % 32) * 16 + (r // 32 % 4) * 4 + col % 4
    if SWZ:
        return ((r // 128) * ((cols + 3) // 4) + col // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + col % 4
    else:
        return r * cols + col


@triton.jit
def _unit_loop(packed, cptr, sptr, kc0, kc_end, j, r0, r1, sr, sj, n, cols, cta, kc_n, per, slot, q, c, t,
               SWZ_B: tl.constexpr, KCU: tl.constexpr, PREFETCH: tl.constexpr, ONCE: tl.constexpr):
    # the program's KCU units one after the other (PREFETCH: the next unit's loads issued before this one's stores)
    p0, p1, sv = _unit_loads(cptr, sptr, kc0, kc_end, j, r0, r1, sr, sj, n, cols, SWZ_B, not ONCE)
    for u in range(KCU):
        kc = kc0 + u
        if PREFETCH:  # the next unit's loads in flight while this one is decoded and stored
            q0, q1, qs = _unit_loads(cptr, sptr, kc + 1, kc_end, j, r0, r1, sr, sj, n, cols, SWZ_B, not ONCE)
        unit_at = ((cta * kc_n + kc) * per + slot).to(tl.int64)  # the unit's index (2304 bytes each)
        if ONCE:  # [32, 4 c, 4 j] to the store's [32, 16] (Triton: through shared memory; 16-byte stores), one
            # mask value per unit
            word = tl.reshape(_words(p0[:, None, :] >> c, p1[:, None, :] >> c), [32, 16])
            ok = tl.zeros_like(q) + kc < kc_end
        else:
            word = _words(p0 >> c, p1 >> c)
            ok = kc * 4 + j < kc_end * 4
            tl.store(packed + unit_at * 2304 + 2048 + t, sv, mask=kc * 4 + sj < kc_end * 4)
        tl.store(packed.to(tl.pointer_type(tl.uint32)) + (unit_at * 576 + q), word, mask=ok)
        if PREFETCH:
            p0, p1, sv = q0, q1, qs
        else:
            p0, p1, sv = _unit_loads(cptr, sptr, kc + 1, kc_end, j, r0, r1, sr, sj, n, cols, SWZ_B, not ONCE)


@triton.jit
def gather(packed, small, table_at, DUAL: tl.constexpr, SWZ_A: tl.constexpr, SWZ_B: tl.constexpr,
           G_P2: tl.constexpr, POST: tl.constexpr, ROWS: tl.constexpr, BYTES: tl.constexpr, KCU: tl.constexpr,
           PREFETCH: tl.constexpr, ONCE: tl.constexpr, ROWS_FIRST: tl.constexpr, WHOLE: tl.constexpr):
    pid = tl.program_id(0)
    table = table_at.to(tl.pointer_type(tl.int64))  # device memory, or pinned host memory read in place
    n = tl.load(table + 0).to(tl.int32)
    k = tl.load(table + 1).to(tl.int32)
    n_pad = tl.load(table + 2).to(tl.int32)
    kc_n = tl.load(table + 3).to(tl.int32)
    per = tl.load(table + 4).to(tl.int32)
    blocks = tl.load(table + 5).to(tl.int32)
    groups = tl.load(table + 6).to(tl.int32)
    units = tl.load(table + 7).to(tl.int32)
    a_progs = tl.load(table + 8).to(tl.int32)
    rows_t = table + 16  # group g's row at rows_t + 16 g
    # (sizes as int32: per-element offsets inside one group's matrix stay 32-bit, Plan checks they fit; fewer
    # registers per element than int64 offsets)
    g_idx = tl.arange(0, G_P2)
    g_ok = g_idx < groups
    cols = k // 16
    # programs: the weights' units, then the activation rows, then the small things; or (ROWS_FIRST) the rows, the
    # small things, then the weights (the rows' programs then start in the first wave, not after the weights' last)
    if ROWS_FIRST:
        rpid = pid
        wpid = pid - a_progs - 1
    else:
        wpid = pid
        rpid = pid - units
    if (wpid >= 0) & (wpid < units):  # ---- KCU consecutive 64-row x 64-K units of the packed weights (one block)
        kcp_n = (kc_n + KCU - 1) // KCU
        per_mat = units // (2 if DUAL else 1)
        mat = wpid // per_mat
        unit = wpid % per_mat
        rb = unit // kcp_n
        if DUAL:
            cta = rb // blocks
            slot = mat * blocks + rb % blocks
        else:
            cta = rb // per
            slot = rb % per
        base = rows_t + (rb * 64 // n_pad) * 16 + 3 + 2 * mat  # one group per block: n_pad is a multiple of 64
        cptr = tl.load(base).to(tl.pointer_type(tl.uint64))  # codes read as 8-byte pairs (group_table: aligned)
        sptr = tl.load(base + 1).to(tl.pointer_type(tl.uint8))
        # one output word per element: word (w, g, c, j) of a unit holds bytes
        # (e, hp); byte (e, hp) packs nibble e of byte c of words 2j (x) and 2j + 1 (y) of source row
        # 16w + 8(1-hp) + g, i.e. byte c of both halves of the row's code pair j
        if ONCE:  # the unit as [32 row pairs (w, g), 4 bytes c, 4 pairs j]: each code pair loaded by one lane
            wg = tl.arange(0, 32)[:, None]
            j = tl.arange(0, 4)[None, :]
            c = (tl.arange(0, 4) * 8).to(tl.uint64)[None, :, None]
            q = wg * 16 + tl.arange(0, 16)[None, :]
            rw = rb * 64 + 16 * (wg // 8) + wg % 8
        else:
            q = tl.arange(0, 512)
            j = q % 4
            c = ((q // 4) % 4 * 8).to(tl.uint64)
            rw = rb * 64 + 16 * (q // 128) + (q // 16) % 8
        r0 = (rw + 8) % n_pad  # hp = 0
        r1 = rw % n_pad  # hp = 1
        # scales (loaded per unit unless ONCE): output byte (w, g, j, h) of a unit is scale column j of row
        # 16w + 8h + g
        t = tl.arange(0, 256)
        sr = (rb * 64 + 16 * (t // 64) + 8 * (t % 2) + (t // 8) % 8) % n_pad
        sj = (t // 2) % 4
        kc0 = (unit % kcp_n) * KCU
        kc_end = tl.minimum(kc0 + KCU, kc_n)
        if ONCE:  # scales first, once per program
            _program_scales(sptr, packed, rb, kc0, kc_end, n, n_pad, cols, (cta * kc_n + kc0) * per + slot, per,
                            SWZ_B, KCU)
        if WHOLE:  # (ONCE) the program's KCU units at once: each row's KCU * 32 code bytes in one request, no loop
            kp = kc0 * 4 + tl.arange(0, KCU * 4)[None, :]
            ok = (kp < cols) & (kp < kc_end * 4)
            p0 = tl.reshape(tl.load(cptr + (r0 * cols + kp), mask=ok & (r0 < n), other=0), [32, 1, KCU, 4])
            p1 = tl.reshape(tl.load(cptr + (r1 * cols + kp), mask=ok & (r1 < n), other=0), [32, 1, KCU, 4])
            c4 = (tl.arange(0, 4) * 8).to(tl.uint64)[None, :, None, None]
            word = tl.reshape(tl.permute(_words(p0 >> c4, p1 >> c4), (2, 0, 1, 3)), [KCU, 512])  # [u, (wg, c, j)]
            uu = tl.arange(0, KCU)[:, None]
            dst = ((cta * kc_n + kc0 + uu) * per + slot).to(tl.int64) * 576 + tl.arange(0, 512)[None, :]
            tl.store(packed.to(tl.pointer_type(tl.uint32)) + dst, word, mask=(tl.zeros_like(dst) + kc0 + uu) < kc_end)
        else:
            _unit_loop(packed, cptr, sptr, kc0, kc_end, j, r0, r1, sr, sj, n, cols, cta, kc_n, per, slot, q, c, t,
                       SWZ_B, KCU, PREFETCH, ONCE)
    elif (rpid >= 0) & (rpid < a_progs):  # ---- ROWS packed activation rows
        a_codes = small
        a_scales = small + tl.load(table + 9)
        rows = tl.load(rows_t + g_idx * 16 + 2, mask=g_ok, other=0)
        ends = tl.cumsum(rows, 0)
        r = rpid * ROWS + tl.arange(0, ROWS)
        live = r < tl.sum(rows, 0)
        g = tl.minimum(tl.sum((ends[None, :] <= r[:, None]).to(tl.int32), 1), groups - 1)
        start = tl.sum(tl.where(g_idx[None, :] < g[:, None], rows[None, :], 0), 1)
        local = (r - start).to(tl.int64)
        cp = tl.load(rows_t + g * 16 + 0, mask=live, other=0).to(tl.pointer_type(tl.uint8))
        sp = tl.load(rows_t + g * 16 + 1, mask=live, other=0).to(tl.pointer_type(tl.uint8))
        half = k // 2
        for b in range(0, half, BYTES):
            cb = b + tl.arange(0, BYTES)
            msk = live[:, None] & (cb[None, :] < half)
            v = tl.load(cp[:, None] + local[:, None] * half + cb[None, :], mask=msk, other=0)
            tl.store(a_codes + r.to(tl.int64)[:, None] * half + cb[None, :], v, mask=msk)
        for b in range(0, cols, 64):
            sc = b + tl.arange(0, 64)
            msk = live[:, None] & (sc[None, :] < cols)
            v = tl.load(sp[:, None] + _scale_at(local[:, None], sc[None, :], cols, SWZ_A), mask=msk, other=0)
            tl.store(a_scales + r.to(tl.int64)[:, None] * cols + sc[None, :], v, mask=msk)
    else:  # ---- offsets, A's global scales, gs_b
        offsets = (small + tl.load(table + 10)).to(tl.pointer_type(tl.int32))
        gs_b = (small + tl.load(table + 11)).to(tl.pointer_type(tl.float32))
        gs_a = (small + tl.load(table + 12)).to(tl.pointer_type(tl.float32))
        rows = tl.load(rows_t + g_idx * 16 + 2, mask=g_ok, other=0)
        tl.store(offsets + 1 + g_idx, tl.cumsum(rows, 0).to(tl.int32), mask=g_ok)
        tl.store(offsets + g_idx, tl.zeros([G_P2], tl.int32), mask=g_idx == 0)
        pa = tl.load(rows_t + g_idx * 16 + 7, mask=g_ok, other=0).to(tl.pointer_type(tl.float32))
        pb = tl.load(rows_t + g_idx * 16 + 8, mask=g_ok, other=0).to(tl.pointer_type(tl.float32))
        pb2 = tl.load(rows_t + g_idx * 16 + 9, mask=g_ok, other=0).to(tl.pointer_type(tl.float32))
        tl.store(gs_a + g_idx, tl.load(pa, mask=g_ok, other=1.0), mask=g_ok)
        tl.store(gs_b + 2 * g_idx, tl.load(pb, mask=g_ok, other=1.0) * POST, mask=g_ok)
        tl.store(gs_b + 2 * g_idx + 1, tl.load(pb2, mask=g_ok, other=1.0) * POST, mask=g_ok)
