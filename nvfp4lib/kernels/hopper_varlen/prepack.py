"""The weight prepack in one GPU pass (Triton): the layout of :func:`nvfp4lib.kernels.rs_layout.prepack_weights`,
written by one program per 64-row × 64-K unit straight from the stacked codes and scale bytes.

The torch form (``rs_layout``) is the specification and the CPU path; it takes ~20 whole-tensor passes, which a
one-shot call pays every time. Here each output byte is computed where it is stored: code byte ``o`` of a unit is
``(w, g, c, j, e, h') = digits of o`` (sizes 4, 8, 4, 4, 2, 2), holding the nibbles of row ``16w + 8(1-h') + g`` at
K columns ``16j + 2c + e`` (x) and that + 8 (y) as ``((x & 7) << 1) | (x >> 3) << 7 | (y >> 3) | (y & 7) << 4``;
scale byte ``o`` is ``(w, g, j, h)`` (4, 8, 4, 2): row ``16w + 8h + g``, scale column ``4·kc + j``. Rows past a
group's N and columns past K read as zero (the padding of the stacked form). Units land in CTA blocks as in
``prepack_weights``: ``[ctas, K/64, per, 2304]``, a single matrix's 64-row unit u at block u // per, slot u % per;
the dual's gate and up units of block b at slots ``b·blocks ..`` of matrix 0, then of matrix 1.
"""
from __future__ import annotations

import torch

from ..rs_layout import UNIT_BYTES

_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def prepack_unit(codes_ptr, scales_ptr, out_ptr, n, k, n_pad, kc_n, per, blocks, mat, dual: tl.constexpr):
        unit = tl.program_id(0)
        rb = unit // kc_n
        kc = unit % kc_n
        if dual:
            cta = rb // blocks
            slot = mat * blocks + rb % blocks
        else:
            cta = rb // per
            slot = rb % per
        dst = out_ptr + ((cta * kc_n + kc) * per + slot).to(tl.int64) * 2304
        o = tl.arange(0, 2048)
        hp = o % 2
        e = (o // 2) % 2
        j = (o // 4) % 4
        c = (o // 16) % 4
        g = (o // 64) % 8
        w = o // 512
        row = rb * 64 + 16 * w + 8 * (1 - hp) + g
        grp = row // n_pad
        r = row % n_pad
        src = (grp * n + r).to(tl.int64)
        ok = r < n
        k0 = kc * 64 + 16 * j + 2 * c + e
        k1 = k0 + 8
        b0 = tl.load(codes_ptr + src * (k // 2) + k0 // 2, mask=ok & (k0 < k), other=0).to(tl.int32)
        b1 = tl.load(codes_ptr + src * (k // 2) + k1 // 2, mask=ok & (k1 < k), other=0).to(tl.int32)
        x = (b0 >> ((k0 % 2) * 4)) & 15
        y = (b1 >> ((k1 % 2) * 4)) & 15
        byte = ((x & 7) << 1) | ((x >> 3) << 7) | (y >> 3) | ((y & 7) << 4)
        tl.store(dst + o, byte.to(tl.uint8))
        s = tl.arange(0, 256)
        hs = s % 2
        js = (s // 2) % 4
        gs = (s // 8) % 8
        ws = s // 64
        srow = rb * 64 + 16 * ws + 8 * hs + gs
        sr = srow % n_pad
        ssrc = ((srow // n_pad) * n + sr).to(tl.int64)
        sk = kc * 4 + js
        sv = tl.load(scales_ptr + ssrc * (k // 16) + sk, mask=(sr < n) & (sk < k // 16), other=0)
        tl.store(dst + 2048 + s, sv)

    _KERNEL = prepack_unit
    return _KERNEL


def prepack_stacked(mats: list[tuple[torch.Tensor, torch.Tensor]], n: int, k: int, n_pad: int, k_pad: int,
                    nwg: int, blocks: int) -> torch.Tensor:
    """``mats``: one or two (codes [G·N, K/2] uint8, scale bytes [G·N, K/16] uint8), groups stacked without
    padding. Returns the packed weights ``[ctas, K_pad/64, nwg·blocks, 2304]`` uint8, as ``prepack_weights`` of
    the padded matrices would."""
    codes0 = mats[0][0]
    groups = codes0.shape[0] // n
    rb_n, kc_n, per = groups * n_pad // 64, k_pad // 64, nwg * blocks
    dual = len(mats) == 2
    ctas = rb_n // (blocks if dual else per)
    out = torch.empty((ctas, kc_n, per, UNIT_BYTES), dtype=torch.uint8, device=codes0.device)
    kernel = _kernel()
    for m, (codes, scales) in enumerate(mats):
        kernel[(rb_n * kc_n,)](codes, scales, out, n, k, n_pad, kc_n, per, blocks, m, dual=dual, num_warps=4)
    return out
