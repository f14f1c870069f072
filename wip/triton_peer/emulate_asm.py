"""Emulate the PTX decode sequence bit for bit (numpy float16 = IEEE binary16, subnormals kept)."""
import numpy as np
import torch
from nvfp4lib.formats import E2M1_VALUES

def prmt(a, sel):  # b = 0
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [0, 0, 0, 0]
    out = 0
    for i in range(4):
        out |= src[(sel >> (4 * i)) & 0x7] << (8 * i)  # no sign-replicate bits used
    return out

def h2(x):  # uint32 -> two float16 (low, high)
    return np.array([x & 0xFFFF, x >> 16], dtype=np.uint16).view(np.float16)

def pack(h):
    u = np.asarray(h, dtype=np.float16).view(np.uint16)
    return int(u[0]) | (int(u[1]) << 16)

def mul(a, b):
    return pack(h2(a) * h2(b))

def cvt_e4m3x2(b16):
    v = torch.tensor([b16 & 0xFF, b16 >> 8], dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float16)
    return pack(v.numpy())

def decode(codes, scales):
    c01, c23 = cvt_e4m3x2(scales & 0xFFFF), cvt_e4m3x2(scales >> 16)
    k = 0x74007400
    out = []
    q01, q23 = prmt(codes, 0x7170), prmt(codes, 0x7372)
    for sh_sign, sh_mag in ((12, 9), (8, 5)):
        for q, c in ((q01, c01), (q23, c23)):
            t = (q << sh_sign) & 0xFFFFFFFF
            u = ((q << sh_mag) & 0xFFFFFFFF) & 0x0E000E00
            t = (t & 0x80008000) | u
            out.append(mul(mul(t, k), c))
    return out  # lo01, lo23, hi01, hi23

rng = np.random.default_rng(0)
lut = np.array(E2M1_VALUES, dtype=np.float64)
bad = 0
sc_all = [s for s in range(256) if (s & 0x7F) != 0x7F]
for b in range(256):
    for s in sc_all:
        # bytes: b in every slot; scales: s in slot 0/1, another in 2/3
        s2 = sc_all[(s * 7 + b) % len(sc_all)]
        codes = b | (b << 8) | (b << 16) | (b << 24)
        scales = s | (s << 8) | (s2 << 16) | (s2 << 24)
        lo01, lo23, hi01, hi23 = decode(codes, scales)
        sv = torch.tensor([s, s2], dtype=torch.uint8).view(torch.float8_e4m3fn).double().numpy()
        want_lo = [lut[b & 0xF] * sv[0]] * 2 + [lut[b & 0xF] * sv[1]] * 2
        want_hi = [lut[b >> 4] * sv[0]] * 2 + [lut[b >> 4] * sv[1]] * 2
        got_lo = list(h2(lo01).astype(np.float64)) + list(h2(lo23).astype(np.float64))
        got_hi = list(h2(hi01).astype(np.float64)) + list(h2(hi23).astype(np.float64))
        for g, w in zip(got_lo + got_hi, want_lo + want_hi):
            if not (g == w and np.signbit(g) == np.signbit(w)):
                bad += 1
print("mismatches:", bad)
bad = 0
for _ in range(20000):
    bs = rng.integers(0, 256, 4); ss = [sc_all[i] for i in rng.integers(0, len(sc_all), 4)]
    ss[1] = ss[0]; ss[3] = ss[2]  # a thread's byte pairs share a scale
    codes = int(bs[0]) | int(bs[1]) << 8 | int(bs[2]) << 16 | int(bs[3]) << 24
    scales = ss[0] | ss[1] << 8 | ss[2] << 16 | ss[3] << 24
    lo01, lo23, hi01, hi23 = decode(codes, scales)
    sv = torch.tensor(ss, dtype=torch.uint8).view(torch.float8_e4m3fn).double().numpy()
    want = [lut[int(bs[i]) & 0xF] * sv[i] for i in range(4)] + [lut[int(bs[i]) >> 4] * sv[i] for i in range(4)]
    got = [float(x) for r in (lo01, lo23, hi01, hi23) for x in h2(r)]
    bad += sum(1 for g, w in zip(got, want) if g != w or np.signbit(g) != np.signbit(w))
print("random mismatches:", bad)
