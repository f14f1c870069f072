"""Proposed CPU tests for the Triton swap-AB kernel (wip/triton_peer/triton_nvfp4.py), to move into tests/test_peers.py
once that file ships as nvfp4lib/peers/triton_nvfp4.py.

1. The inline-PTX decode, emulated instruction by instruction (prmt, shl, and, lop3, mul.rn.f16x2 in IEEE fp16,
   cvt.rn.f16x2.e4m3x2), against E2M1 x E4M3 for every code byte and every finite scale: exact.
2. The swap kernel's data flow (tile table, TMA descriptors, K permutation, activation decode, epilogue, dual) in
   Triton's CPU interpreter (plain-Triton decode in place of the PTX), against the exact reference.
"""
import importlib
import importlib.util
import os

import numpy as np
import pytest
import torch

from nvfp4lib.formats import E2M1_VALUES


def _module():
    mod = importlib.import_module("nvfp4lib.peers.triton_nvfp4")
    if hasattr(mod, "_setup_swap"):
        return mod
    path = os.path.join(os.path.dirname(__file__), "..", "wip", "triton_peer", "triton_nvfp4.py")
    spec = importlib.util.spec_from_file_location("nvfp4lib.peers._triton_wip", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- 1. the PTX, emulated (vectorized over all inputs)
def _f16(u32):  # uint32 array -> (low, high) float16 halves as float64
    u = np.asarray(u32, dtype=np.uint32)
    lo = (u & 0xFFFF).astype(np.uint16).view(np.float16)
    hi = (u >> 16).astype(np.uint16).view(np.float16)
    return lo, hi


def _pack(lo, hi):
    return lo.astype(np.float16).view(np.uint16).astype(np.uint32) | (
        hi.astype(np.float16).view(np.uint16).astype(np.uint32) << 16)


def _mul_f16x2(a, b):
    (al, ah), (bl, bh) = _f16(a), _f16(b)
    return _pack(al * bl, ah * bh)  # numpy float16 products are IEEE round-to-nearest, subnormals kept


def _cvt_e4m3x2(b16):
    b = torch.from_numpy(np.stack([b16 & 0xFF, b16 >> 8], -1).astype(np.uint8))
    v = b.view(torch.float8_e4m3fn).to(torch.float16).numpy()
    return _pack(v[..., 0], v[..., 1])


def _prmt0(x, sel):  # prmt.b32 d, x, 0, sel (no sign-replicate selectors)
    src = [(x >> (8 * i)) & 0xFF for i in range(4)] + [np.zeros_like(x)] * 4
    return sum((src[(sel >> (4 * i)) & 7].astype(np.uint32) << (8 * i)) for i in range(4)).astype(np.uint32)


def emulate_decode_ptx(codes, scales):
    """The instruction sequence of triton_nvfp4._DECODE_PTX on uint32 arrays; returns $0..$3."""
    codes = np.asarray(codes, dtype=np.uint32)
    scales = np.asarray(scales, dtype=np.uint32)
    c01, c23 = _cvt_e4m3x2(scales & 0xFFFF), _cvt_e4m3x2(scales >> 16)
    k = np.full_like(codes, 0x74007400)
    q01, q23 = _prmt0(codes, 0x7170), _prmt0(codes, 0x7372)
    outs = []
    for q, c, sign, mag in ((q01, c01, 12, 9), (q23, c23, 12, 9), (q01, c01, 8, 5), (q23, c23, 8, 5)):
        t = (q << sign) & 0xFFFFFFFF
        u = ((q << mag) & 0xFFFFFFFF) & 0x0E000E00
        t = (t & 0x80008000) | u  # lop3 0xEA: (a & b) | c
        outs.append(_mul_f16x2(_mul_f16x2(t, k), c))
    return outs


def test_decode_ptx_is_exact_for_every_code_and_scale():
    pytest.importorskip("triton")
    src = _module()._DECODE_PTX
    for op in ("prmt.b32 q01, $4, 0, 0x7170", "0x74007400", "lop3.b32 t, t, 0x80008000, u, 0xEA",
               "cvt.rn.f16x2.e4m3x2 c01, sl"):
        assert op in src  # the emulation below follows these instructions
    codes_b = np.arange(256, dtype=np.uint32)
    sc = np.array([s for s in range(256) if (s & 0x7F) != 0x7F], dtype=np.uint32)
    b, s = np.meshgrid(codes_b, sc, indexing="ij")
    b, s = b.ravel(), s.ravel()
    rot = np.roll(b, 12345)  # other bytes in the other slots: catch cross-lane mistakes
    s2 = np.roll(s, 777)
    codes = b | (rot << 8) | (np.roll(b, 3) << 16) | (np.roll(rot, 5) << 24)
    scales = s | (s << 8) | (s2 << 16) | (s2 << 24)
    lo01, lo23, hi01, hi23 = emulate_decode_ptx(codes, scales)
    lut = np.array(E2M1_VALUES)
    sv = torch.from_numpy(np.stack([s, s2], -1).astype(np.uint8)).view(torch.float8_e4m3fn).double().numpy()
    bytes_ = [codes & 0xFF, (codes >> 8) & 0xFF, (codes >> 16) & 0xFF, codes >> 24]
    scl = [sv[:, 0], sv[:, 0], sv[:, 1], sv[:, 1]]
    got = [*_f16(lo01), *_f16(lo23), *_f16(hi01), *_f16(hi23)]
    want = [lut[bytes_[i] & 0xF] * scl[i] for i in range(4)] + [lut[bytes_[i] >> 4] * scl[i] for i in range(4)]
    for g, w in zip(got, want):
        g = g.astype(np.float64)
        assert np.array_equal(g, w) and np.array_equal(np.signbit(g), np.signbit(w))


# ---------------------------------------------------------------- 2. the kernel in Triton's interpreter
# TRITON_INTERPRET must be set before triton is first imported (part of triton.language is fixed at import), so the
# kernel runs in a fresh interpreter process.
_INTERPRETER_SCRIPT = r"""
import builtins, json, sys
import numpy as np
import torch
import triton.runtime.interpreter as interp

class _IntMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, builtins.int)

class _int(metaclass=_IntMeta):  # Triton 3.6's interpreter int()s 1-element arrays, which numpy 2 refuses
    def __new__(cls, x=0, *args):
        if isinstance(x, np.ndarray) and x.size == 1:
            x = x.reshape(())
        return builtins.int(x, *args)

interp.int = _int
import importlib, importlib.util, os
from nvfp4lib.problems import get_problem, make_inputs
from nvfp4lib.reference import reference_grouped_gemm, relative_error

T = importlib.import_module("nvfp4lib.peers.triton_nvfp4")
if not hasattr(T, "_setup_swap"):  # not shipped yet: the wip copy
    spec = importlib.util.spec_from_file_location(
        "nvfp4lib.peers._triton_wip", os.path.join(sys.argv[1], "wip", "triton_peer", "triton_nvfp4.py"))
    T = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(T)
errs = {}
for name in ("C1", "C9", "E1-empty-group", "E3-ragged"):
    for dual in (False, True):
        x = make_inputs(get_problem(name).with_dual(dual), seed=1111, mode="gaussian")
        ref = reference_grouped_gemm(x.a, x.b, x.b2)
        for cand in ((64, 64, 128, 4, 3), (64, 32, 64, 4, 3)):
            run, outs, _ = T._setup_swap(x.a, x.b, x.b2, torch.float16, cand)
            for o in outs:
                o.fill_(float("nan"))
            run()
            errs[f"{name}{'-dual' if dual else ''}{cand}"] = relative_error(outs, ref)
print(json.dumps(errs))
"""


@pytest.mark.slow
def test_swap_kernel_in_the_interpreter():
    pytest.importorskip("triton")
    import json
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT, root], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    errs = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(errs) == 16
    bad = {k: v for k, v in errs.items() if not v <= 1e-4}
    assert not bad, bad
