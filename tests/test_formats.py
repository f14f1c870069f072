"""Tests for nvfp4lib.formats: the NVFP4 encoding, NVFP4Tensor, and the scale layouts.

The oracles here are written independently of the implementation: a hand-written E2M1
table, E2M1/E4M3 values derived from their bit fields, brute-force nearest-value search
in Python floats, an explicit-loop version of the cuBLAS blocked-layout formula, and
(where this torch ships it) torch's vendored torchao NVFP4 quantizer.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nvfp4lib.formats import (
    NVFP4Tensor,
    dequantize,
    e2m1_decode,
    e2m1_encode,
    pack_e2m1,
    quantize,
    scales_cute_view,
    swizzle_scales,
    unpack_e2m1,
    unswizzle_scales,
)

FAST = settings(max_examples=60, deadline=None)
SLOW = settings(max_examples=25, deadline=None)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]

# --------------------------------------------------------------------------- oracles

# Hand-written: code -> value. Bit 3 is the sign; 0x8 is negative zero.
HAND_E2M1 = {
    0x0: 0.0, 0x1: 0.5, 0x2: 1.0, 0x3: 1.5, 0x4: 2.0, 0x5: 3.0, 0x6: 4.0, 0x7: 6.0,
    0x8: -0.0, 0x9: -0.5, 0xA: -1.0, 0xB: -1.5, 0xC: -2.0, 0xD: -3.0, 0xE: -4.0, 0xF: -6.0,
}
GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # magnitudes of codes 0..7


def e2m1_from_bits(code: int) -> float:
    """E2M1 from its fields: s eemm... (1 sign, 2 exponent bits with bias 1, 1 mantissa)."""
    sign = -1.0 if code & 0x8 else 1.0
    e, m = (code >> 1) & 0x3, code & 0x1
    mag = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
    return sign * mag


def e4m3_from_bits(byte: int) -> float:
    """E4M3FN from its fields (bias 7, no infinities, 0x7F/0xFF are NaN)."""
    sign = -1.0 if byte & 0x80 else 1.0
    e, m = (byte >> 3) & 0xF, byte & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    mag = (m / 8) * 2.0**-6 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8)
    return sign * mag


E4M3_POS = sorted({e4m3_from_bits(b) for b in range(0x7F)})  # 0 .. 448, 127 values


def nearest_even(a: float, grid: list[float]) -> int:
    """Index of the grid value nearest to a >= 0; on a tie the even index (mantissa 0)."""
    d = [abs(a - v) for v in grid]
    best = min(d)
    idx = [i for i, di in enumerate(d) if di == best]
    return idx[0] if len(idx) == 1 else next(i for i in idx if i % 2 == 0)


def ref_e2m1_code(y: float) -> int:
    mag = 7 if abs(y) >= 6 else nearest_even(abs(y), GRID)
    return mag | (8 if math.copysign(1.0, y) < 0 else 0)


def ref_e4m3(t: float) -> float:
    """Round-to-nearest-even onto E4M3 (t >= 0, already clamped to 448)."""
    # Even byte <=> even index in the sorted positive list (index == byte for 0..0x7E).
    return E4M3_POS[nearest_even(t, E4M3_POS)]


def ref_quantize(x: np.ndarray, g: float | None):
    """Scalar reference of the quantize recipe in numpy float32 arithmetic.

    Returns (codes [..., K] as int array, scale values [..., K//16] as float)."""
    with np.errstate(over="ignore"):  # fp32 overflow to inf is part of the recipe
        return _ref_quantize(x, g)


def _ref_quantize(x: np.ndarray, g: float | None):
    f32 = np.float32
    x = x.astype(np.float32)
    if g is None:
        amax = f32(np.abs(x).max()) if x.size else f32(0)
        g32 = f32(1.0) if amax == 0 else f32(amax / f32(2688.0))
    else:
        g32 = f32(g)
    rows = x.reshape(-1, x.shape[-1])
    codes = np.zeros(rows.shape, dtype=np.int64)
    scales = np.zeros((rows.shape[0], rows.shape[1] // 16))
    for r in range(rows.shape[0]):
        for b in range(rows.shape[1] // 16):
            blk = rows[r, 16 * b : 16 * b + 16]
            bamax = f32(np.abs(blk).max())
            t = f32(f32(bamax / f32(6.0)) / g32)
            s = ref_e4m3(min(float(t), 448.0))
            scales[r, b] = s
            denom = f32(f32(s) * g32)
            for j in range(16):
                codes[r, 16 * b + j] = 0 if denom == 0 else ref_e2m1_code(float(f32(blk[j] / denom)))
    return codes.reshape(x.shape), scales.reshape(*x.shape[:-1], -1), float(g32)


def _load_torch_vendored_mx_utils():
    """torch's vendored port of torchao's NVFP4 quantizer, if this torch ships it.
    Loaded by path: the package __init__ pulls in optional dependencies."""
    spec = importlib.util.find_spec("torch")
    path = Path(spec.origin).parent / "_vendor" / "quack" / "mx_utils.py"
    if not path.exists():
        return None
    try:
        mod_spec = importlib.util.spec_from_file_location("_nvfp4_test_mx_utils", path)
        mod = importlib.util.module_from_spec(mod_spec)
        with warnings.catch_warnings():  # its torch.compile handles import deprecated bits
            warnings.simplefilter("ignore")
            mod_spec.loader.exec_module(mod)
    except Exception:  # noqa: BLE001 - any failure just means "oracle unavailable"
        return None
    return mod if hasattr(mod, "to_nvfp4") and hasattr(mod, "to_blocked") else None


MX = _load_torch_vendored_mx_utils()


def half_ulp_e2m1(y: np.ndarray) -> np.ndarray:
    """Half the E2M1 grid spacing around |y| <= 6 (the worst rounding error there)."""
    return np.where(y < 2, 0.25, np.where(y < 4, 0.5, 1.0))


# --------------------------------------------------------------------------- strategies


@st.composite
def float_arrays(draw, max_rows=4, max_blocks=4, lo_exp=-30, hi_exp=30):
    """Small float32 arrays [rows, K]: per-block magnitudes spanning many decades,
    with exact zeros, negative zeros, repeated values and grid-like values mixed in."""
    rows = draw(st.integers(1, max_rows))
    nb = draw(st.integers(1, max_blocks))
    K = 16 * nb
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    exps = rng.uniform(lo_exp, hi_exp, size=(rows, nb, 1)) if draw(st.booleans()) else \
        rng.uniform(-3, 3, size=(rows, nb, 1))
    kind = draw(st.sampled_from(["normal", "t3", "uniform", "grid"]))
    if kind == "normal":
        v = rng.standard_normal((rows, nb, 16))
    elif kind == "t3":
        v = rng.standard_t(3, (rows, nb, 16))
    elif kind == "uniform":
        v = rng.uniform(-1, 1, (rows, nb, 16))
    else:  # multiples of 1/4: many exact ties after scaling by powers of two
        v = rng.integers(-24, 25, (rows, nb, 16)) / 4.0
    x = (v * 10.0**exps).astype(np.float32)
    specials = draw(st.lists(st.tuples(st.integers(0, rows * K - 1),
                                       st.sampled_from([0.0, -0.0, 1.0, -6.0, 0.25, 1e-30]))))
    flat = x.reshape(-1)
    for i, val in specials:
        flat[i] = val
    return flat.reshape(rows, K)


# --------------------------------------------------------------------------- E2M1 codes


def test_hand_table_matches_bit_fields():
    for code, val in HAND_E2M1.items():
        ref = e2m1_from_bits(code)
        assert ref == val and math.copysign(1, ref) == math.copysign(1, val), hex(code)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_all_256_bytes_both_nibbles(device):
    packed = torch.arange(256, dtype=torch.uint8, device=device)
    vals = e2m1_decode(unpack_e2m1(packed)).cpu()
    assert vals.dtype == torch.float32 and vals.shape == (512,)
    expected = []
    for byte in range(256):  # element 2i = low nibble, 2i+1 = high nibble
        expected += [HAND_E2M1[byte & 0xF], HAND_E2M1[byte >> 4]]
    exp_t = torch.tensor(expected, dtype=torch.float32)
    assert torch.equal(vals, exp_t)
    assert torch.equal(torch.signbit(vals), torch.signbit(exp_t))  # -0.0 stays -0.0


def test_pack_nibble_order_by_hand():
    codes = torch.tensor([[0x1, 0x2, 0xF, 0x0, 0x7, 0x8]], dtype=torch.uint8)
    assert pack_e2m1(codes).tolist() == [[0x21, 0x0F, 0x87]]


@FAST
@given(st.lists(st.integers(0, 15), min_size=2, max_size=64).filter(lambda v: len(v) % 2 == 0),
       st.integers(1, 3))
def test_pack_unpack_inverse(codes, lead):
    c = torch.tensor(codes, dtype=torch.uint8).repeat(lead, 1)
    p = pack_e2m1(c)
    assert p.shape == (lead, len(codes) // 2)
    assert torch.equal(unpack_e2m1(p), c)
    # and the other direction: any byte pattern survives unpack -> pack
    assert torch.equal(pack_e2m1(unpack_e2m1(p)), p)


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="torch lacks float4_e2m1fn_x2")
def test_packing_matches_torch_float4_e2m1fn_x2():
    x = torch.tensor([[0.5, -3.0, 6.0, 0.0, 1.5, -0.5, 4.0, 2.0]])
    packed = pack_e2m1(e2m1_encode(x))
    f4 = packed.view(torch.float4_e2m1fn_x2)
    assert f4.shape == (1, 4) and torch.equal(f4.view(torch.uint8), packed)
    if MX is None:
        pytest.skip("no torch-side float -> float4_e2m1fn_x2 converter to compare against")
    # torch's (vendored torchao) converter, bit-manipulation based: same bytes.
    xs = torch.randn(64, 32, generator=torch.Generator().manual_seed(0)) * 3
    xs[0, :14] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 7.0, -0.0, 6.0, -1e9, -0.1])
    theirs = MX._pack_uint4(MX._f32_to_floatx_unpacked(xs, 2, 1))
    assert torch.equal(pack_e2m1(e2m1_encode(xs)), theirs.view(torch.uint8))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_encode_decode_roundtrip_on_grid(dtype):
    vals = torch.tensor([HAND_E2M1[c] for c in range(16)], dtype=dtype)
    codes = e2m1_encode(vals)
    assert codes.tolist() == list(range(16))  # includes -0.0 -> 0x8
    assert torch.equal(e2m1_decode(codes), vals.float())


TIES = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_ties_to_even_every_tie(dtype, device):
    for tie, want in TIES.items():
        for sign in (1.0, -1.0):
            x = torch.tensor([sign * tie], dtype=dtype, device=device)
            got = e2m1_decode(e2m1_encode(x)).item()
            assert got == sign * want, (dtype, sign * tie, got)
            # one ulp either side of the tie must go to the nearer neighbour
            up = torch.nextafter(x, x * 2)
            down = torch.nextafter(x, x * 0)
            lo, hi = max(v for v in GRID if v < tie), min(v for v in GRID if v > tie)
            assert e2m1_decode(e2m1_encode(up)).item() == sign * hi
            assert e2m1_decode(e2m1_encode(down)).item() == sign * lo


@FAST
@given(st.lists(st.floats(-12, 12, width=32), min_size=1, max_size=64))
def test_encode_is_nearest_ties_even(xs):
    x = torch.tensor(xs, dtype=torch.float32)
    got = e2m1_encode(x).tolist()
    assert got == [ref_e2m1_code(v) for v in xs]


@FAST
@given(st.floats(6.0, 3.0e38).map(lambda v: float(np.float32(v))), st.booleans())
def test_saturation(v, neg):
    x = torch.tensor([-v if neg else v, math.inf if not neg else -math.inf])
    want = 0xF if neg else 0x7
    assert e2m1_encode(x).tolist() == [want, want]


def test_encode_nan_raises():
    with pytest.raises(ValueError, match="NaN"):
        e2m1_encode(torch.tensor([1.0, math.nan, math.nan]))


# --------------------------------------------------------------------------- E4M3 scales


def test_e4m3_bit_field_oracle_agrees_with_torch():
    # Sanity of the test oracle: torch's float8 decode of every byte.
    t = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double().tolist()
    for b in range(256):
        ref = e4m3_from_bits(b)
        assert (math.isnan(ref) and math.isnan(t[b])) or ref == t[b], hex(b)


@pytest.mark.parametrize("device", DEVICES)
def test_all_finite_e4m3_scales_dequantize_exactly(device):
    finite = [b for b in range(256) if b & 0x7F != 0x7F]  # 254 bytes
    n = len(finite)
    scales = torch.tensor(finite, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(n, 1)
    # every element of row r has code 0x7 (6.0) or 0xB (-1.5)
    codes = torch.tensor([0x7, 0xB] * 8, dtype=torch.uint8).repeat(n, 1)
    g = 0.3  # not a power of two: exercises the single fp32 rounding
    t = NVFP4Tensor(pack_e2m1(codes), scales, g).to(device)
    g32 = float(np.float32(g))
    out32 = dequantize(t).cpu()
    out64 = dequantize(t, torch.float64).cpu()
    for r, b in enumerate(finite):
        s = Fraction(e4m3_from_bits(b))
        for j, q in ((0, Fraction(6)), (1, Fraction(-3, 2))):
            exact = q * s * Fraction(g32)
            assert out64[r, j].item() == float(exact)  # exact in float64
            assert out32[r, j].item() == float(np.float32(float(exact)))  # one rounding


@FAST
@given(st.integers(0, 2**31 - 1), st.floats(2.0**-66, 2.0**66))
def test_dequantize_is_exact_product_one_rounding(seed, g):
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (3, 16), dtype=torch.uint8, generator=gen)
    sb = torch.randint(0, 0x7F, (3, 2), dtype=torch.uint8, generator=gen) | \
        (torch.randint(0, 2, (3, 2), dtype=torch.uint8, generator=gen) << 7)
    t = NVFP4Tensor(data, sb.view(torch.float8_e4m3fn), g)
    out32, out64 = dequantize(t), dequantize(t, torch.float64)
    codes = unpack_e2m1(data)
    for r in range(3):
        for k in range(32):
            exact = Fraction(HAND_E2M1[int(codes[r, k])]) * Fraction(e4m3_from_bits(int(sb[r, k // 16]))) \
                * Fraction(float(np.float32(g)))
            assert out64[r, k].item() == float(exact)
            assert out32[r, k].item() == float(np.float32(float(exact)))


# --------------------------------------------------------------------------- quantize


@SLOW
@given(float_arrays(max_rows=3, max_blocks=3), st.sampled_from(FLOAT_DTYPES),
       st.one_of(st.none(), st.floats(1e-12, 1e12)))
def test_quantize_matches_scalar_reference(x, dtype, g):
    xt = torch.from_numpy(x).to(dtype)
    xr = xt.double().numpy()  # the values quantize actually sees (already rounded to dtype)
    assume(np.all(np.isfinite(xr)))
    q = quantize(xt, global_scale=g)
    codes, scales, g32 = ref_quantize(xr, g)
    assert q.global_scale.item() == g32
    assert torch.equal(q.scales.double(), torch.from_numpy(scales))
    assert torch.equal(unpack_e2m1(q.data).long(), torch.from_numpy(codes))


@SLOW
@given(float_arrays(), st.one_of(st.none(), st.floats(1e-6, 1e6)))
def test_quantization_error_bound(x, g):
    """Per element, with s the stored E4M3 block scale and G the global scale:

      |x - deq| <= s*G * hu(|x|/(s*G))         if |x|/(s*G) <= 6  (nearest grid point)
      |x - deq| <= |x| - 6*s*G                 if |x|/(s*G) > 6   (saturated: scale rounded down)

    where hu is half the E2M1 spacing (0.25 below 2, 0.5 below 4, 1 up to 6), plus
    O(2^-21) relative slack for the fp32 divide and the final fp32 product. Blocks
    whose scale flushed to 0 dequantize to 0 and their ideal scale was <= 2^-10.

    For blocks whose ideal scale t = amax/6/G lies in E4M3's normal range
    [2^-6, 448], the scale-rounding term is bounded a priori: |s - t| <= 2^-4 * t, so
    with S = amax/6 the error is <= max(hu(|x| / (S(1-2^-4))) * S(1+2^-4),
    |x| - 6 S (1-2^-4)) <= (17/16) * amax / 6.
    """
    xt = torch.from_numpy(x)
    q = quantize(xt, global_scale=g)
    deq = dequantize(q, torch.float64).numpy()
    G = q.global_scale.item()
    s = np.repeat(q.scales.double().numpy(), 16, axis=-1)
    sg = s * G
    ax = np.abs(x.astype(np.float64))
    err = np.abs(x - deq)
    slack = 2.0**-20 * (ax + sg)

    zero = sg == 0
    assert np.all(deq[zero] == 0)
    blocks = ax.reshape(*x.shape[:-1], -1, 16)
    bamax = blocks.max(-1)
    t = bamax / 6 / G
    s_blk = q.scales.double().numpy()
    assert np.all(t[s_blk == 0] <= 2.0**-10 * (1 + 2.0**-20))

    nz = ~zero
    y = np.where(nz, ax / np.where(nz, sg, 1), 0)
    tight = np.where(y <= 6, sg * half_ulp_e2m1(y), ax - 6 * sg)
    assert np.all(err[nz] <= tight[nz] + slack[nz]), np.max((err - tight - slack)[nz])

    # a-priori bound for blocks with normal-range scales
    normal = (t >= 2.0**-6) & (t <= 448)
    assert np.all(np.abs(s_blk - t)[normal] <= 2.0**-4 * t[normal] * (1 + 2.0**-20))
    S = np.repeat(bamax / 6, 16, axis=-1)
    S_lo, S_hi = S * (1 - 2.0**-4), S * (1 + 2.0**-4)
    y_hi = np.minimum(ax / np.where(S_lo > 0, S_lo, 1), 6)
    apriori = np.maximum(half_ulp_e2m1(y_hi) * S_hi, ax - 6 * S_lo)
    nmask = np.repeat(normal, 16, axis=-1)
    assert np.all(err[nmask] <= apriori[nmask] + slack[nmask])
    assert np.all(err[nmask] <= (17 / 16) * S[nmask] + slack[nmask])


@SLOW
@given(float_arrays(lo_exp=-3, hi_exp=3), st.booleans())
def test_quantize_dequantize_quantize_idempotent(x, explicit_g):
    """Holds whenever every block's scale is in E4M3's normal range (true here: the
    per-block magnitudes span < 2^6 * 448, the range default global scaling keeps
    normal); see test_requantize_subnormal_scale_block_is_not_idempotent."""
    xt = torch.from_numpy(x)
    q1 = quantize(xt)
    t = torch.from_numpy(np.abs(x).reshape(x.shape[0], -1, 16).max(-1)) / 6 / q1.global_scale
    assume(bool(((t == 0) | (t >= 2.0**-6)).all()))
    d1 = dequantize(q1)
    q2 = quantize(d1, global_scale=q1.global_scale if explicit_g else None)
    assert torch.equal(q2.data, q1.data)
    assert torch.equal(q2.scales.view(torch.uint8), q1.scales.view(torch.uint8))
    if explicit_g:
        assert q2.global_scale.item() == q1.global_scale.item()
        assert torch.equal(dequantize(q2), d1)
    else:  # the recomputed amax/2688 may land one float32 ulp away
        assert abs(q2.global_scale.item() / q1.global_scale.item() - 1) <= 2.0**-23


def test_requantize_subnormal_scale_block_is_not_idempotent():
    # Documented limitation: ideal scale 1.6 * 2^-9 rounds to the subnormal 2 * 2^-9,
    # the block max lands on 4 (not 6), so re-quantizing picks the scale 2^-9.
    x = torch.zeros(1, 16)
    x[0, 0] = 6 * 1.6 * 2.0**-9
    q1 = quantize(x, global_scale=1.0)
    assert q1.scales.float().item() == 2 * 2.0**-9
    d1 = dequantize(q1)
    assert d1[0, 0].item() == 4 * 2 * 2.0**-9
    q2 = quantize(d1, global_scale=1.0)
    assert q2.scales.float().item() == 2.0**-9
    assert dequantize(q2)[0, 0].item() == 6 * 2.0**-9



@SLOW
@given(st.integers(0, 2**31 - 1), st.sampled_from([1.0, 1.25, 1.5, 1.75]), st.integers(-24, 2))
def test_quantize_ties_to_even_end_to_end(seed, g_mant, g_exp):
    """Elements placed exactly on E2M1 ties of their block's s*G must round to even
    through quantize -- which dividing by s*G, not multiplying by its reciprocal,
    guarantees. G has <= 3 significant bits so that s*G (<= 7 bits) times a tie
    (<= 3 bits) is exact in fp32 and the elements really sit on the ties."""
    g = g_mant * 2.0**g_exp
    gen = torch.Generator().manual_seed(seed)
    block_mag = torch.exp(torch.randn(8, 4, 1, generator=gen))
    x = (torch.randn(8, 4, 16, generator=gen) * block_mag).reshape(8, 64)
    q = quantize(x, global_scale=g)
    sg = (q.scales.float() * q.global_scale).repeat_interleave(16, -1)
    ties = torch.tensor(list(TIES))
    pick = torch.randint(0, len(ties), x.shape, generator=gen)
    sign = torch.where(torch.rand(x.shape, generator=gen) < 0.5, -1.0, 1.0)
    x2 = sign * ties[pick] * sg
    # keep each block's largest element, so every block keeps its scale
    amax_pos = x.abs().reshape(8, 4, 16).argmax(-1, keepdim=True)
    keep = torch.zeros(8, 4, 16, dtype=torch.bool).scatter(-1, amax_pos, True).reshape(8, 64)
    x2 = torch.where(keep, x, x2)
    q2 = quantize(x2, global_scale=q.global_scale)
    assert torch.equal(q2.scales.view(torch.uint8), q.scales.view(torch.uint8))
    want = sign * torch.tensor(list(TIES.values()))[pick]
    got = e2m1_decode(unpack_e2m1(q2.data))
    check = ~keep & (sg > 0)  # blocks whose scale flushed to zero hold only zeros
    assert check.float().mean() > 0.5
    assert torch.equal(got[check], want[check])


def test_default_global_scale_and_max_block_scale():
    x = torch.linspace(-3, 7, 64).reshape(2, 32)
    q = quantize(x)
    assert q.global_scale.item() == pytest.approx(7 / 2688, rel=2**-23)
    assert q.scales.float().max().item() == 448.0
    assert dequantize(q).abs().max().item() == pytest.approx(7, rel=2**-22)


@pytest.mark.parametrize("device", DEVICES)
def test_all_zero_input(device):
    x = torch.zeros(2, 3, 32, device=device)
    x[0, 0, 5] = -0.0
    q = quantize(x)
    assert q.global_scale.item() == 1.0 and q.device.type == device
    assert not q.scales.float().any() and not q.data.any()  # zero-scale block -> 0x0 codes


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_input_dtypes_agree_with_float32(dtype):
    x = (torch.randn(4, 48, generator=torch.Generator().manual_seed(1)) * 5).to(dtype)
    a, b = quantize(x), quantize(x.float())
    assert torch.equal(a.data, b.data) and torch.equal(a.scales.float(), b.scales.float())
    assert dequantize(a, dtype).dtype == dtype


@pytest.mark.skipif(MX is None, reason="torch's vendored NVFP4 quantizer not available")
@SLOW
@given(float_arrays(lo_exp=-2, hi_exp=2))
def test_agrees_with_torch_vendored_nvfp4(x):
    """torch's port of torchao's to_nvfp4 multiplies by (1/G)/s instead of dividing by
    s*G, so codes may differ only where x/(s*G) sits within rounding of an E2M1 tie."""
    xt = torch.from_numpy(x)
    q = quantize(xt)
    t = torch.from_numpy(np.abs(x).reshape(x.shape[0], -1, 16).max(-1)) / 6 / q.global_scale
    assume(bool((t >= 2.0**-6).all()))  # torchao clamps scales up to E4M3's smallest normal
    data, scales, pts = MX.to_nvfp4(xt, per_tensor_scale=q.global_scale)
    assert torch.equal(scales.view(torch.uint8), q.scales.view(torch.uint8))
    diff = unpack_e2m1(data.view(torch.uint8)) != unpack_e2m1(q.data)
    if diff.any():
        y = (xt / (q.scales.float().repeat_interleave(16, -1) * q.global_scale)).abs()
        mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
        near_tie = ((y[diff].unsqueeze(-1) - mids).abs() <= 4e-7 * mids).any(-1)
        assert near_tie.all()


# --------------------------------------------------------------------------- NVFP4Tensor


def test_nvfp4tensor_properties():
    data = torch.zeros(2, 3, 16, dtype=torch.uint8)
    scales = torch.ones(2, 3, 2).to(torch.float8_e4m3fn)
    t = NVFP4Tensor(data, scales, 0.5)
    assert t.shape == torch.Size([2, 3, 32]) and t.K == 32
    assert t.device == torch.device("cpu")
    assert t.global_scale.dtype == torch.float32 and t.global_scale.ndim == 0
    assert t.nbytes == 96 + 12 + 4
    t2 = t.to("cpu")
    assert isinstance(t2, NVFP4Tensor) and t2.shape == t.shape


def _parts(lead=(2,), K=32):
    return (torch.zeros(*lead, K // 2, dtype=torch.uint8),
            torch.ones(*lead, K // 16).to(torch.float8_e4m3fn),
            torch.tensor(1.0))


@pytest.mark.parametrize("mutate, exc, pattern", [
    (lambda d, s, g: (d.float(), s, g), TypeError, "data must be a torch.uint8"),
    (lambda d, s, g: (d, s.float(), g), TypeError, "scales must be a torch.float8_e4m3fn"),
    (lambda d, s, g: (d, s, g.double()), TypeError, "global_scale must be a float32"),
    (lambda d, s, g: (d, s, "1.0"), TypeError, "global_scale"),
    (lambda d, s, g: (d, s, g.reshape(1)), ValueError, "0-d"),
    (lambda d, s, g: (d[:, :12], s, g), ValueError, "K = 24"),
    (lambda d, s, g: (d, s[:, :1], g), ValueError, r"scales shape \(2, 1\)"),
    (lambda d, s, g: (d, torch.cat([s, s]), g), ValueError, r"scales shape \(4, 2\)"),
    (lambda d, s, g: (d, s, torch.tensor(0.0)), ValueError, "finite and > 0"),
    (lambda d, s, g: (d, s, torch.tensor(-2.0)), ValueError, "finite and > 0"),
    (lambda d, s, g: (d, s, torch.tensor(math.nan)), ValueError, "finite and > 0"),
    (lambda d, s, g: (d, s, math.inf), ValueError, "finite and > 0"),
])
def test_nvfp4tensor_rejects_bad_parts(mutate, exc, pattern):
    with pytest.raises(exc, match=pattern):
        NVFP4Tensor(*mutate(*_parts()))


# --------------------------------------------------------------------------- errors


def test_quantize_errors():
    with pytest.raises(ValueError, match="K = 24"):
        quantize(torch.ones(2, 24))
    with pytest.raises(ValueError, match="K = 0"):
        quantize(torch.ones(2, 0))
    with pytest.raises(ValueError, match="2 non-finite"):
        quantize(torch.tensor([math.nan, 1.0, math.inf] + [0.0] * 13))
    with pytest.raises(ValueError, match="float32 range"):
        quantize(torch.full((16,), 1e300, dtype=torch.float64))
    with pytest.raises(TypeError, match="int32"):
        quantize(torch.ones(16, dtype=torch.int32))
    for bad in (0.0, -1.0, math.nan, math.inf, 1e-50, 1e40, torch.tensor(-3.0)):
        with pytest.raises(ValueError, match="global_scale"):
            quantize(torch.ones(16), global_scale=bad)
    with pytest.raises(ValueError, match="0-d"):
        quantize(torch.ones(16), global_scale=torch.ones(1))


def test_dequantize_nan_scale_raises():
    q = quantize(torch.randn(3, 32))
    sc = q.scales.view(torch.uint8).clone()
    sc[0, 1], sc[2, 0] = 0x7F, 0xFF
    bad = NVFP4Tensor(q.data, sc.view(torch.float8_e4m3fn), q.global_scale)
    with pytest.raises(ValueError, match=r"scales holds 2 NaN"):
        dequantize(bad)


def test_code_errors():
    with pytest.raises(ValueError, match="exceed 15"):
        e2m1_decode(torch.tensor([3, 16], dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8"):
        e2m1_decode(torch.tensor([3], dtype=torch.int64))
    with pytest.raises(ValueError, match="even"):
        pack_e2m1(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(TypeError, match="floating-point"):
        e2m1_encode(torch.ones(4, dtype=torch.int32))


# --------------------------------------------------------------------------- scale layout


def loop_swizzle(m: torch.Tensor) -> torch.Tensor:
    """cuBLAS's formula, element by element: offset = 512 * (tile_row * n_col_tiles +
    tile_col) + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4; padding left zero."""
    rows, cols = m.shape
    nrt, nct = -(-rows // 128), -(-cols // 4)
    out = torch.zeros(nrt * nct * 512, dtype=m.dtype)
    for r in range(rows):
        for c in range(cols):
            off = 512 * ((r // 128) * nct + c // 4) + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
            out[off] = m[r, c]
    return out


@SLOW
@given(st.integers(1, 300), st.integers(1, 11))
def test_swizzle_matches_loop_reference(rows, cols):
    m = torch.arange(1, rows * cols + 1, dtype=torch.int32).reshape(rows, cols)
    assert torch.equal(swizzle_scales(m), loop_swizzle(m))
    if MX is not None:
        assert torch.equal(swizzle_scales(m), MX.to_blocked(m))


@FAST
@given(st.integers(1, 400), st.integers(1, 20), st.one_of(st.none(), st.integers(1, 3)),
       st.integers(0, 2**31 - 1))
def test_swizzle_unswizzle_inverse(rows, cols, L, seed):
    shape = (rows, cols) if L is None else (L, rows, cols)
    raw = torch.randint(0, 0x7F, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    s = raw.view(torch.float8_e4m3fn)
    b = swizzle_scales(s)
    assert b.dtype == torch.float8_e4m3fn and b.ndim == 1
    nbatch = 1 if L is None else L
    assert b.numel() == nbatch * (-(-rows // 128) * 128) * (-(-cols // 4) * 4)
    back = unswizzle_scales(b, rows, cols, L)
    assert torch.equal(back.view(torch.uint8), raw)
    if L is not None:  # batches are concatenated, each swizzled on its own
        per = [swizzle_scales(s[i]) for i in range(L)]
        assert torch.equal(b.view(torch.uint8), torch.cat(per).view(torch.uint8))


@SLOW
@given(st.integers(1, 260), st.integers(1, 9), st.integers(1, 2))
def test_cute_view_indexes_same_elements(rows, cols, L):
    m = torch.arange(1, L * rows * cols + 1, dtype=torch.int64).reshape(L, rows, cols)
    b = swizzle_scales(m)
    v = scales_cute_view(b, rows, cols, L)
    rm, rk = -(-rows // 128), -(-cols // 4)
    assert v.shape == (32, 4, rm, 4, rk, L)
    assert v.stride() == (16, 4, 512 * rk, 1, 512, 512 * rm * rk)
    assert v.data_ptr() == b.data_ptr()  # a view, not a copy
    # explicit loops over the 6-d index
    vl, ml = v.tolist(), m.tolist()
    for li in range(L):
        for im in range(rm):
            for i4 in range(4):
                for i32 in range(32):
                    r = 128 * im + 32 * i4 + i32
                    for jk in range(rk):
                        for j in range(4):
                            c = 4 * jk + j
                            want = ml[li][r][c] if r < rows and c < cols else 0
                            assert vl[i32][i4][im][j][jk][li] == want


def test_layout_errors():
    with pytest.raises(ValueError, match="512 elements"):
        unswizzle_scales(torch.zeros(100), 5, 3)
    with pytest.raises(ValueError, match="1024 elements"):
        scales_cute_view(torch.zeros(512), 5, 3, L=2)
    with pytest.raises(ValueError, match="rows, cols"):
        swizzle_scales(torch.zeros(4))


def test_addresses_are_read_once_and_not_carried_into_copies():
    """NVFP4Tensor.addresses() is kept on the tensor (a one-shot call reads its weights' every call); a deep copy or a
    saved and loaded tensor holds other storage and reads its own."""
    import copy
    import io

    x = quantize(torch.randn(4, 32))
    a = x.addresses()
    assert a is x.addresses()
    assert a == (x.data.shape, -1, True, x.data.data_ptr(), x.scales.data_ptr(), x.global_scale.data_ptr())
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    for other in (copy.deepcopy(x), torch.load(buf, weights_only=False)):
        assert other.addresses()[3:] == (other.data.data_ptr(), other.scales.data_ptr(),
                                         other.global_scale.data_ptr())
        assert other.addresses()[3] != a[3]
